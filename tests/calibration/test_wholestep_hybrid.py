"""The Qwen3-Next whole-step configuration (issue 23 item 7) without torch or a GPU: the per-rank shapes the builder
reads from specs.json, the layer count that fits one H200, the kernel list of its steps, and the predictions file the
check is registered with (k3sim/validation/decode_step_hybrid.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from k3sim.calibration.wholestep import run as R
from k3sim.calibration.wholestep import spec as S
from k3sim.configs import load_hardware, load_model
from k3sim.errors import InputError
from k3sim.validation import decode_step as DS
from k3sim.validation import decode_step_hybrid as V

QWEN = "models/qwen3-next-80b-a3b.yaml"


@pytest.fixture(scope="module")
def spec():
    return S.load_specs()[R.QWEN]


def test_qwen_slice_keeps_the_3_to_1_pattern_with_head(spec):
    assert [r["index"] for r in spec.layers if r["attn"] == "gqa"] == [4, 8, 12, 16]
    assert (spec.num_gdn, spec.num_gqa, len(spec.layers)) == (12, 4, 16)
    assert all(r["ffn"] == "moe" for r in spec.layers)
    assert spec.embed_head and spec.vocab_local == 151936 and (spec.tp, spec.ep) == (1, 1)


def test_qwen_per_rank_shapes_by_hand(spec):
    g, a, e = spec.gdn, spec.gqa, spec.moe
    assert (g.key_heads, g.value_heads, g.head_k, g.head_v, g.conv) == (16, 32, 128, 128, 4)
    assert g.conv_channels == 2 * 16 * 128 + 32 * 128 == 8192            # q, k, v
    assert g.in_proj == 8192 + 32 * 128 + 2 * 32 == 12352                # + z, b, a
    assert (a.q_heads, a.kv_heads, a.head_dim, a.out_gate, a.qk_norm) == (16, 2, 256, True, True)
    assert a.rope_dim == 64                                              # 0.25 x 256 (partial_rotary_factor)
    assert a.qkv == 16 * 256 * 2 + 2 * 2 * 256 == 9216                   # q and its gate, k, v
    assert (e.experts, e.experts_local, e.topk, e.width, e.shared_width) == (512, 512, 10, 512, 512)
    assert (e.router, e.shared_gate, e.latent) == ("softmax", True, None)


def test_tp_splits_heads_and_replicates_kv_heads(root):
    m = load_model(root / QWEN)
    s = S.spec_from_config(m, tp=4, ep=4, layers=(1, 4))
    # 16 / 32 GDN heads over 4 ranks; 16 query heads split, 2 KV heads replicated (one per rank)
    assert (s.gdn.key_heads, s.gdn.value_heads, s.gqa.q_heads, s.gqa.kv_heads) == (4, 8, 4, 1)
    assert (s.moe.experts_local, s.moe.shared_width) == (128, 128)
    with pytest.raises(InputError, match="not divisible by 3"):
        S.spec_from_config(m, tp=3, layers=(1, 4))
    with pytest.raises(InputError, match="mamba2"):     # a kind the builder has no layer for
        S.spec_from_config(load_model(root / "models/nemotron-h-56b.yaml"), layers=(1, 4))


def test_weight_bytes_agree_with_the_parameter_count(spec, root):
    from k3sim.memory.params import layer_params

    m = load_model(root / QWEN)
    n = sum(sum(layer_params(m, i).values()) for i in range(16)) + 2 * m.vocab_size * m.hidden_size
    assert S.weight_bytes(spec) == pytest.approx(2 * n, rel=1e-6)
    # per layer: 512 experts x 3 x 2048 x 512 bf16 = 3.22 GB of the 3.29 GB; 53.9 GB for the slice
    assert 53.9e9 < S.weight_bytes(spec) < 54.0e9


def test_cache_and_state_bytes_by_hand(spec):
    # 4 GQA layers x B 256 x C 32768 x (k + v: 2 x 2 KV heads x 256) x 2 B
    assert S.cache_bytes(spec, 256, 32768) == 4 * 256 * 32768 * 2 * 2 * 256 * 2 == 68_719_476_736
    # 12 GDN layers x 256 x (32 x 128 x 128 fp32 state + 8192 channels x 4 taps bf16 conv state)
    assert S.state_bytes(spec, 256) == 12 * 256 * (32 * 128 * 128 * 4 + 8192 * 4 * 2) == 6_643_777_536


def test_sixteen_layers_are_the_most_that_fit_one_h200(root):
    m = load_model(root / QWEN)
    hbm = load_hardware("h200").hbm_bytes
    assert S.fit_layers(m, period=4, batch=256, context=32768, hbm_bytes=hbm) == 16
    s20 = S.spec_from_config(m, layers=(1, 20), head=True)  # 67.1 GB weights + 85.9 GB KV: over 150.1 GB alone
    assert S.weight_bytes(s20) + S.cache_bytes(s20, 256, 32768) > hbm
    # the whole decode grid fits one pool beside the 16 layers (no point is skipped on the device)
    sp = S.spec_from_config(m, layers=(1, 16), head=True)
    free = hbm - S.weight_bytes(sp) - S.CONTEXT_BYTES - 6 * 2 ** 30
    pools = S.plan_pools(sp, R.DECODE_B, R.DECODE_C[R.QWEN], free)
    assert len(pools) == 1 and len(pools[0][0]) == 27


def test_manifest_of_a_qwen_decode_step(spec):
    man = S.manifest(spec, S.StepShape(decodes=64, context=32768))
    assert man["layer_counts"] == {"gdn": 12, "gqa": 4, "moe": 16, "embedding": 1, "lm_head": 1}
    gdn = [(o["op"], o["params"]) for o in man["layers"]["gdn"]]
    assert gdn[1] == ("gemm_bf16", {"M": 64, "N": 12352, "K": 2048})
    assert ("conv1d_update", {"B": 64, "D": 8192, "W": 4}) in gdn
    assert ("recurrent_gdn_decode", {"B": 64, "H": 32, "Hk": 16}) in gdn
    assert ("gated_rmsnorm", {"T": 64 * 32, "D": 128}) in gdn and gdn[-2] == ("gemm_bf16", {"M": 64, "N": 2048, "K": 4096})
    gqa = [(o["op"], o["params"]) for o in man["layers"]["gqa"]]
    assert gqa[1] == ("gemm_bf16", {"M": 64, "N": 9216, "K": 2048})
    assert ("rmsnorm", {"T": 64 * 16, "D": 256}) in gqa and ("rope", {"T": 64, "H": 2, "D": 64}) in gqa
    assert ("gqa_decode", {"B": 64, "C": 32768, "Hq": 16, "Hkv": 2, "D": 256}) in gqa
    assert ("sigmoid_mul", {"T": 64, "D": 4096}) in gqa
    moe = [(o["op"], o["params"]) for o in man["layers"]["moe"]]
    assert ("router_softmax_topk", {"T": 64, "E": 512, "topk": 10}) in moe and "router_topk" not in [o for o, _ in moe]
    assert ("moe_grouped_bf16", {"B": 64, "E": 512, "K": 2048, "N": 1024, "topk": 10}) in moe
    assert ("shared_expert_gate", {"T": 64, "D": 2048}) in moe


def test_manifest_of_a_qwen_prefill_after_a_prefix(spec):
    st = S.StepShape(decodes=32, context=4096, chunk=8192, prefix=8192)
    man = S.manifest(spec, st)
    gdn = [(o["op"], o["params"]) for o in man["layers"]["gdn"]]
    assert ("causal_conv1d_fwd", {"B": 1, "T": 8192, "D": 8192, "W": 4}) in gdn
    assert ("chunk_gdn_fwd", {"T": 8192, "H": 32, "Hk": 16}) in gdn and ("recurrent_gdn_decode", {"B": 32, "H": 32, "Hk": 16}) in gdn
    gqa = [(o["op"], o["params"]) for o in man["layers"]["gqa"]]
    assert ("gqa_prefix_causal_fwd", {"Tq": 8192, "Tkv": 16384, "Hq": 16, "Hkv": 2, "D": 256}) in gqa
    assert ("kv_cache_write", {"T": 8192 + 32, "D": 2 * 2 * 256}) in gqa
    no_prefix = [o["op"] for o in S.manifest(spec, S.StepShape(chunk=2048))["layers"]["gqa"]]
    assert "gqa_prefill_fwd" in no_prefix and "gqa_prefix_causal_fwd" not in no_prefix
    seq = S.sequence(spec, st)
    assert sum(o["op"] == "chunk_gdn_fwd" for o in seq) == 12 and sum(o["op"] == "gqa_decode" for o in seq) == 4
    assert man["layers"]["lm_head"][1]["params"] == {"M": 33, "N": 151936, "K": 2048}


def test_prefix_attention_is_priced_at_its_flop():
    # no prefix: the chunk itself; 1 query over 8 keys sees 8 pairs: T (T + 1) / 2 >= 8 at T = 4
    assert DS.prefix_equivalent_tokens(2048, 2048) == 2048
    assert DS.prefix_equivalent_tokens(1, 8) == 4
    c = DS.manifest_call("gqa_prefix_causal_fwd", {"Tq": 8192, "Tkv": 16384, "Hq": 16, "Hkv": 2, "D": 256})
    t = c.params["T"]
    assert c.op == "gqa_prefill_fwd" and c.params["window"] == t
    pairs = 8192 * 8192 + 8192 * 8193 // 2
    assert t * (t + 1) // 2 >= pairs > (t - 1) * t // 2
    g = DS.manifest_call("gdn_gating", {"T": 64, "H": 32})
    assert g.proxy_bytes == 64 * 32 * (2 + 2 + 2 + 4)   # b, a read (bf16); beta (bf16) and g (fp32) written


def test_predictions_cover_every_point_in_kimi_linear_s_format(root):
    rows = V.prediction_rows()
    with open(root / "reports/decode/wholestep_predictions.csv", newline="") as fh:
        assert V.COLUMNS == next(csv.reader(fh))
    a = R.parse_args(["--out", "/tmp/never", "--plan", "qwen"])
    want = {("decode", st.decodes, st.context) for st in R.item_points(a, R.QWEN, "decode")}
    want |= {("prefill", st.chunk, st.prefix, st.decodes) for st in R.item_points(a, R.QWEN, "prefill")}
    got = {("decode", r["B"], r["C"]) if r["part"] == "decode" else ("prefill", r["chunk"], r["prefix"], r["decodes"])
           for r in rows}
    assert got == want and len(rows) == 27 + 20
    for r in rows:
        assert r["predicted_model_s"] > 0 and 0 <= r["proxy_share"] < 1
        assert r["predicted_manifest_s"] == pytest.approx(r["predicted_model_s"], rel=0.2)
    dec = {(r["B"], r["C"]): r["predicted_model_s"] for r in rows if r["part"] == "decode"}
    assert dec[(256, 32768)] > dec[(256, 4096)] > dec[(1, 4096)]   # more cache read, more experts touched


def test_prediction_module_writes_the_file(tmp_path):
    out = tmp_path / "p.csv"
    assert V.main([str(out)]) == 0
    with open(out, newline="") as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == 47
    assert V.main([str(Path(tmp_path))]) == 2   # a directory is refused in one line


def test_the_check_reads_a_qwen_run_against_these_predictions(tmp_path):
    """What phase 2 runs after the device run: `decode_step.check_tables(predictions, run)` on a run directory of the
    harness's format (rows made up here: measured = 1.25 x the step model, so the error is -20 % by construction),
    with a profiled point split by kernel family through the same manifest calls."""
    import pandas as pd

    pred = tmp_path / "pred.csv"
    V.write_predictions(pred)
    P = pd.read_csv(pred)
    run = tmp_path / "run"
    run.mkdir()
    d = P[P.part == "decode"].head(2)
    dec = pd.DataFrame({"config": d.config, "B": d.B.astype(int), "C": d.C.astype(int), "timer": "graph",
                        "seconds": 1.25 * d.predicted_model_s, "status": "ok", "expert_kernel": "grouped_bf16"})
    dec.to_csv(run / "decode_step.csv", index=False)
    p = P[P.part == "prefill"].head(1)
    pd.DataFrame({"config": p.config, "chunk": p.chunk.astype(int), "prefix": p.prefix.astype(int),
                  "decodes": p.decodes.astype(int), "decode_context": 0, "seconds": 1.25 * p.predicted_model_s,
                  "status": "ok", "expert_kernel": "grouped_bf16"}).to_csv(run / "prefill_step.csv", index=False)
    b0, c0 = int(d.B.iloc[0]), int(d.C.iloc[0])
    pd.DataFrame([{"config": R.QWEN, "part": "decode", "expert_kernel": "grouped_bf16", "B": b0, "C": c0,
                   "chunk": "", "prefix": "", "decodes": "", "kernel": k, "calls": 12, "gpu_s": 1e-4}
                  for k in ("chunk_gated_delta_rule_fwd_kernel", "flash_fwd_splitkv_kernel")]).to_csv(
        run / "kernels.csv", index=False)
    steps, fams = DS.check_tables(pred, run)
    assert len(steps) == 3
    assert steps.error_model.to_numpy() == pytest.approx([-0.2, -0.2, -0.2])
    f = fams[(fams.B == b0) & (fams.C == c0)]
    assert f.predicted_s.sum() == pytest.approx(float(d.predicted_manifest_s.iloc[0]), rel=1e-3)
    assert f.profiled_s.sum() == pytest.approx(2e-4)
