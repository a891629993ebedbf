"""The hybrid mixers of the whole-step model (issue 23 item 7): Qwen3-Next's Gated DeltaNet and gated GQA layers,
its softmax router and gated shared expert, as a mixin of `model.WholeStepModel` (GPU side; needs torch + fla).

Kernels are the ones `k3sim/calibration/hybrid_ops.py` measures, called the same way:
- GDN prefill: fla `chunk_gated_delta_rule` (q, k L2-normalised in the kernel, the decay g and beta made
  beforehand, from the prefix's recurrent state when a prefix is cached), as `chunk_gdn_fwd` is timed;
- GDN decode: fla's fused recurrent kernel launched with the state as its input and output (in place, as vLLM and
  SGLang update it): `hybrid_ops.gdn_decode_step`, the call `recurrent_gdn_decode` is timed with;
- short conv: fla's `causal_conv1d` / `causal_conv1d_update` (as the KDA layers); gated norm: fla's
  `rms_norm_gated` with SiLU(z) (HF Qwen3NextRMSNormGated);
- GQA prefill: `hybrid_ops.gqa_prefill_call` (SDPA's flash backend with enable_gqa, `gqa_prefill_fwd`); the chunk
  after a cached prefix through FlashAttention-2's own call (`aten._flash_attention_forward`, causal aligned bottom
  right when the chunk is shorter than its keys, native GQA); decode: SDPA's flash backend over each request's
  contiguous cache [B, Hkv, C, D] (`gqa_decode`, impl sdpa_contiguous);
- RoPE: `decode_ops.rope` on the first rope_dim dims of each head (its table's theta does not change the work);
- router: `hybrid_ops.router_call` (fp32 softmax, top-k, renormalised); shared-expert gate: sigmoid(x w) * y.
On CPU (tests) the attention calls fall back to SDPA's math path with the same masks (`impl` says which ran).
"""

from __future__ import annotations

from k3sim.calibration.wholestep import spec as S

NORM_EPS = 1e-6


class HybridMixers:
    """GDN and GQA layers; `self` is a WholeStepModel (weights helpers, recorder, buffers, fla kernels)."""

    # ------------------------------------------------------------------ weights
    def _gdn_weights(self):
        torch = self.torch
        g, d = self.spec.gdn, self.spec.hidden
        H = g.value_heads
        return {"w_in": self._w(d, g.in_proj), "conv_w": self._w(g.conv_channels, g.conv, std=0.5),
                "A_log": torch.empty(H, device=self.dev).uniform_(0.0, 2.77, generator=self.gen),  # A in [1, 16]
                "dt_bias": torch.empty(H, device=self.dev).normal_(-4.0, 1.0, generator=self.gen),
                "o_norm": self._ones(g.head_v), "w_out": self._w(H * g.head_v, d)}

    def _gqa_weights(self):
        a, d = self.spec.gqa, self.spec.hidden
        w = {"w_qkv": self._w(d, a.qkv), "w_o": self._w(a.q_heads * a.head_dim, d)}
        if a.qk_norm:
            w["q_norm"], w["k_norm"] = self._ones(a.head_dim), self._ones(a.head_dim)
        return w

    # ------------------------------------------------------------------ Gated DeltaNet
    def gdn(self, L, x, st: S.StepShape, state: dict):
        """x [N, d], prefill rows first, then one row per decode; `state` holds this layer's recurrent and conv
        states (serving) or nothing (training)."""
        torch = self.torch
        F = torch.nn.functional
        fla = self.fla
        g, N, P = self.spec.gdn, st.tokens, st.prefill_tokens
        Hk, H, K, V, ch = g.key_heads, g.value_heads, g.head_k, g.head_v, g.conv_channels
        h = self.rmsnorm(x, L["norm1"])
        y = self.gemm(h, L["w_in"])                                         # q | k | v | z | b | a
        mixed = self._short_conv(L, y[:, :ch], st, state)
        self.rec.op("gdn_gating", T=N, H=H)
        b0 = ch + H * V
        beta = torch.sigmoid(y[:, b0:b0 + H]).contiguous()
        gg = (-L["A_log"].exp() * F.softplus(y[:, b0 + H:].float() + L["dt_bias"])).contiguous()
        self.rec.op("split_copy", T=N, D=ch)
        q = mixed[:, :Hk * K].contiguous().view(N, Hk, K)
        k = mixed[:, Hk * K:2 * Hk * K].contiguous().view(N, Hk, K)
        v = mixed[:, 2 * Hk * K:].contiguous().view(N, H, V)
        self.rec.op("split_copy", T=N, D=H * V)
        z = y[:, ch:ch + H * V].contiguous()
        outs = []
        if st.chunk:
            shp = (st.seqs, st.chunk)
            p = dict(T=st.chunk, H=H, Hk=Hk) if st.seqs == 1 else dict(T=st.chunk, H=H, Hk=Hk, B=st.seqs)
            self.rec.op("chunk_gdn_fwd_bwd" if st.train else "chunk_gdn_fwd", **p)
            o, _ = fla.chunk_gated_delta_rule(q=q[:P].view(*shp, Hk, K), k=k[:P].view(*shp, Hk, K),
                                              v=v[:P].view(*shp, H, V), g=gg[:P].view(*shp, H),
                                              beta=beta[:P].view(*shp, H),
                                              initial_state=state.get("gdn_p") if st.prefix else None,
                                              output_final_state=not st.train, use_qk_l2norm_in_kernel=True)
            outs.append(o.reshape(P, H, V))
        if st.decodes:
            B = st.decodes
            self.rec.op("recurrent_gdn_decode", B=B, H=H, Hk=Hk)
            o = torch.empty((B, 1, H, V), dtype=torch.bfloat16, device=self.dev)
            fla.gdn_decode(q[P:].view(B, 1, Hk, K), k[P:].view(B, 1, Hk, K), v[P:].view(B, 1, H, V),
                           gg[P:].view(B, 1, H), beta[P:].view(B, 1, H), state["gdn_d"], o)
            outs.append(o.view(B, H, V))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        self.rec.op("gated_rmsnorm", T=N * H, D=V)
        o = fla.rms_norm_gated(o.reshape(N * H, V), z.view(N * H, V), L["o_norm"], None, activation="swish", eps=NORM_EPS)
        return self.residual(x, self.gemm(o.view(N, H * V), L["w_out"]))

    def _short_conv(self, L, mixed, st: S.StepShape, state: dict):
        """Depthwise causal conv + SiLU over q, k, v: the prefill chunk from its conv state (when a prefix is
        cached), the decodes updating theirs in place."""
        fla, P, ch, W = self.fla, st.prefill_tokens, mixed.shape[1], self.spec.gdn.conv
        parts = []
        if st.chunk:
            self.rec.op("causal_conv1d_fwd", B=st.seqs, T=st.chunk, D=ch, W=W)
            c, _ = fla.causal_conv1d(mixed[:P].view(st.seqs, st.chunk, ch), weight=L["conv_w"], activation="silu",
                                     initial_state=state.get("conv_p") if st.prefix else None, output_final_state=False)
            parts.append(c.reshape(P, ch))
        if st.decodes:
            self.rec.op("conv1d_update", B=st.decodes, D=ch, W=W)
            c, _ = fla.causal_conv1d_update(mixed[P:], state["conv_d"], weight=L["conv_w"], activation="silu")
            parts.append(c)
        return parts[0] if len(parts) == 1 else self.torch.cat(parts)

    # ------------------------------------------------------------------ gated GQA
    def gqa(self, L, x, st: S.StepShape, state: dict):
        torch = self.torch
        a, N, P = self.spec.gqa, st.tokens, st.prefill_tokens
        Hq, Hkv, D = a.q_heads, a.kv_heads, a.head_dim
        h = self.rmsnorm(x, L["norm1"])
        y = self.gemm(h, L["w_qkv"])                                        # q (+ gate) per head | k | v
        qw = Hq * D * (2 if a.out_gate else 1)
        qg = y[:, :qw].view(N, Hq, -1)
        q, gate = qg[..., :D], (qg[..., D:] if a.out_gate else None)
        k = y[:, qw:qw + Hkv * D].view(N, Hkv, D)
        v = y[:, qw + Hkv * D:].view(N, Hkv, D)
        if a.qk_norm:
            q, k = self._head_norm(q, L["q_norm"]), self._head_norm(k, L["k_norm"])
        if a.rope_dim:
            q, k = self._rope(q, st), self._rope(k, st)
        if not st.train:
            self._cache_write(k, v, st, state)
        outs = []
        if st.chunk:
            outs.append(self._prefill_attention(q[:P], k[:P], v[:P], st, state).reshape(P, Hq, D))
        if st.decodes:
            self.rec.op("gqa_decode", B=st.decodes, C=st.context, Hq=Hq, Hkv=Hkv, D=D)
            outs.append(self._decode_attention(q[P:], state["kd"], state["vd"]))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        if gate is not None:
            self.rec.op("sigmoid_mul", T=N, D=Hq * D)
            o = o * torch.sigmoid(gate)
        return self.residual(x, self.gemm(o.reshape(N, Hq * D), L["w_o"]))

    def _head_norm(self, x, w):
        """RMSNorm over each head's dims of x [N, heads, D] (strided views are read as they are)."""
        self.rec.op("rmsnorm", T=x.shape[0] * x.shape[1], D=x.shape[-1])
        f = self.fns["rmsnorm"]
        if f is not None:
            return f(x, w, NORM_EPS)
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), w, NORM_EPS)

    def _rope(self, x, st: S.StepShape):
        """Rotate-half RoPE of the first rope_dim dims of every head of x [N, heads, D] at the step's positions."""
        from k3sim.calibration import decode_ops

        R = self.spec.gqa.rope_dim
        self.rec.op("rope", T=x.shape[0], H=x.shape[1], D=R)
        pos, cos, sin = self._positions(st)
        x = x if x.is_contiguous() else x.contiguous()
        x[..., :R] = decode_ops.rope(x[..., :R], pos, cos, sin)
        return x

    def _positions(self, st: S.StepShape):
        """Token positions of the step (each prefill sequence's prefix..prefix+chunk-1, then context-1 per decode)
        and the cos/sin tables, made once per step shape (a captured graph replays the same buffers)."""
        key = ("rope", st)
        if key not in self._bufs:
            from k3sim.calibration import decode_ops

            torch = self.torch
            pre = torch.arange(st.prefix, st.prefix + st.chunk, device=self.dev).repeat(st.seqs)
            dec = torch.full((st.decodes,), max(0, st.context - 1), device=self.dev, dtype=torch.int64)
            top = max(st.prefix + st.chunk, st.context, 1)
            self._bufs[key] = (torch.cat([pre, dec]), *decode_ops.rope_cache(top, self.spec.gqa.rope_dim, self.dev))
        return self._bufs[key]

    def _cache_write(self, k, v, st: S.StepShape, state: dict):
        """The step's keys and values into the caches: the chunk after its prefix, each decode at its last slot."""
        P = st.prefill_tokens
        self.rec.op("kv_cache_write", T=st.tokens, D=2 * k.shape[1] * k.shape[2])
        if st.chunk:
            for name, t in (("kp", k), ("vp", v)):
                state[name][:, st.prefix:st.prefix + st.chunk] = t[:P].view(st.seqs, st.chunk, *t.shape[1:])
        if st.decodes:
            for name, t in (("kd", k), ("vd", v)):
                state[name][:, :, st.context - 1] = t[P:]

    def _prefill_attention(self, q, k, v, st: S.StepShape, state: dict):
        """Causal attention of the chunk(s): q [P, Hq, D]; keys and values of the chunk, or (prefix) the cache."""
        torch = self.torch
        F = torch.nn.functional
        a = self.spec.gqa
        shp = (st.seqs, st.chunk)
        qq = q.reshape(*shp, a.q_heads, a.head_dim)
        if st.prefix and not st.train:
            Lk = st.prefix + st.chunk
            self.rec.op("gqa_prefix_causal_fwd", Tq=st.chunk, Tkv=Lk, Hq=a.q_heads, Hkv=a.kv_heads, D=a.head_dim,
                        **({} if st.seqs == 1 else {"B": st.seqs}))
            kk, vv = state["kp"][:, :Lk], state["vp"][:, :Lk]
            if self.dev != "cpu":
                self.impl["gqa_prefix"] = "aten_flash_bottom_right"
                return torch.ops.aten._flash_attention_forward(qq, kk, vv, None, None, st.chunk, Lk, 0.0, True, False)[0]
            self.impl["gqa_prefix"] = "sdpa_math_mask"
            key = ("gqa_prefix_mask", st.chunk, Lk)
            if key not in self._bufs:
                q_pos = torch.arange(Lk - st.chunk, Lk, device=self.dev)[:, None]
                self._bufs[key] = q_pos >= torch.arange(Lk, device=self.dev)[None, :]
            o = F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                               attn_mask=self._bufs[key], enable_gqa=True)
            return o.transpose(1, 2)
        if st.train:
            p = dict(T=st.chunk, H=a.q_heads, D=a.head_dim) if st.seqs == 1 else dict(T=st.chunk, H=a.q_heads,
                                                                                        D=a.head_dim, B=st.seqs)
            self.rec.op("sdpa_causal_fwd_bwd", **p)
        else:
            self.rec.op("gqa_prefill_fwd", T=st.chunk, Hq=a.q_heads, Hkv=a.kv_heads, D=a.head_dim, window=st.chunk,
                        **({} if st.seqs == 1 else {"B": st.seqs}))
        kk, vv = k.reshape(*shp, a.kv_heads, a.head_dim), v.reshape(*shp, a.kv_heads, a.head_dim)
        if self.dev != "cpu":
            from k3sim.calibration.hybrid_ops import FULL_IMPL, gqa_prefill_call

            o = gqa_prefill_call(qq, kk, vv, st.chunk)
            self.impl["gqa_prefill"] = FULL_IMPL[0]
            return o
        self.impl["gqa_prefill"] = "sdpa_math"
        o = F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        return o.transpose(1, 2)

    def _decode_attention(self, q, kd, vd):
        """q [B, Hq, D] over each request's cache kd, vd [B, Hkv, C, D] -> [B, Hq, D]."""
        torch = self.torch
        F = torch.nn.functional
        if self.dev != "cpu":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.impl["gqa_decode"] = "sdpa_flash_contiguous"
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q[:, :, None], kd, vd, enable_gqa=True)[:, :, 0]
        self.impl["gqa_decode"] = "sdpa_math"
        return F.scaled_dot_product_attention(q[:, :, None], kd, vd, enable_gqa=True)[:, :, 0]

    # ------------------------------------------------------------------ MoE pieces
    def route_softmax(self, logits):
        """Softmax router: fp32 softmax, top-k, renormalised (hybrid_ops.router_call). Returns (ids, weights)."""
        e = self.spec.moe
        self.rec.op("router_softmax_topk", T=logits.shape[0], E=e.experts, topk=e.topk)
        from k3sim.calibration.hybrid_ops import router_call

        w, ids = router_call(logits, e.topk)
        return ids, w

    def shared_gate(self, h, w_gate, shared):
        """sigmoid(h w_gate) * shared: Qwen3-Next's gated shared expert, the call `shared_expert_gate` is timed as."""
        self.rec.op("shared_expert_gate", T=h.shape[0], D=h.shape[1])
        return self.torch.sigmoid(h @ w_gate) * shared

    # ------------------------------------------------------------------ serving state
    def hybrid_state(self, L, i: int, st: S.StepShape, decode_pool) -> dict:
        """Layer i's caches for a serving step: GDN recurrent and conv states of the prefix and of the decodes;
        GQA keys and values of prefix + chunk and of the decodes (views of `decode_pool` when given)."""
        s: dict = {}
        if L["attn"] == "gdn":
            g = self.spec.gdn
            if st.chunk and st.prefix:
                s["gdn_p"] = self._rand_state(st.seqs, g.value_heads, g.head_k, g.head_v)
                s["conv_p"] = self._w(st.seqs, g.conv_channels, g.conv, std=1.0)
            if st.decodes:
                pool = decode_pool[i] if decode_pool is not None else self._gdn_pool(st.decodes)
                s["gdn_d"], s["conv_d"] = pool["gdn"][:st.decodes], pool["conv"][:st.decodes]
            return s
        a = self.spec.gqa
        if st.chunk:
            for name in ("kp", "vp"):
                s[name] = self._w(st.seqs, st.prefix + st.chunk, a.kv_heads, a.head_dim, std=1.0)
        if st.decodes:
            pool = decode_pool[i] if decode_pool is not None else self._gqa_pool(st.decodes * st.context)
            n = st.decodes * st.context * a.kv_heads * a.head_dim
            for name, flat in (("kd", pool["k"]), ("vd", pool["v"])):
                s[name] = flat[:n].view(st.decodes, a.kv_heads, st.context, a.head_dim)
        return s

    def _gdn_pool(self, max_batch: int) -> dict:
        g = self.spec.gdn
        return {"gdn": self._rand_state(max_batch, g.value_heads, g.head_k, g.head_v),
                "conv": self._w(max_batch, g.conv_channels, g.conv, std=1.0)}

    def _gqa_pool(self, cache_tokens: int) -> dict:
        a = self.spec.gqa
        n = cache_tokens * a.kv_heads * a.head_dim
        return {"k": self._w(n, std=1.0), "v": self._w(n, std=1.0)}

    def hybrid_pool(self, L, max_batch: int, cache_tokens: int) -> dict:
        return self._gdn_pool(max_batch) if L["attn"] == "gdn" else self._gqa_pool(cache_tokens)
