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
