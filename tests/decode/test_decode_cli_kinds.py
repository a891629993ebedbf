"""`k3sim decode` for every shipped model (issue 23 item 5), in-process through the real entry point: the
defaults work for every model (a default context over the model's maximum is capped with a note, an explicit
one refused), the rollback per kind reaches the JSON, `--sweep-batch` runs a hybrid model, and bad input is one
line naming the option and the kind."""

from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

QWEN = "models/qwen3-next-80b-a3b.yaml"
NEMO = "models/nemotron-h-56b.yaml"
LLAMA = "models/llama-3.3-70b.yaml"


def decode_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, "decode", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("path", sorted(glob.glob("models/*.yaml")))
def test_defaults_decode_every_shipped_model(capsys, path):
    d = decode_json(capsys, "--model", path)
    assert math.isfinite(d["tpot_s"]) and d["tpot_s"] > 0 and d["tokens_per_s_per_gpu"] > 0
    assert d["layout"]["tp"] == 8 and d["layout"]["pp"] == 2
    # --ep defaults to tp x attention-dp for an MoE model (8 here, the earlier default), 1 without MoE
    from k3sim.configs import load_model

    assert d["layout"]["ep"] == (8 if load_model(path).moe is not None else 1)


def test_a_default_context_over_the_models_maximum_is_capped_with_a_note(capsys):
    d = decode_json(capsys, "--model", NEMO)
    assert d["context_tokens"] == 8192
    assert "32,768" in d["context_note"] and "8,192" in d["context_note"]
    assert decode_json(capsys, "--model", QWEN, "--tp", "2")["context_note"] is None  # 262,144 allowed
    code, out, err = run_main(capsys, "decode", "--model", NEMO)
    assert code == 0 and "context note" in out


def test_an_explicit_context_over_the_models_maximum_stays_an_error(capsys):
    assert_one_line(*run_main(capsys, "decode", "--model", NEMO, "--context", "32768"),
                    "--context:", "32,768 tokens exceeds the 8,192")


def test_qwen3_next_mtp_reports_its_gdn_rollback(capsys):
    common = ("--model", QWEN, "--tp", "2", "--pp", "1", "--batch", "64", "--context", "32768")
    base = decode_json(capsys, *common)
    d = decode_json(capsys, *common, "--mtp", "1", "--acceptance", "0.8")
    s = d["speculative"]
    assert s["rollback"] == "replay" and s["tokens_per_step"] == pytest.approx(1.8)
    kinds = {k["kind"]: k for k in s["rollback_by_kind"]}
    assert set(kinds) == {"gdn", "gqa"} and kinds["gqa"]["scheme"] == "kv-truncate"
    assert kinds["gdn"]["projection_cache_bytes_per_token"] == 8_256  # tp 2 (test_decode_rollback.py)
    assert any(r["component"] == "gdn_projection_cache" for r in d["breakdown"])
    assert s["rollback_s"] == pytest.approx(kinds["gdn"]["seconds_per_step"]) and s["rollback_s"] > 0
    assert d["tpot_s"] < base["tpot_s"]  # 1.8 tokens per step outweigh the verify, drafts and rollback
    snap = decode_json(capsys, *common, "--mtp", "1", "--acceptance", "0.8", "--rollback", "snapshot")
    assert snap["speculative"]["rollback"] == "snapshot"
    assert any(r["component"] == "gdn_conv_state_snapshots" for r in snap["breakdown"])


def test_sweep_batch_runs_a_hybrid_model(capsys, tmp_path):
    out = tmp_path / "sweep"
    code, text, err = run_main(capsys, "decode", "--model", QWEN, "--tp", "2", "--pp", "1", "--context", "8192",
                               "--sweep-batch", "--out", str(out), "--json")
    assert code == 0, err
    d = json.loads(text)
    assert Path(d["csv"]).exists() and Path(d["plot"]).exists()
    assert len(d["rows"]) == 11 and all(r["tpot_s"] > 0 for r in d["rows"])


@pytest.mark.parametrize("argv, needles", [
    (["--model", QWEN, "--tp", "3"], ["--tp:", "tp=3 does not divide the 16 GDN key heads"]),
    (["--model", NEMO, "--tp", "3", "--context", "4096"], ["--tp:", "256 Mamba2 heads"]),
    (["--model", NEMO, "--tp", "16", "--context", "4096"], ["--tp:", "8 Mamba2 groups"]),
    (["--model", "models/granite-4.0-h-small.yaml", "--tp", "3"], ["--tp:", "128 Mamba2 heads"]),
    (["--model", "models/jamba-1.5-mini.yaml", "--tp", "3"], ["--tp:", "Mamba inner channels"]),
    (["--model", "models/minimax-m1.yaml", "--tp", "3"], ["--tp:", "64 lightning heads"]),
    (["--model", LLAMA, "--tp", "3"], ["--tp:", "64 GQA query heads"]),
    (["--model", LLAMA, "--ep", "8"], ["--ep:", "no MoE layers"]),
    (["--model", LLAMA, "--mtp", "1", "--acceptance", "0.8", "--rollback", "snapshot"],
     ["--rollback:", "no recurrent layers", "remove --rollback"]),
    (["--model", QWEN, "--tp", "1", "--pp", "1", "--mtp", "64", "--acceptance", "0.5"], ["--mtp:", "[0, 63]"]),
    (["--model", QWEN, "--mtp", "-1"], ["--mtp:", "0 or more"]),
])
def test_bad_input_is_one_line_naming_the_option_and_the_kind(capsys, argv, needles):
    assert_one_line(*run_main(capsys, "decode", *argv), *needles)
