"""Documented ranges for every numeric input, and the helpers that enforce them.

One table (`BOUNDS`) serves the config schemas (pydantic types `bounded_int`, `bounded_float`) and the CLI
options (`check_range`, `option_range`), so a YAML field and the option that sets the same quantity accept the
same values. A value outside its range is refused in one line that names the field or option, the range and
why it exists.

The upper ends are modelling choices, not physical limits: each sits one or more orders of magnitude above
the largest published figure (named in `why`), so every real configuration passes while a typo or a hostile
value (10**30, 1e15) is refused before it costs minutes or gigabytes. Booleans are refused where a number is
expected: YAML's `true` would otherwise be read as 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from k3sim.errors import InputError, shorten


@dataclass(frozen=True)
class Range:
    """Closed range [lo, hi] of one kind of quantity, with its unit and the reason for the upper end."""

    lo: float
    hi: float
    unit: str
    why: str

    def text(self) -> str:
        return f"[{_fmt(self.lo)}, {_fmt(self.hi)}] {self.unit}".rstrip()


def _fmt(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e13:
        return f"{int(v):,}"
    return f"{v:.3g}"


# Upper ends: modelling choices (see the module docstring); the published figure each clears is named.
BOUNDS: dict[str, Range] = {
    "layers": Range(1, 10_000, "layers", "~100x the deepest published LLMs (K3 93, DeepSeek-V3 61 layers)"),
    "heads": Range(1, 4_096, "heads", "~30x the most heads published (K3 96 KDA heads, DeepSeek-V3 128)"),
    "experts": Range(1, 65_536, "experts", "~70x the most routed experts published (K3 896, K2 384)"),
    "vocab": Range(1, 10_000_000, "tokens", "~40x the largest published vocabulary (Gemma 3 262,144)"),
    "width": Range(1, 1_048_576, "elements", "widths, head dims and ranks: ~30x the widest published (K3 dense "
                   "FFN 33,792, hidden 7,168)"),
    "kernel": Range(1, 1_024, "taps", "short-conv width (KDA uses 4) and ViT patch size (14)"),
    "tokens": Range(1, 2 ** 30, "tokens", "context, sequence and chunk lengths: ~1000x K3's 1M-token context"),
    "block_tokens": Range(16, 2 ** 30, "tokens", "hash and physical cache blocks: vLLM's default KV block is 16 "
                          "tokens; a 1-token block measured 12.6 s and 0.5 GB for 100 synthetic RAG requests "
                          "(7.0 s, 0.17 GB at 16)"),
    "request_tokens": Range(0, 2 ** 24, "tokens", "one request's input or output in a replayed trace: 16x K3's "
                            "1M context (a replay steps through every output token)"),
    "batch": Range(1, 1_048_576, "sequences", "micro-batches and micro-batch sizes"),
    "requests": Range(1, 100_000, "requests", "a synthetic workload is held in memory: chat at 100,000 requests "
                      "measured 2.2 GB peak and 22 s; replay a Mooncake trace for more, it streams"),
    "gpus": Range(1, 1_048_576, "GPUs", "~10x the largest announced clusters (~100k GPUs)"),
    "parallel": Range(1, 65_536, "ranks", "one parallel degree (tp, pp, ep, cp, dp, virtual stages)"),
    "hbm_bytes": Range(1, 2 ** 46, "bytes", "up to 64 TiB per GPU: B300 has 288 GB"),
    "capacity_bytes": Range(1, 2 ** 60, "bytes", "a cache pool: 1 EiB, far beyond any cluster's memory"),
    "bandwidth": Range(1e6, 1e15, "bytes/s", "1 MB/s to 1 PB/s per GPU: GB200 HBM is 8 TB/s, NVLink 5 0.9 TB/s"),
    "flops": Range(1e9, 1e18, "FLOP/s", "1 GFLOP/s to 1 EFLOP/s per GPU: B200 dense FP4 is ~9 PFLOP/s"),
    "sms": Range(1, 100_000, "SMs", "~600x the most SMs on one GPU (B200 148)"),
    "fraction": Range(0, 1, "", "a share of a whole"),
    "seconds": Range(0, 1e9, "s", "~30 years"),
    "rate": Range(1e-9, 1e12, "per second", "tokens or requests per second"),
    "time_scale": Range(1e-6, 1e6, "", "a factor on a trace's arrival times: a million either way squeezes the "
                        "hour-long conversation trace into 4 ms or stretches it over 112 years"),
    "train_tokens": Range(1e6, 1e15, "tokens", "a training run's token budget: ~30x the 36T tokens of the largest "
                    "published pre-training runs (Qwen3)"),
    "train_days": Range(0.01, 3650, "days", "a training run's wall-clock time: up to ten years"),
    "seed": Range(0, 2 ** 63 - 1, "", "numpy seeds are non-negative 64-bit integers"),
    # one kernel call's parameters (`k3sim kernel-time --set`, k3sim/kernels/ops.py) and the collective model
    "kernel_dim": Range(1, 2 ** 24, "elements", "one dimension of one kernel call (GEMM M, N, K; the tokens or "
                        "context of one call): 16 M, beyond any layer width or token batch of the shipped models"),
    "kernel_bytes": Range(1, 2 ** 40, "bytes", "one kernel's buffer or one collective's per-rank shard: 1 TiB, "
                          "~8x an H200's 141 GB of HBM"),
    "kda_call_tokens": Range(1, 2 ** 26, "tokens", "tokens of one chunked KDA call on one GPU: 64x K3's 1M context"),
    "decode_tokens": Range(1, 64, "tokens", "tokens per sequence of one recurrent KDA decode call (1, or a few "
                           "speculative drafts): the kernel loops over them one by one; longer runs are a "
                           "prefill (chunk_kda_fwd)"),
    "head_dim": Range(1, 256, "elements", "one attention or KDA head's dims: fla's KDA kernels and "
                      "FlashAttention take head dims up to 256"),
    "rotary_dim": Range(2, 1_024, "elements", "rotary embedding dims (at least one rotated pair): 16x K3's 64"),
    "topk": Range(1, 1_024, "experts", "routed experts per token: 64x K3's 16 (DeepSeek-V3 8)"),
    "documents": Range(1, 2 ** 30, "documents", "documents packed into one sequence: at most one per token "
                       "(the tokens bound)"),
    "collective_gpus": Range(2, 65_536, "GPUs", "ranks of one collective: 4x the 16,384 H100s that trained "
                             "Llama 3 405B (arXiv 2407.21783); the collective model's placement and ring routing "
                             "are linear in it (65,536 GPUs answer in under 5 s)"),
    "topology_links": Range(1, 2 ** 20, "links", "links of one topology file: 16 per GPU at the 65,536-GPU "
                            "maximum (an HGX node has 2 per GPU: NVSwitch and NIC)"),
    "measurement_count": Range(1, 1_000_000, "", "counts in a measured row (repetitions, calls per CUDA graph, "
                               "operand sets, split-K partitions): the harness uses at most 200 repetitions and "
                               "321 calls per graph; ~3,000x that is no real run"),
    "workers": Range(1, 1_024, "processes", "local worker processes (--workers, --processes): above the 768 "
                     "hardware threads of a two-socket AMD EPYC 9965 server; at most one per task is started"),
    # scenario training:/serving:/sweep: sections and pipeline options (issue 19)
    "replicas": Range(1, 4_096, "replicas", "one simulated engine per replica: ~500x the 8-replica fleets of "
                      "reports/serving"),
    "load_cap": Range(1, 1_048_576, "requests", "the prefix-aware router's balance threshold in requests (SGLang's "
                      "balance_abs_threshold, default 32); the upper end is the engine batch range's"),
    "zipf_exponent": Range(0, 10, "", "Zipf exponent of expert popularity: at 10 the hottest of K3's 896 "
                           "experts already takes 99.9 % of routed tokens (total skew); beyond it nothing changes"),
    "zipf_milli": Range(0, 10_000, "", "Zipf exponent x 1000, an integer kernel parameter (ep_dispatch, "
                        "ep_combine): zipf_exponent's 0..10"),
    "ep_kernel_code": Range(0, 2, "", "EP all-to-all kernel of ep_dispatch / ep_combine: 0 normal, 1 low_latency, "
                            "2 nccl (k3sim.comm.ep.KERNEL_CODES)"),
    "dispatch_dtype_bytes": Range(1, 2, "bytes", "bytes per dispatched element: 1 fp8 (with per-128-channel fp32 "
                                  "scales), 2 bf16"),
    "stage_forwards": Range(0, 1_000, "stage forwards", "an encoder's forward per micro-batch in stage forwards "
                            "(--encoder-cost), a modelling choice: at 1,000 the encoder alone is the step"),
    "pipeline_stages": Range(1, 256, "stages", "pipeline devices of the discrete-event engine: 4x the 64 stages of "
                             "Megatron-LM's 1T-parameter run (Narayanan et al., SC'21) and of "
                             "benchmarks/bench_pipeline.py (per-stage metrics scan every op once per stage)"),
    "pipeline_ops": Range(1, 131_072, "ops", "compute ops of one pipeline simulation (stages x virtual x "
                          "micro-batches x 2, or x 3 for zb-h1): the 64 x 2 x 512 layout of "
                          "benchmarks/bench_pipeline.py; `k3sim pipeline` with the bubble encoder policy took "
                          "6-13 s and 0.3 GB at this size on 2 shared cores"),
    "sweep_points_train": Range(1, 1_000_000, "points", "layouts of one training sweep: the largest grid "
                                "reports/planner/benchmark.md projects (6.4 s projected on 256 Dask workers); its "
                                "rows hold ~1.5 GB in this process (0.15 GB per 100,000 row dicts, tracemalloc)"),
    "sweep_points_serve": Range(1, 1_024, "points", "points of one serving sweep: each simulates a request "
                                "sample through the fleet (one default-scenario point took 11 s), so 1,024 is hours "
                                "serial"),
}


def check_range(value: Any, name: str, option: str | None = None, *, field: str | None = None,
                integer: bool | None = None) -> Any:
    """Return `value` if it is a number inside `BOUNDS[name]`, else raise InputError naming `option`/`field`.

    `integer=True` also refuses fractions; booleans and NaN are always refused."""
    r = BOUNDS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"expected a number, got {_short(value)}", source=option, field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"must be a finite number in {r.text()}, got {value}", source=option, field=field)
    if integer and value != int(value):
        raise InputError(f"must be a whole number in {r.text()}, got {_short(value)}", source=option, field=field)
    if value < r.lo:
        what = "positive (at least 1)" if r.lo == 1 else f"at least {_fmt(r.lo)}"
        raise InputError(f"must be {what}, got {_short(value)}", source=option, field=field)
    if value > r.hi:
        raise InputError(f"{_short(value)} is outside {r.text()} ({r.why})", source=option, field=field)
    return value


def _short(value: Any, limit: int = 40) -> str:
    """The value as the user can read it: integers with thousands separators, anything cut to `limit`."""
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10 ** 24 \
        else repr(value)
    return shorten(text, limit)


def option_range(name: str, option: str, *, integer: bool = True):
    """A typer/click `callback=` that checks an option against `BOUNDS[name]` (None passes: not given)."""

    def callback(value):
        if value is None:
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(check_range(v, name, option, integer=integer) for v in value)
        return check_range(value, name, option, integer=integer)

    return callback


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()} (booleans are not numbers)")
    return value


def _finite(value: Any) -> Any:
    """Booleans, NaN and infinities refused before the range check (whose message would mislead for NaN)."""
    _not_bool(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value  # pydantic's own type error follows
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value}")
    return value


def bounded_int(name: str, *, lo: int | None = None):
    """A pydantic int type in `BOUNDS[name]` (`lo` overrides the lower end, e.g. 0 for an optional count)."""
    r = BOUNDS[name]
    return Annotated[int, BeforeValidator(_not_bool), Field(ge=r.lo if lo is None else lo, le=int(r.hi))]


def bounded_float(name: str, *, gt: float | None = None):
    """A pydantic finite float in `BOUNDS[name]` (`gt` makes the lower end exclusive)."""
    r = BOUNDS[name]
    lower = {"gt": gt} if gt is not None else {"ge": r.lo}
    return Annotated[float, BeforeValidator(_finite), Field(le=r.hi, allow_inf_nan=False, **lower)]


def describe() -> list[tuple[str, str, str]]:
    """(kind, range, reason) rows, for documentation and `--help` texts."""
    return [(k, r.text(), r.why) for k, r in BOUNDS.items()]
