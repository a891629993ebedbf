"""MTP rollback per layer kind (issue 23 item 5): snapshot and replay bytes per recurrent layer, hand-worked
for one Qwen3-Next GDN layer and one Nemotron-H Mamba2 layer at tp 1 and 2 with MTP 1 and 3; KDA's rows kept;
attention kinds truncate; the MTP module's decoder layer."""

from dataclasses import dataclass

import pytest

from k3sim.configs import load_hardware, load_model
from k3sim.configs.kinds import MIXERS, RECURRENT
from k3sim.decode import SpecConfig, decode_step
from k3sim.decode.model import mtp_layer_indices
from k3sim.decode.rollback import (PROJECTED_INPUTS, projection_cache_bytes_per_token, replay_cache_bytes_per_sequence,
                                   snapshot_bytes_per_sequence)
from k3sim.step import StepLayout

HW = load_hardware("h200")
QWEN = load_model("models/qwen3-next-80b-a3b.yaml")
NEMO = load_model("models/nemotron-h-56b.yaml")
KL = load_model("models/kimi-linear-48b.yaml")


# Qwen3-Next GDN layer: 16 key heads, 32 value heads, d_k = d_v = 128, conv 4, fp32 state, bf16 conv/inputs.
#   state: 32 x 128 x 128 x 4 B = 2,097,152 B at tp 1 (1,048,576 at tp 2)
#   conv window: 3 x (2 x 16 x 128 + 32 x 128) x 2 B = 3 x 8192 x 2 = 49,152 B (24,576 at tp 2)
#   projected inputs per token: q, k 2 x 16 x 128 + v 32 x 128 + beta, g 2 x 32 = 8256 elements x 2 B = 16,512 B
#   (tp 2: 2 x 8 x 128 + 16 x 128 + 2 x 16 = 4128 x 2 = 8,256 B)
#   snapshot: n copies of each; replay cache: 2 (write + read) x (n + 1) tokens x the per-token bytes
@pytest.mark.parametrize("tp, mtp, state, conv, per_token, replay", [
    (1, 1, 2_097_152, 49_152, 16_512, 66_048),
    (1, 3, 6_291_456, 147_456, 16_512, 132_096),
    (2, 1, 1_048_576, 24_576, 8_256, 33_024),
    (2, 3, 3_145_728, 73_728, 8_256, 66_048),
])
def test_qwen3_next_gdn_layer_snapshot_and_replay_bytes(tp, mtp, state, conv, per_token, replay):
    assert snapshot_bytes_per_sequence(QWEN, "gdn", tp, mtp) == (state, conv)
    assert projection_cache_bytes_per_token(QWEN, "gdn", tp) == per_token
    assert replay_cache_bytes_per_sequence(QWEN, "gdn", tp, mtp) == replay


# Nemotron-H-56B Mamba2 layer: 256 heads x head_dim 64, d_state 256, 8 groups, conv 4, fp32 state.
#   state: 256 x 64 x 256 x 4 B = 16,777,216 B at tp 1 (8,388,608 at tp 2)
#   conv window: 3 x (256 x 64 + 2 x 8 x 256) x 2 B = 3 x 20480 x 2 = 122,880 B (tp 2: 3 x 10240 x 2 = 61,440)
#   projected inputs per token: x 256 x 64 + B, C 2 x 8 x 256 + dt 256 = 20736 elements x 2 B = 41,472 B
#   (tp 2: 128 x 64 + 2 x 4 x 256 + 128 = 10368 x 2 = 20,736 B)
@pytest.mark.parametrize("tp, mtp, state, conv, per_token, replay", [
    (1, 1, 16_777_216, 122_880, 41_472, 165_888),
    (1, 3, 50_331_648, 368_640, 41_472, 331_776),
    (2, 1, 8_388_608, 61_440, 20_736, 82_944),
    (2, 3, 25_165_824, 184_320, 20_736, 165_888),
])
def test_nemotron_h_mamba2_layer_snapshot_and_replay_bytes(tp, mtp, state, conv, per_token, replay):
    assert snapshot_bytes_per_sequence(NEMO, "mamba2", tp, mtp) == (state, conv)
    assert projection_cache_bytes_per_token(NEMO, "mamba2", tp) == per_token
    assert replay_cache_bytes_per_sequence(NEMO, "mamba2", tp, mtp) == replay


def test_every_recurrent_kind_has_its_projected_inputs():
    # a new recurrent kind in the registry must say what its replay caches (else it would be priced as free)
    assert set(RECURRENT) <= set(PROJECTED_INPUTS)
    assert all(MIXERS[k].recurrent for k in PROJECTED_INPUTS)


def test_a_single_mamba2_group_is_held_whole_by_every_rank():
    # Granite-4.0-H-Small: 128 heads x 64, d_state 128, one group. At tp 4 a rank holds 32 heads and the whole
    # group: x 32 x 64 + B, C 2 x 128 + dt 32 = 2336 elements x 2 B = 4,672 B per token
    granite = load_model("models/granite-4.0-h-small.yaml")
    assert projection_cache_bytes_per_token(granite, "mamba2", 4) == 4_672


@dataclass
class KT:
    seconds: float
    source: str = "fake"
    detail: str = ""


def copies_only(op, params, hardware=None):
    """Only HBM copies cost: 1 s per GB copied (so seconds = bytes / 1e9), every other kernel nothing."""
    return KT(params["bytes"] / 1e9 if op == "hbm_copy" else 0.0)


def test_kda_keeps_its_rows_and_adds_its_conv_window_under_snapshot():
    # Kimi-Linear at tp 1: 20 KDA layers of 32 heads x 128 x 128; MTP 2, 16 sequences, snapshot.
    #   kda_state_snapshots: 2 x 16 x 2,097,152 B per layer = 67,108,864 B, x 20 layers = 1,342,177,280 B
    #   kda_conv_state_snapshots: 2 x 16 x 3 x 32 x 384 x 2 B = 2,359,296 B per layer, x 20 = 47,185,920 B
    # a write of X bytes is priced as a copy of X / 2: the fake gives X / 2e9 seconds
    r = decode_step(KL, HW, StepLayout(), 16, 4096, spec=SpecConfig(2, 0.5, "snapshot"), kernel_time=copies_only,
                    memory_cap=False)
    rows = {x.component: x for x in r.rows if x.component.startswith("kda_")}
    assert sum(x.bytes for x in r.rows if x.component == "kda_state_snapshots") == 1_342_177_280
    assert sum(x.bytes for x in r.rows if x.component == "kda_conv_state_snapshots") == 47_185_920
    assert rows["kda_state_snapshots"].count == 20
    (kda,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "kda"]
    assert kda["snapshot_bytes_per_step"] == 1_342_177_280 + 47_185_920
    assert kda["seconds_per_step"] == pytest.approx((1_342_177_280 + 47_185_920) / 2e9)
    assert r.spec["rollback_s"] == pytest.approx(kda["seconds_per_step"])
    (mla,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "mla"]
    assert mla["scheme"] == "kv-truncate" and mla["seconds_per_step"] == 0 and mla["layers"] == 7


def test_kda_replay_caches_q_k_v_g_and_beta_of_the_verified_tokens():
    # Kimi-Linear at tp 1, MTP 2, 16 sequences, replay: 32 heads x (3 x 128 + 128 + 1) = 16,416 elements x 2 B
    # = 32,832 B per token; written and read for 3 tokens: 2 x 3 x 32,832 x 16 = 3,151,872 B per layer, x 20
    r = decode_step(KL, HW, StepLayout(), 16, 4096, spec=SpecConfig(2, 0.5, "replay"), kernel_time=copies_only,
                    memory_cap=False)
    assert sum(x.bytes for x in r.rows if x.component == "kda_projection_cache") == 20 * 3_151_872
    assert not any(x.component.endswith("_snapshots") for x in r.rows)
    (kda,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "kda"]
    assert kda["projection_cache_bytes_per_token"] == 32_832
    assert kda["recurrent_tokens_per_sequence"] == 4  # 3 + ceil(1.75 - 1)
    assert r.spec["kda_tokens_per_sequence"] == r.spec["recurrent_tokens_per_sequence"] == 4


def test_the_mtp_layer_is_the_last_attention_layer_with_an_ffn():
    assert mtp_layer_indices(QWEN) == (47,)  # gqa/moe, as vLLM's Qwen3NextMTP (full_attention + MoE)
    assert mtp_layer_indices(KL) == (26,)  # MLA layer 27 (1-based), as before
    assert mtp_layer_indices(load_model("models/kimi-k3.yaml")) == (92,)
    # Nemotron-H's last attention block (106) has no FFN: its last MLP-only block (117) is added
    assert mtp_layer_indices(NEMO) == (106, 117)


def gdn_and_copies(op, params, hardware=None):
    """HBM copies at 1 s per GB copied, 1 us per one-token GDN or Mamba2 state update, nothing else."""
    if op == "hbm_copy":
        return KT(params["bytes"] / 1e9)
    return KT(1e-6 if op in ("recurrent_gdn_decode", "mamba2_decode") else 0.0)


def test_gdn_snapshot_adds_only_the_conv_windows_the_sequential_verify_does_not_write():
    # Qwen3-Next at tp 2, 36 GDN layers (12 of 48 are GQA), 8 sequences, MTP 1, snapshot. The verify walks its 2
    # tokens as 2 sequential recurrent_gdn_decode calls, each persisting its state (the per-position snapshots),
    # so only the conv window is copied: 1 x 8 x 24,576 B = 196,608 B per layer, priced as a copy of half that
    r = decode_step(QWEN, HW, StepLayout(tp=2, ep=2), 8, 4096, spec=SpecConfig(1, 0.8, "snapshot"),
                    kernel_time=gdn_and_copies, memory_cap=False)
    (gdn,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "gdn"]
    assert gdn["layers"] == 36 and gdn["scheme"] == "snapshot"
    assert gdn["state_copies_in_verify_per_sequence"] == 2 and gdn["state_copies_added_per_sequence"] == 0
    assert not any(x.component == "gdn_state_snapshots" for x in r.rows)
    assert gdn["snapshot_bytes_per_step"] == 36 * 196_608
    assert gdn["seconds_per_step"] == pytest.approx(36 * 196_608 / 2e9)
    (gqa,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "gqa"]
    assert gqa["scheme"] == "kv-truncate" and gqa["layers"] == 12 and gqa["seconds_per_step"] == 0


def test_gdn_replay_caches_inputs_and_walks_the_accepted_token_again():
    # Same layout, replay, acceptance 0.8: a step yields 1.8 tokens, so the recurrence walks 2 + ceil(0.8) = 3
    # tokens, one more sequential call (1 us) per layer; the input cache is 8 x 33,024 B = 264,192 B per layer
    r = decode_step(QWEN, HW, StepLayout(tp=2, ep=2), 8, 4096, spec=SpecConfig(1, 0.8, "replay"),
                    kernel_time=gdn_and_copies, memory_cap=False)
    (gdn,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "gdn"]
    assert gdn["recurrent_tokens_per_sequence"] == 3
    assert gdn["projection_cache_bytes_per_step"] == 36 * 264_192
    assert gdn["replay_seconds_per_step"] == pytest.approx(36 * 1e-6)
    assert gdn["seconds_per_step"] == pytest.approx(36 * (264_192 / 2e9 + 1e-6))
    assert sum(x.count for x in r.rows if x.component == "gdn_replay_accepted") == 36
    assert r.spec["kda_tokens_per_sequence"] is None and r.spec["recurrent_tokens_per_sequence"] == 3


def test_nemotron_h_mamba2_rollback_over_two_stages():
    # Nemotron-H at tp 2, pp 2: 54 Mamba2 layers over the stages; MTP 3 snapshot copies 3 conv windows of
    # 61,440 B per sequence and layer: 4 sequences x 184,320 B = 737,280 B per layer
    r = decode_step(NEMO, HW, StepLayout(tp=2, pp=2), 4, 4096, spec=SpecConfig(3, 0.5, "snapshot"),
                    kernel_time=gdn_and_copies, memory_cap=False)
    (m2,) = [k for k in r.spec["rollback_by_kind"] if k["kind"] == "mamba2"]
    assert m2["layers"] == 54 and m2["snapshot_bytes_per_step"] == 54 * 737_280
    snaps = [x for x in r.rows if x.component == "mamba2_conv_state_snapshots"]
    assert {x.stage for x in snaps} == {0, 1} and sum(x.count for x in snaps) == 54


@pytest.mark.parametrize("path", sorted(__import__("glob").glob("models/*.yaml")))
def test_every_shipped_model_decodes_with_and_without_mtp(path):
    import math

    model = load_model(path)
    lay = StepLayout(tp=8, pp=2, ep=8 if model.moe else 1)
    ctx = min(8192, model.max_context_tokens or 8192)
    for spec in (None, SpecConfig(1, 0.8, "replay"), SpecConfig(2, 0.6, "snapshot")):
        r = decode_step(model, HW, lay, 32, ctx, spec=spec, memory_cap=False)
        assert math.isfinite(r.tpot_s) and r.tpot_s > 0 and r.tokens_per_s_per_gpu > 0
        assert r.limiter
        if spec is not None:
            rolled = [k for k in r.spec["rollback_by_kind"] if k["scheme"] != "kv-truncate"]
            assert bool(rolled) == any(MIXERS[k].recurrent for k in model.mixer_kinds)
            # replay always writes and reads its input cache; a snapshot can be free (lightning: no conv window,
            # and its sequential verify persists every position's state itself)
            assert all(k["seconds_per_step"] > 0 if spec.rollback == "replay" else k["seconds_per_step"] >= 0
                       for k in rolled)
