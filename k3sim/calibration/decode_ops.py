"""The small kernels of one decode step, as plain torch functions.

The graph-timing harness (`graph_parts`) measures these and the whole-step model builder
(`k3sim/calibration/wholestep/`) calls the same functions, so a measured kernel and the real step run
identical code. They are written as a serving engine's eager path writes them (no torch.compile):
each is one or a few elementwise/reduction kernels, capturable in a CUDA graph (fixed shapes, no
host synchronisation). Inputs are bf16 activations [T, D] (T = tokens of the step).

Op names and parameters (k3sim/kernels/ops_decode.py): `rmsnorm` (T, D), `silu_mul` (T, N),
`rope` (T, H, D), `router_topk` (T, E, topk), `residual_add` (T, D), `embedding` (T, D).
"""

from __future__ import annotations

RMS_EPS = 1e-6  # Kimi-Linear / K3 rms_norm_eps (HF config.json)
ROPE_THETA = 50000.0  # K2's rope_theta (domain-facts.md); K3 and Kimi-Linear MLA use NoPE
VOCAB = 163840  # K3 / Kimi-Linear / K2 vocab_size (models/*.yaml)


def rmsnorm(x, weight, eps: float = RMS_EPS):
    """y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32 (torch's fused rms_norm kernel)."""
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def silu_mul(gate_up):
    """SwiGLU activation: [T, 2N] (gate | up) -> silu(gate) * up [T, N]."""
    import torch.nn.functional as F

    n = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :n]) * gate_up[..., n:]


def rope_cache(max_pos: int, dim: int, device, theta: float = ROPE_THETA):
    """cos/sin tables [max_pos, dim/2] (fp32) of the standard rotary embedding."""
    import torch

    inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    ang = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def rope(x, positions, cos, sin):
    """Rotate-half RoPE of x [T, H, D] at `positions` [T] (int64) with tables from `rope_cache`."""
    import torch

    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


def router_topk(logits, bias, topk: int, scoring: str = "sigmoid", scale: float = 1.0):
    """DeepSeek-V3-style noaux_tc router (K3, Kimi-Linear): sigmoid scores, top-k chosen on
    score + bias, weights = the chosen scores renormalised to sum 1, times `scale`
    (routed_scaling_factor). `scoring="softmax"` for softmax routers. Returns (ids int64, weights fp32)."""
    import torch

    s = torch.sigmoid(logits.float()) if scoring == "sigmoid" else torch.softmax(logits.float(), -1)
    ids = torch.topk(s + bias, topk, dim=-1).indices
    w = s.gather(-1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def residual_add(x, residual):
    """In place: residual += x (the stream every layer adds into); returns residual."""
    return residual.add_(x)


def embedding(ids, table):
    """Token embedding gather: ids [T] -> table rows [T, D]."""
    import torch.nn.functional as F

    return F.embedding(ids, table)


# (op, parameter names) measured by the harness; widths of K3 and Kimi-Linear (models/*.yaml)
OPS = {
    "rmsnorm": ("T", "D"),
    "silu_mul": ("T", "N"),
    "rope": ("T", "H", "D"),
    "router_topk": ("T", "E", "topk"),
    "residual_add": ("T", "D"),
    "embedding": ("T", "D"),
}
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
SHAPES = {
    # hidden 7168 (K3) / 2304 (Kimi-Linear); latent 3584 (K3 LatentMoE norm); q_lora 1536, kv_lora 512
    "rmsnorm": [dict(D=d) for d in (7168, 3584, 2304, 1536, 512)],
    # expert width 3072 (K3 routed and shared), 1024 (Kimi-Linear experts), 4224 (K3 dense FFN at TP8)
    "silu_mul": [dict(N=n) for n in (3072, 1024, 4224)],
    # 64 rope dims per head at TP8 (12), Kimi-Linear's 32 heads, K3 at TP1 (96)
    "rope": [dict(H=h, D=64) for h in (12, 32, 96)],
    "router_topk": [dict(E=896, topk=16), dict(E=256, topk=8)],
    "residual_add": [dict(D=d) for d in (7168, 2304)],
    "embedding": [dict(D=d) for d in (7168, 2304)],
}


def make_case(op: str, params: dict, device, seed: int = 0, shared: dict | None = None):
    """(callable with no arguments, bytes one call moves) for one shape, fresh random inputs.

    The bytes are the predictor's own (`k3sim.kernels.ops_decode`: one formula per op), so the operand
    sets the harness rotates to defeat L2 are sized on what the predictor calls the op's traffic.
    `shared` keeps the large constant inputs (the embedding table, rope tables) across the operand
    sets of one shape: only the per-call activations are copied."""
    import torch

    shared = {} if shared is None else shared

    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    T = params["T"]
    if op == "rmsnorm":
        x, w = r(T, params["D"]), r(params["D"])
        fn = lambda: rmsnorm(x, w)
    elif op == "silu_mul":
        x = r(T, 2 * params["N"])
        fn = lambda: silu_mul(x)
    elif op == "rope":
        x = r(T, params["H"], params["D"])
        if ("rope", params["D"]) not in shared:
            shared[("rope", params["D"])] = rope_cache(4096, params["D"], device)
        cos, sin = shared[("rope", params["D"])]
        pos = torch.randint(0, 4096, (T,), generator=g, device=device)
        fn = lambda: rope(x, pos, cos, sin)
    elif op == "router_topk":
        logits = r(T, params["E"], dtype=torch.float32)
        bias = r(params["E"], dtype=torch.float32) * 0.01
        fn = lambda: router_topk(logits, bias, params["topk"])
    elif op == "residual_add":
        x, res = r(T, params["D"]), r(T, params["D"])
        fn = lambda: residual_add(x, res)
    elif op == "embedding":
        if ("emb", params["D"]) not in shared:
            shared[("emb", params["D"])] = r(VOCAB, params["D"])
        table = shared[("emb", params["D"])]
        ids = torch.randint(0, VOCAB, (T,), generator=g, device=device)
        fn = lambda: embedding(ids, table)
    else:
        raise KeyError(op)
    from k3sim.kernels.ops import OPS as SPECS

    return fn, int(SPECS[op].bytes(params))
