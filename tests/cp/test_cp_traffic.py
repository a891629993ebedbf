"""Traffic formulas on hand-worked numbers (the arithmetic is written in each test)."""

from __future__ import annotations

import pytest

from cp_fakes import k3
from k3sim.cp.traffic import check_strategy, layer_traffic, ring_kv_recv_bytes_per_rank
from k3sim.errors import InputError

MIB = 2 ** 20


@pytest.mark.parametrize("S", [32768, 1048576])
def test_kcp_bf16_p8_is_42_mib_at_any_length(S):
    """[S~|M] per head: 128 x (128 + 128) x 2 B = 64 KiB; 96 heads: 6 MiB; 7 other ranks: 42 MiB."""
    fwd, bwd = layer_traffic("kcp", "kda", k3(), S, 8, state_bytes=2.0, conv_halo=False)
    assert fwd.recv_bytes == 7 * 96 * 128 * 256 * 2 == 42 * MIB
    assert fwd.send_bytes == 42 * MIB and fwd.messages == 7
    assert bwd.recv_bytes == 42 * MIB                     # second all-gather of [dS~|dM]


def test_kcp_fp32_and_conv_halo():
    """fla keeps the state in fp32: 84 MiB; the halo adds 3 rows x 96 x (128+128+128) x 2 B = 221 184 B."""
    fwd, _ = layer_traffic("kcp", "kda", k3(), 65536, 8, state_bytes=4.0)
    assert fwd.recv_bytes == 84 * MIB + 3 * 96 * 384 * 2
    assert fwd.messages == 7 + 1


def test_kcp_single_rank_moves_nothing():
    fwd, bwd = layer_traffic("kcp", "kda", k3(), 4096, 1, state_bytes=2.0)
    assert fwd.recv_bytes == bwd.recv_bytes == 0 and fwd.messages == 0


def test_lasp2_moves_half_of_kcp_when_dk_equals_dv():
    """LASP-2 gathers only S (d_k x d_v); KCP also needs M (d_k x d_k)."""
    kcp, _ = layer_traffic("kcp", "kda", k3(), 8192, 4, state_bytes=2.0, conv_halo=False)
    lasp, _ = layer_traffic("lasp2", "kda", k3(), 8192, 4, state_bytes=2.0)
    assert 2 * lasp.recv_bytes == kcp.recv_bytes


def test_ring_4bsd_rule_at_1e6_tokens():
    """h_kv = d = 7168, bf16: 4 S d = 4 x 1e6 x 7168 = 28.7 GB ('about 30 GB'); a rank receives (P-1)/P of it."""
    assert ring_kv_recv_bytes_per_rank(1e6, 10 ** 6, 2 * 7168) == pytest.approx(28.672e9, rel=1e-5)
    assert ring_kv_recv_bytes_per_rank(1e6, 8, 2 * 7168) == pytest.approx(7 / 8 * 28.672e9)


def test_mla_ring_latent_vs_expanded():
    """S = 32768, P = 8 -> L = 4096 tokens per hop, 7 hops.
    latent 576 x 2 B = 1152 B/token: 7 x 4096 x 1152 = 33 030 144 B;
    expanded 96 x (192 + 128) = 30 720 elements: 7 x 4096 x 61 440 = 1 761 607 680 B (53.3x)."""
    lat, lat_b = layer_traffic("ring", "mla", k3(), 32768, 8, mla_kv="latent")
    exp, _ = layer_traffic("ring", "mla", k3(), 32768, 8, mla_kv="expanded")
    assert lat.recv_bytes == 33_030_144 and lat.messages == 7
    assert exp.recv_bytes == 1_761_607_680
    assert lat_b.recv_bytes == (7 + 8) * 4096 * 1152    # K/V again (7 hops) plus dK/dV (8: the last goes home)


def test_ulysses_kda_moves_q_k_v_gate_beta_and_o():
    """S = 32768, P = 4 -> L = 8192. In: 96 x (3 x 128 + 128 + 1) = 49 248 elements/token ->
    8192 x 49 248 x 2 B = 806 879 232 B, a rank keeps 1/4: sends 605 159 424 B. Out: 8192 x 96 x 128 x 2
    x 3/4 = 150 994 944 B. Total 756 154 368 B (domain-facts: 'about 0.75 GB')."""
    fwd, bwd = layer_traffic("ulysses", "kda", k3(), 32768, 4)
    assert fwd.send_bytes == 605_159_424 + 150_994_944
    assert bwd.send_bytes == fwd.send_bytes
    assert fwd.messages == 2 * 3


def test_ulysses_mla_moves_expanded_qkv():
    """In: 96 x (2 x 192 + 128) = 49 152 elements/token, out 96 x 128; S = 16384, P = 2 -> L = 8192, keep 1/2."""
    fwd, _ = layer_traffic("ulysses", "mla", k3(), 16384, 2)
    assert fwd.recv_bytes == 503_316_480  # 8192 x 61 440 x 2 B, half of it from the other rank


def test_allgather_kv_bytes():
    """All-gather of L x 576 x 2 B from 3 other ranks; S = 8192, P = 4 -> 3 x 2048 x 1152 = 7 077 888 B."""
    fwd, bwd = layer_traffic("allgather-kv", "mla", k3(), 8192, 4)
    assert fwd.recv_bytes == 7_077_888
    assert bwd.recv_bytes == 7_077_888                  # reduce-scatter of dK/dV (re-gather added in the model)


@pytest.mark.parametrize("strategy,kind,S,P,tp,match", [
    ("ring", "kda", 8192, 4, 1, "does not apply to KDA"),
    ("kcp", "mla", 8192, 4, 1, "does not apply to MLA"),
    ("lasp2", "mla", 8192, 4, 1, "does not apply to MLA"),
    ("kcp", "kda", 8192, 3, 1, "does not divide"),
    ("zigzag-ring", "mla", 24, 8, 1, "2P = 16 does not divide"),
    ("allgather-kv", "mla", 24, 8, 1, "2P = 16"),
    ("ulysses", "kda", 16 * 1024, 16, 8, "P <= heads"),
    ("ulysses", "mla", 5 * 1024, 5, 1, "divide the 96"),
    ("kcp", "kda", 0, 8, 1, "must be positive"),
    ("warp", "kda", 8192, 4, 1, "unknown strategy"),
])
def test_bad_strategy_inputs(strategy, kind, S, P, tp, match):
    heads = 96 // tp
    with pytest.raises(InputError, match=match):
        check_strategy(strategy, kind, S, P, heads, "--strategy")


def test_good_zigzag_passes():
    assert check_strategy("zigzag-ring", "mla", 32, 8, 96, "--mla-strategy") == "zigzag"


def test_default_state_dtype_is_the_models_else_fp32():
    from types import SimpleNamespace

    from k3sim.cp import default_state_dtype

    assert default_state_dtype(SimpleNamespace(kda=SimpleNamespace(state_dtype="bf16"))) == "bf16"
    assert default_state_dtype(SimpleNamespace(kda=None)) == "fp32"  # no KDA layers: nothing to move anyway
