"""FP8 training in the per-layer costs (`step/training.py`, issue 22 item 2): each FP8 linear layer is three
GEMMs at their shapes plus the quantisations they need, read from the one predictor; which operators stay bf16;
the forward seconds of each recompute module. Numbers are worked out here from `predict_kernel_time` directly."""

from __future__ import annotations

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.predict import predict_kernel_time
from k3sim.step.batch import Batch
from k3sim.step.calls import Call, Timer
from k3sim.step.glue import GlueCalibration
from k3sim.step.layers import layer_calls
from k3sim.step.layout import StepLayout
from k3sim.step.training import (_as_bf16, _call_costs, _fp8_or_bf16, _input_of, fp8_call_costs, fp8_eligible,
                                 fp8_ops, training_layer_costs)

PROXY = GlueCalibration.proxy()  # the glue factors are GLUE's; these tests are about precision


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


@pytest.fixture(scope="module")
def k3():
    return load_model("models/kimi-k3.yaml")


def _t(hw, op, **p) -> float:
    return predict_kernel_time(op, p, hardware=hw).seconds


def test_one_fp8_linear_is_three_gemms_and_four_quantisations(h200):
    """K3's merged q/k/v projection at TP8, 4096 tokens: X (4096 x 7168) W (7168 x 4608)."""
    ops = fp8_ops(Timer(h200))
    M, N, K = 4096, 4608, 7168
    call = Call("kda_qkv_proj", "gemm_bf16", {"M": M, "N": N, "K": K})
    f, bi, bw = fp8_call_costs(Timer(h200), call, ops, set())
    g, q, qt = ops.gemm, "fp8_quant_128", ops.quant_t
    # forward: Y = X W and X quantised in 1x128 tiles
    assert f == pytest.approx(_t(h200, g, M=M, N=N, K=K) + _t(h200, q, T=M, D=K), rel=1e-12)
    # dgrad: dX = dY W^T at (M, K, N), dY quantised in 1x128 tiles
    assert bi == pytest.approx(_t(h200, g, M=M, N=K, K=N) + _t(h200, q, T=M, D=N), rel=1e-12)
    # wgrad: dW = X^T dY at (K, N, M), dY and X quantised along the tokens (128x1)
    assert bw == pytest.approx(_t(h200, g, M=K, N=N, K=M) + _t(h200, qt, T=M, D=N) + _t(h200, qt, T=M, D=K),
                               rel=1e-12)
    # the bf16 GEMMs it replaces take longer at this shape (the FP8 tensor cores' gain exceeds the quantisation)
    bf16 = sum(_call_costs(Timer(h200), call, PROXY))
    assert f + bi + bw < bf16


def test_gemms_reading_one_input_quantise_it_once(h200):
    """The decay gate reads the same normalised hidden state as the q/k/v projection: its forward and wgrad
    skip X's quantisation; its output gradient is its own."""
    timer = Timer(h200)
    ops = fp8_ops(timer)
    seen: set[str] = set()
    fp8_call_costs(timer, Call("kda_qkv_proj", "gemm_bf16", {"M": 4096, "N": 4608, "K": 7168}), ops, seen)
    f, bi, bw = fp8_call_costs(timer, Call("kda_decay_gate", "gemm_bf16", {"M": 4096, "N": 1536, "K": 7168}),
                               ops, seen)
    g, qt = ops.gemm, ops.quant_t
    assert f == pytest.approx(_t(h200, g, M=4096, N=1536, K=7168), rel=1e-12)
    assert bi == pytest.approx(_t(h200, g, M=4096, N=7168, K=1536) + _t(h200, "fp8_quant_128", T=4096, D=1536),
                               rel=1e-12)
    assert bw == pytest.approx(_t(h200, g, M=7168, N=1536, K=4096) + _t(h200, qt, T=4096, D=1536), rel=1e-12)


def test_routed_experts_are_grouped_fp8_gemms_with_their_quantisations(h200):
    """K3's routed gate/up at EP64, 8192 (token, expert) pairs over 14 local experts."""
    ops = fp8_ops(Timer(h200))
    p = {"B": 8192, "E": 14, "K": 3584, "N": 6144, "topk": 1}
    f, bi, bw = fp8_call_costs(Timer(h200), Call("routed_experts_gate_up", "moe_grouped_bf16", p), ops, set())

    def ratio(m, n, k):  # block-scaled over row-wise at the dense shape of the same rows
        if not ops.block:
            return 1.0
        return _t(h200, "gemm_fp8_block", M=m, N=n, K=k) / _t(h200, "gemm_fp8", M=m, N=n, K=k)

    fwd = _t(h200, "moe_grouped_fp8", **p) * ratio(8192, 6144, 3584)
    dgrad = _t(h200, "moe_grouped_fp8", **{**p, "K": 6144, "N": 3584}) * ratio(8192, 3584, 6144)
    q = lambda op, D: _t(h200, op, T=8192, D=D)  # noqa: E731
    assert f == pytest.approx(fwd + q("fp8_quant_128", 3584), rel=1e-12)
    assert bi == pytest.approx(dgrad + q("fp8_quant_128", 6144), rel=1e-12)
    assert bw == pytest.approx(fwd + q(ops.quant_t, 6144) + q(ops.quant_t, 3584), rel=1e-12)


def _fp8_layer_calls(model, layer: int, tp: int, ep: int, tokens: int) -> list[Call]:
    lay = StepLayout(tp=tp, ep=ep, expert_kernel="grouped_bf16", fuse_router=False)
    return layer_calls(model, layer, lay, Batch(prefill=((tokens, 0),)), "grouped_bf16")


def test_which_operators_run_in_fp8(k3):
    """K3 layer 1 (KDA + MoE) at TP8 / EP64: the linear layers are FP8 candidates (each then runs FP8 where that is
    faster, `_fp8_or_bf16`); the beta projection (12 outputs, under
    one 128-wide scaling group) and the router (DeepSeek-V3 keeps gating in higher precision) stay bf16; norms,
    the KDA kernels, conv, router top-k and the permutes are not GEMMs."""
    calls = _fp8_layer_calls(k3, 1, 8, 64, 4096)
    fp8 = {c.component for c in calls if fp8_eligible(c) or c.op == "moe_grouped_bf16"}
    assert fp8 == {"kda_qkv_proj", "kda_decay_gate", "kda_out_gate_a", "kda_out_gate_b", "kda_o_proj",
                   "moe_latent_down", "shared_experts_gate_up", "shared_experts_down", "routed_experts_gate_up",
                   "routed_experts_down", "moe_latent_up"}
    gemms_bf16 = {c.component for c in calls if c.op.startswith("gemm_") and c.component not in fp8}
    assert gemms_bf16 == {"kda_beta_proj", "moe_router"}


def test_a_linear_runs_in_fp8_only_where_that_is_faster(h200):
    """`_fp8_or_bf16` takes the smaller of the FP8 path (GEMMs + quantisations) and the bf16 GEMMs, and only an FP8
    reader marks its input quantised. K3's output-gate up-projection (K = 128: one scaling group) and its q/k/v
    projection at 32K tokens, whichever way the measurements fall."""
    timer = Timer(h200)
    ops = fp8_ops(timer)
    for comp, p in (("kda_out_gate_b", {"M": 32768, "N": 1536, "K": 128}),
                    ("kda_qkv_proj", {"M": 32768, "N": 4608, "K": 7168})):
        call = Call(comp, "gemm_bf16", p)
        fp8 = fp8_call_costs(timer, call, ops, set())
        bf16 = _call_costs(timer, call, PROXY)
        seen: set[str] = set()
        parts, used = _fp8_or_bf16(timer, call, ops, seen, PROXY)
        assert used == (sum(fp8) < sum(bf16)) and parts == (fp8 if used else bf16)
        assert seen == ({_input_of(comp)} if used else set())
    # the big projection gains at 32K tokens on the H200's measurements
    assert _fp8_or_bf16(timer, Call("kda_qkv_proj", "gemm_bf16", {"M": 32768, "N": 4608, "K": 7168}), ops, set(),
                        PROXY)[1]


def _scaled_kernel_time(per_unit: dict[str, float]):
    """Hand-set clock: a GEMM takes per_unit[op] seconds per 256^3 multiply-adds, a quantisation per_unit[op] per
    256 x 256 elements; every answer "measured" (so `fp8_ops` picks the block-scaled GEMM)."""
    from types import SimpleNamespace

    def kt(op, params, hardware=None, **kw):
        p = params
        units = p["M"] * p["N"] * p["K"] / 256 ** 3 if "M" in p else p["T"] * p["D"] / 256 ** 2
        return SimpleNamespace(seconds=per_unit.get(op, 0.0) * units, source="measured", detail="")
    return kt


def test_a_shared_input_is_quantised_once_whichever_reader_comes_first(h200):
    """Two FP8 readers of the FFN input and the bf16 router, on a clock set by hand (us): bf16 GEMM 10, FP8 block
    GEMM 6 per 256^3; fp8_quant_128 4, fp8_quant_128_t 5 per 256 x 256.
    - latent down (256 x 256 x 256), alone: bf16 3 x 10 = 30; FP8 3 x 6 + quantisations X 4, dY 4, dY^T 5, X^T 5
      = 36 (slower alone), 18 + 9 = 27 when X is quantised anyway (faster);
    - shared gate/up (M 256, N 1024, K 256: 4 units): bf16 3 x 40 = 120; FP8 3 x 24 + X 4 + dY 16 + dY^T 20 +
      X^T 5 = 117 (faster alone), so X is quantised, and the latent down joins it;
    - router: bf16 by rule, 10 per GEMM.
    Layer: forward 10 (6 + X 4) + 24 + 10, dgrad 10 (6 + dY 4) + 40 (24 + 16) + 10, wgrad 16 (6 + 5 + 5) +
    44 (24 + 20) + 10; the same in either order (call order used to charge X to the latent down and keep it
    bf16: 30 + 117 + 30 = 177 in all, against 174)."""
    from k3sim.step.training import _sum, fp8_linears

    timer = Timer(h200, _scaled_kernel_time({"gemm_bf16": 10e-6, "gemm_fp8_block": 6e-6, "gemm_fp8": 5e-6,
                                             "fp8_quant_128": 4e-6, "fp8_quant_128_t": 5e-6}))
    ops = fp8_ops(timer)
    assert ops.gemm == "gemm_fp8_block" and ops.quant_t == "fp8_quant_128_t"
    down = Call("moe_latent_down", "gemm_bf16", {"M": 256, "N": 256, "K": 256})
    shared = Call("shared_experts_gate_up", "gemm_bf16", {"M": 256, "N": 1024, "K": 256})
    router = Call("moe_router", "gemm_bf16", {"M": 256, "N": 256, "K": 256})
    for calls in ([down, shared, router], [shared, router, down]):
        (f, bi, bw), _, kept = _sum(timer, calls, PROXY, "fp8")
        assert (f, bi, bw) == pytest.approx((44e-6, 60e-6, 70e-6), rel=1e-12)
        assert kept == ()  # the router is bf16 by rule, not listed
    assert fp8_linears(timer, [down, router], ops, PROXY) == set()  # no FP8 reader of X: the latent down stays bf16
    assert _sum(timer, [down], PROXY, "fp8")[0] == pytest.approx((10e-6, 10e-6, 10e-6), rel=1e-12)
    assert _sum(timer, [down], PROXY, "fp8")[2] == ("moe_latent_down",)


def test_each_k3_layers_fp8_choice_is_the_cheapest_assignment_of_its_linears(h200, k3):
    """Over all 2^n FP8 / bf16 assignments of a layer's candidate linears (a shared input's quantisation paid once
    if any FP8 reader reads it), the layer costs' choice is the cheapest: K3's KDA + MoE and MLA + MoE layers at
    4096 and 32768 tokens, TP8 / EP64 (the per-call parts come from `fp8_call_costs` and `_call_costs`; the
    search is this test's own)."""
    from itertools import product

    timer = Timer(h200)
    ops = fp8_ops(timer)
    for tokens in (4096, 32768):
        layers = training_layer_costs(k3, h200, tp=8, ep=64, tokens=tokens, seq_len=tokens, glue=PROXY,
                                      precision="fp8")
        for layer in (1, 3):
            calls = _fp8_layer_calls(k3, layer, 8, 64, tokens)
            rest = sum(sum(_call_costs(timer, _as_bf16(c), PROXY)) for c in calls
                       if not (fp8_eligible(c) or c.op == "moe_grouped_bf16"))
            cands = [c for c in calls if fp8_eligible(c) or c.op == "moe_grouped_bf16"]
            bf16 = [sum(_call_costs(timer, c, PROXY)) for c in cands]
            gemms = [sum(fp8_call_costs(timer, c, ops, {_input_of(c.component)})) for c in cands]
            quant = {_input_of(c.component): sum(fp8_call_costs(timer, c, ops, set())) - g
                     for c, g in zip(cands, gemms)}
            best = min(rest + sum(g if x else b for x, g, b in zip(pick, gemms, bf16))
                       + sum(quant[t] for t in {_input_of(c.component) for x, c in zip(pick, cands) if x})
                       for pick in product((False, True), repeat=len(cands)))
            got = next(c for c in layers if c.layer == layer)
            assert got.forward_s + got.backward_s == pytest.approx(best, rel=1e-9), (tokens, layer)
            # the latent down-projection shares the FFN input with the shared experts: FP8 with them
            assert "moe_latent_down" not in got.bf16_linears
    # fp8 is faster than bf16 and leaves the embedding and the LM head alone
    bf16_costs = training_layer_costs(k3, h200, tp=8, ep=64, tokens=4096, seq_len=4096, glue=PROXY)
    fp8_costs = training_layer_costs(k3, h200, tp=8, ep=64, tokens=4096, seq_len=4096, glue=PROXY, precision="fp8")
    total = lambda c: c.forward_s + c.backward_s  # noqa: E731
    assert total(fp8_costs[2]) < total(bf16_costs[2])
    assert (total(fp8_costs[0]), total(fp8_costs[-1])) == (total(bf16_costs[0]), total(bf16_costs[-1]))


def _bf16_and_fp8_seconds(hw, c: Call, ops) -> list[tuple[float, float]]:
    """(bf16, fp8) seconds of each GEMM of one FP8 linear (forward, dgrad, wgrad), quantisation left out."""
    p = c.params
    if c.op == "moe_grouped_bf16":
        fwd, dgrad = dict(p), {**p, "K": p["N"], "N": p["K"]}
        rows = p["B"] * p["topk"]
        block = lambda q: 1.0 if not ops.block else (  # noqa: E731
            _t(hw, "gemm_fp8_block", M=rows, N=q["N"], K=q["K"]) / _t(hw, "gemm_fp8", M=rows, N=q["N"], K=q["K"]))
        pair = lambda q: (_t(hw, "moe_grouped_bf16", **q), _t(hw, "moe_grouped_fp8", **q) * block(q))  # noqa: E731
        return [pair(fwd), pair(dgrad), pair(fwd)]
    M, N, K = p["M"], p["N"], p["K"]
    return [(_t(hw, "gemm_bf16", M=m, N=n, K=k), _t(hw, ops.gemm, M=m, N=n, K=k))
            for m, n, k in ((M, N, K), (M, K, N), (K, N, M))]


def test_k3_layers_gain_within_what_the_fp8_gemms_allow(h200, k3):
    """Per layer, fp8 compute lies between T - sum_i (t_i - f_i) and the bf16 layer's: T is the bf16 seconds of the
    fp8 layout's calls (router apart from the latent down-projection), t_i and f_i the bf16 and FP8 seconds of each
    GEMM of a linear that goes FP8 (the quantisation it adds only raises the lower end); the upper end is the
    claim that FP8 pays for its quantisation at K3's 32K training shapes. Every f_i / t_i exceeds 0.4: FP8 tensor
    cores at most double the bf16 rate (1979 / 989 TFLOP/s on the datasheet), less what the kernels leave."""
    tokens = 32768
    timer = Timer(h200)
    ops = fp8_ops(timer)
    fp8 = training_layer_costs(k3, h200, tp=8, ep=64, tokens=tokens, seq_len=tokens, glue=PROXY, precision="fp8")
    bf16 = training_layer_costs(k3, h200, tp=8, ep=64, tokens=tokens, seq_len=tokens, glue=PROXY)
    ratios = {}
    for layer in (0, 1, 3):  # KDA + dense FFN, KDA + MoE, MLA + MoE
        a, b = fp8[layer + 1], bf16[layer + 1]
        T8, T16 = a.forward_s + a.backward_s, b.forward_s + b.backward_s
        calls = _fp8_layer_calls(k3, layer, 8, 64, tokens)
        T = sum(sum(_call_costs(timer, _as_bf16(c), PROXY)) for c in calls)
        gain = 0.0
        for c in calls:
            if fp8_eligible(c) or c.op == "moe_grouped_bf16":
                pairs = _bf16_and_fp8_seconds(h200, c, ops)
                assert all(t8 / t16 > 0.4 for t16, t8 in pairs), c.component
                if c.component not in a.bf16_linears:
                    gain += sum(t16 - t8 for t16, t8 in pairs)
        assert gain > 0.0
        assert T - gain <= T8 < T16, (layer, T - gain, T8, T16)
        ratios[layer] = T8 / T16
    # the dense-FFN layer is all GEMMs and KDA; the MLA layer's attention core stays bf16 and gains least
    assert ratios[0] < ratios[1] < ratios[3] < 1.0


def test_bf16_training_prices_a_fp8_checkpoint_as_bf16_gemms_and_fp8_keeps_head_and_router_bf16(h200):
    """DeepSeek-V3 stores its linears in FP8 (serving runs them as FP8 GEMMs); bf16 training runs every GEMM in
    bf16, and fp8 training keeps the LM head and the router GEMM in bf16."""
    ds = load_model("models/deepseek-v3.yaml")

    def ops_used(precision):
        seen = []

        def kt(op, params, **kw):
            seen.append((op, tuple(params.get(k) for k in ("M", "N", "K"))))
            return predict_kernel_time(op, params, **kw)
        training_layer_costs(ds, h200, tp=1, ep=64, tokens=4096, seq_len=4096, kernel_time=kt, glue=PROXY,
                             precision=precision)
        return seen
    bf16 = ops_used("bf16")
    assert not [op for op, _ in bf16 if "fp8" in op]
    fp8 = ops_used("fp8")
    # the LM head (a vocab-wide dimension) and the router (256 outputs) are priced in bf16 only, at all 3 shapes
    kept = {ds.vocab_size, ds.moe.num_routed_experts}
    assert not [d for op, d in fp8 if op.startswith("gemm_fp8") and kept & set(d)]
    assert len({d for op, d in fp8 if op == "gemm_bf16" and kept & set(d)}) == 6
    assert {"fp8_quant_128", "moe_grouped_fp8", fp8_ops(Timer(h200)).gemm} <= {op for op, _ in fp8}


def test_module_forward_seconds_of_a_k3_mla_layer(h200, k3):
    """K3 layer 3 (MLA + MoE) in bf16: norms, MLA up-projections, attention core and the MoE SwiGLUs, each the
    forward seconds of its calls (hand-listed here), all inside the layer's forward."""
    tokens = 4096
    c = training_layer_costs(k3, h200, tp=8, ep=64, tokens=tokens, seq_len=tokens, glue=PROXY)[4]
    assert c.layer == 3 and set(c.module_forward_s) == {"norms", "mla_up_proj", "attention_core", "moe_act"}
    lay = StepLayout(tp=8, ep=64, expert_kernel="grouped_bf16")
    calls = {x.component: x for x in layer_calls(k3, 3, lay, Batch(prefill=((tokens, 0),)), "grouped_bf16")}
    fwd = lambda name: _call_costs(Timer(h200), calls[name], PROXY)[0]  # noqa: E731
    norms = sum(_call_costs(Timer(h200), x, PROXY)[0] for x in layer_calls(
        k3, 3, lay, Batch(prefill=((tokens, 0),)), "grouped_bf16") if x.op == "rmsnorm")
    assert c.module_forward_s["norms"] == pytest.approx(norms, rel=1e-12)
    assert c.module_forward_s["mla_up_proj"] == pytest.approx(fwd("mla_q_b_proj") + fwd("mla_kv_b_expand"), rel=1e-12)
    assert c.module_forward_s["attention_core"] == pytest.approx(fwd("mla_prefill_attention"), rel=1e-12)
    assert c.module_forward_s["moe_act"] == pytest.approx(fwd("routed_experts_swiglu") + fwd("shared_experts_swiglu"),
                                                          rel=1e-12)
    assert sum(c.module_forward_s.values()) < c.forward_s
    kda = training_layer_costs(k3, h200, tp=8, ep=64, tokens=tokens, seq_len=tokens, glue=PROXY)[1]
    assert kda.layer == 0 and set(kda.module_forward_s) == {"norms", "kda_core"}  # KDA + dense FFN


def test_the_assumption_row_names_the_linears_kept_in_bf16(h200, k3):
    """Given the layer costs, the fp8 assumption row lists the linears FP8 would make slower at their shapes (K3's
    output-gate low-rank pair: K or N = 128, where the measured block-scaled kernel pads to 512), not a generic
    clause; without them it keeps the generic one."""
    from k3sim.step.training import precision_assumption

    costs = training_layer_costs(k3, h200, tp=8, ep=64, tokens=4096, seq_len=4096, glue=PROXY, precision="fp8")
    kept = {c for lc in costs for c in lc.bf16_linears}
    assert {"kda_out_gate_a", "kda_out_gate_b"} <= kept and "kda_qkv_proj" not in kept
    row = precision_assumption("fp8", h200, layer_costs=costs)[0]["assumption"]
    assert f"predicted slower at this layout's shapes: {', '.join(sorted(kept))}" in row
    assert "any linear FP8 would make slower" in precision_assumption("fp8", h200)[0]["assumption"]
    assert precision_assumption("bf16", h200, layer_costs=costs) == []
    assert all(lc.bf16_linears == () for lc in training_layer_costs(k3, h200, tp=8, ep=64, tokens=4096,
                                                                     seq_len=4096, glue=PROXY))


def test_an_unknown_precision_is_a_caller_bug(h200, k3):
    with pytest.raises(ValueError, match="precision"):
        training_layer_costs(k3, h200, tokens=4096, seq_len=4096, glue=PROXY, precision="fp4")
