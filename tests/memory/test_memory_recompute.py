"""Selective recompute and FP8 activation caching (issue 22 items 2 and 3), tensor by tensor by hand.

Every figure below is worked out from the model's shapes in the comments (elements per token x bytes), not
read back from the code: bf16 2 B, fp32 4 B, FP8 e4m3 with a fp32 scale per 1x128 tile 1 + 4/128 = 1.03125 B,
E5M6 1.5 + 4/128 = 1.53125 B.
"""

from __future__ import annotations

import pytest

from memory_toys import toy_fixture, toy_gpu_fixture  # noqa: F401 (the `toy`, `toy_gpu` fixtures)

from k3sim.configs import ModelConfig, Parallelism, load_hardware, load_model
from k3sim.configs.planning import DEEPSEEK_V3_RECOMPUTE
from k3sim.errors import InputError
from k3sim.memory import activations as act
from k3sim.memory.plan import train_plan

UP = ("norms", "mla_up_proj")  # DeepSeek-V3 sec. 3.2.3


def _bytes(tensors, precision="bf16"):
    return sum(t.elements * act.element_bytes(t.store, precision, 2.0) for t in tensors if t.only_if is None)


@pytest.fixture
def dsv3(root):
    return load_model(root / "models/deepseek-v3.yaml")


def test_formats_per_element():
    assert act.FP8_CACHED == 1.03125 and act.E5M6_CACHED == 1.53125
    assert act.element_bytes("linear", "bf16", 2.0) == 2.0 and act.element_bytes("linear", "fp8", 2.0) == 1.03125
    assert act.element_bytes("attn_linear", "fp8", 2.0) == 1.53125
    assert act.element_bytes("act", "fp8", 2.0) == 2.0 and act.element_bytes("fp32", "fp8", 2.0) == 4


def test_toy_tensors_by_hand(toy):
    # KDA h=2, dk=dv=4: q/k/v 24 elements before and after the conv (48 + 48 B), fp32 inverse norms 2h (16 B),
    # fla's Aqk + Akk 2 x 2 x 64 (512 B), the raw decay gate h dk = 8 in bf16 (16 B), beta raw in bf16 and after
    # the sigmoid in fp32 (4 + 8 B), output-gate low rank 2 (4 B), chunk output, output gate, o_proj input 8 each
    # (3 x 16 B)
    assert _bytes(act.kda_tensors(toy)) == 48 + 48 + 16 + 512 + 16 + 4 + 8 + 4 + 48 == 704
    # MLA h=2, no q compression: q 2 x 6 (24 B); kv_a latent and its norm 8 + 8 (32 B); K 12 (24 B), V 8 (16 B);
    # fp32 LSE 2 (8 B); gated output: attention output, gate, o_proj input 8 each (48 B); k_pe only if recomputed
    assert _bytes(act.mla_tensors(toy)) == 24 + 32 + 24 + 16 + 8 + 48 == 152
    # LatentMoE E=4 top-2, latent 8, expert width 8, one shared expert: fp32 scores 4 (16 B); shared SwiGLU in and
    # out 16 + 8 (48 B); latent down output and up-projection input 8 + 8 (32 B); per copy (x2) dispatched input
    # 8, SwiGLU input 16, fp32 weight 1, weighted SwiGLU output 8 -> 2 x (16 + 32 + 4 + 16) = 136 B
    assert _bytes(act.ffn_tensors(toy, "moe")) == 16 + 48 + 32 + 136 == 232
    assert _bytes(act.ffn_tensors(toy, "dense")) == 2 * 3 * 32 == 192       # gate/up 64 + SwiGLU out 32
    assert act.layer_activation_bytes_per_token(toy, 1) == 4 * 16 * 2 + 704 + 232   # + two norms in and out


def test_deepseek_v3_moe_layer_by_hand(dsv3):
    # layer 5: MLA (128 heads, q_lora 1536, kv_lora 512, qk 192, v 128) + MoE (256 experts top-8 of width 2048,
    # one shared of 2048), hidden 7168
    norms = 4 * 7168 * 2
    mla = 2 * (1536 + 1536 + 128 * 192 + 512 + 512 + 128 * 192 + 128 * 128 + 128 * 128) + 4 * 128
    moe = 4 * 256 + 2 * (2 * 2048 + 2048) + 2 * 8 * (7168 + 2 * 2048 + 2048) + 4 * 8
    none = act.layer_activations(dsv3, 5)
    assert none.kept_bytes == norms + mla + moe == 456_224 and none.recomputed_bytes == 0
    # norms drop the two pre-norm outputs and the q_a / kv_a norm outputs: 7168 + 7168 + 1536 + 512 elements
    assert act.layer_activations(dsv3, 5, ("norms",)).recomputed_bytes == 2 * 16_384
    # mla_up_proj drops q, K, V (3 x 128 x 192 ... : 24576 + 24576 + 16384) and must keep k_pe (64 elements)
    up = act.layer_activations(dsv3, 5, ("mla_up_proj",))
    assert up.recomputed_bytes == 2 * 65_536 and up.kept_bytes == 456_224 - 131_072 + 2 * 64
    # attention_core frees only the fp32 LSE: its output stays, o_proj saves it (normal checkpointing)
    assert act.layer_activations(dsv3, 5, ("attention_core",)).recomputed_bytes == 4 * 128
    # moe_act drops the routed (8 x 2048) and shared (2048) SwiGLU outputs
    assert act.layer_activations(dsv3, 5, ("moe_act",)).recomputed_bytes == 2 * (8 * 2048 + 2048)
    sel = act.layer_activations(dsv3, 5, UP)
    assert (sel.kept_bytes, sel.recomputed_bytes) == (292_512, 163_840)


def test_deepseek_v3_fp8_caching_by_hand(dsv3):
    sel = act.layer_activations(dsv3, 5, UP, "fp8")
    # kept under norms + mla_up_proj: bf16 layer input, FFN norm input, q_a / kv_a latents, k_pe (16448 el);
    # fp32 LSE, router scores, routing weights (512 + 1024 + 32 B); FP8 dispatched inputs 8 x 7168, routed and
    # shared SwiGLU inputs 8 x 4096 + 4096 and outputs 8 x 2048 + 2048 (112640 el); E5M6 attention output 16384
    assert sel.kept_bytes == 2 * 16_448 + 1568 + 112_640 * 1.03125 + 16_384 * 1.53125 == 175_712
    assert set(sel.fp8_tensors) == {"routed_in", "routed_gate_up", "routed_act", "shared_gate_up", "shared_act"}
    assert sel.e5m6_tensors == ("mla_attn_out",)
    # rebuilt: attention pre-norm output and the latent norms in FP8 (7168 + 1536 + 512 el), the MoE pre-norm
    # output in bf16 (the router reads it in BF16), q / K / V in bf16
    assert sel.recomputed_bytes == 9216 * 1.03125 + 2 * 7168 + 2 * 65_536 == 154_912
    # the dense layer 0: its pre-norm output and SwiGLU output (18432) are linear inputs, FP8; the SwiGLU input of
    # a dense FFN (2 x 18432) stays bf16 (DeepSeek's exception is the MoE SwiGLU)
    dense = act.layer_activations(dsv3, 0, UP, "fp8")
    assert dense.kept_bytes == 2 * 16_448 + 512 + 16_384 * 1.53125 + 2 * 36_864 + 18_432 * 1.03125 == 151_232


def test_kda_core_drops_the_conv_output_and_chunk_state(root):
    k3 = load_model(root / "models/kimi-k3.yaml")
    # K3 KDA layer 1 (0-based): 96 heads of 128: conv output 96 x 384 bf16, fp32 inverse norms 2 x 96, Aqk + Akk
    # 2 x 96 x 64 bf16; the conv input, the gate, beta and the chunk output stay
    la = act.layer_activations(k3, 1, ("kda_core",))
    assert la.recomputed_bytes == 2 * 36_864 + 4 * 192 + 2 * 12_288 == 99_072
    assert la.full_bytes == act.layer_activations(k3, 1).kept_bytes


def test_plan_modes_and_rows(toy, toy_gpu):
    par = Parallelism(dp=2, ep=2, zero_stage=1)
    kw = dict(workspace_fraction=0.0, allow_overflow=True)
    base = train_plan(toy, toy_gpu, par, 100, **kw)
    assert base.recompute == "full" and base.activation_checkpointing
    assert train_plan(toy, toy_gpu, par, 100, activation_checkpointing=False, **kw).recompute == "none"
    # the scenario's field wins over the workload's checkpointing
    none = train_plan(toy, toy_gpu, par, 100, recompute="none", **kw)
    assert none.recompute == "none" and none.per_gpu_bytes["activations"] == (1024 + 1064 + 1064 + 512) * 100
    # selective with no modules is DeepSeek-V3's recipe. norms rebuild the two pre-norm outputs (2 x 16 elements)
    # and KDA's o_proj input / MLA's kv_a norm output (8): 80 B a layer; the toy has no q compression, so
    # mla_up_proj rebuilds K and V only (12 + 8 elements, 40 B) and keeps k_pe (2 elements, 4 B): the MLA layer
    # rebuilds 120 B, the largest
    sel = train_plan(toy, toy_gpu, par, 100, recompute="selective", **kw)
    assert sel.recompute_modules == DEEPSEEK_V3_RECOMPUTE and sel.recompute == "selective"
    kept = (1024 - 80) + 2 * (1064 - 80) + (512 - 120 + 4)
    assert sel.per_gpu_bytes["activations"] == (kept + 120) * 100 == 342_800
    row = next(r for r in sel.breakdown if r.component == "activations")
    assert "selective recompute of norms, mla_up_proj" in row.source
    fp8 = train_plan(toy, toy_gpu, par, 100, recompute="selective", precision="fp8", **kw)
    row = next(r for r in fp8.breakdown if r.component == "activations")
    assert "routed_in" in fp8.fp8_tensors and "FP8-cached" in row.source and "routed_gate_up" in row.source
    assert fp8.per_gpu_bytes["activations"] < sel.per_gpu_bytes["activations"]


def test_stage_layers_in_flight_and_dualpipe_copies(toy, toy_gpu):
    par = Parallelism(pp=2)
    kw = dict(workspace_fraction=0.0, allow_overflow=True, recompute="none")
    plan = train_plan(toy, toy_gpu, par, 100, stage_layers=[[0], [1, 2, 3]], in_flight=[3, 1], **kw)
    # rank 0: layer 1 (1024 B/token) x 3 in flight; rank 1: 1064 + 1064 + 512 x 1
    acts = {s["stage"]: s for s in plan.stages}
    assert acts[0]["in_flight_micro_batches"] == 3 and acts[0]["layers"] == [1]
    assert acts[0]["activation_bytes"] == 3 * 1024 * 100 and acts[1]["activation_bytes"] == (2 * 1064 + 512) * 100
    one = train_plan(toy, toy_gpu, par, 100, stage_layers=[[0], [1, 2, 3]], in_flight=[3, 1],
                     parameter_copies=2, **kw)
    # DualPipe: each rank also holds the mirror stage's weights and grads (rank 0 <-> rank 1 at pp=2), so both
    # ranks hold every parameter's weight and gradient once; the optimizer states stay the own stage's
    for s1, s2 in zip(plan.stages, one.stages):
        assert s2["params"] == s1["params"]
    w = {r.component: r.bytes for r in one.breakdown}
    total_params = sum(s["params"] for s in plan.stages)
    assert w["weights"] == 2 * total_params and w["gradients"] == 4 * total_params
    with pytest.raises(InputError, match="exactly once") as err:
        train_plan(toy, toy_gpu, par, 100, stage_layers=[[0, 1], [1, 2, 3]], **kw)
    assert err.value.field == "stage_layers"
    with pytest.raises(InputError) as err:
        train_plan(toy, toy_gpu, par, 100, in_flight=[1.0], **kw)
    assert err.value.field == "in_flight"


def test_deepseek_v3_recipe_fits_h800_with_fp8_caching(dsv3):
    """The issue's point: DeepSeek-V3's published layout (PP16, EP64 over 8 nodes, ZeRO-1, DP = 2048 / 16 = 128,
    no TP; 4096-token sequences, one per micro-batch, 120 micro-batches per DP rank: arXiv 2412.19437 sec.
    3.2-4.2) fits 80 GB with selective recompute of the norms and MLA up-projections and FP8-cached
    activations, and does not without one or the other (1F1B's in-flight counts)."""
    hw = load_hardware("h800")
    par = Parallelism(tp=1, pp=16, ep=64, dp=128, zero_stage=1)

    def plan(**kw):
        return train_plan(dsv3, hw, par, 4096, num_micro_batches=120, allow_overflow=True, **kw)

    sel = plan(recompute="selective", precision="fp8")
    # rank 0 is the fullest: layers 0-3 (3 dense + 1 MoE), 16 micro-batches in flight under 1F1B, plus one MoE
    # layer's rebuilt tensors; per-token figures from the two tests above
    assert sel.worst_stage == 0 and sel.in_flight_micro_batches == 16
    assert sel.per_gpu_bytes["activations"] == (16 * (3 * 151_232 + 175_712) + 154_912) * 4096
    assert sel.fits and sel.per_gpu_bytes["total"] < 80e9
    # full recompute: 4 layer inputs of 7168 x 2 B per micro-batch + one MoE layer in full
    full = plan(recompute="full")
    assert full.per_gpu_bytes["activations"] == (16 * 4 * 14_336 + 456_224) * 4096 and full.fits
    assert not plan(recompute="selective").fits          # bf16 caching: selective alone does not fit
    assert not plan(recompute="none", precision="fp8").fits
    assert not plan(recompute="none").fits


def test_bad_recompute_modules_name_the_field(toy, toy_gpu, dsv3):
    dense_mla = ModelConfig(name="dense-mla", hidden_size=16, num_layers=2, vocab_size=100, dense_ffn_width=32,
                            mla=dict(num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2,
                                     v_head_dim=4))
    kda_only = ModelConfig(name="kda-only", hidden_size=16, num_layers=2, vocab_size=100, full_attn_layers=[],
                           dense_ffn_width=32, kda=dict(num_heads=2, head_dim_k=4, head_dim_v=4, conv_kernel_size=4))
    cases = [(dense_mla, ("moe_act",), "selective", "MoE layers"),
             (kda_only, ("mla_up_proj",), "selective", "MLA layers"),
             (dsv3, ("norms", "kda_core"), "selective", "KDA layers"),
             (toy, ("norms",), None, "set training.recompute: selective"),
             (toy, ("norms", "norms"), "selective", "twice")]
    for model, modules, mode, words in cases:
        with pytest.raises(InputError, match=words) as err:
            train_plan(model, toy_gpu, Parallelism(), 64, recompute=mode, recompute_modules=modules,
                       allow_overflow=True)
        assert err.value.field == "training.recompute_modules", (model.name, modules)
    with pytest.raises(InputError) as err:
        train_plan(toy, toy_gpu, Parallelism(), 64, precision="fp4", allow_overflow=True)
    assert err.value.field == "training.precision"
    # the default recipe on a model without MLA layers is the norms alone: the plan names no module it skipped
    plan = train_plan(kda_only, toy_gpu, Parallelism(), 64, recompute="selective", allow_overflow=True)
    assert plan.recompute_modules == ("norms",)
    row = next(r for r in plan.breakdown if r.component == "activations")
    assert "selective recompute of norms +" in row.source and "mla_up_proj" not in row.source

