"""Numerical self-checks of the whole-step model on small random inputs (GPU; `run.py --check`).

- MoE: the capturable path in use (grouped GEMM: sort by local expert, group ends, rows past the last
  end left uncomputed, select-then-combine; or the MXFP4 kernel with other ranks' picks dropped)
  against a per-pick loop in fp32 over the same routing (MXFP4: dequantised weights). Catches a wrong
  permutation, a wrong group end, or uncomputed rows leaking into the output.
- MLA decode: the kernel in use (helper H4's, when present) against the torch reference.
- GDN (Qwen3-Next): the chunk kernel from a prefix state and the in-place decode step, called as the model calls
  them, against the gated delta rule token by token in float64 (`hybrid_ops.gdn_reference`).
- GQA: the chunk's queries against prefix + chunk keys (FlashAttention-2, bottom-right causal) and the decode
  attention over a contiguous cache, as the model calls them, against masked softmax attention in float64.
Relative errors ||out - ref|| / ||ref||; bf16 operands land near 1e-2 or below (METHOD.md).
"""

from __future__ import annotations

TOKENS = 32  # under EP8, 32 x 16 picks gather 128 rows of 512 (spec.moe_rows): the compaction is exercised


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def moe_check(model) -> float | None:
    torch = model.torch
    F = torch.nn.functional
    L = next((x for x in model.layers if x["ffn"] == "moe"), None)
    if L is None:
        return None
    e = model.spec.moe
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn((TOKENS, model.spec.hidden), device="cuda", generator=g).to(torch.bfloat16)
    with torch.no_grad():
        out = model.moe(L, x)
        h = model.rmsnorm(x, L["norm2"])
        if e.latent:
            y = h @ L["w_lat_router"]
            xin, logits = y[:, :e.latent], y[:, e.latent:]
            if e.latent_norm:
                xin = model.rmsnorm(xin, L["lat_norm"])
        else:
            xin, logits = h, h @ L["w_router"]
        ids, wts = model.route(logits, L.get("router_bias"))
        if model.mxfp4 is not None:
            gate, up, down = L["experts"].dequantized(torch.float32)    # [E, N, K], [E, N, K], [E, K, N]

            def expert(eid, v):
                return (F.silu(gate[eid] @ v) * (up[eid] @ v)).to(torch.bfloat16).float() @ down[eid].T
        else:
            def expert(eid, v):
                gu = v @ L["e_gu"][eid].float()
                return (F.silu(gu[:e.width]) * gu[e.width:]) @ L["e_dn"][eid].float()
        routed = torch.zeros((TOKENS, xin.shape[1]), device="cuda")
        for t in range(TOKENS):
            for j in range(e.topk):
                eid = int(ids[t, j])
                if eid < e.experts_local:
                    routed[t] += float(wts[t, j]) * expert(eid, xin[t].float())
        ref = routed.to(torch.bfloat16)
        if e.latent:
            ref = ref @ L["w_up"]
        if e.shared_width:
            gu = h @ L["s_gu"]
            sh = (F.silu(gu[:, :e.shared_width]) * gu[:, e.shared_width:]) @ L["s_dn"]
            ref = ref + (torch.sigmoid(h.float() @ L["w_sg"].float()) * sh.float()).to(sh.dtype) if e.shared_gate else ref + sh
    return _rel(out - x, ref)


def mla_check(model) -> float | None:
    if model.spec.mla is None or not model.mla_kernel:
        return None
    torch = model.torch
    m = model.spec.mla
    g = torch.Generator(device="cuda").manual_seed(8)
    B, C = 3, 777
    ql = torch.randn((B, m.heads, m.kv_lora), device="cuda", generator=g).to(torch.bfloat16)
    qpe = torch.randn((B, m.heads, m.rope), device="cuda", generator=g).to(torch.bfloat16)
    cache = torch.randn((B, C, m.kv_lora + m.rope), device="cuda", generator=g).to(torch.bfloat16)
    scale = (m.nope + m.rope) ** -0.5
    with torch.no_grad():
        out = model.mla_decode_attn(ql, qpe, cache, scale)
        ref = model.md.reference(ql, qpe, cache, None, scale)
    return _rel(out, ref)


def gdn_check(model) -> dict | None:
    """fla's chunk kernel from an initial state (T 200: three full chunks and a partial one) and the in-place decode
    step after it, against the float64 recurrence; the decode output is poisoned first."""
    if model.spec.gdn is None:
        return None
    torch = model.torch
    from k3sim.calibration import hybrid_ops as h

    g = model.spec.gdn
    x = h.gdn_inputs(200, g.value_heads, g.key_heads, seed=11)
    h0 = 0.1 * torch.randn((1, g.value_heads, g.head_k, g.head_v), device="cuda", generator=h._gen(12))
    with torch.no_grad():
        o, ht = model.fla.chunk_gated_delta_rule(**x, initial_state=h0.clone(), output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    ro, rs = h.gdn_reference(**x, h0=h0)
    y = h.gdn_inputs(1, g.value_heads, g.key_heads, seed=13)
    state, od = ht.clone(), torch.full_like(y["v"], float("nan"))
    model.fla.gdn_decode(**y, state=state, o=od)
    ry, rst = h.gdn_reference(**y, h0=rs)
    return {"chunk_o": _rel(o, ro), "chunk_state": _rel(ht, rs), "decode_o": _rel(od, ry), "decode_state": _rel(state, rst)}


def gqa_check(model) -> dict | None:
    """The model's prefix attention (chunk 100 after 300 cached tokens) and decode attention (B 3, C 333)."""
    if model.spec.gqa is None:
        return None
    torch = model.torch
    from k3sim.calibration.wholestep import spec as S

    a = model.spec.gqa
    gen = torch.Generator(device="cuda").manual_seed(14)

    def r(*shape):
        return torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)

    st = S.StepShape(chunk=100, prefix=300)
    q, kp, vp = r(100, a.q_heads, a.head_dim), r(1, 400, a.kv_heads, a.head_dim), r(1, 400, a.kv_heads, a.head_dim)
    rep = a.q_heads // a.kv_heads
    with torch.no_grad():
        o = model._prefill_attention(q, None, None, st, {"kp": kp, "vp": vp})[0]
        s = torch.einsum("qhd,khd->hqk", q.double(), kp[0].double().repeat_interleave(rep, 1)) * a.head_dim ** -0.5
        keep = torch.arange(300, 400, device="cuda")[:, None] >= torch.arange(400, device="cuda")[None, :]
        ref = torch.einsum("hqk,khd->qhd", s.masked_fill(~keep, float("-inf")).softmax(-1),
                           vp[0].double().repeat_interleave(rep, 1))
        qd, kd, vd = r(3, a.q_heads, a.head_dim), r(3, a.kv_heads, 333, a.head_dim), r(3, a.kv_heads, 333, a.head_dim)
        od = model._decode_attention(qd, kd, vd)
        sd = torch.einsum("bhd,bhcd->bhc", qd.double(), kd.double().repeat_interleave(rep, 1)) * a.head_dim ** -0.5
        refd = torch.einsum("bhc,bhcd->bhd", sd.softmax(-1), vd.double().repeat_interleave(rep, 1))
    return {"prefix_o": _rel(o, ref), "decode_o": _rel(od, refd)}


def run_all(model) -> dict:
    res = {}
    for name, fn in (("moe_rel_err", moe_check), ("mla_decode_rel_err", mla_check), ("gdn_rel_err", gdn_check),
                     ("gqa_rel_err", gqa_check)):
        try:
            v = fn(model)
            res[name] = None if v is None else ({k: round(x, 6) for k, x in v.items()} if isinstance(v, dict)
                                                else round(v, 6))
        except Exception as err:  # noqa: BLE001 - a failed check is reported, not fatal
            res[name] = f"{type(err).__name__}: {err}"[:300]
    return res
