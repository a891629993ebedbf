"""Numerical self-checks of the whole-step model on small random inputs (GPU; `run.py --check`).

- MoE: the capturable path in use (grouped GEMM: sort by local expert, group ends, rows past the last
  end left uncomputed, select-then-combine; or the MXFP4 kernel with other ranks' picks dropped)
  against a per-pick loop in fp32 over the same routing (MXFP4: dequantised weights). Catches a wrong
  permutation, a wrong group end, or uncomputed rows leaking into the output.
- MLA decode: the kernel in use (helper H4's, when present) against the torch reference.
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
        ids, wts = model.route(logits, L["router_bias"])
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
            ref = ref + (F.silu(gu[:, :e.shared_width]) * gu[:, e.shared_width:]) @ L["s_dn"]
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


def run_all(model) -> dict:
    res = {}
    for name, fn in (("moe_rel_err", moe_check), ("mla_decode_rel_err", mla_check)):
        try:
            v = fn(model)
            res[name] = None if v is None else round(v, 6)
        except Exception as err:  # noqa: BLE001 - a failed check is reported, not fatal
            res[name] = f"{type(err).__name__}: {err}"[:300]
    return res
