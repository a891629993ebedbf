"""A toy hybrid model small enough to count by hand, and a toy GPU: plain functions, and the `toy` /
`toy_gpu` fixtures the memory tests import from here (not from a tests/memory/conftest.py: a second
conftest.py would shadow tests/conftest.py for `from conftest import ...`)."""

from __future__ import annotations

import pytest

from k3sim.configs import HardwareProfile, ModelConfig
from k3sim.configs.hardware import DATASHEET_FIELDS


def toy_model() -> ModelConfig:
    """4 layers: 3 KDA then 1 MLA; layer 1 dense FFN, layers 2-4 latent MoE; AttnRes blocks of 2."""
    return ModelConfig(
        name="toy", hidden_size=16, num_layers=4, vocab_size=100, full_attn_layers=[4],
        first_k_dense=1, dense_ffn_width=32, attn_res_block_size=2,
        kda=dict(num_heads=2, head_dim_k=4, head_dim_v=4, conv_kernel_size=4, output_gate_rank=2),
        mla=dict(num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
                 output_gate=True),
        moe=dict(num_routed_experts=4, num_active_experts=2, num_shared_experts=1, expert_ffn_width=8,
                 latent_width=8, latent_norm=True),
    )


def toy_gpu() -> HardwareProfile:
    return HardwareProfile(
        name="toy-gpu", hbm_bytes=1e6, hbm_bandwidth_bytes_per_s=1e9, peak_flops_per_s={"bf16": 1e12},
        scaleup_bandwidth_bytes_per_s=1e9, scaleup_domain_gpus=8, scaleout_bandwidth_bytes_per_s=1e8,
        num_sms=1, sources={f: "test" for f in DATASHEET_FIELDS})


@pytest.fixture(name="toy")
def toy_fixture() -> ModelConfig:
    return toy_model()


@pytest.fixture(name="toy_gpu")
def toy_gpu_fixture() -> HardwareProfile:
    return toy_gpu()
