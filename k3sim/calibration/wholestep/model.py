"""Random-weight bf16 model with the exact per-rank shapes of a `StepSpec` (GPU side; needs torch + fla).

Kernels are the ones the calibration harness measures, called the same way:
- KDA: fla `fused_recurrent_kda` (decode, `kda_ops.recurrent_decode`'s arguments) and `chunk_kda`
  (prefill/train, `kda_ops.KDA_OPTIONS`, from an `initial_state` when a prefix is cached); fla's
  `causal_conv1d` / `causal_conv1d_update` for the short conv; fla's `rms_norm_gated` (sigmoid) for o_norm.
- MLA decode: helper H4's split-K Triton kernel `mla_decode.MLADecode` (one instance per (B, C, H), its
  buffers reused by the captured graph); without triton (CPU tests) its `torch_decode` (two batched
  GEMMs and a softmax over the latent cache).
- MLA prefill/train: up-projected keys/values (kv_b), torch SDPA (flash backend: v padded to the q/k
  head dim, as vLLM pads v for FlashAttention), causal with lower-right alignment when a prefix is cached.
- Norms, SwiGLU, router top-k, embedding: helper H4's `k3sim.calibration.decode_ops` where it has a
  function of that name, else plain torch with the same semantics (`IMPL` records which ran).
- Projections: cuBLAS `x @ w` with w stored [K, N]; routed experts: `torch._grouped_mm` as
  `torch_ops.moe_grouped_bf16` calls it (weights (E, N, K) transposed), or H4's token-centric MXFP4
  kernel (`mxfp4.MXFP4Experts`, random codes in its layout; `mxfp4.route` metadata, in which the
  picks on other EP ranks sort last and their slot is dropped, so only local experts' weights stream).
- Residual adds out of place (`x + y`): decode_ops' in-place add moves the same bytes, but would
  overwrite a slice's static input buffer between graph replays and break autograd in training.

Qwen3-Next's mixers (Gated DeltaNet, gated GQA), its softmax router and gated shared expert: `hybrid.py`.

Every op call goes through `Recorder.op(...)`, so one traced eager call gives the kernel list actually
run, which `run.py` compares with `spec.manifest` (the CPU-side list the analytical model is checked
against).

MoE routing is capturable in a CUDA graph (no host sync): sigmoid scores + a score-correction bias,
top-k, renormalise; picks sorted by local expert (other EP ranks' picks sort last), group ends by
cumsum; only the first `spec.moe_rows` sorted picks (all of them without EP; under EP the expected
local count plus six standard deviations) are gathered, computed and combined (fp32 index_add), as
the picks an all-to-all would deliver to this rank; the grouped GEMM computes rows up to the last
group end only.
"""

from __future__ import annotations

import math
import os

from k3sim.calibration.wholestep import spec as S
from k3sim.calibration.wholestep.hybrid import HybridMixers

NORM_EPS = 1e-6


class Recorder:
    """Collects (op, params) of every kernel call while `on`; costs nothing when off."""

    def __init__(self):
        self.on = False
        self.ops: list[dict] = []

    def op(self, op: str, **params) -> None:
        if self.on:
            self.ops.append({"op": op, "params": params})


def _impls():
    """Which implementation serves each small op: H4's decode_ops where present, else torch."""
    try:
        from k3sim.calibration import decode_ops  # helper H4's module (may not exist yet)
    except Exception:  # noqa: BLE001 - absent or broken: fall back to torch
        decode_ops = None
    names = ["rmsnorm", "silu_mul", "router_topk", "embedding"]  # same signatures as the torch fallbacks
    return {n: (getattr(decode_ops, n) if decode_ops is not None and hasattr(decode_ops, n) else None) for n in names}


def _drop_grad(p) -> None:
    p.grad = None


def fla_ops():
    """fla's kernels the model calls (one place, so CPU tests can hand in stand-ins with the same API)."""
    from types import SimpleNamespace

    os.environ.setdefault("FLA_FLASH_KDA", "0")  # fla's Triton kernels, as the harness measures them
    from fla.modules.causal_conv1d.ops import causal_conv1d, causal_conv1d_update
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    from k3sim.calibration import hybrid_ops  # GDN: the measured chunk call and the in-place decode launch

    return SimpleNamespace(causal_conv1d=causal_conv1d, causal_conv1d_update=causal_conv1d_update,
                           rms_norm_gated=rms_norm_gated, chunk_kda=chunk_kda, fused_recurrent_kda=fused_recurrent_kda,
                           chunk_gated_delta_rule=hybrid_ops._fla_gdn(), gdn_decode=hybrid_ops.gdn_decode_step)


class WholeStepModel(HybridMixers):
    """Weights and kernels of one rank. `grad=True` makes weights trainable leaves (training step).
    `fla` and `device` exist for CPU tests (stand-in kernels); a measurement uses the defaults."""

    def __init__(self, spec: S.StepSpec, *, expert_kernel: str = "grouped_bf16", grad: bool = False, seed: int = 0,
                 fla=None, device: str = "cuda", free_grads: bool = False):
        import torch

        self.spec, self.expert_kernel, self.grad = spec, expert_kernel, grad
        # free_grads: each weight gradient is dropped as soon as autograd has accumulated it (the
        # optimizer-in-backward memory pattern), so a model whose weights fit but whose weights plus
        # gradients do not (Kimi-Linear-48B whole: 2 x 96 GB) still runs every weight-gradient kernel.
        self.free_grads = free_grads
        self.fla = fla if fla is not None else fla_ops()
        self.rec = Recorder()
        self._rows: dict = {}
        self.params: list = []  # trainable leaves (grad=True): their .grad is reset between repetitions
        self.torch = torch
        self.dev = device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.fns = _impls()
        self.impl = {n: ("decode_ops" if f is not None else "torch") for n, f in self.fns.items()}
        self.md, self.mla_kernel = self._mla_kernel()
        self.impl["mla_decode"] = "mla_decode.MLADecode" if self.mla_kernel else "torch"
        self._mla_inst: dict = {}
        self._bufs: dict = {}
        self.mxfp4 = self._mxfp4() if expert_kernel == "mxfp4" else None
        self.impl["routed_experts"] = "mxfp4.MXFP4Experts" if self.mxfp4 else "torch._grouped_mm"
        d = spec.hidden
        self.layers = []
        for r in spec.layers:
            layer = {"index": r["index"], "attn": r["attn"], "ffn": r["ffn"], "norm1": self._ones(d), "norm2": self._ones(d)}
            layer.update({"kda": self._kda_weights, "mla": self._mla_weights, "gdn": self._gdn_weights,
                          "gqa": self._gqa_weights}[r["attn"]]())
            layer.update(self._dense_weights() if r["ffn"] == "dense" else self._moe_weights())
            self.layers.append(layer)
        if spec.embed_head:
            self.embed = self._w(spec.vocab_local, d, std=1.0)
            self.final_norm = self._ones(d)
            self.head = self._w(d, spec.vocab_local)

    # ------------------------------------------------------------------ weights (random, never zeros)
    def _w(self, *shape, std: float | None = None, dtype=None, leaf: bool = True):
        torch = self.torch
        std = std if std is not None else 1.0 / math.sqrt(shape[-2] if len(shape) >= 2 else shape[-1])
        t = torch.empty(shape, device=self.dev, dtype=dtype or torch.bfloat16).normal_(0.0, std, generator=self.gen)
        return self._leaf(t) if leaf else t

    def _leaf(self, t):
        if self.grad:
            t.requires_grad_(True)
            self.params.append(t)
            if self.free_grads:
                t.register_post_accumulate_grad_hook(_drop_grad)
        return t

    def _ones(self, n):
        # Norm weights around 1 (random, not constant): RMSNorm gains as a trained model has them.
        torch = self.torch
        t = torch.empty(n, device=self.dev, dtype=torch.bfloat16).normal_(1.0, 0.02, generator=self.gen)
        return self._leaf(t)

    def _kda_weights(self):
        torch = self.torch
        k, d = self.spec.kda, self.spec.hidden
        hk = k.heads * k.head_dim
        w = {"w_qkv": self._w(d, 3 * hk), "conv_w": self._w(3 * hk, k.conv, std=0.5), "w_b": self._w(d, k.heads),
             "A_log": torch.empty(k.heads, device=self.dev).uniform_(0.0, 1.0, generator=self.gen),
             "dt_bias": torch.empty(hk, device=self.dev).normal_(0.0, 0.5, generator=self.gen),
             "o_norm": self._ones(k.head_dim), "w_o": self._w(hk, d)}
        if k.gate_rank is None:
            w["w_f"] = self._w(d, hk)
        else:
            w["w_fa"], w["w_fb"] = self._w(d, k.gate_rank), self._w(k.gate_rank, hk)
        if k.out_gate_rank is None:
            w["w_g"] = self._w(d, hk)
        else:
            w["w_ga"], w["w_gb"] = self._w(d, k.out_gate_rank), self._w(k.out_gate_rank, hk)
        return w

    def _mla_weights(self):
        m, d = self.spec.mla, self.spec.hidden
        H, qk, kv_a = m.heads, m.nope + m.rope, m.kv_lora + m.rope
        w = {"kv_norm": self._ones(m.kv_lora), "w_kvb": self._w(m.kv_lora, H * (m.nope + m.v)), "w_o": self._w(H * m.v, d)}
        if m.q_lora is None:
            w["w_q"], w["w_kva"] = self._w(d, H * qk), self._w(d, kv_a)
        else:
            w["w_qkva"], w["q_norm"], w["w_qb"] = self._w(d, m.q_lora + kv_a), self._ones(m.q_lora), self._w(m.q_lora, H * qk)
        if m.out_gate:
            w["w_gate"] = self._w(d, H * m.v)
        if not self.grad:
            # Absorbed decode weights, materialised once as vLLM does (W_UK^T per head, W_UV per head).
            kvb = w["w_kvb"].detach().view(m.kv_lora, H, m.nope + m.v)
            w["w_uk"] = kvb[:, :, :m.nope].permute(1, 2, 0).contiguous()   # [H, nope, kv_lora]
            w["w_uv"] = kvb[:, :, m.nope:].permute(1, 0, 2).contiguous()   # [H, kv_lora, v]
        return w

    def _dense_weights(self):
        d, f = self.spec.hidden, self.spec.dense_width
        return {"w_gu": self._w(d, 2 * f), "w_dn": self._w(f, d)}

    def _moe_weights(self):
        torch = self.torch
        e, d = self.spec.moe, self.spec.hidden
        xw = e.latent or d
        w = {} if e.router == "softmax" else {
            "router_bias": torch.empty(e.experts, device=self.dev).normal_(0.0, 0.01, generator=self.gen)}
        if e.latent:
            w["w_lat_router"] = self._w(d, e.latent + e.experts)
            w["w_up"] = self._w(e.latent, d)
            if e.latent_norm:
                w["lat_norm"] = self._ones(e.latent)
        else:
            w["w_router"] = self._w(d, e.experts)
        if self.mxfp4 is not None:
            w["experts"] = self.mxfp4.MXFP4Experts.random(e.experts_local, xw, e.width, self.dev,
                                                           seed=int(torch.randint(0, 2 ** 31, (1,), generator=self.gen, device=self.dev)))
        else:
            # (E, N, K) then a transposed view, as torch_ops.moe_grouped_bf16 lays them out.
            # With free_grads the transposed view is itself the leaf (no transpose node between the
            # grouped GEMM's weight gradient and the leaf: with one, the H200 run kept each layer's
            # expert gradients alive through the backward although .grad was dropped).
            t = (lambda a: self._leaf(a.detach().transpose(-2, -1))) if self.free_grads else (lambda a: a.transpose(-2, -1))
            w["e_gu"] = t(self._w(e.experts_local, 2 * e.width, xw, std=1.0 / math.sqrt(xw), leaf=not self.free_grads))
            w["e_dn"] = t(self._w(e.experts_local, xw, e.width, std=1.0 / math.sqrt(e.width), leaf=not self.free_grads))
        if e.shared_width:
            w["s_gu"], w["s_dn"] = self._w(d, 2 * e.shared_width), self._w(e.shared_width, d)
            if e.shared_gate:
                w["w_sg"] = self._w(d, 1)
        return w

    def _mla_kernel(self):
        """(module, use its Triton kernel?): the kernel needs triton and a GPU."""
        try:
            from k3sim.calibration import mla_decode as md  # helper H4's kernel
        except Exception:  # noqa: BLE001
            return None, False
        m = self.spec.mla
        dims = m is not None and (m.kv_lora, m.rope) == (md.D_LATENT, md.D_ROPE)  # the kernel's fixed widths
        return md, (getattr(md, "triton", None) is not None and self.dev != "cpu" and dims)

    def _mxfp4(self):
        from k3sim.calibration import mxfp4

        if getattr(mxfp4, "triton", None) is None:
            raise RuntimeError("the MXFP4 expert kernel needs triton; use --expert-kernel grouped_bf16")
        return mxfp4

    def buf(self, key, shape, dtype, fill=None):
        """A persistent buffer (made once per key): graph-captured kernels keep writing the same memory."""
        if key not in self._bufs:
            t = self.torch.empty(shape, dtype=dtype, device=self.dev)
            self._bufs[key] = t.fill_(fill) if fill is not None else t
        return self._bufs[key]

    # ------------------------------------------------------------------ small ops
    def rmsnorm(self, x, w):
        self.rec.op("rmsnorm", T=x.shape[0], D=x.shape[-1])
        f = self.fns["rmsnorm"]
        if f is not None:
            return f(x, w, NORM_EPS)
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), w, NORM_EPS)

    def silu_mul(self, gu, width, T=None):
        self.rec.op("silu_mul", T=T if T is not None else gu.shape[0], N=width)
        f = self.fns["silu_mul"]
        if f is not None:
            return f(gu)
        F = self.torch.nn.functional
        return F.silu(gu[:, :width]) * gu[:, width:]

    def gemm(self, x, w):
        self.rec.op("gemm_bf16", M=x.shape[0], N=w.shape[1], K=w.shape[0])
        return x @ w

    def residual(self, x, *ys):
        self.rec.op("residual_add", T=x.shape[0], D=x.shape[-1])
        for y in ys:
            x = x + y
        return x

    # ------------------------------------------------------------------ KDA
    def kda(self, L, x, st: S.StepShape, state: dict):
        """x [N, d], prefill rows first (seq-major), then one row per decode. `state` holds this layer's
        prefill and decode recurrent/conv states (serving) or nothing (training)."""
        torch = self.torch
        fla = self.fla
        from k3sim.calibration.kda_ops import K3_GATE_LOWER_BOUND, KDA_OPTIONS

        k, N, P = self.spec.kda, st.tokens, st.prefill_tokens
        H, K = k.heads, k.head_dim
        hk = H * K
        h = self.rmsnorm(x, L["norm1"])
        qkv = self.gemm(h, L["w_qkv"])
        parts = []
        if st.chunk:
            self.rec.op("causal_conv1d_fwd", B=st.seqs, T=st.chunk, D=3 * hk, W=k.conv)
            y, _ = fla.causal_conv1d(qkv[:P].view(st.seqs, st.chunk, 3 * hk), weight=L["conv_w"], activation="silu",
                                 initial_state=state.get("conv_p") if st.prefix else None, output_final_state=False)
            parts.append(y.view(P, 3 * hk))
        if st.decodes:
            self.rec.op("conv1d_update", B=st.decodes, D=3 * hk, W=k.conv)
            y, _ = fla.causal_conv1d_update(qkv[P:], state["conv_d"], weight=L["conv_w"], activation="silu")
            parts.append(y)
        qkv = parts[0] if len(parts) == 1 else torch.cat(parts)
        if "w_f" in L:
            g = self.gemm(h, L["w_f"])
        else:
            g = self.gemm(self.gemm(h, L["w_fa"]), L["w_fb"])
        bl = self.gemm(h, L["w_b"])
        self.rec.op("sigmoid", T=N, D=H)
        beta = torch.sigmoid(bl)
        self.rec.op("split_copy", T=N, D=3 * hk)
        q, kk, v = (t.contiguous() for t in qkv.view(N, 3, H, K).unbind(1))
        g = g.view(N, H, K)
        outs = []
        if st.chunk:
            shp = (st.seqs, st.chunk)
            p = dict(T=st.chunk, H=H) if st.seqs == 1 else dict(T=st.chunk, H=H, B=st.seqs)
            self.rec.op("chunk_kda_fwd_bwd" if st.train else "chunk_kda_fwd", **p)
            o, _ = fla.chunk_kda(q=q[:P].view(*shp, H, K), k=kk[:P].view(*shp, H, K), v=v[:P].view(*shp, H, K),
                             g=g[:P].reshape(*shp, H, K), beta=beta[:P].reshape(*shp, H), A_log=L["A_log"],
                             dt_bias=L["dt_bias"], initial_state=state.get("kda_p") if st.prefix else None,
                             output_final_state=not st.train, **KDA_OPTIONS)
            outs.append(o.view(P, H, K))
        if st.decodes:
            B = st.decodes
            self.rec.op("recurrent_kda_decode", B=B, T=1, H=H)
            o, _ = fla.fused_recurrent_kda(q=q[P:].view(B, 1, H, K), k=kk[P:].view(B, 1, H, K), v=v[P:].view(B, 1, H, K),
                                       g=g[P:].reshape(B, 1, H, K), beta=beta[P:].reshape(B, 1, H),
                                       A_log=L["A_log"], dt_bias=L["dt_bias"], initial_state=state["kda_d"],
                                       output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, lower_bound=K3_GATE_LOWER_BOUND)
            outs.append(o.view(B, H, K))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        if "w_g" in L:
            og = self.gemm(h, L["w_g"])
        else:
            og = self.gemm(self.gemm(h, L["w_ga"]), L["w_gb"])
        self.rec.op("gated_rmsnorm", T=N * H, D=K)
        o = fla.rms_norm_gated(o.reshape(N * H, K), og.view(N * H, K), L["o_norm"], None, activation="sigmoid", eps=NORM_EPS)
        return self.residual(x, self.gemm(o.view(N, hk), L["w_o"]))

    # ------------------------------------------------------------------ MLA
    def mla_decode_attn(self, ql, qpe, cache, scale):
        """ql [B, H, kv_lora], qpe [B, H, rope], cache [B, C, kv_lora + rope] -> [B, H, kv_lora]."""
        torch = self.torch
        B, H, R = ql.shape
        C = cache.shape[1]
        self.rec.op("mla_decode", B=B, C=C, H=H)
        if self.mla_kernel:
            key = (B, C, H)
            if key not in self._mla_inst:
                self._mla_inst[key] = self.md.MLADecode(B, C, H, self.dev)
            lens = self.buf(("lens", B, C), (B,), torch.int32, fill=C)
            return self._mla_inst[key](ql, qpe, cache, lens, scale)
        if self.md is not None and (R, qpe.shape[-1]) == (self.md.D_LATENT, self.md.D_ROPE):
            return self.md.torch_decode(ql, qpe, cache, scale)
        q = torch.cat([ql, qpe], dim=-1)                                       # [B, H, 576]
        s = torch.bmm(q, cache.transpose(1, 2)).float() * scale                # [B, H, C]
        p = torch.softmax(s, dim=-1).to(cache.dtype)
        return torch.bmm(p, cache[:, :, :R])                                   # [B, H, 512]

    def sdpa_prefix(self, args, Tq: int, Tk: int, scale: float):
        """Chunk queries against prefix + chunk keys, causal aligned to the bottom right: torch's
        `causal_lower_right` (flash backend); if this torch refuses it, an explicit boolean mask
        (memory-efficient backend) and `impl["sdpa_prefix"]` says so in every row."""
        torch = self.torch
        F = torch.nn.functional
        if self.impl.get("sdpa_prefix") != "bool-mask":
            try:
                from torch.nn.attention.bias import causal_lower_right

                o = F.scaled_dot_product_attention(*args, attn_mask=causal_lower_right(Tq, Tk), scale=scale)
                self.impl["sdpa_prefix"] = "causal_lower_right"
                return o
            except (RuntimeError, ImportError, NotImplementedError) as err:
                self.impl["sdpa_prefix"] = "bool-mask"
                print(f"[wholestep] causal_lower_right refused ({type(err).__name__}: {str(err)[:120]}); "
                      "using a boolean mask", flush=True)
        key = ("prefix_mask", Tq, Tk)
        if key not in self._bufs:
            q_pos = torch.arange(Tk - Tq, Tk, device=self.dev)[:, None]
            self._bufs[key] = q_pos >= torch.arange(Tk, device=self.dev)[None, :]
        return F.scaled_dot_product_attention(*args, attn_mask=self._bufs[key], scale=scale)

    def mla(self, L, x, st: S.StepShape, state: dict):
        torch = self.torch
        F = torch.nn.functional
        m, N, P = self.spec.mla, st.tokens, st.prefill_tokens
        H, qk, kv_a = m.heads, m.nope + m.rope, m.kv_lora + m.rope
        scale = qk ** -0.5
        h = self.rmsnorm(x, L["norm1"])
        if m.q_lora is None:
            q = self.gemm(h, L["w_q"])
            kv = self.gemm(h, L["w_kva"])
        else:
            qkva = self.gemm(h, L["w_qkva"])
            q = self.gemm(self.rmsnorm(qkva[:, :m.q_lora], L["q_norm"]), L["w_qb"])
            kv = qkva[:, m.q_lora:]
        lat = self.rmsnorm(kv[:, :m.kv_lora], L["kv_norm"])
        q = q.view(N, H, qk)
        outs = []
        if not st.train:
            self.rec.op("kv_cache_write", T=N, D=kv_a)
            new = torch.cat([lat, kv[:, m.kv_lora:]], dim=-1)                 # [N, 576]
            if st.chunk:
                state["cache_p"][:, st.prefix:st.prefix + st.chunk] = new[:P].view(st.seqs, st.chunk, kv_a)
            if st.decodes:
                state["cache_d"][:, st.context - 1] = new[P:]
        if st.chunk:
            Lk = st.prefix + st.chunk
            if st.train:
                lat_all, kpe_all = lat.view(st.seqs, Lk, m.kv_lora), kv[:, m.kv_lora:].reshape(st.seqs, Lk, m.rope)
            else:
                c = state["cache_p"][:, :Lk]
                lat_all, kpe_all = c[..., :m.kv_lora], c[..., m.kv_lora:]
            kvb = self.gemm(lat_all.reshape(st.seqs * Lk, m.kv_lora), L["w_kvb"]).view(st.seqs, Lk, H, m.nope + m.v)
            k_full = torch.cat([kvb[..., :m.nope], kpe_all[:, :, None, :].expand(st.seqs, Lk, H, m.rope)], dim=-1)
            D = max(qk, m.v)
            v = F.pad(kvb[..., m.nope:], (0, D - m.v))
            qq = q[:P].view(st.seqs, st.chunk, H, qk)
            args = (qq.transpose(1, 2), k_full.transpose(1, 2), v.transpose(1, 2))
            if st.prefix:
                self.rec.op("sdpa_prefix_causal_fwd", Tq=st.chunk, Tkv=Lk, H=H, D=D)
                o = self.sdpa_prefix(args, st.chunk, Lk, scale)
            else:
                p = dict(T=st.chunk, H=H, D=D) if st.seqs == 1 else dict(T=st.chunk, H=H, D=D, B=st.seqs)
                self.rec.op("sdpa_causal_fwd_bwd" if st.train else "sdpa_causal_fwd", **p)
                o = F.scaled_dot_product_attention(*args, is_causal=True, scale=scale)
            outs.append(o.transpose(1, 2)[..., :m.v].reshape(P, H * m.v))
        if st.decodes:
            B = st.decodes
            qd = q[P:]
            self.rec.op("bmm_bf16", batch=H, M=B, N=m.kv_lora, K=m.nope)
            ql = torch.bmm(qd[..., :m.nope].transpose(0, 1), L["w_uk"]).transpose(0, 1)   # [B, H, 512]
            a = self.mla_decode_attn(ql, qd[..., m.nope:], state["cache_d"][:, :st.context], scale)
            self.rec.op("bmm_bf16", batch=H, M=B, N=m.v, K=m.kv_lora)
            outs.append(torch.bmm(a.transpose(0, 1), L["w_uv"]).transpose(0, 1).reshape(B, H * m.v))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        if m.out_gate:
            gl = self.gemm(h, L["w_gate"])
            self.rec.op("sigmoid_mul", T=N, D=H * m.v)
            o = o * torch.sigmoid(gl)
        return self.residual(x, self.gemm(o, L["w_o"]))

    # ------------------------------------------------------------------ FFN
    def dense(self, L, x):
        h = self.rmsnorm(x, L["norm2"])
        a = self.silu_mul(self.gemm(h, L["w_gu"]), self.spec.dense_width)
        return self.residual(x, self.gemm(a, L["w_dn"]))

    def route(self, logits, bias):
        """Sigmoid scores + score-correction bias -> top-k ids; weights = renormalised scores (a softmax router:
        `route_softmax`)."""
        torch = self.torch
        e = self.spec.moe
        if e.router == "softmax":
            return self.route_softmax(logits)
        self.rec.op("router_topk", T=logits.shape[0], E=e.experts, topk=e.topk)
        f = self.fns["router_topk"]
        if f is not None:
            return f(logits, bias, e.topk)
        s = torch.sigmoid(logits.float())
        ids = torch.topk(s + bias, e.topk, dim=-1).indices
        w = s.gather(1, ids)
        return ids, w / w.sum(-1, keepdim=True)

    def moe(self, L, x):
        torch = self.torch
        e, N = self.spec.moe, x.shape[0]
        h = self.rmsnorm(x, L["norm2"])
        if e.latent:
            y = self.gemm(h, L["w_lat_router"])
            xin, logits = y[:, :e.latent], y[:, e.latent:]
            if e.latent_norm:
                xin = self.rmsnorm(xin, L["lat_norm"])
        else:
            xin, logits = h, self.gemm(h, L["w_router"])
        ids, wts = self.route(logits, L.get("router_bias"))
        xw, k, El = xin.shape[1], e.topk, e.experts_local
        topk_local = k * El / e.experts
        tk = int(topk_local) if float(topk_local).is_integer() else topk_local
        if self.mxfp4 is not None:
            self.rec.op("moe_mxfp4_decode", B=N, E=El, K=xw, N=e.width, topk=tk)
            key = torch.where(ids < El, ids, torch.full_like(ids, El))       # other ranks' picks -> slot El
            meta = self.mxfp4.route(key, wts, El + 1)
            if El < e.experts:
                # that slot sorts last: drop it, so its rows are neither computed nor read
                meta["num_slots"] = meta["num_slots"] - (key == El).any().to(torch.int32).reshape(1)
            y = self.buf(("mx_y", N * k, xw), (N * k, xw), torch.bfloat16, fill=0.0)  # unwritten rows stay 0
            routed = L["experts"](xin.contiguous(), meta, N, k, y=y)
        else:
            rows = S.moe_rows(N, k, El, e.experts)
            self.rec.op("moe_permute", T=N, topk=k, rows=rows, D=xw)
            flat = ids.reshape(-1)
            key = torch.where(flat < El, flat, torch.full_like(flat, El))   # other ranks' picks sort last
            key_sorted, order = torch.sort(key, stable=True)
            key_sorted, order = key_sorted[:rows], order[:rows]            # local picks first: keep `rows`
            counts = torch.zeros(El + 1, device=x.device, dtype=torch.int32).scatter_add_(
                0, key, torch.ones_like(key, dtype=torch.int32))
            # group ends; clamped so a (6-sigma) overflow past `rows` is dropped, never read out of bounds
            offs = torch.cumsum(counts[:El], 0, dtype=torch.int32).clamp_(max=rows)
            local = (key_sorted < El)[:, None]
            tok = order // k
            xs = xin[tok]
            if xs.requires_grad:
                # Training: the grouped GEMM's backward leaves the rows past the last group end unwritten
                # in grad(xs); a select (not a multiply) keeps them out of grad(xin).
                xs = torch.where(local, xs, torch.zeros((), dtype=xs.dtype, device=xs.device))
            self.rec.op("moe_grouped_bf16", B=N, E=El, K=xw, N=2 * e.width, topk=tk)
            gu = torch._grouped_mm(xs, L["e_gu"], offs=offs, out_dtype=torch.bfloat16)
            a = self.silu_mul(gu, e.width, T=f"{N}x{tk}")
            self.rec.op("moe_grouped_bf16", B=N, E=El, K=e.width, N=xw, topk=tk)
            dn = torch._grouped_mm(a, L["e_dn"], offs=offs, out_dtype=torch.bfloat16)
            self.rec.op("moe_combine", T=N, topk=tk, rows=rows, D=xw)
            # Rows past the last group end are not computed by the grouped GEMM: select before the
            # multiply (in training, grad(w) = sum(grad * dn) must not see those rows either).
            dn = torch.where(local, dn, torch.zeros((), dtype=dn.dtype, device=dn.device))
            contrib = dn * wts.reshape(-1)[order].to(dn.dtype)[:, None]
            routed = torch.zeros((N, xw), dtype=torch.float32, device=x.device).index_add(
                0, tok, contrib.float()).to(dn.dtype)
        if e.latent:
            routed = self.gemm(routed, L["w_up"])
        ys = [routed]
        if e.shared_width:
            sh = self.gemm(self.silu_mul(self.gemm(h, L["s_gu"]), e.shared_width), L["s_dn"])
            ys.append(self.shared_gate(h, L["w_sg"], sh) if e.shared_gate else sh)
        return self.residual(x, *ys)

    # ------------------------------------------------------------------ whole step
    def embed_tokens(self, ids):
        self.rec.op("embedding", T=ids.shape[0], D=self.spec.hidden)
        f = self.fns["embedding"]
        if f is not None:
            return f(ids, self.embed)
        return self.torch.nn.functional.embedding(ids, self.embed)

    def lm_head(self, x, rows):
        h = self.rmsnorm(x if rows is None else x[rows], self.final_norm)
        return self.gemm(h, self.head)

    def head_rows(self, st: S.StepShape):
        """Rows the LM head scores: every row in training and decode-only steps (None); else each prefill
        sequence's last token and every decode (an index tensor, made once per step shape)."""
        if st.train or not st.chunk:
            return None
        key = ("rows", st)
        if key not in self._rows:
            last = [st.chunk * (i + 1) - 1 for i in range(st.seqs)]
            self._rows[key] = self.torch.tensor(last + list(range(st.prefill_tokens, st.tokens)), device=self.dev)
        return self._rows[key]

    def forward(self, x_or_ids, st: S.StepShape, states: list[dict] | None = None):
        """One step. Input: token ids [N] when the spec has the embedding, else hidden states [N, d].
        `states[i]` holds layer i's caches (serving)."""
        out_rows = self.head_rows(st) if self.spec.embed_head else None
        x = self.embed_tokens(x_or_ids) if self.spec.embed_head else x_or_ids
        for i, L in enumerate(self.layers):
            s = states[i] if states is not None else {}
            x = {"kda": self.kda, "mla": self.mla, "gdn": self.gdn, "gqa": self.gqa}[L["attn"]](L, x, st, s)
            x = self.dense(L, x) if L["ffn"] == "dense" else self.moe(L, x)
        if self.spec.embed_head:
            return self.lm_head(x, out_rows)
        return x

    def trace(self, *args, **kwargs) -> list[dict]:
        """Kernel list of one eager call (op + params, in order), for the manifest check."""
        self.rec.ops, self.rec.on = [], True
        try:
            with self.torch.no_grad():
                self.forward(*args, **kwargs)
        finally:
            self.rec.on = False
        return self.rec.ops

    # ------------------------------------------------------------------ serving state
    def alloc_states(self, st: S.StepShape, decode_pool: dict | None = None):
        """Per-layer random caches for a serving step: KDA/conv states of the prefill sequences (their
        prefix) and of the decodes, MLA latent caches (GDN and GQA: `hybrid_state`). `decode_pool` (from `decode_pool`) supplies views
        of preallocated decode buffers so a sweep over (B, C) does not reallocate."""
        torch = self.torch
        states = []
        kd = self.spec.kda
        for i, L in enumerate(self.layers):
            s = {}
            if L["attn"] == "kda":
                hk3 = 3 * kd.heads * kd.head_dim
                if st.chunk and st.prefix:
                    s["kda_p"] = self._rand_state(st.seqs, kd.heads, kd.head_dim, kd.head_dim)
                    s["conv_p"] = self._w(st.seqs, hk3, kd.conv, std=1.0)
                if st.decodes:
                    if decode_pool is not None:
                        s["kda_d"] = decode_pool[i]["kda"][:st.decodes]
                        s["conv_d"] = decode_pool[i]["conv"][:st.decodes]
                    else:
                        s["kda_d"] = self._rand_state(st.decodes, kd.heads, kd.head_dim, kd.head_dim)
                        s["conv_d"] = self._w(st.decodes, hk3, kd.conv, std=1.0)
            elif L["attn"] in ("gdn", "gqa"):
                s = self.hybrid_state(L, i, st, decode_pool)
            else:
                m = self.spec.mla
                kv_a = m.kv_lora + m.rope
                if st.chunk:
                    s["cache_p"] = self._w(st.seqs, st.prefix + st.chunk, kv_a, std=1.0)
                if st.decodes:
                    if decode_pool is not None:
                        n = st.decodes * st.context * kv_a
                        s["cache_d"] = decode_pool[i]["cache"][:n].view(st.decodes, st.context, kv_a)
                    else:
                        s["cache_d"] = self._w(st.decodes, st.context, kv_a, std=1.0)
            states.append(s)
        return states

    def _rand_state(self, *shape):
        return self.torch.empty(shape, device=self.dev, dtype=self.torch.float32).normal_(0.0, 1.0, generator=self.gen)

    def decode_pool(self, max_batch: int, cache_tokens: int):
        """Random decode buffers reused across (B, C) points: KDA/conv states for `max_batch` sequences and
        an MLA latent cache of `cache_tokens` (= max B x C that fits) per MLA layer."""
        kd, m = self.spec.kda, self.spec.mla
        pool = []
        for L in self.layers:
            if L["attn"] == "kda":
                pool.append({"kda": self._rand_state(max_batch, kd.heads, kd.head_dim, kd.head_dim),
                             "conv": self._w(max_batch, 3 * kd.heads * kd.head_dim, kd.conv, std=1.0)})
            elif L["attn"] in ("gdn", "gqa"):
                pool.append(self.hybrid_pool(L, max_batch, cache_tokens))
            else:
                pool.append({"cache": self._w(cache_tokens * (m.kv_lora + m.rope), std=1.0)})
        return pool
