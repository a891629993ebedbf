"""The call primitives every part of a layer is built from: norms, GEMMs, elementwise kernels, the short conv
and the TP all-reduce, each a `Call` in the kernel registry's vocabulary with its per-rank shape.

Small kernels go by the op names the calibration harness measures them under (`k3sim/calibration/decode_ops.py`,
`k3sim/kernels/ops_decode.py`); one the registry lacks is priced by `Timer`'s HBM proxy over `proxy_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from k3sim.configs.model import ModelConfig
from k3sim.step.batch import Batch
from k3sim.step.calls import BF16, Call

RMSNORM, SILU_MUL, ROUTER_TOPK, RESIDUAL = "rmsnorm", "silu_mul", "router_topk", "residual_add"
ROUTER_SOFTMAX_TOPK, SHARED_EXPERT_GATE = "router_softmax_topk", "shared_expert_gate"
FP32 = 4


def _c(x: float) -> int:
    return max(1, int(math.ceil(x)))


def rmsnorm(component: str, M: int, N: float) -> Call:
    return Call(component, RMSNORM, {"T": M, "D": _c(N)}, proxy_bytes=2 * M * N * BF16)


def swiglu(component: str, M: int, N: float) -> Call:
    """silu(gate) * up over N outputs: reads 2N, writes N per token."""
    return Call(component, SILU_MUL, {"T": M, "N": _c(N)}, proxy_bytes=3 * M * N * BF16)


def relu2(component: str, M: int, N: float) -> Call:
    """Squared ReLU over N values (Nemotron-H's plain MLP, `ffn_gated: false`): reads and writes N per token.
    No measured kernel: the HBM proxy over its bytes."""
    return Call(component, "relu2", {"T": M, "N": _c(N)}, proxy_bytes=2 * M * N * BF16)


def ffn_activation(model: ModelConfig, prefix: str, M: int, N: float) -> Call:
    """The FFN activation over N outputs: `<prefix>_swiglu` for a GLU, `<prefix>_relu2` for a plain MLP."""
    return swiglu(f"{prefix}_swiglu", M, N) if model.ffn_gated else relu2(f"{prefix}_relu2", M, N)


def ffn_in_proj(model: ModelConfig, prefix: str, M: int, N: float, K: int, dtype: str) -> Call:
    """The FFN's input projection to width N: gate and up in one GEMM (`<prefix>_gate_up`, 2N outputs) for a
    GLU, up alone (`<prefix>_up`) for a plain MLP (configs.kinds.ffn.matrices)."""
    if model.ffn_gated:
        return gemm(f"{prefix}_gate_up", M, 2 * N, K, dtype)
    return gemm(f"{prefix}_up", M, N, K, dtype)


def residual(component: str, M: int, d: int) -> Call:
    return Call(component, RESIDUAL, {"T": M, "D": d}, proxy_bytes=3 * M * d * BF16)


def elementwise(component: str, op: str, M: int, N: float, streams: float = 2.0) -> Call:
    """An elementwise kernel over M x N bf16 values reading and writing `streams` tensors in all."""
    return Call(component, op, {"T": M, "D": _c(N)}, proxy_bytes=streams * M * N * BF16)


def gemm(component: str, M: int, N: float, K: float, dtype: str = "bf16") -> Call:
    return Call(component, f"gemm_{dtype}", {"M": M, "N": _c(N), "K": _c(K)})


def linear_dtype(model: ModelConfig, component: str) -> str:
    """The GEMM dtype of a linear layer: FP8 where the memory plan stores its weights in FP8 (block-scaled FP8
    checkpoints such as DeepSeek-V3 and K2 run their projections as FP8 GEMMs in vLLM, SGLang and DeepSeek's own
    stack, arXiv 2412.19437 sec. 3.3), so the bytes a step streams are the bytes the plan places; BF16
    otherwise. The router, the absorbed per-head products and the LM head stay BF16 (DeepSeek-V3 keeps gating
    and the output head in higher precision)."""
    from k3sim.memory.params import stored_format

    return "fp8" if stored_format(model, component) == "fp8" else "bf16"


def collective(component: str, op: str, nbytes: float, gpus: int, **kw) -> Call:
    return Call(component, op, {"bytes": _c(nbytes), "gpus": gpus}, **kw)


# vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py: CustomAllreduce,
# _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8], max_size = 8192 * 1024 bytes) takes a serving step's TP
# all-reduce inside one NVLink domain; larger buffers and other group sizes go to NCCL.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX_BYTES = 8192 * 1024


def all_reduce(component: str, nbytes: float, t: int) -> Call:
    """A TP all-reduce of `nbytes` per rank: vLLM's custom kernel where it applies, NCCL otherwise."""
    if t in CUSTOM_AR_WORLD_SIZES and nbytes <= CUSTOM_AR_MAX_BYTES:
        return collective(component, "custom_all_reduce", nbytes, t)
    return collective(component, "all_reduce", nbytes, t)


def tp_all_reduce(M: int, d: int, t: int) -> Call:
    """The all-reduce of a row-parallel output projection: M tokens x d bf16 partial sums."""
    return all_reduce("tp_all_reduce", M * d * BF16, t)


def low_rank_or_full(prefix: str, M: int, out: float, d: int, rank: int | None, dtype: str = "bf16") -> list[Call]:
    """A gate projection d -> out: one GEMM (full rank) or d -> rank (replicated) then rank -> out."""
    if rank is None:
        return [gemm(prefix, M, out, d, dtype)]
    return [gemm(prefix + "_a", M, rank, d, dtype), gemm(prefix + "_b", M, out, rank, dtype)]


def short_conv(component: str, batch: Batch, channels: int, width: int) -> Iterator[Call]:
    """The depthwise causal conv of a recurrent mixer over `channels` channels of `width` taps: one
    `conv1d_update` for the decoding sequences (their (width - 1)-token conv state read and written) and one
    `causal_conv1d_fwd` per prefill chunk (vLLM's causal_conv1d_update / causal_conv1d_fn)."""
    if batch.num_decode:
        B = batch.num_decode
        state = B * (width - 1) * channels * BF16 * 2  # read + write
        yield Call(component, "conv1d_update", {"B": B, "D": channels, "W": width},
                   proxy_bytes=2 * batch.decode_tokens * channels * BF16 + state)
    for chunk, _prefix in batch.prefill:
        yield Call(component, "causal_conv1d_fwd", {"B": 1, "T": chunk, "D": channels, "W": width},
                   proxy_bytes=2 * chunk * channels * BF16)


@dataclass(frozen=True)
class MixerCalls:
    """How the step prices one mixer kind (`k3sim.configs.kinds.MIXERS[kind]`): `body(model, layout, batch)`
    yields the kind's calls between the layer's input norm and its residual (component names start with the
    kind's: `gdn_in_proj`, ...; the TP all-reduce of its output projection is added by the layer); `core` maps the
    kind's core components (recurrent step, chunked prefill, attention) to the limiter's category; `per_chunk`
    are the components re-timed per prefill chunk and `decode_context` those that grow with the decode context
    (the serving fast path's split, `serving.stepcost`); `proxies` names, per component, the measured op a kind
    without its own kernel borrows and why (the step's rows and extras repeat it)."""

    kind: str
    body: Callable[..., Iterator[Call]]
    core: Mapping[str, str]
    per_chunk: tuple[str, ...] = ()
    decode_context: tuple[str, ...] = ()
    proxies: Mapping[str, str] = field(default_factory=dict)
