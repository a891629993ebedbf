"""`decode_step`: time per output token and tokens/s of a decode step of B sequences, and what bounds it.

A decode iteration runs every layer once for B sequences (B tokens; B (n + 1) when verifying n MTP drafts)
on each pipeline stage. Its cost is the step model's (`k3sim.step.forward_step`: every kernel from the
calibrated predictor under the CUDA-graph convention). Throughput counts the micro-batches PP keeps in
flight: `pp` micro-batches of B sequences share the replica, so each sequence gets a token every
max(sum of stages, pp x busiest stage) seconds; tokens/s per GPU divides the replica's rate by its GPUs.
The batch a replica can hold at a context comes from the memory planner (`max_concurrent_requests`).

Speculative decoding with MTP (any model): the verify step feeds n + 1 tokens per sequence through every
layer (`Batch.tokens_per_decode`), the n draft passes of the MTP module run on the last stage
(`mtp_draft_seconds`), and a step advances `accepted_tokens_per_step(n, a)` tokens per sequence. Every
recurrent layer kind (KDA, GDN, Mamba2, Mamba, lightning) adds its state rollback, snapshot or replay
(`k3sim.decode.rollback`, per kind in the `speculative` block's `rollback_by_kind`); attention layers (MLA,
GQA, SWA) truncate their KV and add nothing.

The step is split into compute, exposed communication and hidden communication: the step model's own split
(`forward_step` extras `comm_exposed_s` / `comm_hidden_s`, two-batch overlap included) where it gives one,
else every collective row counted exposed (no overlap split known: hidden is None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from k3sim.configs.kinds import MIXERS
from k3sim.configs.model import ModelConfig
from k3sim.decode.mtp import SpecConfig
from k3sim.step import Batch, StepLayout, StepResult, forward_step
from k3sim.step.calls import Call, StepComponent, Timer
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
    tokens_per_s_per_node: float = 0.0  # tokens/s per GPU x layout.gpus_per_node
    compute_s: float = 0.0  # step_s less the exposed communication
    comm_exposed_s: float = 0.0  # communication on the critical path of the step
    comm_hidden_s: float | None = None  # communication overlapped with compute (None: the step model gave no split)
    comm_split_source: str = ""
    expert_load_max_over_mean: float | None = None  # busiest EP rank's routed load over the mean (step model)
    extras: dict[str, Any] = field(default_factory=dict)  # the step model's extras, as it gave them
    ep_kernel_used: str | None = None  # the EP all-to-all kernel the verify step runs (None: no all-to-all)


def mtp_layer_indices(model: ModelConfig) -> tuple[int, ...]:
    """The layers whose calls price the MTP module's one decoder layer: the model's last layer with an
    attention (non-recurrent) mixer, as vLLM builds Qwen3-Next's MTP layer (`qwen3_next_mtp.py`:
    `Qwen3NextDecoderLayer(layer_type="full_attention")` with the MoE block), so the draft keeps a KV cache
    and no recurrent state to roll back; DeepSeek-V3's and the Kimi models' last layer is such a layer
    (MLA + MoE), so their draft is unchanged. Where that layer has no FFN (Nemotron-H's blocks hold a mixer
    or an FFN), the last mixer-free FFN layer is added, so the draft is one attention + FFN layer like
    every other model's. A model without attention layers takes its last layer as it is."""
    layers = model.layers
    attn = [ly for ly in layers if ly.mixers and not any(MIXERS[k].recurrent for k in ly.mixers)]
    if not attn:
        return (model.num_layers - 1,)
    last = attn[-1]
    if last.ffn is not None:
        return (last.index,)
    ffn_only = [ly for ly in layers if not ly.mixers and ly.ffn is not None]
    return (last.index,) + ((ffn_only[-1].index,) if ffn_only else ())


def _draft_calls(model: ModelConfig, layout: StepLayout, batch: Batch, kernel: str) -> list[Call]:
    """One pass of an MTP module for every sequence of `batch` (one token each), as DeepSeek-V3 builds it
    (arXiv 2412.19437 sec. 2.2, eq. 21-23) and vLLM serves it (`vllm/model_executor/models/deepseek_mtp.py`,
    DeepSeekMultiTokenPredictorLayer): the next token's embedding (shared with the main model) and the
    previous hidden state, each RMSNorm-ed, concatenated and projected 2d -> d by `eh_proj` (a plain
    replicated linear: whole on every TP rank), one decoder layer, then the shared head (final norm + LM head).
    The layer is priced as the model's layers `mtp_layer_indices` name (its last attention layer; an
    assumption for K3, whose MTP layer is not published). Its attention reads the module's own cache over
    the context."""
    from k3sim.step.layers import embedding_calls, gemm, layer_calls, lm_head_calls, rmsnorm

    M, d = batch.tokens, model.hidden_size
    calls = [*embedding_calls(model, batch), rmsnorm("mtp_enorm", M, d), rmsnorm("mtp_hnorm", M, d),
             gemm("mtp_eh_proj", M, d, 2 * d)]
    for i in mtp_layer_indices(model):
        calls += layer_calls(model, i, layout, batch, kernel)
    return calls + lm_head_calls(model, layout, batch)


def _draft_rows(model: ModelConfig, layout: StepLayout, num_decode: int, context: int,
                timer: Timer) -> list[StepComponent]:
    """Rows of one MTP draft pass on the last stage (hidden rows carry no time)."""
    from k3sim.step.forward import _eval_calls, choose_expert_kernel

    b = Batch.decode(num_decode, context)
    kernel = choose_expert_kernel(model, layout, b, timer) if model.moe else "none"
    return _eval_calls(timer, _draft_calls(model, layout, b, kernel), layout.pp - 1)


def mtp_draft_seconds(model: ModelConfig, hw: Any, layout: StepLayout, num_decode: int, *,
                      timer: Timer | None = None, mtp: int = 1, context: int = 1) -> float:
    """Seconds of the `mtp` draft passes of one decode step for `num_decode` sequences (per attention-DP
    rank), any model: each draft token is one pass of the MTP module (`_draft_calls`) over the previous
    one, in sequence (one module reused for every depth, as vLLM runs num_speculative_tokens > 1).

    `context`: the sequences' mean context in tokens (the MTP layer's attention reads its cache over it);
    the default 1 prices an empty cache, so give the decode context. `timer` defaults to the predictor
    under the layout's convention. The draft passes run without two-batch overlap: their collectives
    count as exposed communication."""
    if isinstance(mtp, bool) or mtp < 0 or num_decode < 0:
        raise ValueError(f"mtp and num_decode must be >= 0, got {mtp!r}, {num_decode!r}")
    if mtp == 0 or num_decode == 0:
        return 0.0
    layout = layout.for_hardware(hw)
    timer = timer or Timer(hw, None, layout.convention)
    rows = _draft_rows(model, layout, num_decode, max(1, int(context)), timer)
    return mtp * sum(r.seconds for r in rows if not r.hidden)


def _speculate(model: ModelConfig, layout: StepLayout, batch: int, context: int, spec: SpecConfig, timer: Timer,
               stage_s: list[float], rows: list[StepComponent], expert_kernel: str) -> tuple[dict[str, Any], float]:
    """The MTP work beyond the n + 1-token verify the step model already priced: every recurrent kind's
    rollback (`k3sim.decode.rollback`; attention kinds truncate their KV), the n draft passes on the last
    stage (any model). Returns the `speculative` block and the drafts' communication seconds (exposed)."""
    from k3sim.decode.rollback import rollback

    kinds = rollback(model, layout, batch, spec, expert_kernel, timer, stage_s, rows)
    recurrent = {k.kind: k for k in kinds if k.scheme != "kv-truncate"}
    one = _draft_rows(model, layout, batch, context, timer)
    draft = spec.depth * sum(r.seconds for r in one if not r.hidden)
    draft_comm = spec.depth * sum(r.seconds for r in one if not r.hidden and _comm(r.op))
    stage_s[-1] += draft
    # one row for the drafts: HBM bytes (its collectives' wire bytes left out, as bytes_per_step counts),
    # FLOP, and seconds with its exposed communication (draft_comm_s in the speculative block)
    rows.append(StepComponent("mtp_drafts", "mtp_module", sum(r.bytes for r in one if not _comm(r.op)) * spec.depth,
                              sum(r.flop for r in one) * spec.depth, draft,
                              "step model (MTP module: eh_proj + one layer + shared LM head)", layout.pp - 1,
                              spec.depth))
    walked = spec.recurrent_tokens_per_sequence() if recurrent else None
    info = {"depth": spec.depth, "acceptance": spec.acceptance,
            "rollback": spec.rollback if recurrent else "kv-truncate",
            "tokens_per_step": spec.tokens_per_step, "verify_tokens_per_sequence": spec.depth + 1,
            "draft_s": draft, "draft_comm_s": draft_comm,
            "recurrent_tokens_per_sequence": walked,
            "kda_tokens_per_sequence": walked if "kda" in recurrent else None,
            "rollback_s": sum(k.seconds_per_step for k in kinds),
            "rollback_by_kind": [k.as_dict() for k in kinds]}
    return info, draft_comm


def _comm_split(res: StepResult, rows: list[StepComponent], step: float, extra_comm: float) -> tuple:
    """(compute_s, comm_exposed_s, comm_hidden_s, source) of a decode step: the step model's split where it
    reports one, else every collective row of the forward counted exposed and no hidden figure."""
    ex = res.extras or {}
    exposed, hidden = ex.get("comm_exposed_s"), ex.get("comm_hidden_s")
    if exposed is not None:
        exposed, src = float(exposed) + extra_comm, "step model (forward_step comm_exposed_s / comm_hidden_s)"
        hidden = None if hidden is None else float(hidden)
    else:
        exposed = sum(r.seconds for r in res.rows if _comm(r.op)) + extra_comm
        hidden, src = None, "collective rows, all counted exposed (the step model reports no overlap split)"
    return step - exposed, exposed, hidden, src


def decode_step(model: ModelConfig, hw: Any, layout: StepLayout, batch: int, context: int, *,
                spec: SpecConfig | None = None, zipf: float | None = None, kernel_time: Callable | None = None,
                memory_cap: bool = True) -> DecodeResult:
    """One decode iteration of `batch` sequences (per attention-DP rank) at `context` tokens each, per GPU
    of `layout`. `zipf`: the router skew of the distinct-expert count (None: the layout's routing_zipf)."""
    layout = layout.for_hardware(hw)  # "auto" dispatch dtype -> the profile's (the draft pass needs it too)
    timer = Timer(hw, kernel_time, layout.convention)
    tpd = 1 if spec is None else spec.depth + 1
    b = Batch.decode(batch, context, tpd)
    res: StepResult = forward_step(model, hw, layout, b, timer=timer)
    rows = list(res.rows)
    stage_s = list(res.stage_seconds)
    spec_info, draft_comm = (None, 0.0) if spec is None else _speculate(model, layout, batch, context, spec,
                                                                        timer, stage_s, rows, res.expert_kernel)
    step = sum(stage_s)
    pp = layout.pp
    cycle = max(step, pp * max(stage_s))
    tokens_per_step = spec.tokens_per_step if spec else 1.0
    tpot = cycle / tokens_per_step
    per_replica = batch * layout.attention_dp * pp * tokens_per_step / cycle
    compute, exposed, hidden, split_src = _comm_split(res, rows, step, draft_comm)
    per_gpu = per_replica / layout.gpus
    load = res.extras.get("expert_load_max_over_mean")
    if load is None and model.moe is not None:  # the step model's own figure, where its extras lack it
        from k3sim.step.layers import expert_load

        load = expert_load(model, layout, b).max_over_mean
    out = DecodeResult(
        batch=batch, context=context, layout=layout, tpot_s=tpot, step_s=step, stage_seconds=stage_s,
        tokens_per_s=per_replica, tokens_per_s_per_gpu=per_gpu,
        bytes_per_step_per_gpu=sum(r.bytes for r in rows if r.stage == _busiest(stage_s) and not _comm(r.op)),
        flop_per_step_per_gpu=sum(r.flop for r in rows if r.stage == _busiest(stage_s)),
        limiter=res.limiter, expected_distinct_experts_per_layer=0.0, expected_distinct_experts_per_rank=0.0,
        expert_kernel=res.expert_kernel, rows=rows, spec=spec_info,
        tokens_per_s_per_node=per_gpu * layout.gpus_per_node,
        compute_s=compute, comm_exposed_s=exposed, comm_hidden_s=hidden, comm_split_source=split_src,
        expert_load_max_over_mean=None if load is None else float(load), extras=dict(res.extras))
    if model.moe is not None:
        from k3sim.step.layers import dispatches, ep_kernel

        out.ep_kernel_used = ep_kernel(layout, b) if dispatches(layout) else None
        _expert_tables(out, model, hw, layout, b, timer, layout.routing_zipf if zipf is None else zipf)
    if memory_cap:
        out.max_batch_by_memory = max_batch(model, hw, layout, context)
    return out


def _expert_tables(out: DecodeResult, model: ModelConfig, hw: Any, layout: StepLayout, b: Batch, timer: Timer,
                   zipf: float) -> None:
    moe = model.moe
    tokens = b.tokens * layout.attention_dp
    out.expected_distinct_experts_per_layer = distinct_experts(tokens, moe.num_routed_experts,
                                                               moe.num_active_experts, zipf)
    out.expected_distinct_experts_per_rank = out.expected_distinct_experts_per_layer / layout.ep
    out.expert_kernels = expert_kernel_table(model, hw, layout, b, timer)
    out.router_fusion = router_fusion_table(model, hw, layout, b, timer)


def _comm(op: str) -> bool:
    """A collective or an expert-parallel all-to-all kernel: the step model's one test (registry kind)."""
    from k3sim.step.forward import is_communication

    return is_communication(op)


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

