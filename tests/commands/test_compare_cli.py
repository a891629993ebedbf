"""`k3sim compare`: one question on several profiles on one footing, the footing said, hand-worked ratios, the
derived rule against the derived profiles' own answers, and bad input in one line naming the option."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

LLAMA = "models/llama-3.3-70b.yaml"
# Datasheet HBM bandwidths (hardware_profiles/h200.yaml, b200.yaml), bytes/s
H200_HBM, B200_HBM = 4.8e12, 8.0e12


def compare_json(capsys, *argv) -> dict:
    code, out, err = run_main(capsys, "compare", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_default_footing_is_derived_and_said(capsys):
    """H200 has its own rows, B200 none: the most measured footing both have is derived (from H200's rows)."""
    d = compare_json(capsys, "--hardware", "h200,b200")
    f = d["footing"]
    assert (f["name"], f["chosen"], f["source_profile"]) == ("derived", "default", "h200")
    assert f["native"] == {"h200": "measured", "b200": "datasheet"}
    assert f["line"].startswith("footing derived: h200's measured kernels rescaled") and "(default)" in f["line"]
    assert "profiles' own: h200 measured, b200 datasheet" in f["line"] and f["ignores"]
    code, out, err = run_main(capsys, "compare", "--hardware", "h200,b200", "--footing", "datasheet")
    assert code == 0, err
    flat = " ".join(out.split())  # the table wraps the line
    assert "footing datasheet: every profile's datasheet roofline" in flat and "given (--footing)" in flat


def test_datasheet_footing_of_a_bandwidth_bound_decode_is_the_hbm_ratio_by_hand(capsys):
    """Llama-3.3-70B decode of one sequence on one GPU (no collective): every call streams its bytes far below the
    ridge (~1 FLOP/B against 206 on the H200, 281 on the B200), so on the datasheet footing each profile's TPOT is
    bytes / HBM bandwidth and the ratio is 8.0 / 4.8 = 5/3, the H200 measured rows notwithstanding."""
    d = compare_json(capsys, "--hardware", "h200,b200", "--footing", "datasheet", "--model", LLAMA, "--tp", "1",
                     "--pp", "1", "--batch", "1", "--context", "4096")
    h200, b200 = d["profiles"]
    assert b200["speedup_vs_first"] == pytest.approx(5 / 3, rel=1e-9)
    assert b200["ratio_to_first"]["tokens_per_s_per_gpu"] == pytest.approx(5 / 3, rel=1e-9)
    assert b200["ratio_to_first"]["tpot_s"] == pytest.approx(3 / 5, rel=1e-9)
    assert h200["datasheet_share_of_seconds"] == b200["datasheet_share_of_seconds"] == 1.0
    # by hand: per layer q, o 8192^2 + k, v 8192 x 1024 + SwiGLU 3 x 8192 x 28672; 80 layers; the LM head
    # 128256 x 8192 (the input embedding reads one row); bf16. KV of 4096 tokens: 80 layers x K, V x 8 x 128 x 2 B.
    weights = (80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 128256 * 8192) * 2
    kv = 4096 * 80 * 2 * 8 * 128 * 2
    # norms, rope and residual adds are the rest (< 0.1 %)
    assert h200["figures"]["tpot_s"] == pytest.approx((weights + kv) / H200_HBM, rel=1e-3)
    assert b200["figures"]["tpot_s"] == pytest.approx((weights + kv) / B200_HBM, rel=1e-3)


def test_each_footing_against_the_profiles_own_answers(capsys):
    """measured = the profile's own (H200); datasheet = a datasheet-only profile's own (B200 has no rows: today's
    answer unchanged; H100 SXM on it = the h100-sxm-datasheet profile); derived of a derived profile (H100 SXM, same
    compute as the H200: r_c = 1) = that profile's own answers, the Derivation rule it generalises."""
    own = {hw: compare_json(capsys, "--hardware", f"{hw},{other}", "--footing", footing)["profiles"][0]
           for hw, other, footing in [("h200", "h100-sxm", "derived"), ("b200", "h200", "datasheet"),
                                      ("h100-sxm-datasheet", "h200", "datasheet")]}
    derived = compare_json(capsys, "--hardware", "h200,h100-sxm,b200")
    datasheet = compare_json(capsys, "--hardware", "h100-sxm,b200", "--footing", "datasheet")
    code, out, err = run_main(capsys, "decode", "--hardware", "h100-sxm", "--json")
    assert code == 0, err
    h100_own = json.loads(out)["tpot_s"]
    assert derived["footing"]["name"] == "derived"
    h200, h100, b200 = (p["figures"]["tpot_s"] for p in derived["profiles"])
    assert h200 == pytest.approx(own["h200"]["figures"]["tpot_s"], rel=1e-12)
    assert h100 == pytest.approx(h100_own, rel=1e-9)
    assert datasheet["profiles"][1]["figures"]["tpot_s"] == pytest.approx(own["b200"]["figures"]["tpot_s"], rel=1e-12)
    assert datasheet["profiles"][0]["figures"]["tpot_s"] == pytest.approx(
        own["h100-sxm-datasheet"]["figures"]["tpot_s"], rel=1e-12)
    # the B200's derived step is slower than its datasheet bound and faster than the H200's measured one
    assert h200 > b200 > own["b200"]["figures"]["tpot_s"]


def test_derived_factor_by_hand():
    """The rule per regime on the H200 -> B200 datasheet figures (BF16 989 / 2250 TFLOP/s, HBM 4.8 / 8.0 TB/s)."""
    from k3sim.configs import load_hardware
    from k3sim.kernels.footing import derived_factor

    h200, b200 = load_hardware("h200"), load_hardware("b200")

    def spec(flop: float, nbytes: float):
        return SimpleNamespace(flop=lambda p: flop, bytes=lambda p: nbytes, dtype="bf16")

    # memory-bound stream: t_m = 1 ms at 0.8 of it (w = 1): x 4.8 / 8
    r = derived_factor(spec(0.0, 4.8e9), {}, 1.25e-3, h200, b200)
    assert (r.s, r.w) == (pytest.approx(0.6), 1.0) and r.regime.startswith("memory-bound")
    # compute-bound GEMM: t_c = 1 ms, t_m = 1 us, at 1/1.2 of its roof: x 989 / 2250
    r = derived_factor(spec(989e9, 4.8e6), {}, 1.2e-3, h200, b200)
    assert (r.s, r.w) == (pytest.approx(989 / 2250), 1.0) and r.regime.startswith("compute-bound")
    # latency-bound: 1 us of bytes in 10 us (u = 0.1, w = 0.2): t' = t (1 + (0.6 - 1) 0.2) = 0.92 t
    r = derived_factor(spec(0.0, 4.8e6), {}, 10e-6, h200, b200)
    assert r.w == pytest.approx(0.2) and 1 + (r.s - 1) * r.w == pytest.approx(0.92)
    # compute-bound on the H200 (t_c 1 ms > t_m 0.9 ms), memory-bound on the B200 (0.44 ms < 0.54 ms): x 0.54
    r = derived_factor(spec(989e9, 0.9e-3 * 4.8e12), {}, 1.5e-3, h200, b200)
    assert r.s == pytest.approx(0.54) and r.regime.startswith("near the ridge, HBM")


def test_ratios_are_to_the_first_profile(capsys):
    d = compare_json(capsys, "--hardware", "b200,h200", "--what", "prefill", "--prompt", "8192")
    b200, h200 = d["profiles"]
    assert d["first"] == "b200" and b200["speedup_vs_first"] == 1.0
    assert h200["ratio_to_first"]["ttft_s"] == pytest.approx(h200["figures"]["ttft_s"] / b200["figures"]["ttft_s"])
    assert h200["speedup_vs_first"] == pytest.approx(1 / h200["ratio_to_first"]["ttft_s"])
    assert d["question"]["chunk_tokens"] == 8192 and d["units"]["ttft_s"] == "s"


def test_measured_footing_with_a_datasheet_only_profile_is_refused(capsys):
    line = assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200,h100-sxm", "--footing", "measured"),
                           "--footing", "b200 (datasheet)", "h100-sxm (derived)")
    assert "--footing derived" in line


def test_unknown_and_malformed_hardware_lists_are_refused_naming_hardware(capsys):
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b300"), "--hardware", "b300",
                    "unknown hardware profile")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200"), "--hardware", "two or more")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,,b200"), "--hardware", "empty")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200,h200"), "--hardware", "h200 given twice")


def test_options_of_another_question_and_other_bad_values_are_refused(capsys):
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--what", "train", "--batch", "8"),
                    "--batch", "--what decode")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--prompt", "4096"),
                    "--prompt", "--what prefill")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--footing", "datasheet",
                              "--derived-from", "h200"), "--derived-from", "datasheet footing")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--derived-from", "b200"),
                    "--derived-from", "no measured rows")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--what", "serve"), "--what")
    assert_one_line(*run_main(capsys, "compare", "--hardware", "h200,b200", "--footing", "roofline"), "--footing")


def test_derived_collectives_scale_their_bandwidth_part_by_the_link_ratio():
    """An all_reduce of 1 GiB is bandwidth-bound: on the derived footing the B200 takes 450 / 900 of the H200's
    (NVLink 4 against 5, latency kept); over 16 GPUs the H200 leaves its 8-GPU node (50 GB/s NIC) where a
    GB200 NVL72 stays in its 72-GPU NVLink domain (900 GB/s): 50 / 900 of the time, plus the latency kept."""
    from k3sim.configs import load_hardware
    from k3sim.kernels.footing import Footing
    from k3sim.predict import predict_kernel_time

    ft = Footing("derived", predict_kernel_time)
    h200, b200, gb200 = (load_hardware(n) for n in ("h200", "b200", "gb200-nvl72"))
    p8, p16 = {"bytes": 2 ** 30, "gpus": 8}, {"bytes": 2 ** 30, "gpus": 16}
    assert ft("all_reduce", p8, h200).seconds == predict_kernel_time("all_reduce", p8, h200).seconds
    assert ft("all_reduce", p8, b200).seconds / ft("all_reduce", p8, h200).seconds == pytest.approx(0.5, rel=0.01)
    assert ft("all_reduce", p16, gb200).seconds / ft("all_reduce", p16, h200).seconds == pytest.approx(
        50 / 900, rel=0.05)
    assert ft("all_reduce", p8, b200).source.startswith("derived from h200 (collective: bandwidth part x0.5")


def test_derived_published_kernel_is_the_min_of_the_derived_base_and_its_published_roofline():
    """FlashMLA on the derived footing: min(the derived mla_decode, FlashMLA's published fractions of the B200's
    own peaks), as the facade prices it over the measured kernel on a profile's own footing."""
    from k3sim.configs import load_hardware
    from k3sim.kernels.footing import Footing
    from k3sim.kernels.ops import get_op
    from k3sim.kernels.published import PUBLISHED, published_seconds
    from k3sim.predict import predict_kernel_time

    ft, b200, spec = Footing("derived", predict_kernel_time), load_hardware("b200"), get_op("mla_decode_flashmla")
    for p in ({"B": 64, "C": 32768, "H": 16}, {"B": 64, "C": 4096, "H": 128}):
        roof = published_seconds(PUBLISHED["mla_decode_flashmla"], spec.flop(p), spec.bytes(p), b200)
        want = min(ft("mla_decode", p, b200).seconds, roof)
        assert ft("mla_decode_flashmla", p, b200).seconds == pytest.approx(want, rel=1e-12)
