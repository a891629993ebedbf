"""Kernels of the hybrid models' sequence mixers on one GPU (issue 23 item 4): Gated DeltaNet, Mamba2's SSD,
GQA / sliding-window attention, and the softmax router with the shared-expert gate.

What is timed, and through what:
  chunk_gdn_fwd, chunk_gdn_fwd_bwd   fla `chunk_gated_delta_rule` (Triton path), grouped value heads (H value heads
                                     over Hk key heads), q/k L2-normalised in the kernel, Qwen3-Next's gate
                                     g = -exp(A_log) softplus(a + dt_bias) in fp32 and beta = sigmoid(b)
                                     (HF modeling_qwen3_next), K = V = 128; time_cuda (events, L2 flushed)
  recurrent_gdn_decode               fla's `fused_recurrent_gated_delta_rule_fwd_kernel` launched with the state
                                     as both its input and output (in place, as vLLM and SGLang update it), one
                                     token per request; graph replay
  mamba2_chunk_fwd, _fwd_bwd         Mamba2's chunked scan (SSD) as fla `chunk_simple_gla`: SSD is linear attention
                                     with one scalar decay per head and step (Dao & Gu 2024, arXiv 2405.21060,
                                     sec. 3-4: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t), so
                                     q = C, k = B (each group's B, C expanded to its heads), v = dt x, g = dt A,
                                     scale 1; d_state N = 128 (fla's K), head_dim P = 64 (fla's V); time_cuda
  mamba2_decode                      our own Triton kernel of Mamba2's single-step selective state update (the
                                     computation of mamba_ssm's selective_state_update: softplus(dt + dt_bias), D
                                     skip, z gate), state [B, H, P, N] fp32 updated in place; graph replay
  gqa_prefill_fwd                    FlashAttention-2 through torch: SDPA's flash backend (enable_gqa) for full
                                     causal attention (window = T), aten._flash_attention_forward with
                                     window_size_left = window - 1 for sliding windows; time_cuda
  gqa_decode                         one query token per request over a paged bf16 KV cache (256-token pages in
                                     shuffled order): torch's FlashAttention-2 varlen call with a block table where
                                     this torch has it ("fa2_paged"), else SDPA's flash backend over each request's
                                     contiguous cache ("sdpa_contiguous"); the row says which; graph replay
  gqa_decode_paged                   one query token per request over a paged bf16 KV cache read through a block
                                     table (64-token pages in shuffled order, vLLM's [pages, page, Hkv, D] layout):
                                     our own Triton split-KV kernel (flash-decoding: each program walks its share of
                                     one request's pages for one KV head and all the query heads of its group, an
                                     online softmax over the pages, then a merge of the splits); graph replay
  mamba2 at d_state 256              Nemotron-H 56B's Mamba2 (256 heads x 64, d_state 256, 32 heads a group):
                                     `mamba2_decode` rows at N = 256 (our Triton kernel, as above), and fla
                                     `chunk_simple_gla` at K = 256 into mamba2_chunk_fwd_dstate256.csv (not an op of
                                     the store, whose chunk op takes d_state as an optional parameter, not a column:
                                     those rows check the predictor's K = 256 extrapolation instead)
  router_softmax_topk                fp32 softmax of bf16 logits, top-k, renormalised (Qwen3-Next norm_topk_prob);
                                     graph replay
  shared_expert_gate                 sigmoid(x w_gate) * shared-expert output (Qwen3-Next's gated shared expert);
                                     graph replay

Every kernel is checked against a float64 reference (fresh random inputs, at the shape family it is timed at)
before it is timed; `hybrid_check.csv` holds each check's relative error, and a family that fails is not timed.

fla compiles and autotunes each head-count family for minutes on one core. The fla families are warmed in
parallel worker processes at the start (`--warm`), while this process measures the torch and own-kernel parts;
a file lock around Triton's autotuning benchmarks and around every measurement here keeps two processes from
timing on the GPU at once. Compiled kernels and autotune choices land in TRITON_CACHE_DIR, which the driver
script carries between device calls.

Run: python3 -m k3sim.calibration.hybrid_ops --out DIR --budget-s 540
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from k3sim.calibration.records import OpWriter

HEAD_DIM = 128  # GDN key and value head dims of Qwen3-Next and Qwen3.5 (linear_key/value_head_dim)
MAMBA_P, MAMBA_N = 64, 128  # Mamba2 head_dim and d_state of Nemotron-H 8B, Nemotron 3 Nano, Granite-4.0-H
# (Hk key heads, H value heads) per rank: Qwen3-Next 16/32 and Qwen3.5 16/64 at TP 1, 2, 4, 8
GDN_FAMILIES = [(16, 32), (16, 64), (8, 16), (8, 32), (4, 8), (4, 16), (2, 4), (2, 8)]
GDN_T = [16384, 4096, 65536, 2048, 8192, 32768]  # coarse pass first: a cut sweep still spans the range
GDN_DECODE_B = [1, 16, 256, 4, 64, 2, 8, 32, 128]
# Mamba2 heads per rank: Nemotron-H 8B / Granite-4.0-H-Small 128 heads at TP 1, 2, 4, 8 (Nemotron 3 Nano's 64 inside)
MAMBA_HEADS = [128, 64, 32, 16]
MAMBA_DECODE_H = [128, 64, 32, 16, 8]
HEADS_PER_GROUP = 16  # Nemotron-H 8B: 128 heads in 8 groups (B and C shared within a group)
# Mamba2 at d_state 256: Nemotron-H 56B (models/nemotron-h-56b.yaml: 256 heads x 64, d_state 256, 8 groups) at TP 1, 2,
# 4, 8; every other shipped Mamba2 model (Nemotron-H 8B, Nemotron 3 Nano, Granite-4.0-H) has d_state 128
MAMBA_N256, MAMBA_N256_HEADS, MAMBA_N256_GROUP = 256, [256, 128, 64, 32], 32
# GQA attention (Hq, Hkv, D) per rank: Qwen3-Next 16/2 and Qwen3.5 32/2 at head dim 256 (kv heads replicated past
# TP 2), Nemotron-H 56B / MiniMax-M1 64/8, Granite-4.0-H 32/8, Nemotron 3 Nano 32/2 at 128
GQA_PREFILL_SHAPES = [(16, 2, 256), (32, 2, 256), (8, 1, 256), (4, 1, 256), (2, 1, 256),
                      (64, 8, 128), (32, 8, 128), (32, 4, 128), (32, 2, 128), (16, 2, 128), (8, 1, 128)]
GQA_PREFILL_T = [16384, 4096, 65536, 2048, 8192, 32768]
SWA_SHAPES = [(32, 4, 128), (8, 1, 128), (16, 2, 256)]
SWA_WINDOWS = [4096, 1024, 128]  # Mistral 4096, Gemma 3 1024, gpt-oss / MiMo-V2-Flash 128
SWA_T = [16384, 4096, 65536]
GQA_DECODE_SHAPES = [(16, 2, 256), (8, 1, 256), (2, 1, 256), (64, 8, 128), (32, 4, 128), (8, 1, 128)]
GQA_DECODE_B = [1, 16, 256, 4, 64, 2, 8, 32, 128]  # run c added 2-128: FA2's split-KV choice changes with B Hkv
GQA_DECODE_C = [16384, 1024, 131072, 4096, 65536]
PAGE_TOKENS = 256  # FlashAttention-2's paged KV needs pages of a multiple of 256 tokens
MAX_KV_BYTES = 8 * 2 ** 30  # harness choice: one decode call's cache stays under 8 GiB
# Paged decode (our Triton kernel): 64-token pages, one page per loop step of a program (a harness choice: vLLM's
# FlashAttention backend defaults to 16-token blocks, its hybrid models inflate them to hundreds of tokens)
PAGED_PAGE_TOKENS = 64
GQA_PAGED_C = [16384, 1024, 131072, 4096, 65536]
GQA_PAGED_B = [1, 16, 256, 4, 64, 2, 8, 32, 128]
# router (E, topk): Qwen3-Next / Qwen3.5 512/10, Nemotron 3 Nano 128/6, Granite-4.0-H 72/10, MiniMax-M1 32/2
ROUTER_SHAPES = [(512, 10), (128, 6), (72, 10), (32, 2)]
ROUTER_T = [1, 16, 256, 4096, 4, 64, 1024, 16384, 2, 8, 32, 128, 512, 2048, 8192]
SHARED_GATE_D = [2048, 4096]  # Qwen3-Next, Qwen3.5 hidden sizes
CHECK_TOL = 3e-2  # relative error against float64 for bf16 inputs and outputs (METHOD.md: 1e-3 to 1e-2 expected)
T_WARM = 16384  # the tokens of the call that autotunes an fla family (autotune keys do not include T)
WARM_DIR = ".warm"

RESUME: dict[str, set] = {}
OP_PARAMS = {"chunk_gdn_fwd": ["T", "H", "Hk"], "chunk_gdn_fwd_bwd": ["T", "H", "Hk"], "recurrent_gdn_decode": ["B", "H", "Hk"],
             "mamba2_chunk_fwd": ["T", "H"], "mamba2_chunk_fwd_bwd": ["T", "H"], "mamba2_decode": ["B", "H", "P", "N"],
             "gqa_prefill_fwd": ["T", "Hq", "Hkv", "D", "window"], "gqa_decode": ["B", "C", "Hq", "Hkv", "D"],
             "gqa_decode_paged": ["B", "C", "Hq", "Hkv", "D"],
             "router_softmax_topk": ["T", "E", "topk"], "shared_expert_gate": ["T", "D"]}


# ---- the bench lock ------------------------------------------------------------------------------------

_LOCK_PATH = ["/tmp/k3sim-hybrid-bench.lock"]


@contextlib.contextmanager
def gpu_lock():
    """Exclusive use of the GPU for timing among this run's processes (fcntl lock on one file)."""
    import fcntl

    with open(_LOCK_PATH[0], "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def install_bench_lock() -> None:
    """Triton's autotuner times each config with triton.testing.do_bench (driver.get_benchmarker imports it at
    call time): run the config once outside the lock (its compile is CPU work, done in parallel across
    processes), then benchmark it holding the lock, so that concurrent warm-ups never time on a shared GPU."""
    import torch
    import triton.testing as tt

    original = tt.do_bench

    def locked(fn, *args, **kwargs):
        fn()
        torch.cuda.synchronize()
        with gpu_lock():
            return original(fn, *args, **kwargs)

    tt.do_bench = locked


# ---- shared helpers ------------------------------------------------------------------------------------

def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf (a check never passes on NaN)."""
    import torch

    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


class Checks:
    """Rows of hybrid_check.csv: each kernel against its float64 reference before it is timed."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / "hybrid_check.csv"
        new = not self.path.exists()
        self.fh = open(self.path, "a", newline="")
        self.w = csv.writer(self.fh)
        if new:
            self.w.writerow(["op", "shape", "output", "rel_err", "tol", "passed"])

    def record(self, op: str, shape: str, errs: dict[str, float], tol: float = CHECK_TOL) -> bool:
        ok = True
        for name, e in errs.items():
            passed = e <= tol
            ok &= passed
            self.w.writerow([op, shape, name, f"{e:.3e}", tol, int(passed)])
        self.fh.flush()
        print(f"[check] {op} {shape}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
              + ("" if ok else "  FAILED"), flush=True)
        return ok

    def failed(self, op: str, shape: str, err: BaseException) -> bool:
        self.w.writerow([op, shape, f"error {type(err).__name__}: {str(err)[:200]}", "inf", CHECK_TOL, 0])
        self.fh.flush()
        print(f"[check] {op} {shape}: ERROR {type(err).__name__}: {str(err)[:300]}", flush=True)
        return False


def sweep_locked(writer: OpWriter, cases: list[dict], measure, deadline: float) -> int:
    """Measure every case (holding the GPU lock) until the deadline; failures are rows, the sweep goes on;
    cases an earlier run measured ok (--resume-from) are skipped."""
    import torch

    op = writer.path.stem
    done = 0
    for params in cases:
        if tuple(str(params[k]) for k in OP_PARAMS.get(op, [])) in RESUME.get(op, set()):
            continue
        if time.monotonic() > deadline:
            writer.failed(params, "skipped: part time budget exhausted")
            continue
        try:
            with gpu_lock():
                timing, extras = measure(**params)
            writer.ok(params, timing, **extras)
            print(f"[{op}] {params}: {timing.seconds * 1e6:.1f} us", flush=True)
            done += 1
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            writer.failed(params, err)
            print(f"[{op}] {params}: FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)
        torch.cuda.empty_cache()
    writer.close()
    return done


def _gen(seed: int):
    import torch

    return torch.Generator(device="cuda").manual_seed(seed)


def _randn(shape, gen, dtype=None, grad: bool = False):
    import torch

    t = torch.randn(shape, device="cuda", generator=gen, dtype=torch.float32)
    t = t.to(dtype or torch.bfloat16)
    return t.requires_grad_(grad)


# ---- Gated DeltaNet ------------------------------------------------------------------------------------

def _fla_gdn():
    os.environ.setdefault("FLA_FLASH_QLA", "0")  # fla's Triton kernels, not the TileLang backend (absent anyway)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    _allow_gated_dqkwg()
    return chunk_gated_delta_rule


def _allow_gated_dqkwg() -> None:
    """fla 0.6.0 refuses the gated chunk_bwd_dqkwg on Hopper with Triton 3.4-3.7.0 (fla issue #640: a Triton codegen
    bug corrupts dk when the kernel's K tile BK is 64; PR #983 keeps the guard for that Triton range). On Hopper the
    kernel takes BK = min(next_pow2(K), 128) = 128 at K = 128 (fla/ops/common/chunk_o.py, CONST_TILING 128), the
    path the issue reports correct; the device image has Triton 3.6.0 and no newer one can be carried. So the guard
    is lifted in this process only, and the float64 backward checks (gdn_check_bwd, mamba2_check_bwd) decide
    whether a family's backward is timed."""
    import fla.ops.common.chunk_o as chunk_o

    if HEAD_DIM == 128 and MAMBA_N == 128:
        chunk_o.TRITON_ABOVE_3_7_1 = True


def gdn_inputs(T: int, H: int, Hk: int, *, B: int = 1, grad: bool = False, seed: int = 0) -> dict:
    """One GDN layer's kernel inputs (HF modeling_qwen3_next): q, k [B, T, Hk, 128], v [B, T, H, 128] bf16;
    g = -exp(A_log) softplus(a + dt_bias) fp32 with A ~ U(1, 16) and dt_bias = softplus^-1(dt), dt log-uniform
    in [1e-3, 1e-1] (Mamba2's initialisation, which Qwen3-Next keeps); beta = sigmoid(b) bf16."""
    import torch
    import torch.nn.functional as F

    gen = _gen(seed)
    q, k = _randn((B, T, Hk, HEAD_DIM), gen, grad=grad), _randn((B, T, Hk, HEAD_DIM), gen, grad=grad)
    v = _randn((B, T, H, HEAD_DIM), gen, grad=grad)
    A_log = torch.log(1 + 15 * torch.rand(H, device="cuda", generator=gen))
    dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * torch.rand(H, device="cuda", generator=gen))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    a = torch.randn((B, T, H), device="cuda", generator=gen)
    g = (-A_log.exp() * F.softplus(a + dt_bias)).requires_grad_(grad)
    beta = torch.sigmoid(torch.randn((B, T, H), device="cuda", generator=gen)).to(torch.bfloat16).requires_grad_(grad)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def gdn_reference(q, k, v, g, beta, h0=None):
    """The gated delta rule token by token in float64 (fla's fused_recurrent form): S <- exp(g) S;
    u = beta (v - S^T k); S <- S + k u^T; o = S^T q / sqrt(K); q and k L2-normalised; value head h reads key
    head h // (H / Hk). Returns (o [B, T, H, V], S [B, H, K, V])."""
    import torch

    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    rep = v.shape[2] // q.shape[2]
    q = (q / q.norm(dim=-1, keepdim=True)).repeat_interleave(rep, dim=2) * q.shape[-1] ** -0.5
    k = (k / k.norm(dim=-1, keepdim=True)).repeat_interleave(rep, dim=2)
    B, T, H, V = v.shape
    S = torch.zeros(B, H, k.shape[-1], V, dtype=torch.float64, device=v.device) if h0 is None else h0.double()
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], u)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, dim=1), S


def gdn_check_fwd(checks: Checks, H: int, Hk: int, T: int = 256) -> bool:
    chunk = _fla_gdn()
    x = gdn_inputs(T, H, Hk, seed=101)
    import torch

    with torch.no_grad():
        o, ht = chunk(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ro, rs = gdn_reference(**x)
    return checks.record("chunk_gdn_fwd", f"T={T} H={H} Hk={Hk}", {"o": rel_err(o, ro), "final_state": rel_err(ht, rs)})


def gdn_check_bwd(checks: Checks, H: int, Hk: int, T: int = 128) -> bool:
    import torch

    chunk = _fla_gdn()
    x = gdn_inputs(T, H, Hk, grad=True, seed=202)
    do = torch.randn_like(x["v"])
    o, _ = chunk(**x, use_qk_l2norm_in_kernel=True)
    o.backward(do)
    got = {n: x[n].grad.clone() for n in ("q", "k", "v", "g", "beta")}
    ref_in = {n: x[n].detach().double().requires_grad_(True) for n in x}
    ro, _ = gdn_reference(**ref_in)
    ro.backward(do.double())
    errs = {"o": rel_err(o, ro)}
    errs.update({f"d{n}": rel_err(got[n], ref_in[n].grad) for n in got})
    return checks.record("chunk_gdn_fwd_bwd", f"T={T} H={H} Hk={Hk}", errs)


def gdn_fwd(out_dir: Path, deadline: float, H: int, Hk: int, lengths: list[int]) -> int:
    import torch

    from k3sim.calibration.timing import time_cuda

    chunk = _fla_gdn()
    w = OpWriter(out_dir, "chunk_gdn_fwd", ["T", "H", "Hk"])

    def measure(T, H, Hk):
        x = gdn_inputs(T, H, Hk)
        with torch.no_grad():
            return time_cuda(lambda: chunk(**x, output_final_state=True, use_qk_l2norm_in_kernel=True),
                             budget_s=1.0), {}

    return sweep_locked(w, [dict(T=t, H=H, Hk=Hk) for t in lengths], measure, deadline)


def gdn_fwd_bwd(out_dir: Path, deadline: float, H: int, Hk: int, lengths: list[int]) -> int:
    import torch

    from k3sim.calibration.timing import time_cuda

    chunk = _fla_gdn()
    w = OpWriter(out_dir, "chunk_gdn_fwd_bwd", ["T", "H", "Hk"])

    def measure(T, H, Hk):
        x = gdn_inputs(T, H, Hk, grad=True)
        do = torch.randn_like(x["v"])

        def step():
            o, _ = chunk(**x, use_qk_l2norm_in_kernel=True)
            o.backward(do)

        def reset():
            for t in x.values():
                t.grad = None

        return time_cuda(step, before_each=reset, budget_s=1.5), {}

    return sweep_locked(w, [dict(T=t, H=H, Hk=Hk) for t in lengths], measure, deadline)


def gdn_decode_step(q, k, v, g, beta, state, o) -> None:
    """One decode step of B requests in place: fla's fused recurrent GDN kernel with h0 = ht = state (each program
    reads its [K, BV] tile of the state once before it writes it back), o written; the launch of
    fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gated_delta_rule_fwd with its block sizes."""
    import triton

    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kernel

    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BK, BV = triton.next_power_of_2(K), min(8, triton.next_power_of_2(V))
    kernel[(triton.cdiv(V, BV) * B * H,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=o, h0=state, ht=state,
        cu_seqlens=None, scale=K ** -0.5, T=T, H=Hk, HV=H, K=K, V=V, BK=BK, BV=BV, IS_BETA_HEADWISE=True,
        USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False,
        num_warps=1, num_stages=3)


def _decode_operands(B: int, H: int, Hk: int, seed: int):
    import torch

    x = gdn_inputs(1, H, Hk, B=B, seed=seed)
    state = 0.1 * torch.randn((B, H, HEAD_DIM, HEAD_DIM), device="cuda", generator=_gen(seed + 7))
    o = torch.empty_like(x["v"])
    return x, state, o


def gdn_check_decode(checks: Checks, H: int, Hk: int, B: int = 3) -> bool:
    import torch

    x, state, o = _decode_operands(B, H, Hk, seed=303)
    o.fill_(float("nan"))
    s0 = state.clone()
    gdn_decode_step(**x, state=state, o=o)
    torch.cuda.synchronize()
    ro, rs = gdn_reference(**x, h0=s0)
    return checks.record("recurrent_gdn_decode", f"B={B} H={H} Hk={Hk}",
                         {"o": rel_err(o, ro), "state_in_place": rel_err(state, rs)})


def gdn_decode(out_dir: Path, deadline: float, H: int, Hk: int, batches: list[int]) -> int:
    from k3sim.calibration.graph_parts import GRAPH_EXTRAS, operand_sets, time_graph

    w = OpWriter(out_dir, "recurrent_gdn_decode", ["B", "H", "Hk"], GRAPH_EXTRAS)

    def measure(B, H, Hk):
        fns = []
        for s in range(operand_sets(2 * B * H * HEAD_DIM * HEAD_DIM * 4)):
            x, state, o = _decode_operands(B, H, Hk, seed=s)
            fns.append(lambda x=x, state=state, o=o: gdn_decode_step(**x, state=state, o=o))
        return time_graph(fns, budget_s=0.3)

    return sweep_locked(w, [dict(B=b, H=H, Hk=Hk) for b in batches], measure, deadline)


# ---- Mamba2: the chunked scan (SSD) as fla's chunk_simple_gla -------------------------------------------

def _fla_simple_gla():
    from fla.ops.simple_gla import chunk_simple_gla

    _allow_gated_dqkwg()
    return chunk_simple_gla


def mamba2_ssd_inputs(T: int, H: int, *, B: int = 1, seed: int = 0, N: int = MAMBA_N,
                      heads_per_group: int = HEADS_PER_GROUP) -> dict:
    """Mamba2's scan inputs (mamba_ssm's Mamba2 layer): x [B, T, H, P] bf16; dt = softplus(dt_raw + dt_bias)
    fp32 (dt_bias as gdn_inputs); A = -exp(A_log), A ~ U(1, 16); B, C [B, T, G, N] bf16 with G = H /
    heads_per_group groups (16 at d_state 128, Nemotron-H 8B; 32 at d_state 256, Nemotron-H 56B)."""
    import torch
    import torch.nn.functional as F

    gen = _gen(seed)
    G = max(1, H // heads_per_group)
    x = _randn((B, T, H, MAMBA_P), gen)
    dt0 = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * torch.rand(H, device="cuda", generator=gen))
    dt = F.softplus(torch.randn((B, T, H), device="cuda", generator=gen) + dt0 + torch.log(-torch.expm1(-dt0)))
    A = -torch.log(1 + 15 * torch.rand(H, device="cuda", generator=gen)).exp()
    Bm, Cm = _randn((B, T, G, N), gen), _randn((B, T, G, N), gen)
    return dict(x=x, dt=dt, A=A, B=Bm, C=Cm)


def ssd_as_gla(x, dt, A, B, C, grad: bool = False) -> dict:
    """SSD's scan in fla's simple-GLA form (module docstring): q = C and k = B expanded to every head of their
    group, v = dt x (bf16), g = dt A (log decay per head and step), scale 1. Made before the timed call."""
    rep = x.shape[2] // B.shape[2]
    q = C.repeat_interleave(rep, dim=2).contiguous().requires_grad_(grad)
    k = B.repeat_interleave(rep, dim=2).contiguous().requires_grad_(grad)
    v = (x.float() * dt[..., None]).to(x.dtype).requires_grad_(grad)
    g = (dt * A).contiguous().requires_grad_(grad)
    return dict(q=q, k=k, v=v, g=g)


def ssd_reference(x, dt, A, B, C):
    """Mamba2's SSM step by step in float64 from its own parameters (not the GLA form): h_t [P, N] =
    exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t. Returns (y [B, T, H, P], h [B, H, P, N])."""
    import torch

    rep = x.shape[2] // B.shape[2]
    x, dt, A = x.double(), dt.double(), A.double()
    Bh, Ch = B.double().repeat_interleave(rep, dim=2), C.double().repeat_interleave(rep, dim=2)
    b, T, H, P = x.shape
    h = torch.zeros(b, H, P, Bh.shape[-1], dtype=torch.float64, device=x.device)
    ys = []
    for t in range(T):
        h = h * torch.exp(dt[:, t] * A)[..., None, None] + torch.einsum("bhp,bhn->bhpn", dt[:, t, :, None] * x[:, t], Bh[:, t])
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ch[:, t]))
    return torch.stack(ys, dim=1), h


def gla_reference(q, k, v, g):
    """Scalar-decay linear attention step by step in float64 (fla's naive simple GLA, scale 1): S <- exp(g) S +
    k v^T; o = S^T q. Differentiable: the backward check's reference."""
    import torch

    q, k, v, g = (t.double() for t in (q, k, v, g))
    b, T, H, K = q.shape
    S = torch.zeros(b, H, K, v.shape[-1], dtype=torch.float64, device=q.device)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None] + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, dim=1)


def mamba2_check_fwd(checks: Checks, H: int, T: int = 256, N: int = MAMBA_N) -> bool:
    """The forward against Mamba2's own recurrence: this checks the SSD -> simple-GLA mapping too."""
    import torch

    gla = _fla_simple_gla()
    raw = mamba2_ssd_inputs(T, H, seed=404, **_mamba_shape(N))
    x = ssd_as_gla(**raw)
    with torch.no_grad():
        o, ht = gla(**x, scale=1.0, output_final_state=True)
    ry, rh = ssd_reference(**raw)
    return checks.record("mamba2_chunk_fwd", f"T={T} H={H}" + ("" if N == MAMBA_N else f" N={N}"),
                         {"y": rel_err(o, ry), "final_state": rel_err(ht, rh.transpose(-1, -2))})


def _mamba_shape(N: int) -> dict:
    """d_state and heads per group of a Mamba2 family: 128 / 16 (Nemotron-H 8B), 256 / 32 (Nemotron-H 56B)."""
    return dict(N=N, heads_per_group=MAMBA_N256_GROUP if N == MAMBA_N256 else HEADS_PER_GROUP)


def mamba2_check_bwd(checks: Checks, H: int) -> bool:
    """The backward against autograd of the GLA form's recurrence in float64."""
    import torch

    gla = _fla_simple_gla()
    xg = ssd_as_gla(**mamba2_ssd_inputs(128, H, seed=505), grad=True)
    do = torch.randn_like(xg["v"])
    o, _ = gla(**xg, scale=1.0)
    o.backward(do)
    ref_in = {n: t.detach().double().requires_grad_(True) for n, t in xg.items()}
    ro = gla_reference(**ref_in)
    ro.backward(do.double())
    errs = {"o": rel_err(o, ro), **{f"d{n}": rel_err(xg[n].grad, ref_in[n].grad) for n in xg}}
    return checks.record("mamba2_chunk_fwd_bwd", f"T=128 H={H}", errs)


def mamba2_chunk(out_dir: Path, deadline: float, H: int, lengths: list[int], backward: bool, N: int = MAMBA_N) -> int:
    """One head count's chunked scans. At d_state 256 (forward only) the rows go to mamba2_chunk_fwd_dstate256.csv
    with K and V columns: the store's mamba2_chunk_fwd takes K as an optional parameter, not a column, so these
    rows stay out of it and check its K = 256 extrapolation (`dstate256_check`)."""
    import torch

    from k3sim.calibration.timing import time_cuda

    gla = _fla_simple_gla()
    shape = _mamba_shape(N)
    op = "mamba2_chunk_fwd_bwd" if backward else "mamba2_chunk_fwd"
    if N != MAMBA_N:
        op += f"_dstate{N}"
    w = OpWriter(out_dir, op, ["T", "H"], ["G"] if N == MAMBA_N else ["G", "K", "V"])

    def measure(T, H):
        x = ssd_as_gla(**mamba2_ssd_inputs(T, H, **shape), grad=backward)
        G = max(1, H // shape["heads_per_group"])
        extra = {"G": G} if N == MAMBA_N else {"G": G, "K": N, "V": MAMBA_P}
        if not backward:
            with torch.no_grad():
                return time_cuda(lambda: gla(**x, scale=1.0, output_final_state=True), budget_s=1.0), extra
        do = torch.randn_like(x["v"])

        def step():
            o, _ = gla(**x, scale=1.0)
            o.backward(do)

        def reset():
            for t in x.values():
                t.grad = None

        return time_cuda(step, before_each=reset, budget_s=1.5), extra

    return sweep_locked(w, [dict(T=t, H=H) for t in lengths], measure, deadline)


# ---- Mamba2 decode: our Triton kernel of the single-step state update -----------------------------------

_SSM_KERNEL = []


def _ssm_update_kernel():
    """The Triton kernel, built on first use (triton is imported only on the GPU machine)."""
    if _SSM_KERNEL:
        return _SSM_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def ssm_update(state, x, dt, dt_bias, A, Bm, Cm, D, z, y, H: tl.constexpr, G: tl.constexpr,
                   P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr):
        b, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        grp = h // (H // G)
        p = pb * BP + tl.arange(0, BP)
        n = tl.arange(0, N)
        row = (b * H + h).to(tl.int64)
        s_ptr = state + (row * P + p[:, None]) * N + n[None, :]
        s = tl.load(s_ptr)
        xv = tl.load(x + row * P + p).to(tl.float32)
        zv = tl.load(z + row * P + p).to(tl.float32)
        d = tl.load(dt + row).to(tl.float32) + tl.load(dt_bias + h)
        d = tl.where(d > 20.0, d, tl.log(1.0 + tl.exp(d)))  # softplus, as mamba_ssm's dt_softplus
        bv = tl.load(Bm + (b * G + grp) * N + n).to(tl.float32)
        cv = tl.load(Cm + (b * G + grp) * N + n).to(tl.float32)
        s = s * tl.exp(d * tl.load(A + h)) + (d * xv)[:, None] * bv[None, :]
        tl.store(s_ptr, s)
        out = tl.sum(s * cv[None, :], axis=1) + tl.load(D + h) * xv
        out = out * zv * tl.sigmoid(zv)
        tl.store(y + row * P + p, out.to(y.dtype.element_ty))

    _SSM_KERNEL.append(ssm_update)
    return ssm_update


SSM_BLOCK_P, SSM_WARPS = 16, 4  # harness choice: a [16, 128] fp32 state tile per program


def mamba2_decode_step(ops: dict) -> None:
    B, H, P, N = ops["state"].shape
    G = ops["B"].shape[1]
    _ssm_update_kernel()[(B, H, P // SSM_BLOCK_P)](
        ops["state"], ops["x"], ops["dt"], ops["dt_bias"], ops["A"], ops["B"], ops["C"], ops["D"], ops["z"], ops["y"],
        H=H, G=G, P=P, N=N, BP=SSM_BLOCK_P, num_warps=SSM_WARPS)


def mamba2_decode_operands(B: int, H: int, P: int, N: int, seed: int) -> dict:
    import torch

    gen = _gen(seed)
    G = max(1, H // _mamba_shape(N)["heads_per_group"])
    f32 = dict(device="cuda", generator=gen)
    return dict(state=0.1 * torch.randn((B, H, P, N), **f32), x=_randn((B, H, P), gen), z=_randn((B, H, P), gen),
                dt=_randn((B, H), gen), dt_bias=torch.randn(H, **f32) - 4.0,
                A=-torch.log(1 + 15 * torch.rand(H, **f32)).exp(), B=_randn((B, G, N), gen), C=_randn((B, G, N), gen),
                D=torch.randn(H, **f32), y=torch.empty((B, H, P), device="cuda", dtype=torch.bfloat16))


def mamba2_decode_reference(ops: dict):
    """mamba_ssm's selective_state_update in float64: dt = softplus(dt + dt_bias); s <- exp(dt A) s + dt x B^T;
    y = (s C + D x) silu(z). Returns (y, s)."""
    import torch
    import torch.nn.functional as F

    o = {k: v.double() for k, v in ops.items()}
    rep = o["x"].shape[1] // o["B"].shape[1]
    Bh, Ch = o["B"].repeat_interleave(rep, dim=1), o["C"].repeat_interleave(rep, dim=1)
    dt = F.softplus(o["dt"] + o["dt_bias"])
    s = o["state"] * torch.exp(dt * o["A"])[..., None, None] + (dt[..., None] * o["x"])[..., None] * Bh[:, :, None, :]
    y = (torch.einsum("bhpn,bhn->bhp", s, Ch) + o["D"][:, None] * o["x"]) * F.silu(o["z"])
    return y, s


def mamba2_decode(out_dir: Path, deadline: float, checks: Checks, N: int = MAMBA_N) -> int:
    """Check then time our state-update kernel at d_state N: 128 over MAMBA_DECODE_H heads, 256 (Nemotron-H 56B,
    32 heads a group) over MAMBA_N256_HEADS; the check runs at the largest head count and at one whose groups do
    not fill a power of two (24 heads at 128; 96 = 3 groups at 256)."""
    import torch

    from k3sim.calibration.graph_parts import GRAPH_EXTRAS, operand_sets, time_graph

    group = _mamba_shape(N)["heads_per_group"]
    for H in ((128, 24) if N == MAMBA_N else (256, 96)):
        try:
            ops = mamba2_decode_operands(3, H, MAMBA_P, N, seed=606)
            ops["y"].fill_(float("nan"))
            ref_y, ref_s = mamba2_decode_reference(ops)
            mamba2_decode_step(ops)
            torch.cuda.synchronize()
            if not checks.record("mamba2_decode", f"B=3 H={H} P={MAMBA_P} N={N}",
                                 {"y": rel_err(ops["y"], ref_y), "state_in_place": rel_err(ops["state"], ref_s)}):
                return 0
        except Exception as err:  # noqa: BLE001
            return int(checks.failed("mamba2_decode", f"B=3 H={H} N={N}", err))
    w = OpWriter(out_dir, "mamba2_decode", ["B", "H", "P", "N"], GRAPH_EXTRAS + ["G"])

    def measure(B, H, P, N):
        sets = [mamba2_decode_operands(B, H, P, N, seed=s) for s in range(operand_sets(2 * B * H * P * N * 4))]
        t, extras = time_graph([lambda o=o: mamba2_decode_step(o) for o in sets], budget_s=0.3)
        return t, dict(extras, G=max(1, H // group))

    heads = MAMBA_DECODE_H if N == MAMBA_N else MAMBA_N256_HEADS
    cases = [dict(B=b, H=h, P=MAMBA_P, N=N) for h in heads for b in GDN_DECODE_B]
    return sweep_locked(w, cases, measure, deadline)


# ---- GQA / sliding-window attention ---------------------------------------------------------------------

def attention_reference(q, k, v, window: int):
    """Causal attention with a window of `window` keys per query (window >= T: full), float64; q [B, T, Hq, D],
    k, v [B, T, Hkv, D]; query head h reads kv head h // (Hq / Hkv)."""
    import torch

    rep = q.shape[2] // k.shape[2]
    q, k, v = q.double(), k.double().repeat_interleave(rep, dim=2), v.double().repeat_interleave(rep, dim=2)
    T = q.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    i = torch.arange(T, device=q.device)
    keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def gqa_prefill_call(q, k, v, window: int):
    """q [1, T, Hq, D], k, v [1, T, Hkv, D] bf16 -> o [1, T, Hq, D]. Full (window >= T): SDPA's flash backend
    with enable_gqa (on [B, H, T, D] views); a window: aten._flash_attention_forward (FlashAttention-2's local
    attention, window_size_left = window - 1, right 0)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    T = q.shape[1]
    if window >= T and FULL_IMPL[0] == "sdpa_flash_gqa":
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True, enable_gqa=True)
            return o.transpose(1, 2)
        except RuntimeError as err:  # this torch's flash backend refuses GQA: the same kernel through aten
            print(f"[gqa_prefill] SDPA flash refused: {str(err)[:200]}; aten._flash_attention_forward instead", flush=True)
            FULL_IMPL[0] = "aten_flash"
    left = window - 1 if window < T else None
    return torch.ops.aten._flash_attention_forward(q, k, v, None, None, T, T, 0.0, True, False,
                                                   window_size_left=left, window_size_right=0 if left else None)[0]


FULL_IMPL = ["sdpa_flash_gqa"]  # becomes "aten_flash" if SDPA's flash backend refuses GQA (rows say which)


def _qkv(T: int, Hq: int, Hkv: int, D: int, seed: int):
    gen = _gen(seed)
    return _randn((1, T, Hq, D), gen), _randn((1, T, Hkv, D), gen), _randn((1, T, Hkv, D), gen)


def gqa_prefill(out_dir: Path, deadline: float, checks: Checks) -> int:
    from k3sim.calibration.timing import time_cuda

    failed = set()
    for Hq, Hkv, D in GQA_PREFILL_SHAPES:
        for window in (1 << 30, 100, 640):  # full, and windows shorter than the check's 1000 tokens
            name = f"T=1000 Hq={Hq} Hkv={Hkv} D={D} window={min(window, 1000)}"
            try:
                q, k, v = _qkv(1000, Hq, Hkv, D, seed=707)
                ok = checks.record("gqa_prefill_fwd", name,
                                   {"o": rel_err(gqa_prefill_call(q, k, v, window), attention_reference(q, k, v, window))})
            except Exception as err:  # noqa: BLE001
                ok = checks.failed("gqa_prefill_fwd", name, err)
            if not ok:
                failed.add((Hq, Hkv, D, window < 1000))
    w = OpWriter(out_dir, "gqa_prefill_fwd", OP_PARAMS["gqa_prefill_fwd"], ["impl", "flash"])

    def measure(T, Hq, Hkv, D, window):
        q, k, v = _qkv(T, Hq, Hkv, D, seed=0)
        t = time_cuda(lambda: gqa_prefill_call(q, k, v, window), budget_s=1.0)
        return t, {"impl": FULL_IMPL[0] if window >= T else "aten_flash_window", "flash": _flash_version()}

    cases = [dict(T=t, Hq=hq, Hkv=hkv, D=d, window=t) for (hq, hkv, d) in GQA_PREFILL_SHAPES for t in GQA_PREFILL_T
             if (hq, hkv, d, False) not in failed]
    cases += [dict(T=t, Hq=hq, Hkv=hkv, D=d, window=wd) for (hq, hkv, d) in SWA_SHAPES for wd in SWA_WINDOWS
              for t in SWA_T if wd < t and (hq, hkv, d, True) not in failed]
    return sweep_locked(w, cases, measure, deadline)


def _flash_version() -> str:
    try:
        from torch.nn.attention import _get_flash_version

        return str(_get_flash_version())
    except Exception:  # noqa: BLE001 - provenance only
        return "unknown"


def _has_paged_flash() -> bool:
    import torch

    return "block_table" in str(torch.ops.aten._flash_attention_forward.default._schema)


def gqa_decode_operands(B: int, C: int, Hq: int, Hkv: int, D: int, seed: int, page: int = PAGE_TOKENS) -> dict:
    """A paged cache of B requests x C tokens in `page`-token pages, pages in shuffled order; q [B, Hq, D]."""
    import torch

    gen = _gen(seed)
    pages = B * (-(-C // page))
    kc, vc = _randn((pages, page, Hkv, D), gen), _randn((pages, page, Hkv, D), gen)
    table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(B, -1)
    return dict(q=_randn((B, Hq, D), gen), k=kc, v=vc, table=table, C=C,
                cu_q=torch.arange(B + 1, device="cuda", dtype=torch.int32),
                cu_k=torch.arange(B + 1, device="cuda", dtype=torch.int32) * C)


def gqa_decode_call(ops: dict, impl: str):
    """One decode step's attention: 'fa2_paged' = FlashAttention-2 varlen with the block table (q rows = requests);
    'sdpa_contiguous' = SDPA's flash backend over each request's contiguous cache (ops['kd'], ops['vd'])."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "fa2_paged":
        return torch.ops.aten._flash_attention_forward(
            ops["q"], ops["k"], ops["v"], ops["cu_q"], ops["cu_k"], 1, ops["C"], 0.0, False, False,
            block_table=ops["table"])[0]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(ops["q"][:, :, None], ops["kd"], ops["vd"], enable_gqa=True)
    return o[:, :, 0]


def _contiguous_cache(ops: dict) -> None:
    """[B, Hkv, C, D] copies of the paged cache, in each request's page order (the sdpa_contiguous operands)."""
    B = ops["table"].shape[0]
    for name in ("k", "v"):
        pages = ops[name][ops["table"].long()]  # [B, pages, 256, Hkv, D]
        ops[name + "d"] = pages.reshape(B, -1, *pages.shape[-2:])[:, :ops["C"]].transpose(1, 2).contiguous()


def gqa_decode_reference(ops: dict):
    import torch

    B, Hq, D = ops["q"].shape
    outs = []
    for b in range(B):
        k = ops["k"][ops["table"][b].long()].reshape(-1, *ops["k"].shape[-2:])[:ops["C"]]
        v = ops["v"][ops["table"][b].long()].reshape(-1, *ops["v"].shape[-2:])[:ops["C"]]
        rep = Hq // k.shape[1]
        s = torch.einsum("hd,chd->hc", ops["q"][b].double(), k.double().repeat_interleave(rep, 1)) * D ** -0.5
        outs.append(torch.einsum("hc,chd->hd", s.softmax(-1), v.double().repeat_interleave(rep, 1)))
    return torch.stack(outs)


def gqa_decode_check(checks: Checks) -> str | None:
    """The implementation to time: fa2_paged if this torch has it and it passes, else sdpa_contiguous if it passes."""
    impls = (["fa2_paged"] if _has_paged_flash() else []) + ["sdpa_contiguous"]
    for impl in impls:
        ok = True
        for Hq, Hkv, D in ((16, 2, 256), (8, 1, 128), (64, 8, 128)):
            name = f"{impl} B=3 C=1000 Hq={Hq} Hkv={Hkv} D={D}"
            try:
                ops = gqa_decode_operands(3, 1000, Hq, Hkv, D, seed=808)
                if impl == "sdpa_contiguous":
                    _contiguous_cache(ops)
                ok &= checks.record("gqa_decode", name, {"o": rel_err(gqa_decode_call(ops, impl), gqa_decode_reference(ops))})
            except Exception as err:  # noqa: BLE001
                ok = checks.failed("gqa_decode", name, err)
        if ok:
            return impl
    return None


def gqa_decode(out_dir: Path, deadline: float, checks: Checks) -> int:
    from k3sim.calibration.graph_parts import GRAPH_EXTRAS, operand_sets, time_graph

    impl = gqa_decode_check(checks)
    if impl is None:
        return 0
    w = OpWriter(out_dir, "gqa_decode", OP_PARAMS["gqa_decode"], GRAPH_EXTRAS + ["impl", "page_tokens", "flash"])

    def measure(B, C, Hq, Hkv, D):
        kv = 2 * B * C * Hkv * D * 2
        sets = []
        for s in range(operand_sets(kv, cap=64)):
            ops = gqa_decode_operands(B, C, Hq, Hkv, D, seed=s)
            if impl == "sdpa_contiguous":
                _contiguous_cache(ops)
                del ops["k"], ops["v"]
            sets.append(ops)
        t, extras = time_graph([lambda o=o: gqa_decode_call(o, impl) for o in sets], budget_s=0.3)
        return t, dict(extras, impl=impl, page_tokens=PAGE_TOKENS if impl == "fa2_paged" else 0, flash=_flash_version())

    cases = [dict(B=b, C=c, Hq=hq, Hkv=hkv, D=d) for (hq, hkv, d) in GQA_DECODE_SHAPES for c in GQA_DECODE_C
             for b in GQA_DECODE_B if 2 * b * c * hkv * d * 2 <= MAX_KV_BYTES]
    return sweep_locked(w, cases, measure, deadline)


# ---- paged GQA decode: our Triton split-KV kernel over a block table -------------------------------------

_PAGED_KERNELS: list = []
PAGED_WARPS, PAGED_STAGES = 4, 2  # harness choice


def _paged_kernels():
    """(partial, merge) Triton kernels, built on first use (triton is imported only on the GPU machine).

    partial: program (b, h, s) = request b, KV head h, split s. It loads the G query heads of h's group (padded to
    GP >= 16 rows for the tensor cores), walks pages [s * pps, (s + 1) * pps) of the request through the block
    table, one PAGE-token page per step: scores q k^T scaled, masked past the request's length, an online softmax
    (running max m, sum l), acc += p v. One split writes the output itself; several write acc / l and the
    log-sum-exp m + log l of each split (fp32), and merge (program = one request and query head) combines them
    weighted by exp(lse_s - max lse) (the flash-decoding reduction, Dao et al. 2023)."""
    if _PAGED_KERNELS:
        return _PAGED_KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def partial(q, k_cache, v_cache, table, lens, o_part, lse_part, o, scale, HQ, HKV, stride_tb, pps, splits,
                D: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, PAGE: tl.constexpr):
        b, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        n = tl.arange(0, PAGE)
        gm = g < G
        qrow = b * HQ + h * G + g
        qt = tl.load(q + qrow[:, None] * D + d[None, :], mask=gm[:, None], other=0.0)
        L = tl.load(lens + b)
        p0 = s * pps
        p1 = tl.minimum(p0 + pps, tl.cdiv(L, PAGE))
        m = tl.full([GP], float("-inf"), tl.float32)
        l = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for p in range(p0, p1):
            page = tl.load(table + b * stride_tb + p).to(tl.int64)
            off = ((page * PAGE + n)[:, None] * HKV + h) * D + d[None, :]
            kt = tl.load(k_cache + off)
            sc = tl.dot(qt, tl.trans(kt)) * scale
            sc = tl.where((p * PAGE + n < L)[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            alpha = tl.exp(m - m_new)
            pr = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(pr, 1)
            vt = tl.load(v_cache + off)
            acc = acc * alpha[:, None] + tl.dot(pr.to(vt.dtype), vt)
            m = m_new
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        if splits == 1:
            tl.store(o + qrow[:, None] * D + d[None, :], out.to(o.dtype.element_ty), mask=gm[:, None])
        else:
            row = qrow.to(tl.int64) * splits + s
            tl.store(o_part + row[:, None] * D + d[None, :], out, mask=gm[:, None])
            tl.store(lse_part + row, tl.where(l > 0, m + tl.log(l), float("-inf")), mask=gm)

    @triton.jit
    def merge(o_part, lse_part, o, splits, D: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, D)
        m = tl.full([1], float("-inf"), tl.float32)
        l = tl.zeros([1], tl.float32)
        acc = tl.zeros([D], tl.float32)
        for s in range(0, splits):
            lse = tl.load(lse_part + r * splits + s + tl.zeros([1], tl.int64))
            m_new = tl.maximum(m, lse)
            live = m_new > float("-inf")
            alpha = tl.where(live, tl.exp(m - m_new), 0.0)
            beta = tl.where(live, tl.exp(lse - m_new), 0.0)
            acc = acc * alpha + tl.load(o_part + (r * splits + s) * D + d) * beta
            l = l * alpha + beta
            m = m_new
        tl.store(o + r * D + d, (acc / l).to(o.dtype.element_ty))

    _PAGED_KERNELS.extend([partial, merge])
    return _PAGED_KERNELS


def paged_splits(B: int, Hkv: int, pages: int, sms: int = 132) -> tuple[int, int]:
    """(splits, pages per split) of one call: enough programs for two per SM (B x Hkv x splits >= 2 x SMs), at
    most 128 splits, every split non-empty (splits = ceil(pages / pages per split))."""
    want = max(1, min(pages, 128, -(-2 * sms // max(1, B * Hkv))))
    pps = -(-pages // want)
    return -(-pages // pps), pps


def paged_decode_call(ops: dict) -> object:
    """One decode step's attention over the paged cache: q [B, Hq, D] -> o [B, Hq, D] (bf16)."""
    partial, merge = _paged_kernels()
    q, kc = ops["q"], ops["k"]
    B, Hq, D = q.shape
    Hkv = kc.shape[2]
    G = Hq // Hkv
    splits, pps = ops["splits"], ops["pps"]
    o = ops["o"]
    partial[(B, Hkv, splits)](q, kc, ops["v"], ops["table"], ops["lens"], ops["o_part"], ops["lse"], o, D ** -0.5,
                              Hq, Hkv, ops["table"].stride(0), pps, splits, D=D, G=G, GP=max(16, 1 << (G - 1).bit_length()),
                              PAGE=kc.shape[1], num_warps=PAGED_WARPS, num_stages=PAGED_STAGES)
    if splits > 1:
        merge[(B * Hq,)](ops["o_part"], ops["lse"], o, splits, D=D, num_warps=1)
    return o


def paged_decode_operands(B: int, C: int, Hq: int, Hkv: int, D: int, seed: int, page: int = PAGED_PAGE_TOKENS) -> dict:
    """gqa_decode_operands' cache in `page`-token pages (shuffled), plus the lengths, split plan and buffers."""
    import torch

    ops = gqa_decode_operands(B, C, Hq, Hkv, D, seed, page=page)
    pages = ops["table"].shape[1]
    splits, pps = paged_splits(B, Hkv, pages, torch.cuda.get_device_properties(0).multi_processor_count)
    ops.update(lens=torch.full((B,), C, device="cuda", dtype=torch.int32), splits=splits, pps=pps,
               o=torch.empty((B, Hq, D), device="cuda", dtype=torch.bfloat16),
               o_part=torch.empty((B * Hq * splits, D) if splits > 1 else (1, D), device="cuda", dtype=torch.float32),
               lse=torch.empty((B * Hq * splits,) if splits > 1 else (1,), device="cuda", dtype=torch.float32))
    return ops


def paged_decode_check(checks: Checks) -> bool:
    """Against the float64 softmax over the gathered pages: D 256 and 128, one and several splits, lengths that end
    inside a page (1000 = 15 pages + 40 tokens; 700; 200), the output poisoned first."""
    ok = True
    # splits 16, 16, 16, 2 and 1 (paged_splits on 132 SMs)
    for B, C, Hq, Hkv, D in ((3, 1000, 16, 2, 256), (3, 1000, 8, 1, 128), (2, 4096, 64, 8, 128), (96, 700, 16, 2, 256),
                             (160, 200, 8, 2, 128)):
        name = f"B={B} C={C} Hq={Hq} Hkv={Hkv} D={D}"
        try:
            ops = paged_decode_operands(B, C, Hq, Hkv, D, seed=909)
            ops["o"].fill_(float("nan"))
            ok &= checks.record("gqa_decode_paged", name + f" splits={ops['splits']}",
                                {"o": rel_err(paged_decode_call(ops), gqa_decode_reference(ops))})
        except Exception as err:  # noqa: BLE001
            ok = checks.failed("gqa_decode_paged", name, err)
    return ok


def gqa_decode_paged(out_dir: Path, deadline: float, checks: Checks) -> int:
    from k3sim.calibration.graph_parts import GRAPH_EXTRAS, operand_sets, time_graph

    if not paged_decode_check(checks):
        return 0
    w = OpWriter(out_dir, "gqa_decode_paged", OP_PARAMS["gqa_decode_paged"],
                 GRAPH_EXTRAS + ["impl", "page_tokens", "splits"])

    def measure(B, C, Hq, Hkv, D):
        sets = [paged_decode_operands(B, C, Hq, Hkv, D, seed=s) for s in range(operand_sets(2 * B * C * Hkv * D * 2, cap=64))]
        t, extras = time_graph([lambda o=o: paged_decode_call(o) for o in sets], budget_s=0.3)
        return t, dict(extras, impl="triton_paged_splitkv", page_tokens=PAGED_PAGE_TOKENS, splits=sets[0]["splits"])

    cases = [dict(B=b, C=c, Hq=hq, Hkv=hkv, D=d) for c in GQA_PAGED_C for b in GQA_PAGED_B
             for (hq, hkv, d) in GQA_DECODE_SHAPES if 2 * b * c * hkv * d * 2 <= MAX_KV_BYTES]
    return sweep_locked(w, cases, measure, deadline)


# ---- router and shared-expert gate ----------------------------------------------------------------------

def router_call(logits, topk: int):
    """vLLM's fused_topk for a softmax router with norm_topk_prob (Qwen3-Next), in torch: fp32 softmax, top-k,
    weights renormalised over the k picked."""
    import torch

    w, ids = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), topk, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def router(out_dir: Path, deadline: float, checks: Checks) -> int:
    import torch

    from k3sim.calibration.graph_parts import GRAPH_EXTRAS, operand_sets, time_graph

    logits = _randn((333, 512), _gen(909))
    w, ids = router_call(logits, 10)
    ref = torch.softmax(logits.double(), -1)
    rw, rids = torch.topk(ref, 10, dim=-1)
    same = float((ids == rids).float().mean())
    if not checks.record("router_softmax_topk", "T=333 E=512 topk=10",
                         {"weights": rel_err(w, rw / rw.sum(-1, keepdim=True)), "ids_mismatch": 1.0 - same}):
        return 0
    x, y, wg = _randn((333, 2048), _gen(1)), _randn((333, 2048), _gen(2)), _randn((2048, 1), _gen(3))
    if not checks.record("shared_expert_gate", "T=333 D=2048",
                         {"out": rel_err(torch.sigmoid(x @ wg) * y, torch.sigmoid(x.double() @ wg.double()) * y.double())}):
        return 0
    wr = OpWriter(out_dir, "router_softmax_topk", OP_PARAMS["router_softmax_topk"], GRAPH_EXTRAS)

    def measure_router(T, E, topk):
        sets = [_randn((T, E), _gen(s)) for s in range(operand_sets(T * E * 2, cap=64))]
        return time_graph([lambda lg=lg: router_call(lg, topk) for lg in sets], budget_s=0.2)

    n = sweep_locked(wr, [dict(T=t, E=e, topk=k) for (e, k) in ROUTER_SHAPES for t in ROUTER_T], measure_router, deadline)
    wg_ = OpWriter(out_dir, "shared_expert_gate", OP_PARAMS["shared_expert_gate"], GRAPH_EXTRAS)

    def measure_gate(T, D):
        sets = [(_randn((T, D), _gen(s)), _randn((T, D), _gen(s + 99)), _randn((D, 1), _gen(s + 7)))
                for s in range(operand_sets(2 * T * D * 2, cap=64))]
        return time_graph([lambda s=s: torch.sigmoid(s[0] @ s[2]) * s[1] for s in sets], budget_s=0.2)

    return n + sweep_locked(wg_, [dict(T=t, D=d) for d in SHARED_GATE_D for t in ROUTER_T], measure_gate, deadline)


# ---- fla families: parallel warm-up, then measurement as each family is ready ---------------------------

def family_specs(gdn: list[tuple[int, int]], mamba_heads: list[int], n256_heads: list[int] | None = None) -> list[str]:
    """'gdn:Hk:H', 'mamba2:H' and 'mamba2n256:H' (d_state 256, forward only): one warm-up process each."""
    n256 = MAMBA_N256_HEADS if n256_heads is None else n256_heads
    return [f"gdn:{hk}:{h}" for hk, h in gdn] + [f"mamba2:{h}" for h in mamba_heads] + [f"mamba2n256:{h}" for h in n256]


def _marker(warm_dir: Path, spec: str, state: str) -> Path:
    return warm_dir / f"{spec.replace(':', '-')}.{state}"


def warm(spec: str, warm_dir: Path) -> None:
    """Compile and autotune one family: the forward at T_WARM (and GDN's decode kernel), marker <spec>.fwd; then
    the forward+backward at T_WARM, marker <spec>.done; <spec>.failed on an error. Runs in its own process, its
    benchmarks under the GPU lock."""
    import torch

    install_bench_lock()
    t0 = time.monotonic()
    kind, *nums = spec.split(":")
    try:
        if kind == "gdn":
            Hk, H = int(nums[0]), int(nums[1])
            chunk = _fla_gdn()
            with torch.no_grad():
                chunk(**gdn_inputs(T_WARM, H, Hk), output_final_state=True, use_qk_l2norm_in_kernel=True)
            x, state, o1 = _decode_operands(2, H, Hk, seed=1)
            gdn_decode_step(**x, state=state, o=o1)
            torch.cuda.synchronize()
            _marker(warm_dir, spec, "fwd").write_text(f"{time.monotonic() - t0:.1f}\n")
            o, _ = chunk(**gdn_inputs(T_WARM, H, Hk, grad=True), use_qk_l2norm_in_kernel=True)
        else:
            H, N = int(nums[0]), MAMBA_N256 if kind == "mamba2n256" else MAMBA_N
            gla = _fla_simple_gla()
            with torch.no_grad():
                gla(**ssd_as_gla(**mamba2_ssd_inputs(T_WARM, H, **_mamba_shape(N))), scale=1.0, output_final_state=True)
            torch.cuda.synchronize()
            _marker(warm_dir, spec, "fwd").write_text(f"{time.monotonic() - t0:.1f}\n")
            if N != MAMBA_N:  # d_state 256: the forward only is timed
                _marker(warm_dir, spec, "done").write_text(f"{time.monotonic() - t0:.1f}\n")
                print(f"[warm] {spec}: {time.monotonic() - t0:.1f}s", flush=True)
                return
            o, _ = gla(**ssd_as_gla(**mamba2_ssd_inputs(T_WARM, H), grad=True), scale=1.0)
        o.backward(torch.randn_like(o))
        torch.cuda.synchronize()
        _marker(warm_dir, spec, "done").write_text(f"{time.monotonic() - t0:.1f}\n")
    except Exception as err:  # noqa: BLE001 - the measuring process reads the marker
        _marker(warm_dir, spec, "failed").write_text(f"{type(err).__name__}: {str(err)[:500]}\n")
    print(f"[warm] {spec}: {time.monotonic() - t0:.1f}s", flush=True)


def start_warm(specs: list[str], warm_dir: Path) -> list:
    """One process per family; their output goes to warm_dir/<spec>.log."""
    warm_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for spec in specs:
        log = open(_marker(warm_dir, spec, "log"), "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "k3sim.calibration.hybrid_ops", "--warm", spec,
                                       "--warm-dir", str(warm_dir), "--out", str(warm_dir)],
                                      stdout=log, stderr=subprocess.STDOUT))
    return procs


def next_ready(specs: list[str], warm_dir: Path | None, deadline: float, stage: str) -> tuple[str | None, str]:
    """The first of `specs` whose warm-up reached `stage` ('fwd' or 'done') or failed, waiting until the deadline."""
    while True:
        for spec in specs:
            if warm_dir is None or _marker(warm_dir, spec, stage).exists() or _marker(warm_dir, spec, "done").exists():
                return spec, "ready"
            if _marker(warm_dir, spec, "failed").exists():
                return spec, _marker(warm_dir, spec, "failed").read_text().strip()
        if time.monotonic() > deadline:
            return None, "deadline"
        time.sleep(1.0)


def measure_family(part: str, spec: str, out_dir: Path, checks: Checks, deadline: float, lengths: list[int]) -> int:
    """Check, then time one family's ops of `part`, each sweep in its share of the family's time."""
    nums = [int(v) for v in spec.split(":")[1:]]
    t0 = time.monotonic()
    mid = t0 + 0.6 * (deadline - t0)
    n = 0
    if part == "gdn_fwd":
        Hk, H = nums
        if _guarded(checks, "chunk_gdn_fwd", spec, lambda: gdn_check_fwd(checks, H, Hk)):
            n += gdn_fwd(out_dir, mid, H, Hk, lengths)
        if _guarded(checks, "recurrent_gdn_decode", spec, lambda: gdn_check_decode(checks, H, Hk)):
            n += gdn_decode(out_dir, deadline, H, Hk, GDN_DECODE_B)
    elif part == "gdn_bwd":
        Hk, H = nums
        if _guarded(checks, "chunk_gdn_fwd_bwd", spec, lambda: gdn_check_bwd(checks, H, Hk)):
            n += gdn_fwd_bwd(out_dir, deadline, H, Hk, lengths)
    elif part == "mamba2_fwd":
        if _guarded(checks, "mamba2_chunk_fwd", spec, lambda: mamba2_check_fwd(checks, nums[0])):
            n += mamba2_chunk(out_dir, deadline, nums[0], lengths, backward=False)
    elif part == "mamba2n256_fwd":
        if _guarded(checks, "mamba2_chunk_fwd", spec, lambda: mamba2_check_fwd(checks, nums[0], N=MAMBA_N256)):
            n += mamba2_chunk(out_dir, deadline, nums[0], lengths, backward=False, N=MAMBA_N256)
    elif _guarded(checks, "mamba2_chunk_fwd_bwd", spec, lambda: mamba2_check_bwd(checks, nums[0])):
        n += mamba2_chunk(out_dir, deadline, nums[0], lengths, backward=True)
    return n


def _guarded(checks: Checks, op: str, spec: str, check) -> bool:
    import torch

    try:
        return bool(check())
    except Exception as err:  # noqa: BLE001 - the family is not timed; the run goes on
        return checks.failed(op, spec, err)
    finally:
        torch.cuda.empty_cache()


def fla_part(part: str, out_dir: Path, deadline: float, checks: Checks, specs: list[str], warm_dir: Path | None,
             lengths: list[int]) -> int:
    """Measure each family of `part` ('gdn_fwd', 'gdn_bwd', 'mamba2_fwd', 'mamba2_bwd') as its warm-up reaches the
    stage the part needs, sharing the part's time among the families left."""
    kind, stage = part.split("_")[0], "fwd" if part.endswith("_fwd") else "done"
    left = [s for s in specs if s.startswith(kind + ":")]
    n = 0
    while left:
        spec, state = next_ready(left, warm_dir, deadline, stage)
        if spec is None:
            print(f"[{part}] warm-up not finished by the deadline: {left}", flush=True)
            break
        left.remove(spec)
        if state != "ready":
            checks.failed(part, spec, RuntimeError(f"warm-up failed: {state}"))
            continue
        share = (deadline - time.monotonic()) / (len(left) + 1)
        t0 = time.monotonic()
        n += measure_family(part, spec, out_dir, checks, time.monotonic() + share, lengths)
        print(f"[{part}] {spec}: {time.monotonic() - t0:.0f}s", flush=True)
    return n


# ---- driver ---------------------------------------------------------------------------------------------

# The forward parts first (their warm-up ends first), the torch parts while the backward kernels compile.
# Issue 23 item 4's remainder (run 20261203-1gpu-hybrid-d): the paged decode and d_state 256 parts.
PARTS = ["gdn_fwd", "mamba2_fwd", "mamba2_decode", "router", "gqa_prefill", "gqa_decode", "gdn_bwd", "mamba2_bwd",
         "gqa_decode_paged", "mamba2_decode_n256", "mamba2n256_fwd"]
PART_BUDGETS = {"gdn_fwd": 120, "mamba2_fwd": 40, "mamba2_decode": 25, "router": 25, "gqa_prefill": 80,
                "gqa_decode": 60, "gdn_bwd": 120, "mamba2_bwd": 60, "gqa_decode_paged": 110, "mamba2_decode_n256": 30,
                "mamba2n256_fwd": 60}
FLA_PARTS = ("gdn_fwd", "gdn_bwd", "mamba2_fwd", "mamba2_bwd", "mamba2n256_fwd")


def read_done(run_dir: Path) -> dict[str, set]:
    """op -> parameter tuples (as text) with an ok row in an earlier run's CSVs (--resume-from)."""
    from k3sim.calibration.records import read_done as done_rows

    return done_rows(run_dir, OP_PARAMS)


def run(out_dir: Path, parts: list[str], budget_s: float, budgets: dict[str, float], specs: list[str],
        lengths: list[int], warm_workers: bool = True) -> None:
    from k3sim.calibration.records import provenance, write_provenance

    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    kinds = {p.split("_")[0] for p in parts if p in FLA_PARTS}
    fla_specs = [s for s in specs if s.split(":")[0] in kinds]
    warm_dir = out_dir.parent / f"{out_dir.name}-warm" if warm_workers and fla_specs else None
    procs = start_warm(fla_specs, warm_dir) if warm_dir else []
    info = provenance(" ".join(shlex.quote(a) for a in sys.argv), 1, parts)
    info["timing"] = ("chunk_* and gqa_prefill_fwd: timing.time_cuda (CUDA events, L2 flushed by a 256 MiB write "
                      "before each repetition, launch headroom; rows without a timer column); decode, router and gate "
                      "ops: graph_parts.time_graph (CUDA-graph replay over operand copies >= 3x the L2; rows timer=graph)")
    info["flash_attention"] = _flash_version()
    info["fla_families"] = ",".join(fla_specs)
    write_provenance(out_dir, info)
    checks = Checks(out_dir)
    try:
        for part in parts:
            left = budget_s - (time.monotonic() - start)
            reserve = sum(budgets.get(p, PART_BUDGETS[p]) for p in parts[parts.index(part) + 1:])
            # an fla part may run past its own budget into time the later parts do not need (it ends when done)
            share = left - reserve if part in FLA_PARTS else min(left - reserve, budgets.get(part, PART_BUDGETS[part]))
            deadline = time.monotonic() + max(0.0, share)
            t0 = time.monotonic()
            try:
                n = _run_part(part, out_dir, deadline, checks, fla_specs, warm_dir, lengths)
            except Exception as err:  # noqa: BLE001 - one part failing must not lose the others
                print(f"[hybrid] {part}: FAILED {type(err).__name__}: {err}", flush=True)
                n = 0
            print(f"[hybrid] {part}: {n} rows in {time.monotonic() - t0:.0f}s (run {time.monotonic() - start:.0f}s)",
                  flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    info["elapsed_s"] = round(time.monotonic() - start, 1)
    write_provenance(out_dir, info)


def _run_part(part: str, out_dir: Path, deadline: float, checks: Checks, specs: list[str], warm_dir: Path | None,
              lengths: list[int]) -> int:
    if part == "mamba2_decode":
        return mamba2_decode(out_dir, deadline, checks)
    if part == "router":
        return router(out_dir, deadline, checks)
    if part == "gqa_prefill":
        return gqa_prefill(out_dir, deadline, checks)
    if part == "gqa_decode":
        return gqa_decode(out_dir, deadline, checks)
    if part == "gqa_decode_paged":
        return gqa_decode_paged(out_dir, deadline, checks)
    if part == "mamba2_decode_n256":
        return mamba2_decode(out_dir, deadline, checks, N=MAMBA_N256)
    return fla_part(part, out_dir, deadline, checks, specs, warm_dir, lengths)


def parse_families(text: str) -> list[tuple[int, int]]:
    """'16:32,16:64' -> [(16, 32), (16, 64)] (key heads : value heads); H must be a multiple of Hk."""
    from k3sim.errors import InputError

    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        try:
            hk, h = (int(v) for v in item.split(":"))
        except ValueError:
            raise InputError(f"expected KEY_HEADS:VALUE_HEADS, got {item!r}", source="--gdn-families") from None
        if hk <= 0 or h <= 0 or h % hk:
            raise InputError(f"value heads must be a positive multiple of key heads, got {item!r}",
                             source="--gdn-families")
        out.append((hk, h))
    return out


def main(argv: list[str] | None = None) -> None:
    from k3sim.calibration.runner import _budgets, _int_list
    from k3sim.errors import InputError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget-s", type=float, default=float(sum(PART_BUDGETS.values())))
    ap.add_argument("--part-budgets", default="", help="e.g. gdn=200,gqa_prefill=60 (defaults: PART_BUDGETS)")
    ap.add_argument("--gdn-families", default="", help="KEY:VALUE head pairs, e.g. 16:32,16:64 (default: all 8)")
    ap.add_argument("--mamba-heads", default="", help="Mamba2 heads per rank, e.g. 128,64 (default: 128,64,32,16)")
    ap.add_argument("--n256-heads", default="", help="Mamba2 heads per rank at d_state 256 (default: 256,128,64,32)")
    ap.add_argument("--lengths", default="", help="tokens of the chunk ops (default: 2K-64K)")
    ap.add_argument("--resume-from", type=Path, action="append", default=[],
                    help="an earlier run directory (repeatable): shapes it measured ok are skipped")
    ap.add_argument("--no-warm", action="store_true", help="no parallel warm-up processes (a warm Triton cache)")
    ap.add_argument("--warm", default="", help=argparse.SUPPRESS)  # internal: one family's warm-up process
    ap.add_argument("--warm-dir", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.warm:
        warm(a.warm, a.warm_dir)
        return
    try:
        parts = [p.strip() for p in a.parts.split(",") if p.strip()]
        bad = [p for p in parts if p not in PARTS]
        if bad or not parts:
            raise InputError(f"unknown part(s) {bad or [a.parts]}; choose from {PARTS}", source="--parts")
        if not 0 < a.budget_s < float("inf"):
            raise InputError(f"must be a positive number of seconds, got {a.budget_s}", source="--budget-s")
        budgets = _budgets(a.part_budgets)
        unknown = sorted(set(budgets) - set(parts))
        if unknown:
            raise InputError(f"budgets given for parts not run: {unknown}", source="--part-budgets")
        specs = family_specs(parse_families(a.gdn_families) or GDN_FAMILIES,
                             _int_list(a.mamba_heads, "--mamba-heads") or MAMBA_HEADS,
                             _int_list(a.n256_heads, "--n256-heads") or MAMBA_N256_HEADS)
        for run_dir in a.resume_from:
            for op, done in read_done(run_dir).items():
                RESUME.setdefault(op, set()).update(done)
        run(a.out, parts, a.budget_s, budgets, specs, _int_list(a.lengths, "--lengths") or GDN_T, not a.no_warm)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
