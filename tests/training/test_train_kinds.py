"""The training step for every layer kind (issue 23 item 5): the hybrid models of the issue and a dense GQA model
train on 8 H200 at layouts their heads allow, through the real predictor; the recompute modules of the new
kinds; TP of layers with one sublayer; the hardware FLOP of the new cores; `k3sim memory --mode train`."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from fakes import fake_kernel_time  # noqa: E402
from memory_toys import toy_model  # noqa: E402

from k3sim.configs import load_hardware, load_model  # noqa: E402
from k3sim.configs.parallel import Parallelism  # noqa: E402
from k3sim.kernels.ops import OPS  # noqa: E402
from k3sim.memory.params import count_params  # noqa: E402
from k3sim.step.training import LayerCost  # noqa: E402
from k3sim.training import TrainOptions, TrainingContext, train_step  # noqa: E402
from k3sim.training.step import _hardware_flop_per_token  # noqa: E402

H200 = load_hardware("h200")
# one layout of 8 GPUs per model, each dividing its heads / groups / experts (`configs.kinds` TP rules)
LAYOUTS = {
    "qwen3-next-80b-a3b": dict(tp=1, ep=8, dp=8),     # 16 key / 32 value GDN heads, 2 KV heads, 512 experts
    "nemotron-h-56b": dict(tp=8),                     # 256 Mamba2 heads, 8 groups, 8 KV heads
    "granite-4.0-h-small": dict(tp=2, ep=8, dp=4),    # 128 heads, 1 group (replicated), 72 experts
    "jamba-1.5-mini": dict(tp=2, ep=8, dp=4),         # d_inner 8192, 8 KV heads, 16 experts
    "minimax-m1": dict(tp=8, ep=8),                   # 64 lightning heads, 8 KV heads, 32 experts
    "llama-3.3-70b": dict(tp=8),                      # 64 query / 8 KV heads
}


@pytest.fixture(scope="module")
def models():
    root = Path(__file__).parents[2]
    return {name: load_model(root / f"models/{name}.yaml") for name in LAYOUTS}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_training_step_of_every_kind(models, name):
    m = models[name]
    r = train_step(m, H200, Parallelism(**LAYOUTS[name]), seq_len=4096, num_micro_batches=8)
    assert math.isfinite(r.step_time_s) and r.step_time_s > 0
    assert 0 < r.mfu < r.hfu < 1
    assert sum(x.seconds for x in r.breakdown) == pytest.approx(r.step_time_s)
    assert r.tokens_per_step == 8 * 4096 * LAYOUTS[name].get("dp", 1)
    assert r.memory.per_gpu_bytes["activations"] > 0 and isinstance(r.fits, bool)


def test_qwen3_next_selective_linear_attn_core_recomputes_its_modules(models):
    """Selective recompute of the GDN core re-runs exactly the layers' `linear_attn_core` forward: 36 GDN layers'
    worth; the GQA layers have none."""
    m, par = models["qwen3-next-80b-a3b"], Parallelism(tp=2, ep=8, dp=4)
    ctx = TrainingContext(m, H200)
    opts = TrainOptions(recompute="selective", recompute_modules=("linear_attn_core",))
    r = train_step(m, H200, par, seq_len=4096, num_micro_batches=4, options=opts, context=ctx)
    costs = ctx.layer_costs(2, 8, 1, 4096, 4096, opts.moe_glue, "bf16")
    gdn = [c.module_forward_s["linear_attn_core"] for c in costs if c.kind == "gdn"]
    assert len(gdn) == 36 and r.stages[0]["recompute_s"] == pytest.approx(sum(gdn), rel=1e-12)
    both = train_step(m, H200, par, seq_len=4096, num_micro_batches=4, context=ctx,
                      options=TrainOptions(recompute="selective", recompute_modules=("linear_attn_core", "norms")))
    assert both.stages[0]["recompute_s"] > r.stages[0]["recompute_s"]


def _module_costs(model, hw, **_):
    """1 s forward, 1 s input and 0.5 s weight gradient per layer; KDA's core 0.3 s of the forward."""
    return ([LayerCost(i, k, 1.0, 1.0, 0.5, 0.0, 0.0, module_forward_s={"kda_core": 0.3} if k == "kda" else {})
             for i, k in enumerate(model.layer_kinds)]
            + [LayerCost(-1, "embedding", 0.0, 0.0, 0.0, 0.0, 0.0),
               LayerCost(model.num_layers, "lm_head", 0.0, 0.0, 0.0, 0.0, 0.0)])


@pytest.mark.parametrize("modules", [("kda_core",), ("linear_attn_core",), ("kda_core", "linear_attn_core")])
def test_linear_attn_core_covers_kda_core_once(modules):
    # the toy's 3 KDA layers x 0.3 s, counted once whichever of the two names the selection gives
    r = train_step(toy_model(), H200, Parallelism(), seq_len=64, num_micro_batches=1, kernel_time=fake_kernel_time(),
                   layer_costs=_module_costs, options=TrainOptions(use_pipeline_engine=False, recompute="selective",
                                                                   recompute_modules=modules))
    assert r.stages[0]["recompute_s"] == pytest.approx(0.9)


def test_single_sublayer_layers_take_half_the_tp_exchange(models):
    """Nemotron-H's 118 layers each hold one sublayer (a mixer or an MLP): 59 two-sublayer layers' worth of
    sequence-parallel all-gathers and reduce-scatters, forward, backward and (full checkpointing) recompute."""
    from k3sim.training.placement import groups
    from k3sim.training.step import _MicroBatch, _tp_comm

    m, par = models["nemotron-h-56b"], Parallelism(tp=8)
    ctx = TrainingContext(m, H200)
    r = train_step(m, H200, par, seq_len=4096, num_micro_batches=1, context=ctx)
    mb = _MicroBatch.of(par, 4096, 1, 1, True, TrainOptions(), m)
    per_layer, _ = _tp_comm(ctx.coll, groups(par), par, mb, m.hidden_size, TrainOptions())
    assert r.stages[0]["exposed_comm_s"]["tp"] == pytest.approx(118 / 2 * per_layer * 3, rel=1e-12)


def test_hardware_flop_counts_the_gqa_and_gdn_cores(models):
    m = models["qwen3-next-80b-a3b"]
    gemm = 3 * 2.0 * count_params(m).active_params
    # 12 GQA layers: FlashAttention's causal fwd+bwd, 3.5 x 4 T^2 H D / 2 over T tokens = 3.5 x 2 x 4096 x 16 x 256
    # per token each; 36 GDN layers: fla's chunk forward+backward at 32 value heads over 16 key heads (registry)
    gqa = 12 * 3.5 * 2 * 4096 * 16 * 256
    gdn = 36 * OPS["chunk_gdn_fwd_bwd"].flop({"T": 4096, "H": 32, "Hk": 16, "K": 128, "V": 128}) / 4096
    assert _hardware_flop_per_token(m, 4096, False) == pytest.approx(gemm + gqa + gdn, rel=1e-12)


@pytest.mark.parametrize("name, layout", [
    ("qwen3-next-80b-a3b", ("--tp", "2", "--ep", "8", "--dp", "16")), ("nemotron-h-56b", ("--tp", "8", "--pp", "2")),
    ("granite-4.0-h-small", ("--ep", "8", "--dp", "8")), ("jamba-1.5-mini", ("--tp", "2", "--ep", "8", "--dp", "4")),
    ("minimax-m1", ("--tp", "8", "--ep", "8", "--pp", "8")), ("llama-3.3-70b", ("--tp", "8", "--pp", "4"))])
def test_memory_command_plans_training_of_every_kind(cli_json, name, layout):
    out = cli_json("memory", "--model", f"models/{name}.yaml", "--mode", "train", "--context", "4096", *layout)
    assert out["mode"] == "train" and out["per_gpu_bytes"]["activations"] > 0
    if name == "qwen3-next-80b-a3b":
        # full checkpointing, 1 micro-batch in flight, 4096 / tp 2 = 2048 tokens a rank: 48 layer inputs of 2048 x
        # 2 B, plus the largest layer rebuilt whole, the GDN layer's 159,338 B (tests/memory/test_activations_kinds.py)
        assert out["per_gpu_bytes"]["activations"] == (48 * 4096 + 159_338) * 2048
