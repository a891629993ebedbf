"""`k3sim decode` at the layouts of serving at scale (issue 21 item 8), in-process through the real entry point:
the options map to the StepLayout, the JSON reports tokens/s per GPU and per node and the step split, MTP
works for an MLA-only model, and bad input is one line naming the option, exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

K2 = "models/kimi-k2.yaml"  # MLA-only, DeepSeek-V3 architecture
KL = "models/kimi-linear-48b.yaml"


def decode_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, "decode", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_reports_per_node_throughput_and_the_step_split(capsys):
    d = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "2", "--ep", "8", "--batch", "32",
                    "--context", "4096")
    assert d["tokens_per_s_per_node"] == pytest.approx(8 * d["tokens_per_s_per_gpu"])
    assert d["layout"]["gpus_per_node"] == 8 and d["layout"]["gpus"] == 16
    assert d["batch_per_dp_rank"] == 32
    assert d["compute_s"] > 0 and d["comm_exposed_s"] > 0
    assert d["compute_s"] + d["comm_exposed_s"] == pytest.approx(d["step_s"])
    assert "expert_load_max_over_mean" in d and "comm_hidden_s" in d and d["comm_split_source"]
    assert d["layout"]["ep_kernel"] == "auto" and d["layout"]["tbo"] is False and d["ep_kernel_used"] is None
    assert d["layout"]["dispatch_dtype"] == "fp8"  # auto resolved: the H200 has FP8
    assert d["speculative"] is None


def test_mla_only_model_decodes_with_mtp(capsys):
    base = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "1", "--ep", "8", "--batch", "32",
                       "--context", "4096")
    d = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "1", "--ep", "8", "--batch", "32",
                    "--context", "4096", "--mtp", "1", "--acceptance", "0.85")
    s = d["speculative"]
    assert s["tokens_per_step"] == pytest.approx(1.85) and s["draft_s"] > 0 and s["rollback"] == "kv-truncate"
    assert any(r["component"] == "mtp_drafts" and r["seconds"] == pytest.approx(s["draft_s"]) for r in d["breakdown"])
    # the verify (q = 2) and the draft cost more than a plain step, and the credit is 1.85 tokens per step
    assert d["step_s"] > base["step_s"]
    assert d["tpot_s"] == pytest.approx(d["step_s"] / 1.85)


def test_routing_zipf_is_the_zipf_option(capsys):
    a = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "1", "--ep", "8", "--batch", "8", "--zipf", "1.2")
    b = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "1", "--ep", "8", "--batch", "8",
                    "--routing-zipf", "1.2")
    u = decode_json(capsys, "--model", K2, "--tp", "8", "--pp", "1", "--ep", "8", "--batch", "8")
    assert a["layout"]["routing_zipf"] == b["layout"]["routing_zipf"] == 1.2
    assert a["expected_distinct_experts_per_layer"] == b["expected_distinct_experts_per_layer"]
    assert a["expected_distinct_experts_per_layer"] < u["expected_distinct_experts_per_layer"]


def test_scale_options_reach_the_layout(capsys):
    d = decode_json(capsys, "--model", K2, "--tp", "1", "--pp", "1", "--ep", "32", "--attention-dp", "32",
                    "--batch", "16", "--context", "4096", "--ep-kernel", "low-latency", "--dispatch-dtype", "bf16",
                    "--redundant-experts", "32", "--max-nodes-per-token", "2", "--tbo")
    lay = d["layout"]
    assert (lay["ep_kernel"], lay["dispatch_dtype"], lay["redundant_experts"], lay["max_nodes_per_token"],
            lay["tbo"]) == ("low-latency", "bf16", 32, 2, True)
    assert d["ep_kernel_used"] == "low-latency"
    assert lay["gpus"] == 32 and d["tokens_per_s_per_node"] == pytest.approx(8 * d["tokens_per_s_per_gpu"])
    assert any(r["op"] in ("ep_dispatch", "ep_combine") for r in d["breakdown"])


def test_fp8_dispatch_halves_what_bf16_sends(capsys):
    common = ("--model", K2, "--tp", "1", "--pp", "1", "--ep", "16", "--attention-dp", "16", "--batch", "32",
              "--context", "4096", "--ep-kernel", "normal")
    fp8 = decode_json(capsys, *common, "--dispatch-dtype", "fp8")
    bf16 = decode_json(capsys, *common, "--dispatch-dtype", "bf16")

    def dispatch_bytes(d):
        return sum(r["bytes"] for r in d["breakdown"] if r["op"] == "ep_dispatch")

    # FP8 sends 1 byte per element plus one fp32 scale per 128 channels (4/128): (1 + 1/32) / 2 of BF16
    assert dispatch_bytes(fp8) == pytest.approx(dispatch_bytes(bf16) * (1 + 1 / 32) / 2, rel=0.02)


@pytest.mark.parametrize("argv, needles", [
    (["--model", K2, "--mtp", "1", "--acceptance", "0.8", "--rollback", "replay"], ["--rollback:", "no recurrent layers"]),
    (["--ep-kernel", "normal"], ["--ep-kernel:", "add --attention-dp N"]),
    (["--dispatch-dtype", "fp8"], ["--dispatch-dtype:", "runs none"]),
    (["--tbo"], ["--tbo:", "remove --tbo"]),
    (["--tp", "2", "--attention-dp", "4", "--ep", "8", "--max-nodes-per-token", "2"],
     ["--max-nodes-per-token:", "spans one node"]),
    (["--model", K2, "--tp", "8", "--ep", "1", "--pp", "1", "--redundant-experts", "8"],
     ["--redundant-experts:", "--ep 1"]),
    (["--tp", "2", "--attention-dp", "4", "--ep", "8", "--ep-kernel", "deepep"],
     ["--ep-kernel:", "normal, low-latency, nccl or auto"]),
    (["--tp", "2", "--attention-dp", "4", "--ep", "8", "--dispatch-dtype", "fp4"], ["--dispatch-dtype:", "fp8, bf16"]),
    (["--redundant-experts", "-2"], ["--redundant-experts:", "0 or more"]),
    (["--redundant-experts", "100000"], ["--redundant-experts:", "outside"]),
    (["--max-nodes-per-token", "0"], ["--max-nodes-per-token:", "positive"]),
    (["--routing-zipf", "12"], ["--zipf/--routing-zipf:", "outside [0, 10]"]),
    (["--zipf", "inf"], ["--zipf/--routing-zipf:", "finite"]),
    (["--model", K2, "--tp", "1", "--pp", "1", "--mtp", "64", "--acceptance", "0.5"], ["--mtp:", "[0, 63]"]),
    (["--model", KL, "--tp", "1", "--pp", "1", "--ep", "1", "--mtp", "32", "--acceptance", "0.5"],
     ["--mtp:", "[0, 31]", "KDA decode kernel"]),
    (["--tp", "1", "--pp", "1", "--ep", "2048", "--attention-dp", "2048"], ["--ep:", "896"]),
    (["--attention-dp", "3", "--tp", "8", "--ep", "16"], ["--ep:"]),
])
def test_bad_input_is_one_line_naming_the_option(capsys, argv, needles):
    assert_one_line(*run_main(capsys, "decode", *argv), *needles)


def test_low_latency_tokens_past_the_buffer_name_an_option(capsys):
    from k3sim.comm.ep import LL_MAX_TOKENS_PER_RANK

    line = assert_one_line(*run_main(capsys, "decode", "--model", K2, "--tp", "1", "--pp", "1", "--ep", "16",
                                     "--attention-dp", "16", "--ep-kernel", "low-latency", "--context", "1024",
                                     "--batch", str(4 * LL_MAX_TOKENS_PER_RANK)))
    assert line.startswith(("error: --ep-kernel", "error: --batch")), line


def test_fp8_dispatch_on_a_profile_without_fp8_names_the_option(capsys, tmp_path):
    src = (Path(__file__).resolve().parents[2] / "hardware_profiles/h200.yaml").read_text()
    text = "\n".join(line for line in src.splitlines()
                     if not line.strip().startswith(("fp8:", "calibration_dir:"))).replace("name: h200", "name: nofp8")
    prof = tmp_path / "nofp8.yaml"
    prof.write_text(text + "\n")
    assert_one_line(*run_main(capsys, "decode", "--model", K2, "--hardware", prof, "--tp", "1", "--pp", "1",
                              "--ep", "16", "--attention-dp", "16", "--dispatch-dtype", "fp8", "--context", "1024",
                              "--batch", "16"), "--dispatch-dtype")
