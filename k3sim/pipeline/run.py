"""One call from options to a PipelineResult: schedule, costs (uniform or model-derived), encoder work
(from `--encoder-cost` or the model's ViT with encoder CP) and the placement policy. The CLI and the
report call this; it does no printing."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from k3sim.configs.bounds import BOUNDS, check_range
from k3sim.errors import InputError
from k3sim.pipeline.placement import POLICIES, EncoderWork
from k3sim.pipeline.result import PipelineResult, run_pipeline
from k3sim.pipeline.schedules import DUAL, build_schedule
from k3sim.pipeline.stagecosts import uniform_costs

# Work bounds (k3sim/configs/bounds.py, with their reasons): checked from the shape before any op is built.
MAX_STAGES = int(BOUNDS["pipeline_stages"].hi)
MAX_OPS = int(BOUNDS["pipeline_ops"].hi)
MERGE = 4                       # MoonViT 2x2 patch merger: LLM tokens = patches / 4 (K2.5 report), for the send size


@dataclass
class LayoutSpec:
    schedule: str = "1f1b"
    stages: int = 8
    virtual: int = 1
    microbatches: int = 16
    uniform: tuple[float, float, float | None] | None = None
    encoder_policy: str = "bubble"
    encoder_cost: float | None = None
    encoder_cp: str = "dynamic"
    images_per_microbatch: float = 2.0   # sampler mean (modelling choice: no public K3 data mix; see encoder.py)
    seed: int = 0
    tp: int = 8
    ep: int = 8
    cp: int = 1
    microbatch_tokens: int = 4096
    seq_len: int = 4096
    attn_res_cache: bool = True
    upfront: int | None = None


def check_spec(spec: LayoutSpec) -> None:
    """Every number of the layout inside its documented range, and the work (stages, ops) bounded, before
    anything is built: one line naming the option. `--stages 10000` ran past a minute; 1e308-second costs
    gave null results."""
    from k3sim.pipeline.schedules import check_shape

    if spec.encoder_cost is not None:
        check_range(spec.encoder_cost, "stage_forwards", "--encoder-cost")
    for name, val, kind in (("--tp", spec.tp, "parallel"), ("--ep", spec.ep, "parallel"), ("--cp", spec.cp, "parallel"),
                            ("--microbatch-tokens", spec.microbatch_tokens, "tokens"),
                            ("--seq-len", spec.seq_len, "tokens"), ("--seed", spec.seed, "seed")):
        check_range(val, kind, name, integer=True)
    if spec.microbatch_tokens % spec.seq_len:
        raise InputError(f"{spec.microbatch_tokens} tokens per micro-batch is not a whole number of "
                         f"{spec.seq_len}-token sequences", source="--microbatch-tokens")
    check_shape(spec.schedule, spec.stages, spec.microbatches, spec.virtual)
    check_range(spec.stages, "pipeline_stages", "--stages", integer=True)
    check_range(spec.virtual, "parallel", "--virtual", integer=True)
    check_range(spec.microbatches, "batch", "--microbatches", integer=True)
    if spec.upfront is not None and not 0 <= spec.upfront <= spec.microbatches:
        raise InputError(f"{spec.upfront:,} up-front encodes: give 0 to {spec.microbatches:,} (one encode per "
                         "micro-batch)", source="--encoder-upfront")
    per = 3 if spec.schedule in ("zb-h1", "dualpipe", "dualpipev") else 2
    ops = spec.stages * (2 if spec.schedule in DUAL else spec.virtual) * spec.microbatches * per
    if ops > MAX_OPS:
        raise InputError(f"{ops:,} compute ops (stages x chunks x micro-batches x {per}) exceed the {MAX_OPS:,} "
                         "one simulation runs (k3sim/configs/bounds.py: pipeline_ops); give "
                         "fewer micro-batches or stages", source="--microbatches")


def simulate_layout(spec: LayoutSpec, model: Any = None, hw: Any = None, *,
                    kernel_time: Callable | None = None, layer_costs: Callable | None = None,
                    keep_timeline: bool = True) -> PipelineResult:
    """`model`/`hw` are needed unless costs are uniform and the encoder cost is given (or no encoder)."""
    if spec.encoder_policy not in POLICIES:
        raise InputError(f"unknown encoder policy {spec.encoder_policy!r}; one of {', '.join(POLICIES)}",
                         source="--encoder-policy")
    check_spec(spec)
    sched = build_schedule(spec.schedule, spec.stages, spec.microbatches, spec.virtual)
    p, v, m = spec.stages, spec.virtual, spec.microbatches
    # model chunks: DualPipe's p stages run twice over (two directions), DualPipeV's 2p stages in a V
    v_model = 2 if spec.schedule == "dualpipev" else v
    need_encoder = spec.encoder_policy != "none"
    need_model = spec.uniform is None or (need_encoder and spec.encoder_cost is None)
    extra: dict = {}
    msc = None
    if need_model:
        if model is None or hw is None:
            raise InputError("model-derived costs need --model and --hardware", source="--model")
        from k3sim.configs.parallel import Parallelism, check_layout

        try:  # the one layout check (configs/parallel.py): heads, experts, pp x virtual <= layers
            check_layout(model, Parallelism(tp=spec.tp, pp=p, virtual_stages=v_model, ep=spec.ep, cp=spec.cp),
                         mode="train", hardware=hw)
        except InputError as err:
            f = (err.field or "").split(".")[-1]  # "parallelism.tp" from the hardware check -> --tp
            option = {"pp": "--stages", "virtual_stages": "--virtual"}.get(f, f"--{f}")
            raise InputError(err.reason, source=option) from None
        from k3sim.pipeline.costs import model_stage_costs

        msc = model_stage_costs(model, hw, p, v_model, tp=spec.tp, ep=spec.ep, cp=spec.cp,
                                tokens=spec.microbatch_tokens, seq_len=spec.seq_len,
                                attn_res_cache=spec.attn_res_cache, kernel_time=kernel_time,
                                layer_costs=layer_costs)
        extra["model_stage_forward_s"] = msc.stage_forward_s
        extra["hop_bytes"] = msc.hop_bytes[:-1]
        extra["hop_cross_node"] = msc.hop_cross_node[:-1]
        if msc.attn_res is not None:
            a = msc.attn_res
            extra["attn_res"] = {"block_bytes": a.block_bytes, "cache_used": spec.attn_res_cache,
                                 "resend_all_bytes_per_microbatch": a.resend_all_bytes,
                                 "cached_bytes_per_microbatch": a.cached_bytes,
                                 "saved_bytes_per_microbatch": a.saved_bytes,
                                 "hop_blocks_resend_all": list(a.hop_blocks_resend_all),
                                 "hop_blocks_cached": list(a.hop_blocks_cached)}
    if spec.uniform is not None:
        f, b, w = spec.uniform   # DualPipe: one micro-batch meets one of a device's two chunks, a whole stage
        costs = uniform_costs(p, sched.v, f, b, w, visits=1 if spec.schedule == "dualpipe" else None)
        stage_fwd = f
    else:
        costs = msc.costs.mirrored() if spec.schedule == "dualpipe" else msc.costs
        stage_fwd = msc.stage_forward_s
    encoder = None
    if need_encoder:
        if spec.encoder_cost is not None:
            encoder = EncoderWork.uniform(m, spec.encoder_cost * stage_fwd)   # its backward: 2 x forward
            extra["encoder"] = {"cost_ratio": spec.encoder_cost, "source": "--encoder-cost"}
        else:
            from k3sim.pipeline.costs import p2p_seconds
            from k3sim.pipeline.encoder import encoder_steps

            steps = encoder_steps(model, hw, m, gpus=spec.tp * spec.cp, mode=spec.encoder_cp, seed=spec.seed,
                                  mean_images=spec.images_per_microbatch, kernel_time=kernel_time)
            scale = stage_fwd / msc.stage_forward_s      # uniform text costs: keep the model's ratio
            fw = [s.forward_s * scale for s in steps]
            bw = [s.backward_s * scale for s in steps]
            from k3sim.predict import predict_kernel_time

            kt = kernel_time or predict_kernel_time
            tokens_out = max(s.image_tokens for s in steps) / MERGE
            nbytes = tokens_out * model.hidden_size * 2 / spec.tp
            send = p2p_seconds(nbytes, hw, p * spec.tp * spec.cp > int(hw.scaleup_domain_gpus), kt)[0] * scale
            extra["encoder"] = {
                "cost_ratio": statistics.mean(fw) / stage_fwd if stage_fwd else None,
                "source": f"ViT from the kernel predictor, {spec.encoder_cp} encoder CP over {spec.tp * spec.cp} GPUs",
                "cp_mode": spec.encoder_cp, "gpus": spec.tp * spec.cp,
                "mean_forward_s": statistics.mean(s.forward_s for s in steps),
                "mean_backward_s": statistics.mean(s.backward_s for s in steps),
                "mean_imbalance": statistics.mean(s.imbalance for s in steps),
                "mean_comm_share": statistics.mean(s.comm_share for s in steps),
                "mean_image_patches": statistics.mean(s.image_tokens for s in steps),
                "images_per_microbatch": spec.images_per_microbatch, "seed": spec.seed,
                "send_s": send}
            encoder = EncoderWork(tuple(fw), tuple(bw), send)
    res = run_pipeline(sched, costs, encoder, spec.encoder_policy, upfront=spec.upfront,
                       keep_timeline=keep_timeline)
    res.extra.update(extra)
    return res
