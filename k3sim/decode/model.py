"""`decode_step`: time per output token and tokens/s of a decode step of B sequences, and what bounds it.

A decode iteration runs every layer once for B sequences (B tokens; B (n + 1) when verifying n MTP drafts)
on each pipeline stage. Its cost is the step model's (`k3sim.step.forward_step`: every kernel from the
calibrated predictor under the CUDA-graph convention). Throughput counts the micro-batches PP keeps in
flight: `pp` micro-batches of B sequences share the replica, so each sequence gets a token every
max(sum of stages, pp x busiest stage) seconds; tokens/s per GPU divides the replica's rate by its GPUs.
The batch a replica can hold at a context comes from the memory planner (`max_concurrent_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from k3sim.configs.model import ModelConfig
from k3sim.decode.mtp import SpecConfig
from k3sim.kernels.ops import COLLECTIVE_OPS
from k3sim.step import Batch, StepLayout, StepResult, forward_step
from k3sim.step.calls import BF16, Call, StepComponent, Timer
from k3sim.step.experts import distinct_experts


@dataclass
class DecodeResult:
    batch: int
    context: int
    layout: StepLayout
    tpot_s: float  # seconds between two output tokens of one sequence
    step_s: float  # one decode iteration through all stages
    stage_seconds: list[float]
    tokens_per_s: float  # whole replica
    tokens_per_s_per_gpu: float
    bytes_per_step_per_gpu: float
    flop_per_step_per_gpu: float
    limiter: str
    expected_distinct_experts_per_layer: float  # whole model (all EP ranks) per MoE layer
    expected_distinct_experts_per_rank: float
    expert_kernel: str
    rows: list[StepComponent]
    max_batch_by_memory: int | None = None
    spec: dict[str, Any] | None = None
    expert_kernels: dict[str, float] = field(default_factory=dict)  # kernel -> routed-expert s per step
    router_fusion: dict[str, float] = field(default_factory=dict)  # fused / unfused router+latent s per step


def _state_snapshot_calls(model: ModelConfig, layout: StepLayout, batch: int, spec: SpecConfig) -> list[Call]:
    """Extra KDA state writes of the snapshot rollback, per KDA layer: n copies of each sequence's state."""
    from k3sim.memory.sizes import kda_state_bytes_per_layer

    state = kda_state_bytes_per_layer(model) / layout.tp
    extra = spec.extra_state_writes() * batch * state
    if extra <= 0:
        return []
    # a write-only stream of X bytes moves what a copy of X/2 bytes moves (copy = read + write)
    return [Call("kda_state_snapshots", "hbm_copy", {"bytes": max(1, int(extra / 2))}, proxy_bytes=extra)]


def _projection_cache_calls(model: ModelConfig, layout: StepLayout, batch: int, spec: SpecConfig) -> list[Call]:
    """Replay's projected-input cache: q, k, v, g (D each) and beta per head and draft token, bf16, written
    in the verify and read in the replay."""
    kda = model.kda
    per_tok = kda.num_heads / layout.tp * (3 * kda.head_dim_k + kda.head_dim_v + 1) * BF16
    nbytes = 2 * batch * (spec.depth + 1) * per_tok
    return [Call("kda_projection_cache", "hbm_copy", {"bytes": max(1, int(nbytes / 2))}, proxy_bytes=nbytes)]


def _draft_step(model: ModelConfig, hw: Any, layout: StepLayout, batch: int, context: int,
                timer: Timer) -> float:
    """One MTP draft pass: one extra layer of the model's last kind plus the LM head at B tokens
    (assumption: K3's MTP module is one decoder layer sharing the LM head, as DeepSeek-V3's)."""
    from k3sim.step.forward import _eval_calls, choose_expert_kernel
    from k3sim.step.layers import layer_calls, lm_head_calls

    b = Batch.decode(batch, context)
    kernel = choose_expert_kernel(model, layout, b, timer) if model.moe else "none"
    calls = layer_calls(model, model.num_layers - 1, layout, b, kernel) + lm_head_calls(model, layout, b)
    return sum(r.seconds for r in _eval_calls(timer, calls, layout.pp - 1) if not r.hidden)


def decode_step(model: ModelConfig, hw: Any, layout: StepLayout, batch: int, context: int, *,
                spec: SpecConfig | None = None, zipf: float = 0.0, kernel_time: Callable | None = None,
                memory_cap: bool = True) -> DecodeResult:
    """One decode iteration of `batch` sequences at `context` tokens each, per GPU of `layout`."""
    timer = Timer(hw, kernel_time, layout.convention)
    tpd = 1 if spec is None else spec.depth + 1
    b = Batch.decode(batch, context, tpd)
    res: StepResult = forward_step(model, hw, layout, b, timer=timer)
    rows = list(res.rows)
    stage_s = list(res.stage_seconds)
    spec_info = None
    if spec is not None and model.kda is not None:
        n_kda = [sum(model.layer_kinds[i] == "kda" for i in ls) for ls in layout.stage_layers(model.num_layers)]
        kda_t = spec.kda_tokens_per_sequence()
        if kda_t != tpd:  # replay walks the previous step's accepted tokens too
            base = timer.row(Call("x", "recurrent_kda_decode", {"B": batch, "T": tpd, "H": _heads(model, layout)}), 0)
            more = timer.row(Call("x", "recurrent_kda_decode", {"B": batch, "T": kda_t, "H": _heads(model, layout)}), 0)
            delta = more.seconds - base.seconds
            for s, n in enumerate(n_kda):
                stage_s[s] += n * delta
                rows.append(StepComponent("kda_replay_accepted", "recurrent_kda_decode", n * (more.bytes - base.bytes),
                                          n * (more.flop - base.flop), n * delta, more.source, s, n))
        extra = _state_snapshot_calls(model, layout, batch, spec) + (
            _projection_cache_calls(model, layout, batch, spec) if spec.rollback == "replay" else [])
        for c in extra:
            r = timer.row(c, 0)
            for s, n in enumerate(n_kda):
                stage_s[s] += n * r.seconds
                rows.append(StepComponent(r.component, r.op, n * r.bytes, 0.0, n * r.seconds, r.source, s, n))
        draft = spec.depth * _draft_step(model, hw, layout, batch, context, timer)
        stage_s[-1] += draft
        rows.append(StepComponent("mtp_drafts", "layer+lm_head", 0.0, 0.0, draft, "step model (one layer + LM head)",
                                  layout.pp - 1, spec.depth))
        spec_info = {"depth": spec.depth, "acceptance": spec.acceptance, "rollback": spec.rollback,
                     "tokens_per_step": spec.tokens_per_step, "kda_tokens_per_sequence": kda_t}
    step = sum(stage_s)
    pp = layout.pp
    cycle = max(step, pp * max(stage_s))
    tokens_per_step = spec.tokens_per_step if spec else 1.0
    tpot = cycle / tokens_per_step
    per_replica = batch * layout.attention_dp * pp * tokens_per_step / cycle
    out = DecodeResult(
        batch=batch, context=context, layout=layout, tpot_s=tpot, step_s=step, stage_seconds=stage_s,
        tokens_per_s=per_replica, tokens_per_s_per_gpu=per_replica / layout.gpus,
        bytes_per_step_per_gpu=sum(r.bytes for r in rows if r.stage == _busiest(stage_s) and not _comm(r.op)),
        flop_per_step_per_gpu=sum(r.flop for r in rows if r.stage == _busiest(stage_s)),
        limiter=res.limiter, expected_distinct_experts_per_layer=0.0, expected_distinct_experts_per_rank=0.0,
        expert_kernel=res.expert_kernel, rows=rows, spec=spec_info)
    if model.moe is not None:
        moe = model.moe
        tokens = b.tokens * layout.attention_dp
        out.expected_distinct_experts_per_layer = distinct_experts(tokens, moe.num_routed_experts,
                                                                   moe.num_active_experts, zipf)
        out.expected_distinct_experts_per_rank = out.expected_distinct_experts_per_layer / layout.ep
        out.expert_kernels = expert_kernel_table(model, hw, layout, b, timer)
        out.router_fusion = router_fusion_table(model, hw, layout, b, timer)
    if memory_cap:
        out.max_batch_by_memory = max_batch(model, hw, layout, context)
    return out


def _heads(model: ModelConfig, layout: StepLayout) -> int:
    return max(1, model.kda.num_heads // layout.tp)


def _comm(op: str) -> bool:
    return op in COLLECTIVE_OPS


def _busiest(stage_s: list[float]) -> int:
    return max(range(len(stage_s)), key=lambda s: stage_s[s])


def expert_kernel_table(model, hw, layout: StepLayout, b: Batch, timer: Timer) -> dict[str, float]:
    """Routed-expert seconds per step (every MoE layer on a token's path through all stages, as the step's
    own rows count them) for each expert kernel the profile knows: tile-centric grouped GEMMs vs
    token-centric MXFP4 streaming, side by side."""
    from k3sim.step.forward import _eval_calls, expert_kernel_known
    from k3sim.step.layers import expert_calls

    out = {}
    n_moe = model.num_moe_layers
    for k in ("mxfp4_token", "grouped_fp8", "grouped_bf16"):
        if not expert_kernel_known(model, layout, b, k, timer):
            continue
        calls = list(expert_calls(model, layout, b, k))
        out[k] = n_moe * sum(r.seconds for r in _eval_calls(timer, calls, 0))
    return out


def router_fusion_table(model, hw, layout: StepLayout, b: Batch, timer: Timer) -> dict[str, float]:
    """Latent down-projection + router per step (every MoE layer): one fused GEMM vs two GEMMs."""
    from k3sim.step.layers import gemm

    moe, d, t, M = model.moe, model.hidden_size, layout.tp, b.tokens
    if not moe.latent_width:
        return {}
    L, E = moe.latent_width, moe.num_routed_experts
    n_moe = model.num_moe_layers
    fused = timer.row(gemm("f", M, (L + E) / t, d), 0).seconds
    split = timer.row(gemm("a", M, L / t, d), 0).seconds + timer.row(gemm("b", M, E / t, d), 0).seconds
    return {"fused_s": n_moe * fused, "unfused_s": n_moe * split}


def max_batch(model: ModelConfig, hw: Any, layout: StepLayout, context: int) -> int | None:
    """Sequences of `context` tokens per micro-batch that fit: the memory planner's concurrent requests
    divided over the pp micro-batches in flight (None if the weights alone do not fit)."""
    from k3sim.errors import DoesNotFit
    from k3sim.memory.plan import serve_plan

    try:
        plan = serve_plan(model, hw, layout.parallelism(), context)
    except DoesNotFit:  # only the misfit: any other planner error is bad input and propagates
        return None
    return plan.max_concurrent_requests // layout.pp
