"""Derived profiles (issue 21 item 6, `k3sim.kernels.store.Derivation`): `h100-sxm` and `h800` answer from the
H200's measured rows, compute-bound times kept, memory-bound ones times the HBM bandwidth ratio, a collective's
bandwidth part times the link ratio with its latency kept, latency-bound tiny kernels as measured; every answer
and every derived row says it is derived; the datasheet-only profiles still answer by name; the derivation is
cached under a key that holds the rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import hardware

from k3sim.configs import load_hardware
from k3sim.kernels import store
from k3sim.kernels.ops import OPS
from k3sim.kernels.predict import _hw_key, clear_cache, profile_predictor
from k3sim.kernels.store import derivation, load_store
from k3sim.predict import predict_kernel_time as kt

R = 4.8 / 3.35  # 1.4328: H200 over H100 SXM / H800 HBM bandwidth (the datasheets, hardware_profiles/*.yaml)
H800_LINK = 450 / 200  # H200 over H800 NVLink per direction (900 and 400 GB/s bidirectional)
ROOT = Path(__file__).resolve().parents[2]
FIT = yaml.safe_load((ROOT / "hardware_profiles/measured/h200/fitted.yaml").read_text())


def fresh() -> None:
    """Forget every in-process memo, as a new process would (the disk cache stays)."""
    clear_cache()
    for memo in (store._CACHE, store._DERIVED, store._DERIVATIONS, store._SOURCES):
        memo.clear()


def test_compute_bound_gemm_keeps_its_time():
    # 2 x 4096 x 7168 x 2048 = 1.2026e11 FLOP / 989e12 = 121.6 us; 104.9 MB / 3.35e12 = 31.3 us on the H100:
    # compute-bound on both GPUs, so the H200's measured time stands
    p = dict(M=4096, N=7168, K=2048)
    a = kt("gemm_bf16", p, "h200")
    assert a.source == "measured"
    for name in ("h100-sxm", "h800"):
        b = kt("gemm_bf16", p, name)
        assert b.seconds == a.seconds
        assert b.source == "derived from h200 (compute-bound, kept; x1): measured"


def test_memory_bound_decode_kernel_scales_by_the_hbm_ratio():
    # absorbed MLA decode, B=16, C=131072, H=16: the latent cache 2 x 16 x 131072 x 576 B + q and output
    # 2 x 16 x 16 x 1088 B = 2,416,476,160 B / 4.8e12 = 503.4 us; 2 x 16 x 16 x 131072 x 1088 = 7.30e10 FLOP /
    # 989e12 = 73.8 us: memory-bound
    p = dict(B=16, C=131072, H=16)
    a = kt("mla_decode", p, "h200")
    assert a.source == "measured" and a.seconds < 503.4e-6 / 0.5  # >= half its roofline: the roof sets its time
    for name in ("h100-sxm", "h800"):
        b = kt("mla_decode", p, name)
        assert b.seconds / a.seconds == pytest.approx(R, rel=0.01)
        assert b.source.startswith("derived from h200 (memory-bound; x1.433)")
    # eager: the kernel's increment is added, the host launch time kept
    ae, be = kt("mla_decode", p, "h200", convention="eager"), kt("mla_decode", p, "h100-sxm", convention="eager")
    assert be.seconds - ae.seconds == pytest.approx(kt("mla_decode", p, "h100-sxm").seconds - a.seconds, rel=1e-9)
    assert ae.seconds > a.seconds


def test_latency_bound_tiny_kernel_stays_as_measured():
    # rmsnorm of one 7168-wide token: 2 x (2 x 7168 + 7168) = 43,008 B / 4.8e12 = 9 ns against ~6 us measured
    p = dict(T=1, D=7168)
    a, b = kt("rmsnorm", p, "h200"), kt("rmsnorm", p, "h100-sxm")
    assert a.source == "measured" and a.seconds > 100 * 9e-9
    assert b.seconds / a.seconds == pytest.approx(1.0, abs=0.01)
    assert "latency share kept" in b.source


def test_near_the_ridge_takes_the_max_of_both_scaled_parts():
    d = derivation(load_hardware("h100-sxm"))
    p = dict(M=768, N=768, K=768)
    # t_c = 2 x 768^3 = 905,969,664 FLOP / 989e12 = 916.05 ns; t_m = 6 x 768^2 = 3,538,944 B / 4.8e12 = 737.28 ns,
    # on the H100 / 3.35e12 = 1056.40 ns > t_c: compute-bound on the H200, memory-bound on the H100
    tc, tm = (float(x[0]) for x in d.roofs(OPS["gemm_bf16"], [p]))
    assert (tc, tm) == (pytest.approx(916.046e-9, rel=1e-5), pytest.approx(737.28e-9, rel=1e-5))
    f, s, w = (float(x[0]) for x in d.kernel_factors(OPS["gemm_bf16"], [p], [1.5e-6]))
    assert s == pytest.approx(1056.401 / 916.046, rel=1e-5) and w == 1.0 and f == s  # 61 % of its roofline
    f, s, w = (float(x[0]) for x in d.kernel_factors(OPS["gemm_bf16"], [p], [4 * 916.046e-9]))
    assert w == pytest.approx(0.5) and f == pytest.approx(1 + 0.5 * (1.153219 - 1), rel=1e-5)  # 25 %: half scaled


def test_collective_bandwidth_part_scales_latency_kept():
    alpha = FIT["ops"]["all_reduce"]["by_gpus"][8]["alpha_s"]  # the committed H200 fit, 8 GPUs
    p = dict(bytes=2 ** 26, gpus=8)
    a = kt("all_reduce", p, "h200")
    assert a.source == "measured" and a.seconds > 10 * alpha
    b = kt("all_reduce", p, "h800")
    assert b.seconds == pytest.approx(alpha + (a.seconds - alpha) * H800_LINK, rel=1e-9)
    assert b.source == "derived from h200 (collective: bandwidth part x2.25, latency kept): measured"
    assert kt("all_reduce", p, "h100-sxm").seconds == a.seconds  # the same NVLink 4
    tiny = dict(bytes=4096, gpus=8)  # under the latency: kept
    assert kt("all_reduce", tiny, "h800").seconds == kt("all_reduce", tiny, "h200").seconds


def test_collective_model_keeps_the_sources_achieved_link_fraction():
    """An all-gather on 6 GPUs (not measured) comes from the collective model: 5 ring steps of the 2-GPU fit's
    latency plus wire bytes over the achieved fraction of the link. On the derived H800 the fraction is the H200's
    (the rescaled fit's bus bandwidth over the H800's link), so the bandwidth part is x2.25 and the latency kept."""
    alpha = FIT["ops"]["all_gather"]["by_gpus"][2]["alpha_s"]  # one ring step (2 GPUs: n - 1 = 1)
    p = dict(bytes=2 ** 22, gpus=6)
    a, b = kt("all_gather", p, "h200"), kt("all_gather", p, "h800")
    assert a.source == "model"
    assert b.seconds == pytest.approx(5 * alpha + (a.seconds - 5 * alpha) * H800_LINK, rel=1e-6)
    assert "achieved fraction 0.595" in a.detail and "achieved fraction 0.595" in b.detail  # 267.9 / 450 GB/s


@pytest.mark.parametrize("op, p", [
    ("gemm_fp8", dict(M=37, N=5000, K=3000)),                  # interpolated
    ("hbm_copy", dict(bytes=2 ** 36)),                          # beyond the range
    ("chunk_kda_fwd", dict(T=8192, H=32, K=64, V=64)),          # extrapolated head dims
    ("moe_mxfp4_decode", dict(B=64, E=48, K=3584, N=2048, topk=8)),
    ("send_recv", dict(bytes=2 ** 20, gpus=2)),
    ("all_to_all", dict(bytes=2 ** 24, gpus=16)),               # across nodes: the model
])
@pytest.mark.parametrize("name", ["h100-sxm", "h800"])
def test_every_answer_says_it_is_derived(op, p, name):
    b = kt(op, p, name)
    assert b.source.startswith("derived from h200 (")
    assert "derived_from.ignores of profile " + name in b.detail
    assert b.seconds >= kt(op, p, "h200").seconds * (1 - 1e-12)  # neither target is faster than the H200


@pytest.mark.parametrize("name, link", [("h100-sxm", 1.0), ("h800", H800_LINK)])
def test_every_derived_row_says_derived_and_stays_within_the_rule(name, link):
    hw = load_hardware(name)
    d = derivation(hw)
    derived, source = load_store(d.source_dir, hw), load_store(d.source_dir, load_hardware("h200"))
    assert set(derived.rows) == set(source.rows) and derived.fingerprint != source.fingerprint
    for op, df in derived.rows.items():
        ok = (df["status"] == "ok").to_numpy()
        f = df["derived_factor"].to_numpy()
        assert df["source"][ok].str.startswith("derived from h200 (").all(), op
        top = link if OPS[op].kind == "collective" else R
        assert (f[ok] >= 1 - 1e-12).all() and (f[ok] <= top * (1 + 1e-12)).all(), op
        assert (f[~ok] == 1).all()
        t0 = source.rows[op]["seconds"].to_numpy()[ok]
        assert df["seconds"].to_numpy()[ok] == pytest.approx(t0 * f[ok], rel=1e-12), op


def test_answer_at_a_graph_timed_shape_is_its_derived_row():
    hw = load_hardware("h100-sxm")
    pts = load_store(derivation(hw).source_dir, hw).points("mla_decode", "graph")
    graph = pts[pts["timer"] == "graph"]
    assert len(graph) >= 50
    for _, row in graph.iloc[::10].iterrows():
        p = {k: int(row[k]) for k in ("B", "C", "H")}
        assert kt("mla_decode", p, hw).seconds == pytest.approx(float(row["seconds"]), rel=1e-12), p


def test_datasheet_profiles_still_answer_the_datasheet_roofline():
    # 120,259,084,288 FLOP / 989e12 = 121.6 us (compute-bound); the same figures as the derived profile's
    for name in ("h100-sxm-datasheet", "h800-datasheet"):
        a = kt("gemm_bf16", dict(M=4096, N=7168, K=2048), name)
        assert a.source == "datasheet-roofline" and a.seconds == pytest.approx(120_259_084_288 / 989e12, rel=1e-12)
    assert kt("all_reduce", dict(bytes=2 ** 26, gpus=8), "h800-datasheet").source == "datasheet-roofline"


def test_warm_derived_profile_answers_from_the_cache_without_parsing():
    queries = [("mla_decode", dict(B=16, C=131072, H=16)), ("all_reduce", dict(bytes=2 ** 26, gpus=8))]
    first = [kt(op, p, "h800") for op, p in queries]
    fresh()
    again = [kt(op, p, "h800") for op, p in queries]
    assert [(x.seconds.hex(), x.source, x.detail) for x in first] == [(x.seconds.hex(), x.source, x.detail)
                                                                     for x in again]
    for name in ("h800", "h200"):  # neither the derived predictor nor its source's parsed the measured CSVs
        assert profile_predictor(name)._store is None


def test_derived_store_is_cached_on_disk(monkeypatch):
    """Built (and saved) here, then loaded from disk. The in-process memo is emptied first: an earlier test may have
    derived the store while another cache directory was set (a hit in the memo saves nothing here)."""
    hw = load_hardware("h800")
    d = derivation(hw)
    src = load_store(d.source_dir, load_hardware("h200"))
    store._DERIVED.clear()
    built = d.store(src)
    store._DERIVED.clear()
    monkeypatch.setattr(store.Derivation, "_derive", lambda *a: pytest.fail("derived again: not cached"))
    again = d.store(src)
    assert again is not built and again.op_fingerprints == built.op_fingerprints
    assert (again.rows["gemm_bf16"]["seconds"] == built.rows["gemm_bf16"]["seconds"]).all()


def test_rule_version_and_source_figures_are_in_the_key(monkeypatch):
    h800, h200 = load_hardware("h800"), load_hardware("h200")
    k, k200 = _hw_key(h800), _hw_key(h200)
    assert k[-1][0] == store.DERIVATION_RULE and k[-1][2] == k200 and k200[-1] == ()
    monkeypatch.setattr(store, "DERIVATION_RULE", "derived-test")
    store._SOURCES.clear()
    assert _hw_key(h800) != k and _hw_key(h200) == k200
    store._SOURCES.clear()


@pytest.fixture
def synth_derived(synth):
    """A synthetic target derived from the synthetic calibrated profile (tests/kernels/conftest.py): half the HBM
    bandwidth (ratio 2), a third of the NVLink (ratio 3)."""
    target = hardware(None, name="testgpu-slow")
    target.hbm_bandwidth_bytes_per_s = synth.hw.hbm_bandwidth_bytes_per_s / 2
    target.scaleup_bandwidth_bytes_per_s = synth.hw.scaleup_bandwidth_bytes_per_s / 3
    target.derived_from = SimpleNamespace(profile=synth.hw, ignores=("everything",))
    yield SimpleNamespace(source=synth.hw, target=target)
    fresh()


def test_synthetic_derivation_scales_by_its_own_ratios(synth_derived):
    src, tgt = synth_derived.source, synth_derived.target
    big = dict(bytes=2 ** 32)  # the synthetic copy runs at 0.9 of its roofline: memory-bound, ratio 2
    assert kt("hbm_copy", big, tgt).seconds / kt("hbm_copy", big, src).seconds == pytest.approx(2.0, rel=1e-9)
    ab = dict(bytes=2 ** 30, gpus=2)  # synthetic truth: alpha 15 us, the rest x3
    a, b = kt("all_gather", ab, src).seconds, kt("all_gather", ab, tgt).seconds
    assert b == pytest.approx(a + (a - 15e-6) * 2, rel=0.01)


def test_an_op_the_source_never_measured_is_the_targets_datasheet_roofline(synth_derived):
    p = dict(T=4096, H=32, D=128)  # sdpa: no synthetic rows
    b = kt("sdpa_causal_fwd", p, synth_derived.target)
    assert b.source == "datasheet-roofline" and "derived from" in b.detail
    assert b.seconds == pytest.approx(4 * 4096 ** 2 * 32 * 128 / 2 / 1e15, rel=1e-12)  # causal FLOP / bf16 peak
