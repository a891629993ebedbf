"""A toy model and GPU for the pipeline cost tests, with fake layer-cost and kernel-time functions whose
numbers are easy to add up by hand."""

from __future__ import annotations

from dataclasses import dataclass

from k3sim.configs import HardwareProfile, ModelConfig
from k3sim.configs.hardware import DATASHEET_FIELDS
from k3sim.step.training import LayerCost


def toy_model(num_layers: int = 8, block: int | None = 2) -> ModelConfig:
    return ModelConfig(
        name="toy", hidden_size=16, num_layers=num_layers, vocab_size=100, full_attn_layers=[4],
        first_k_dense=1, dense_ffn_width=32, attn_res_block_size=block,
        kda=dict(num_heads=2, head_dim_k=4, head_dim_v=4, conv_kernel_size=4, output_gate_rank=2),
        mla=dict(num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
                 output_gate=True),
        moe=dict(num_routed_experts=4, num_active_experts=2, num_shared_experts=1, expert_ffn_width=8,
                 latent_width=8, latent_norm=True),
        vision=dict(num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, patch_size=14),
    )


def toy_gpu() -> HardwareProfile:
    return HardwareProfile(
        name="toy-gpu", hbm_bytes=80e9, hbm_bandwidth_bytes_per_s=1e9, peak_flops_per_s={"bf16": 1e12},
        scaleup_bandwidth_bytes_per_s=1e9, scaleup_domain_gpus=8, scaleout_bandwidth_bytes_per_s=1e8,
        num_sms=1, sources={f: "test" for f in DATASHEET_FIELDS})


def fake_layer_costs(model, hw, *, tp=1, ep=1, cp=1, tokens=4096, seq_len=4096, kernel_time=None, glue=None):
    """Layer i: forward 1 s, backward 2 + 1 s; embedding 0.25 s; LM head 0.5 s; 1000 B hidden, 100 B block."""
    rows = [LayerCost(-1, "embedding", 0.25, 0.5, 0.0, 1000.0, 0.0)]
    rows += [LayerCost(i, model.layer_kinds[i], 1.0, 2.0, 1.0, 1000.0, 100.0 if model.attn_res_block_size else 0.0)
             for i in range(model.num_layers)]
    rows.append(LayerCost(model.num_layers, "lm_head", 0.5, 0.5, 0.5, 0.0, 0.0))
    return rows


@dataclass(frozen=True)
class KT:
    seconds: float
    source: str = "fake"


def fake_kernel_time(op, params, hardware=None):
    """send_recv: 1 us + bytes / 1e9 in a node, 1 us + bytes / 1e8 (the toy GPU's NIC) between nodes
    (gpus_per_node 1); gemm: 2 M N K / 1e12; sdpa fwd T^2 H D 2 / 1e12 (bwd 2.5x that);
    collectives: 10 us + bytes / 1e9."""
    if op == "send_recv":
        return KT(1e-6 + params["bytes"] / (1e8 if params.get("gpus_per_node") == 1 else 1e9))
    if op == "gemm_bf16":
        return KT(2 * params["M"] * params["N"] * params["K"] / 1e12)
    if op == "sdpa_causal_fwd":
        return KT(2 * params["T"] ** 2 * params["H"] * params["D"] / 1e12)
    if op == "sdpa_causal_fwd_bwd":
        return KT(3.5 * 2 * params["T"] ** 2 * params["H"] * params["D"] / 1e12)
    if op in ("all_gather", "reduce_scatter"):
        return KT(1e-5 + params["bytes"] / 1e9)
    raise KeyError(op)
