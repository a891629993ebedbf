"""Parameter counts: a toy model counted by hand, and the three real models against published totals."""

from __future__ import annotations

import pytest

from memory_toys import toy_fixture  # noqa: F401 (the `toy` fixture)

from k3sim.configs import load_model
from k3sim.memory.params import count_params, kda_layer_params, mla_layer_params

# Published (total, active) and the tolerance the issue sets.
PUBLISHED = {
    "kimi-k3": (2.8e12, 104e9, 0.03),
    "kimi-k2": (1.04e12, 32e9, 0.03),
    "kimi-linear-48b": (48e9, 3e9, 0.05),
}


def test_toy_layers_by_hand(toy):
    # KDA (d=16, H=2, dk=dv=4): q,k,v 16*24=384; conv 4*24=96; full-rank alpha gate 16*8=128; beta 16*2=32;
    # A_log + dt_bias 2+8=10; output gate rank 2: 16*2+2*8=48; o_norm 4; o_proj 8*16=128 -> 830.
    assert kda_layer_params(toy) == 384 + 96 + 128 + 32 + 10 + 48 + 4 + 128 == 830
    # MLA (no q_lora): q 16*2*6=192; kv_a 16*10+8=168; kv_b 8*2*8=128; o 8*16=128; gate 16*8=128 -> 744.
    assert mla_layer_params(toy) == 192 + 168 + 128 + 128 + 128 == 744


def test_toy_totals_by_hand(toy):
    r = count_params(toy)
    c = r.by_component()
    assert c["kda"]["total"] == 3 * 830 and c["mla"]["total"] == 744
    assert c["dense_ffn"]["total"] == 3 * 16 * 32
    assert c["routed_experts"] == {"total": 3 * 4 * (3 * 8 * 8), "active": 3 * 2 * (3 * 8 * 8)}
    assert c["shared_experts"]["total"] == 3 * (3 * 16 * 8)
    assert c["latent_projections"]["total"] == 3 * (2 * 16 * 8 + 8)
    assert c["router"]["total"] == 3 * (16 * 4 + 4)
    assert c["norms"]["total"] == 4 * 32 + 16 and c["attn_res"]["total"] == 4 * 64
    assert c["embeddings"] == {"total": 1600, "active": 0} and c["lm_head"]["active"] == 1600
    assert r.total_params == 12822
    assert r.active_params == 12822 - 1600 - 3 * 4 * 192 + 3 * 2 * 192 == 10070


def test_tied_embeddings_drop_lm_head(toy):
    tied = toy.model_copy(update={"tie_word_embeddings": True})
    assert count_params(toy).total_params - count_params(tied).total_params == 1600


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_totals(root, name):
    total, active, tol = PUBLISHED[name]
    r = count_params(load_model(root / f"models/{name}.yaml"))
    assert r.total_params == pytest.approx(total, rel=tol)
    assert r.active_params == pytest.approx(active, rel=tol)
    assert sum(row.total_params for row in r.rows) == r.total_params


def test_k3_routed_experts_dominate(root):
    """3 x 3584 x 3072 = 33.03 M per expert; x 896 x 92 layers = 2.72 T (domain-facts sec. 2.2)."""
    c = count_params(load_model(root / "models/kimi-k3.yaml")).by_component()
    assert c["routed_experts"]["total"] == 92 * 896 * 3 * 3584 * 3072
    assert c["vision"]["total"] == pytest.approx(401e6, rel=0.05)  # MoonViT-V2


def test_k3_checkpoint_bytes(root):
    """Routed experts in MXFP4 and the rest in bf16 reproduce the ~1.56 TB checkpoint."""
    from k3sim.commands.model_info import model_info_result

    info = model_info_result(str(root / "models/kimi-k3.yaml"))
    assert info["weight_bytes"] == pytest.approx(1.56e12, rel=0.03)


def test_stored_weight_bytes_by_format(toy):
    from k3sim.memory.params import stored_format, stored_weight_bytes

    assert stored_weight_bytes(toy) == 2 * 12822  # everything bf16
    fp8_experts = toy.model_copy(update={"moe": toy.moe.model_copy(update={"routed_weight_format": "fp8"})})
    assert stored_format(fp8_experts, "routed_experts") == "fp8" and stored_format(fp8_experts, "norms") == "bf16"
    assert stored_weight_bytes(fp8_experts) == 2 * 12822 - 3 * 4 * (3 * 8 * 8)  # 2304 routed params at 1 B
