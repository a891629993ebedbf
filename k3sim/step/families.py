"""Kernel families: the groups a step's time is split into, and which of them are priced by the HBM proxy.

One table with two keys per family: the registry ops it implements (what the step model predicts,
`op_family`) and substrings of the CUDA kernel names torch.profiler records for it (what a measured step
ran, `kernel_family`). Keeping both keys in one row makes a predicted family and a profiled family the
same group by construction, so a whole-step check can compare them family by family.

`PROXIED` are the families the op registry has not measured (elementwise, routing, copies and the short
conv): the step model prices their calls as HBM copies of the bytes they move, and the training glue
calibration (`step.glue`) was fitted on the profiled time of exactly these families, which is why the model
uses the table (`glue.is_glue`) and not only the checks.
"""

from __future__ import annotations

# (family, profiler kernel-name substrings, registry ops); a kernel or op in no row is OTHER.
# "KDA kernel" holds every recurrent mixer's kernels (KDA, Gated DeltaNet, Mamba2's SSD and state update, and the
# ops Mamba-1 and lightning borrow: `step.mixers`), "MLA attention" every softmax-attention kernel (MLA and
# GQA / SWA): fla's GDN kernels share names with KDA's (chunk_gated_delta_rule_*), and FlashAttention's serve MLA
# prefill and GQA alike, so a profiled kernel could not be told apart by name; the labels are the reports'.
FAMILIES = [
    ("routed experts", ("enable_3x_kernel_for_sm9x", "prepare_grouped_gemm_data", "gate_up_kernel", "down_kernel"),
     ("moe_grouped_bf16", "moe_mxfp4_decode")),
    ("KDA kernel", ("fused_recurrent_kda", "chunk_kda", "chunk_gated_delta", "chunk_gla", "recompute_w_u",
                    "kda_gate_chunk_cumsum", "l2norm_fwd", "l2norm_bwd", "kda_gate_bwd", "chunk_local_cumsum",
                    "fused_recurrent_gated_delta", "chunk_simple_gla", "ssm_update", "selective_scan",
                    "chunk_fwd_kernel_o"),
     ("recurrent_kda_decode", "chunk_kda_fwd", "recurrent_gdn_decode", "chunk_gdn_fwd", "mamba2_decode",
      "mamba2_chunk_fwd")),
    ("MLA attention", ("_split_kernel", "_merge_kernel", "sdpa", "flash", "compute_dot_do_o"),
     ("mla_decode", "sdpa_causal_fwd", "sdpa_prefix_causal_fwd", "gqa_prefill_fwd", "gqa_decode",
      "gqa_decode_paged", "gqa_prefix_causal_fwd")),
    ("GEMMs", ("nvjet", "splitKreduce", "cutlass::Kernel2", "dot_kernel", "reduce_1Block", "gemv"),
     ("gemm_bf16", "bmm_bf16")),
    ("short conv", ("causal_conv1d",), ("conv1d_update", "causal_conv1d_fwd")),
    ("norms", ("layer_norm", "GammaBetaBackward"), ("rmsnorm", "gated_rmsnorm")),
]
OTHER = "elementwise, routing, copies"
PROXIED = (OTHER, "short conv")  # the families the op registry does not measure (HBM-copy proxies)


def kernel_family(name: str) -> str:
    """The family of a profiled CUDA kernel, by substrings of its (mangled) name."""
    for fam, keys, _ops in FAMILIES:
        if any(k in name for k in keys):
            return fam
    return OTHER


def op_family(op: str) -> str:
    """The family of a registry op (or of a manifest op the registry prices by proxy)."""
    for fam, _keys, ops in FAMILIES:
        if op in ops:
            return fam
    return OTHER
