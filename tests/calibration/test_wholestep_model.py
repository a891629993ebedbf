"""The whole-step model on CPU with tiny shapes and stand-in KDA kernels (skipped without torch; CI has none).

What runs on CPU is everything but fla's Triton kernels: projections, MLA (absorbed decode, prefix
attention), the capturable MoE routing and grouped GEMM, the LM head, autograd. The checks: the kernel
list one eager call runs equals the manifest (`spec.sequence`) for decode, mixed prefill and training;
the grouped-GEMM MoE equals a per-pick loop, with and without expert parallelism; backward reaches every
trainable weight with finite gradients.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from k3sim.calibration.wholestep import spec as S  # noqa: E402
from k3sim.calibration.wholestep.model import WholeStepModel  # noqa: E402
from k3sim.configs import load_model  # noqa: E402

F = torch.nn.functional


def _fake_fla():
    """Shape-faithful stand-ins for fla's kernels (same call signatures; not KDA's math)."""

    def causal_conv1d(x, weight=None, activation=None, initial_state=None, output_final_state=False, **kw):
        B, T, D = x.shape
        W = weight.shape[1]
        prev = initial_state[..., 1:].transpose(1, 2).to(x.dtype) if initial_state is not None else x.new_zeros(B, W - 1, D)
        xp = torch.cat([prev, x], 1)
        y = sum(xp[:, i:i + T] * weight[:, i] for i in range(W))
        return F.silu(y), None

    def causal_conv1d_update(x, cache, weight=None, activation=None, **kw):
        cache.copy_(torch.cat([cache[..., 1:], x[..., None].to(cache.dtype)], -1))
        return F.silu((cache * weight).sum(-1)).to(x.dtype), cache

    def kda(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, output_final_state=False, **kw):
        o = v * torch.sigmoid(beta)[..., None] + q * torch.sigmoid(g)
        st = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3]) if output_final_state else None
        return o, st

    def rms_norm_gated(x, g, w, b, activation="sigmoid", eps=1e-6):
        gate = F.silu(g) if activation in ("swish", "silu") else torch.sigmoid(g)
        return F.rms_norm(x, (x.shape[-1],), w, eps) * gate

    def chunk_gdn(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, **kw):
        # grouped value heads: value head h reads key head h // (H / Hk), as fla's kernel does
        rep = v.shape[2] // q.shape[2]
        o = v * beta[..., None] + q.repeat_interleave(rep, 2) * torch.sigmoid(g)[..., None]
        st = torch.zeros(q.shape[0], v.shape[2], q.shape[3], v.shape[3]) if output_final_state else None
        return o.to(v.dtype), st

    def gdn_decode(q, k, v, g, beta, state, o):
        # in place: the state is read and written, o is written (the calls the GPU kernel makes)
        rep = v.shape[2] // q.shape[2]
        state.mul_(torch.exp(g[:, 0])[..., None, None])
        o.copy_((v * beta[..., None] + k.repeat_interleave(rep, 2)).to(o.dtype))

    return SimpleNamespace(causal_conv1d=causal_conv1d, causal_conv1d_update=causal_conv1d_update,
                           chunk_kda=kda, fused_recurrent_kda=kda, rms_norm_gated=rms_norm_gated,
                           chunk_gated_delta_rule=chunk_gdn, gdn_decode=gdn_decode)


def _tiny(root, path):
    """The shipped model with every width shrunk (structure kept: layer pattern, latent, gates, q_lora)."""
    m = load_model(root / path)
    moe = m.moe.model_copy(update=dict(num_routed_experts=8, num_active_experts=4, expert_ffn_width=32,
                                       latent_width=24 if m.moe.latent_width else None,
                                       shared_expert_ffn_width=32 if m.moe.shared_expert_ffn_width else None))
    up = dict(hidden_size=64, vocab_size=512, moe=moe)
    if m.gdn is not None:  # Qwen3-Next: 2 key / 4 value heads, 4 query / 2 KV heads, RoPE on 4 of 16 dims
        up["gdn"] = m.gdn.model_copy(update=dict(num_key_heads=2, num_value_heads=4, head_dim_k=16, head_dim_v=16))
        up["gqa"] = m.gqa.model_copy(update=dict(num_heads=4, num_kv_heads=2, head_dim=16))
        return m.model_copy(update=up)
    up["kda"] = m.kda.model_copy(update=dict(num_heads=4, head_dim_k=16, head_dim_v=16,
                                             alpha_gate_rank=8 if m.kda.alpha_gate_rank else None, output_gate_rank=8))
    up["mla"] = m.mla.model_copy(update=dict(num_heads=4, q_lora_rank=24 if m.mla.q_lora_rank else None,
                                             kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16))
    return m.model_copy(update=dict(up, dense_ffn_width=96))


CASES = [("models/kimi-linear-48b.yaml", 1, 1, (1, 4), True), ("models/kimi-k3.yaml", 2, 4, (5, 8), False),
         ("models/qwen3-next-80b-a3b.yaml", 1, 1, (1, 4), True), ("models/qwen3-next-80b-a3b.yaml", 2, 2, (3, 6), False)]
STEPS = [S.StepShape(decodes=3, context=40), S.StepShape(decodes=2, context=24, chunk=16, prefix=32),
         S.StepShape(chunk=16, prefix=0)]


@pytest.fixture(params=CASES, ids=["kimi-linear-l1-4-head", "k3-tp2-ep4-l5-8", "qwen3-next-l1-4-head",
                                   "qwen3-next-tp2-ep2-l3-6"])
def spec(request, root):
    path, tp, ep, layers, head = request.param
    return S.spec_from_config(_tiny(root, path), tp=tp, ep=ep, layers=layers, head=head, name="tiny")


def _inp(model, st):
    g = torch.Generator().manual_seed(3)
    if model.spec.embed_head:
        return torch.randint(0, model.spec.vocab_local, (st.tokens,), generator=g)
    return torch.randn((st.tokens, model.spec.hidden), generator=g).to(torch.bfloat16)


def test_traced_kernels_equal_the_manifest(spec):
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu")
    for st in STEPS:
        states = model.alloc_states(st)
        traced = model.trace(_inp(model, st), st, states)
        assert traced == S.sequence(spec, st), st
        with torch.no_grad():
            out = model.forward(_inp(model, st), st, states)
        # the LM head scores the decodes and each prefill chunk's last token; a slice returns every row
        rows = st.decodes + (st.seqs if st.chunk else 0) if model.spec.embed_head else st.tokens
        assert out.shape[0] == rows and torch.isfinite(out.float()).all()


def test_decode_pool_views_serve_a_step(spec):
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu")
    pool = model.decode_pool(max_batch=4, cache_tokens=4 * 50)
    st = S.StepShape(decodes=4, context=50)
    states = model.alloc_states(st, pool)
    if spec.mla is not None:
        mla = next(i for i, L in enumerate(model.layers) if L["attn"] == "mla")
        assert states[mla]["cache_d"].shape == (4, 50, spec.mla.kv_lora + spec.mla.rope)
        assert states[mla]["cache_d"].data_ptr() == pool[mla]["cache"].data_ptr()
    else:
        gqa = next(i for i, L in enumerate(model.layers) if L["attn"] == "gqa")
        gdn = next(i for i, L in enumerate(model.layers) if L["attn"] == "gdn")
        assert states[gqa]["kd"].shape == (4, spec.gqa.kv_heads, 50, spec.gqa.head_dim)
        assert states[gqa]["vd"].data_ptr() == pool[gqa]["v"].data_ptr()
        assert states[gdn]["gdn_d"].shape == (4, spec.gdn.value_heads, spec.gdn.head_k, spec.gdn.head_v)
        assert states[gdn]["conv_d"].data_ptr() == pool[gdn]["conv"].data_ptr()
    with torch.no_grad():
        model.forward(_inp(model, st), st, states)


def test_grouped_moe_equals_a_per_pick_loop(spec):
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu")
    # checks.moe_check builds its inputs on "cuda"; the same comparison on CPU here.
    L = next(x for x in model.layers if x["ffn"] == "moe")
    e = spec.moe
    n = 64  # enough tokens that under EP the gathered rows are fewer than all picks (spec.moe_rows)
    if e.experts_local < e.experts:
        assert S.moe_rows(n, e.topk, e.experts_local, e.experts) < n * e.topk
    x = torch.randn((n, spec.hidden), generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        out = model.moe(L, x) - x
        h = model.rmsnorm(x, L["norm2"])
        if e.latent:
            y = h @ L["w_lat_router"]
            xin, logits = model.rmsnorm(y[:, :e.latent], L["lat_norm"]), y[:, e.latent:]
        else:
            xin, logits = h, h @ L["w_router"]
        ids, wts = model.route(logits, L.get("router_bias"))
        routed = torch.zeros((n, xin.shape[1]))
        hits = 0
        for t in range(n):
            for j in range(e.topk):
                eid = int(ids[t, j])
                if eid < e.experts_local:
                    hits += 1
                    gu = xin[t].float() @ L["e_gu"][eid].float()
                    routed[t] += float(wts[t, j]) * ((F.silu(gu[:e.width]) * gu[e.width:]) @ L["e_dn"][eid].float())
        ref = routed.to(torch.bfloat16)
        if e.latent:
            ref = ref @ L["w_up"]
        gu = h @ L["s_gu"]
        sh = (F.silu(gu[:, :e.shared_width]) * gu[:, e.shared_width:]) @ L["s_dn"]
        ref = ref + (torch.sigmoid(h @ L["w_sg"]) * sh if e.shared_gate else sh)
    assert 0 < hits <= n * e.topk
    if e.experts_local < e.experts:
        assert hits < n * e.topk       # EP: some picks live on other ranks and are not computed here
    rel = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert rel < 2e-2


def test_training_backward_reaches_every_weight(spec):
    if spec.embed_head:
        spec = S.StepSpec.from_dict(dict(spec.to_dict(), embed_head=False, vocab_local=0))
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu", grad=True)
    st = S.StepShape(chunk=16, seqs=2, train=True)
    x = torch.randn((st.tokens, spec.hidden)).to(torch.bfloat16).requires_grad_(True)
    assert model.trace(x, st) == S.sequence(spec, st)
    model.forward(x, st).backward(torch.randn((st.tokens, spec.hidden)).to(torch.bfloat16))
    assert model.params and all(p.grad is not None for p in model.params)
    assert all(torch.isfinite(p.grad.float()).all() for p in model.params)
    assert torch.isfinite(x.grad.float()).all()


def test_prefix_attention_mask_fallback_equals_lower_right(spec):
    # The boolean-mask fallback must compute the same attention as causal_lower_right.
    if spec.mla is None:
        pytest.skip("no MLA layer")
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu")
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn((1, 2, n, 8), generator=g) for n in (5, 12, 12))
    a = model.sdpa_prefix((q, k, v), 5, 12, 0.3)
    assert model.impl["sdpa_prefix"] == "causal_lower_right"
    model.impl["sdpa_prefix"] = "bool-mask"
    b = model.sdpa_prefix((q, k, v), 5, 12, 0.3)
    assert torch.allclose(a, b, atol=1e-5)
    # the last query row sees every key; the first sees the 7 prefix keys and itself
    m = model._bufs[("prefix_mask", 5, 12)]
    assert m[-1].all() and int(m[0].sum()) == 8


def test_free_grads_runs_the_weight_gradients_and_keeps_none(spec):
    # The whole model's weights and gradients do not fit together on one GPU: each weight gradient is
    # dropped as soon as autograd accumulates it, so after backward no .grad is held - yet every hook
    # fired (the weight-gradient kernels ran).
    model = WholeStepModel(spec, fla=_fake_fla(), device="cpu", grad=True, free_grads=True)
    fired = []
    for p in model.params:
        p.register_post_accumulate_grad_hook(lambda p: fired.append(1))
    st = S.StepShape(chunk=16, seqs=2, train=True)
    if spec.embed_head:
        x = torch.randint(0, spec.vocab_local, (st.tokens,))
        dy = torch.randn((st.tokens, spec.vocab_local)).to(torch.bfloat16)
    else:
        x = torch.randn((st.tokens, spec.hidden)).to(torch.bfloat16).requires_grad_(True)
        dy = torch.randn((st.tokens, spec.hidden)).to(torch.bfloat16)
    model.forward(x, st).backward(dy)
    assert len(fired) == len(model.params) > 0
    assert all(p.grad is None for p in model.params)
    # the expert weights the grouped GEMM reads are themselves the leaves (no transpose node between the
    # weight gradient and the leaf: with one, the H200 run held every layer's expert gradients alive)
    experts = [L[k] for L in model.layers if L["ffn"] == "moe" for k in ("e_gu", "e_dn")]
    assert experts and all(w.is_leaf and w.grad_fn is None for w in experts)
    ids = {id(p) for p in model.params}
    assert all(id(w) in ids for w in experts)
    plain = WholeStepModel(spec, fla=_fake_fla(), device="cpu", grad=True)  # slices: the measured layout
    assert all(not L[k].is_leaf for L in plain.layers if L["ffn"] == "moe" for k in ("e_gu", "e_dn"))


@pytest.fixture
def qwen(root):
    spec = S.spec_from_config(_tiny(root, "models/qwen3-next-80b-a3b.yaml"), layers=(1, 4), head=True, name="tinyq")
    return WholeStepModel(spec, fla=_fake_fla(), device="cpu")


def test_gqa_prefix_and_decode_attention_agree_with_full_causal(qwen):
    # One sequence of 12 tokens: full causal attention over all 12 (no prefix) against the last 5 as a chunk after
    # a cached prefix of 7 (bottom-right causal) and the last token as a decode over its 12-token cache.
    a = qwen.spec.gqa
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn((12, h, a.head_dim), generator=g) for h in (a.q_heads, a.kv_heads, a.kv_heads))
    with torch.no_grad():
        full = qwen._prefill_attention(q, k, v, S.StepShape(chunk=12), {})[0]
        state = {"kp": k[None].clone(), "vp": v[None].clone()}
        part = qwen._prefill_attention(q[7:], None, None, S.StepShape(chunk=5, prefix=7), state)[0]
        # the decode cache is [B, Hkv, C, D]
        dec = qwen._decode_attention(q[11:], k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous())
    assert torch.allclose(part, full[7:], atol=1e-5)
    assert torch.allclose(dec[0], full[11], atol=1e-5)
    assert (qwen.impl["gqa_prefix"], qwen.impl["gqa_prefill"], qwen.impl["gqa_decode"]) == \
        ("sdpa_math_mask", "sdpa_math", "sdpa_math")


def test_partial_rope_rotates_the_first_dims_only(qwen):
    R = qwen.spec.gqa.rope_dim
    st = S.StepShape(decodes=2, context=9, chunk=3, prefix=4)
    x = torch.randn((st.tokens, 2, qwen.spec.gqa.head_dim))
    y = qwen._rope(x.clone(), st)
    assert R == qwen.spec.gqa.head_dim // 4 and torch.equal(y[..., R:], x[..., R:])
    pos, cos, sin = qwen._positions(st)
    assert pos.tolist() == [4, 5, 6, 8, 8]          # the chunk after its prefix of 4, then position C - 1 per decode
    # rotate-half: the pair (i, i + R/2) turns by the angle of its position
    c, s = cos[pos][:, None], sin[pos][:, None]
    x1, x2 = x[..., :R // 2], x[..., R // 2:R]
    assert torch.allclose(y[..., :R // 2], x1 * c - x2 * s, atol=1e-6)


def test_gdn_calls_fla_with_the_measured_arguments(qwen):
    # What the chunk and decode kernels receive: q, k over the key heads, v, g, beta over the value heads; g fp32,
    # beta in (0, 1); the prefix's state as initial state; the decode state the pool's own tensor (in place).
    seen = {}
    fake = _fake_fla()
    chunk, dec = fake.chunk_gated_delta_rule, fake.gdn_decode

    def chunk_spy(**kw):
        seen["chunk"] = kw
        return chunk(**kw)

    def dec_spy(*args):
        seen["decode"] = args
        return dec(*args)

    fake.chunk_gated_delta_rule, fake.gdn_decode = chunk_spy, dec_spy
    qwen.fla = fake
    g = qwen.spec.gdn
    st = S.StepShape(decodes=3, context=20, chunk=8, prefix=16)
    states = qwen.alloc_states(st)
    L = qwen.layers[0]
    with torch.no_grad():
        qwen.gdn(L, torch.randn((st.tokens, qwen.spec.hidden)).to(torch.bfloat16), st, states[0])
    c = seen["chunk"]
    assert c["q"].shape == (1, 8, g.key_heads, g.head_k) and c["v"].shape == (1, 8, g.value_heads, g.head_v)
    assert c["g"].dtype == torch.float32 and bool((c["g"] < 0).all()) and c["use_qk_l2norm_in_kernel"]
    assert bool(((c["beta"] > 0) & (c["beta"] < 1)).all()) and c["initial_state"] is states[0]["gdn_p"]
    q, k, v, gg, beta, state, o = seen["decode"]
    assert q.shape == (3, 1, g.key_heads, g.head_k) and v.shape == (3, 1, g.value_heads, g.head_v)
    assert gg.shape == beta.shape == (3, 1, g.value_heads) and state is states[0]["gdn_d"]
    assert all(t.is_contiguous() for t in (q, k, v, gg, beta))
