"""Shapes to measure: the layers of the shipped models (K3, Kimi-Linear, K2) at the sizes they take
per rank, plus a geometric sweep so the predictor can interpolate between them.

Measurement points, not model inputs: each (N, K) pair names the layer it comes from.
"""

from __future__ import annotations

# Tokens per GEMM: decode batches (1..256) through prefill/training micro-batches.
GEMM_M = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
          3072, 4096, 6144, 8192, 16384]

# (N, K) = (output width, input width).
GEMM_NK = [
    (7168, 2048),    # the example shape
    (3584, 7168),    # K3 LatentMoE latent down-projection (7168 -> 3584)
    (7168, 3584),    # K3 latent up-projection
    (4608, 7168),    # K3 KDA fused q/k/v projection at TP8: 3*96*128/8
    (7168, 1536),    # K3 KDA/MLA output projection at TP8: 96*128/8 = 1536
    (2112, 7168),    # K3 MLA q_lora (1536) + kv_lora (512) + rope (64) down-projection
    (2304, 1536),    # K3 MLA q up-projection at TP8: 96*192/8
    (6144, 3584),    # K3 expert gate+up (2*3072) in latent width
    (3584, 3072),    # K3 expert down
    (8448, 7168),    # K3 dense FFN gate+up at TP8: 2*33792/8
    (2048, 2304),    # Kimi-Linear expert gate+up (2*1024) from hidden 2304
    (18432, 7168),   # K2 dense FFN width at TP1 (up)
]

HBM_BYTES = [2 ** e for e in range(20, 34)] + [3 * 2 ** e for e in range(19, 32, 2)]

# Grouped MoE: (E experts on this rank, top-k per token over them, K, N).
MOE_CONFIGS = [
    (896, 16, 3584, 6144),   # K3 all experts, gate+up in the latent space
    (896, 16, 3072, 3584),   # K3 all experts, down
    (112, 2, 3584, 6144),    # K3 under EP8: 112 local experts, 16/8 = 2 expected local picks
    (256, 8, 2304, 2048),    # Kimi-Linear gate+up
]
MOE_B = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]

# KDA heads per rank: K3's 96 heads under TP 1, 2, 4, 8 (Kimi-Linear's 32 lies inside the range).
KDA_HEADS = [96, 48, 24, 12]
KDA_T = [4096, 8192, 16384, 32768, 65536, 131072, 262144]
KDA_FWD_BWD_T = [4096, 8192, 16384, 32768, 65536, 131072]
KDA_DECODE_B = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KDA_DECODE_T = [1, 2, 4, 8]

# Causal attention: heads per rank and head dims (128: K2/K3 v; 192: MLA q/k nope+rope).
SDPA_H = [8, 32]
SDPA_D = [128, 192]
SDPA_T = [1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536]  # half-octaves

# Collectives: per-rank shard bytes as nccl-tests counts them.
COLLECTIVE_BYTES = [2 ** e for e in range(10, 31, 1)]

# KCP: global tokens and equal-length packed documents.
KCP_T = [32768, 65536, 131072, 262144, 524288]
KCP_DOCS = [1, 4]
KCP_HEADS = [96, 12]   # K3 without head TP, and at TP8

# ---- deployed shapes (issue 21 item 5; harness k3sim/calibration/deployed.py) ------------------------
# Attention-DP runs every head of a layer on one GPU: MLA query rows per sequence H = heads per GPU x query
# tokens (FlashMLA folds the MTP draft tokens into the heads): 16..128 heads x q 1..4. Coarse values first,
# so a sweep cut short by its time box still spans each range.
DEPLOYED_MLA_H = [128, 64, 32, 16, 256, 512]
DEPLOYED_MLA_B = [64, 1, 256, 8, 128, 32]
DEPLOYED_MLA_C = [32768, 4096, 131072, 1024, 16384, 65536]
DEPLOYED_MLA_MAX_CACHE_BYTES = 60 * 2 ** 30  # harness choice: the bf16 latent cache of one call stays under 60 GiB

# Routed experts of DeepSeek-V3 (256 experts, 8 per token) and Kimi K2 (384, 8): K = hidden 7168,
# N = expert width 2048. Local experts per GPU: (E, where it comes from).
DEPLOYED_EXPERT_K, DEPLOYED_EXPERT_N, DEPLOYED_EXPERT_TOPK = 7168, 2048, 8
DEPLOYED_EXPERTS = [
    (8, "DeepSeek-V3 at EP 32: 256 / 32"),
    (2, "DeepSeek-V3 at EP 128: 256 / 128"),
    (3, "Kimi K2 at EP 128: 384 / 128"),
    (9, "DeepSeek-V3 prefill, 256 + 32 redundant experts over EP 32: 288 / 32"),
    (12, "Kimi K2 at EP 32: 384 / 32"),
]
# Tokens per attention-DP rank b; with dp = ep and 8 % ep != 0 the step model's rule
# (k3sim/step/layers.py routed_expert_shape) gives each rank B = b k dp / ep = 8 b (token, expert) pairs at
# topk 1. Both b and 8 b are measured, so the op's B is covered either way.
DEPLOYED_RANK_TOKENS = [128, 512, 2048, 4096, 8192]
DEPLOYED_EXPERT_B = [1024, 8192, 65536, 128, 4096, 32768, 512, 2048, 16384]

# Around the dispatch: tokens of one rank, hidden width, local picks per token.
DEPLOYED_DISPATCH_T = [128, 512, 2048, 8192, 256, 1024, 4096, 16384]
DEPLOYED_DISPATCH_D = 7168
DEPLOYED_PERMUTE_TOPK = [1, 8, 2, 4]
DEPLOYED_QUANT_D = [7168, 2048]  # hidden (before dispatch) and the expert width (before the down GEMM)

# ---- training shapes (issue 22 items 2 and 6; harness k3sim/calibration/train_fp8.py) ------------------------
# Every linear of a training layer of K3, DeepSeek-V3 and Kimi-Linear-48B (models/*.yaml, as k3sim.step.layers
# issues them) at TP 1, 2, 4 and 8, but the MoE router and the LM head (DeepSeek-V3 keeps both in BF16, arXiv
# 2412.19437 sec. 3.3) and widths under 128 (KDA's beta projection): (N, K, where it comes from: model TP
# component, "+n" more). tests/calibration/test_train_fp8.py checks the list against the models.
TRAIN_LINEARS = [
    (512, 128, "kl tp8 kda_decay_gate_b, kl tp8 kda_out_gate_b"),
    (1024, 128, "kl tp4 kda_decay_gate_b, kl tp4 kda_out_gate_b"),
    (1536, 128, "k3 tp8 kda_out_gate_b"),
    (2048, 128, "kl tp2 kda_decay_gate_b, kl tp2 kda_out_gate_b"),
    (2304, 128, "kl tp8 shared_experts_down"),
    (3072, 128, "k3 tp4 kda_out_gate_b"),
    (4096, 128, "kl tp1 kda_decay_gate_b, kl tp1 kda_out_gate_b"),
    (6144, 128, "k3 tp2 kda_out_gate_b"),
    (12288, 128, "k3 tp1 kda_out_gate_b"),
    (2304, 256, "kl tp4 shared_experts_down"),
    (7168, 256, "ds3 tp8 shared_experts_down"),
    (7168, 448, "k3 tp8 moe_latent_up"),
    (1024, 512, "kl tp8 mla_kv_b_expand"),
    (2048, 512, "kl tp4 mla_kv_b_expand"),
    (2304, 512, "kl tp2 shared_experts_down, kl tp8 kda_o_proj +1"),
    (3072, 512, "k3 tp8 mla_kv_b_expand"),
    (4096, 512, "ds3 tp8 mla_kv_b_expand, kl tp2 mla_kv_b_expand"),
    (6144, 512, "k3 tp4 mla_kv_b_expand"),
    (7168, 512, "ds3 tp4 shared_experts_down"),
    (8192, 512, "ds3 tp4 mla_kv_b_expand, kl tp1 mla_kv_b_expand"),
    (12288, 512, "k3 tp2 mla_kv_b_expand"),
    (16384, 512, "ds3 tp2 mla_kv_b_expand"),
    (24576, 512, "k3 tp1 mla_kv_b_expand"),
    (32768, 512, "ds3 tp1 mla_kv_b_expand"),
    (7168, 768, "k3 tp8 shared_experts_down"),
    (7168, 896, "k3 tp4 moe_latent_up"),
    (2304, 1024, "kl tp1 shared_experts_down, kl tp4 kda_o_proj +1"),
    (7168, 1024, "ds3 tp2 shared_experts_down"),
    (2304, 1152, "kl tp8 dense_down"),
    (2304, 1536, "k3 tp8 mla_q_b_proj"),
    (3072, 1536, "ds3 tp8 mla_q_b_proj"),
    (4608, 1536, "k3 tp4 mla_q_b_proj"),
    (6144, 1536, "ds3 tp4 mla_q_b_proj"),
    (7168, 1536, "k3 tp4 shared_experts_down, k3 tp8 kda_o_proj +1"),
    (9216, 1536, "k3 tp2 mla_q_b_proj"),
    (12288, 1536, "ds3 tp2 mla_q_b_proj"),
    (18432, 1536, "k3 tp1 mla_q_b_proj"),
    (24576, 1536, "ds3 tp1 mla_q_b_proj"),
    (7168, 1792, "k3 tp2 moe_latent_up"),
    (2304, 2048, "kl tp2 kda_o_proj, kl tp2 mla_o_proj"),
    (7168, 2048, "ds3 tp1 shared_experts_down, ds3 tp8 mla_o_proj"),
    (128, 2304, "kl tp1 kda_decay_gate_a, kl tp1 kda_out_gate_a +6"),
    (144, 2304, "kl tp4 mla_qkv_a_proj"),
    (256, 2304, "kl tp8 shared_experts_gate_up"),
    (288, 2304, "kl tp2 mla_qkv_a_proj"),
    (512, 2304, "kl tp4 shared_experts_gate_up"),
    (576, 2304, "kl tp1 mla_qkv_a_proj"),
    (768, 2304, "kl tp8 mla_q_proj"),
    (1024, 2304, "kl tp2 shared_experts_gate_up"),
    (1536, 2304, "kl tp4 mla_q_proj, kl tp8 kda_qkv_proj"),
    (2048, 2304, "kl tp1 shared_experts_gate_up"),
    (2304, 2304, "kl tp4 dense_down, kl tp8 dense_gate_up"),
    (3072, 2304, "kl tp2 mla_q_proj, kl tp4 kda_qkv_proj"),
    (4608, 2304, "kl tp4 dense_gate_up"),
    (6144, 2304, "kl tp1 mla_q_proj, kl tp2 kda_qkv_proj"),
    (7168, 2304, "ds3 tp8 dense_down"),
    (9216, 2304, "kl tp2 dense_gate_up"),
    (12288, 2304, "kl tp1 kda_qkv_proj"),
    (18432, 2304, "kl tp1 dense_gate_up"),
    (7168, 3072, "k3 tp2 shared_experts_down, k3 tp4 kda_o_proj +1"),
    (7168, 3584, "k3 tp1 moe_latent_up"),
    (2304, 4096, "kl tp1 kda_o_proj, kl tp1 mla_o_proj"),
    (7168, 4096, "ds3 tp4 mla_o_proj"),
    (7168, 4224, "k3 tp8 dense_down"),
    (2304, 4608, "kl tp2 dense_down"),
    (7168, 4608, "ds3 tp4 dense_down"),
    (7168, 6144, "k3 tp1 shared_experts_down, k3 tp2 kda_o_proj +1"),
    (128, 7168, "k3 tp1 kda_out_gate_a, k3 tp2 kda_out_gate_a +2"),
    (264, 7168, "k3 tp8 mla_qkv_a_proj, ds3 tp8 mla_qkv_a_proj"),
    (512, 7168, "ds3 tp8 shared_experts_gate_up"),
    (528, 7168, "k3 tp4 mla_qkv_a_proj, ds3 tp4 mla_qkv_a_proj"),
    (560, 7168, "k3 tp8 moe_latent_down+router"),
    (1024, 7168, "ds3 tp4 shared_experts_gate_up"),
    (1056, 7168, "k3 tp2 mla_qkv_a_proj, ds3 tp2 mla_qkv_a_proj"),
    (1120, 7168, "k3 tp4 moe_latent_down+router"),
    (1536, 7168, "k3 tp8 kda_decay_gate, k3 tp8 shared_experts_gate_up +1"),
    (2048, 7168, "ds3 tp2 shared_experts_gate_up"),
    (2112, 7168, "k3 tp1 mla_qkv_a_proj, ds3 tp1 mla_qkv_a_proj"),
    (2240, 7168, "k3 tp2 moe_latent_down+router"),
    (3072, 7168, "k3 tp4 kda_decay_gate, k3 tp4 shared_experts_gate_up +1"),
    (4096, 7168, "ds3 tp1 shared_experts_gate_up"),
    (4480, 7168, "k3 tp1 moe_latent_down+router"),
    (4608, 7168, "k3 tp8 kda_qkv_proj, ds3 tp8 dense_gate_up"),
    (6144, 7168, "k3 tp2 kda_decay_gate, k3 tp2 shared_experts_gate_up +1"),
    (8448, 7168, "k3 tp8 dense_gate_up"),
    (9216, 7168, "k3 tp4 kda_qkv_proj, ds3 tp4 dense_gate_up"),
    (12288, 7168, "k3 tp1 kda_decay_gate, k3 tp1 shared_experts_gate_up +1"),
    (16896, 7168, "k3 tp4 dense_gate_up"),
    (18432, 7168, "k3 tp2 kda_qkv_proj, ds3 tp2 dense_gate_up"),
    (33792, 7168, "k3 tp2 dense_gate_up"),
    (36864, 7168, "k3 tp1 kda_qkv_proj, ds3 tp1 dense_gate_up"),
    (67584, 7168, "k3 tp1 dense_gate_up"),
    (7168, 8192, "ds3 tp2 mla_o_proj"),
    (7168, 8448, "k3 tp4 dense_down"),
    (2304, 9216, "kl tp1 dense_down"),
    (7168, 9216, "ds3 tp2 dense_down"),
    (7168, 12288, "k3 tp1 kda_o_proj, k3 tp1 mla_o_proj"),
    (7168, 16384, "ds3 tp1 mla_o_proj"),
    (7168, 16896, "k3 tp2 dense_down"),
    (7168, 18432, "ds3 tp1 dense_down"),
    (7168, 33792, "k3 tp1 dense_down"),
]
# Tokens per GPU in one GEMM (the micro-batch's tokens; sequence parallel gathers them for the TP linears), in
# the order the sweep takes them: a coarse pass first, so a part cut short by its time box still spans the range.
TRAIN_M = [4096, 16384, 1024, 8192, 2048]
# Routing glue of training (fused permute / unpermute): tokens per GPU, local picks per token, widths (K3's latent
# 3584, DeepSeek-V3 / K3 hidden 7168, Kimi-Linear's 2304 lies inside); coarse values first.
TRAIN_PERMUTE_T = [1024, 4096, 16384, 65536, 2048, 8192, 32768]
TRAIN_PERMUTE_TOPK = [2, 8, 4, 16]
TRAIN_PERMUTE_D = [7168, 2048, 3584]
TRAIN_PERMUTE_EXPERTS = 128  # local experts the picks are drawn from (harness choice: K3 at EP 8 has 112)
TRAIN_PERMUTE_MAX_BYTES = 16 * 2 ** 30  # harness choice: one copy of the permuted bf16 rows stays under 16 GiB
# The wgrad operands quantised along the tokens (fp8_quant_128_t): the input and output widths of the linears
TRAIN_QUANT_T = [1024, 4096, 16384, 65536, 2048, 8192, 32768]
TRAIN_QUANT_D = [7168, 2048, 18432, 512, 1536, 3584, 36864]


def train_gemm_cases(tokens: list[int] | None = None) -> list[dict]:
    """The block-scaled FP8 GEMMs of training (`gemm_fp8_block` M, N, K) at every token count: each linear's
    forward (M, N, K), input gradient (M, K, N) and weight gradient (K, N, M) (k3sim/step/training.py's
    convention), each distinct triple once, token counts in TRAIN_M's order (all shapes at the first, then the
    next), inside one token count forward, input gradient, weight gradient."""
    out, seen = [], set()
    for m in tokens or TRAIN_M:
        for kind in ("forward", "dgrad", "wgrad"):
            for n, k, _ in TRAIN_LINEARS:
                t = {"forward": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[kind]
                if t not in seen:
                    seen.add(t)
                    out.append(dict(M=t[0], N=t[1], K=t[2]))
    return out
