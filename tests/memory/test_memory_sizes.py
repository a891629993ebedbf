"""Per-token / per-request sizes on hand-worked examples."""

from __future__ import annotations


from memory_toys import toy_fixture  # noqa: F401 (the `toy` fixture)

from k3sim.configs import load_model
from k3sim.memory import sizes


def test_k3_sizes(root):
    m = load_model(root / "models/kimi-k3.yaml")
    assert sizes.kda_state_bytes_per_request(m) == 69 * 96 * 128 * 128 * 4 == 434_110_464  # 414 MiB
    assert sizes.kda_state_bytes_per_request(m, "bf16") == 434_110_464 // 2
    assert sizes.mla_kv_bytes_per_token(m) == 24 * (512 + 64) * 2 == 27_648
    # conv: last 3 inputs of q, k, v (96 heads x 128 each), bf16
    assert sizes.conv_state_bytes_per_request(m) == 69 * 3 * 96 * (128 * 3) * 2 == 15_261_696
    # AttnRes: 8 block representatives of 7168 in bf16 = 114.7 KB per token (domain-facts sec. 7)
    assert sizes.attn_res_block_bytes_per_token(m) == 8 * 7168 * 2 == 114_688
    # 51.75 MiB per TP8 rank (domain-facts sec. 2.2)
    assert sizes.kda_state_bytes_per_request(m) / 8 / 2**20 == 51.75


def test_kimi_linear_and_k2_sizes(root):
    lin = load_model(root / "models/kimi-linear-48b.yaml")
    assert sizes.kda_state_bytes_per_request(lin) == 20 * 32 * 128 * 128 * 4
    assert sizes.mla_kv_bytes_per_token(lin) == 7 * 576 * 2
    k2 = load_model(root / "models/kimi-k2.yaml")
    assert sizes.kda_state_bytes_per_request(k2) == 0 and sizes.conv_state_bytes_per_request(k2) == 0
    assert sizes.mla_kv_bytes_per_token(k2) == 61 * 576 * 2
    assert sizes.attn_res_block_bytes_per_token(k2) == 0


def test_toy_sizes(toy):
    assert sizes.kda_state_bytes_per_request(toy) == 3 * (2 * 4 * 4) * 4  # 384
    assert sizes.mla_kv_bytes_per_token(toy) == 1 * (8 + 2) * 2  # 20
    assert sizes.conv_state_bytes_per_request(toy) == 3 * 3 * 2 * (4 + 4 + 4) * 2  # 432
    assert sizes.attn_res_block_bytes_per_token(toy) == 2 * 16 * 2  # ceil(4/2) blocks


def test_fp8_kv_cache_halves(toy):
    fp8 = toy.model_copy(update={"mla": toy.mla.model_copy(update={"kv_cache_dtype": "fp8"})})
    assert sizes.mla_kv_bytes_per_token(fp8) * 2 == sizes.mla_kv_bytes_per_token(toy)
