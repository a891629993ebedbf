"""Context parallelism per layer kind (issue 23): the GDN delta-rule fold, the decayed-sum folds of Mamba2 / Mamba-1
/ lightning, GQA's schemes, SWA's halo, every shipped model through `k3sim cp`, and the one-line refusals.
Bytes are worked by hand in each test from the model files' shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cp_fakes import ALPHA, GEMM_FLOPS, LINK, SDPA_FLOPS, fake_kernel_time, hw
from k3sim.configs import load_model
from k3sim.configs.kinds import MIXERS
from k3sim.cp import cp_step, geometry_from_model, model_cp_step
from k3sim.cp.attention import attention_traffic, window_pairs_per_rank
from k3sim.cp.folds import fold_traffic, state_pass_factor
from k3sim.cp.kinds import SCHEMES, shape_of
from k3sim.errors import InputError
from k3sim.kernels.ops import window_pairs

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "models").glob("*.yaml"))
MIB = 2 ** 20
HBM = 4e12             # bytes/s of the fake hbm_read


def model(name: str):
    return load_model(str(ROOT / "models" / f"{name}.yaml"))


def kt(op: str, p: dict, h) -> SimpleNamespace:
    """`cp_fakes.fake_kernel_time` plus the hybrid kinds' ops, with the same simple known costs."""
    if op in ("chunk_gdn_fwd", "mamba2_chunk_fwd"):
        return SimpleNamespace(seconds=2e-5 + p["T"] * p["H"] * 1e-10, source="fake")
    if op in ("chunk_gdn_fwd_bwd", "mamba2_chunk_fwd_bwd"):
        return SimpleNamespace(seconds=6e-5 + 3 * p["T"] * p["H"] * 1e-10, source="fake")
    if op == "hbm_read":
        return SimpleNamespace(seconds=p["bytes"] / HBM, source="fake")
    if op == "gqa_prefill_fwd":
        return SimpleNamespace(seconds=4.0 * p["D"] * p["Hq"] * window_pairs(p["T"], p["window"]) / SDPA_FLOPS,
                               source="fake")
    return fake_kernel_time(op, p, h)


def swa_toy():
    from k3sim.configs.model import ModelConfig

    att = dict(num_heads=32, num_kv_heads=8, head_dim=128)
    return ModelConfig(name="swa-toy", hidden_size=1024, num_layers=3, vocab_size=1000, tie_word_embeddings=True,
                       layer_pattern=["gqa/dense", "swa/dense x2"], dense_ffn_width=2048, gqa=att,
                       swa={**att, "window_tokens": 4096})


def test_every_registered_mixer_kind_has_a_cp_scheme():
    assert set(SCHEMES) == set(MIXERS)


def test_qwen3_next_gdn_fold_bytes_at_cp4_tp1():
    """(S~, M) per VALUE head: 32 x 128 x (128 + 128) x 4 B = 4 194 304 B (the 32 x 128 x 128 fp32 state is
    2 MiB, the transition as much again); an all-gather over 4 ranks brings 3 x 4 MiB = 12 582 912 B. Conv halo:
    3 rows of q, k (16 key heads x 128 each) and v (32 value heads x 128) = 3 x 8192 x 2 B = 49 152 B."""
    s = shape_of(model("qwen3-next-80b-a3b"), "gdn", tp=1)
    assert s.state_bytes == 32 * 128 * 128 * 4 == 2 * MIB
    assert s.fragment_bytes == 32 * 128 * 256 * 4 == 4_194_304
    fwd, bwd = fold_traffic(s, 4)
    assert fwd.recv_bytes == 3 * 4_194_304 + 49_152 == 12_632_064
    assert bwd.recv_bytes == fwd.recv_bytes and fwd.messages == 3 + 1
    assert dict(s.op_params) == {"H": 32, "Hk": 16, "K": 128, "V": 128} and s.op == "chunk_gdn_fwd"
    half = shape_of(model("qwen3-next-80b-a3b"), "gdn", tp=2)        # TP halves the value and key heads
    assert half.fragment_bytes == 4_194_304 // 2 and dict(half.op_params)["Hk"] == 8


def test_gdn_fold_time_by_hand():
    """S = 262 144, P = 4, fake clock: main chunk_gdn_fwd over L = 65 536 tokens x 32 value heads
    (2e-5 + 65536 x 32 x 1e-10 s), KCP's pre-process (0.90 x main, FLOP ratio), 3 fold steps of a (32 x 128) x 128
    x 128 matmul in three TF32 passes (fp32 state), the all-gather of 4 MiB and the halo; nothing overlaps."""
    r = model_cp_step(model("qwen3-next-80b-a3b"), hw(), 262144, 4, kernel_time=kt)
    gdn = next(k for k in r.kinds if k.kind == "gdn")
    main = 2e-5 + 65536 * 32 * 1e-10
    fold = 3 * 3 * 2 * (32 * 128) * 128 * 128 / GEMM_FLOPS
    ag = ALPHA + 3 * 4_194_304 / LINK
    halo = ALPHA + 49_152 / LINK
    from k3sim.cp.flops import kcp_preprocess_factor

    assert gdn.layer.fwd.time_s == pytest.approx(main * (1 + kcp_preprocess_factor()) + fold + ag + halo, rel=1e-12)
    assert gdn.scheme == "kcp" and gdn.layers == 36 and gdn.layer_state_recv_bytes_per_rank == 3 * 4_194_304


def test_mamba2_decayed_sum_fold_bytes_and_time():
    """Nemotron-H-56B, P = 8: a rank sends its state, 256 heads x 64 x 256 x 4 B = 16 MiB, and one fp32 decay per
    head (1 KiB): 16 778 240 B, 7 of them received; the conv halo is 3 rows of x (256 x 64) and B, C (8 groups x
    256 each) = 3 x 20 480 x 2 B = 122 880 B. Time: main + the local state pass 2KV / (2C(K+V) + 4KV) = 32768 /
    106496 of it (K = 256, V = 64, C = 64) + the prefix scan (8 states through HBM) + all-gather + halo."""
    m = model("nemotron-h-56b")
    s = shape_of(m, "mamba2", tp=1)
    assert s.state_bytes == 16 * MIB and s.fragment_bytes == 16 * MIB + 1024
    fwd, _ = fold_traffic(s, 8)
    assert fwd.recv_bytes == 7 * 16_778_240 + 122_880 == 117_570_560
    assert state_pass_factor(s) == pytest.approx(32768 / 106496, rel=1e-12)
    r = model_cp_step(m, hw(), 65536, 8, kernel_time=kt)
    k = next(k for k in r.kinds if k.kind == "mamba2")
    main = 2e-5 + 8192 * 256 * 1e-10
    expect = main * (1 + 32768 / 106496) + 8 * 16 * MIB / HBM + ALPHA + 7 * 16_778_240 / LINK + ALPHA + 122_880 / LINK
    assert k.layer.fwd.time_s == pytest.approx(expect, rel=1e-12)
    assert k.scheme == "lasp2" and k.layers == 54


@pytest.mark.parametrize("name, kind", [("qwen3-next-80b-a3b", "gdn"), ("nemotron-3-nano-30b-a3b", "mamba2")])
def test_documents_at_rank_edges_skip_the_fold_and_its_pre_process(name, kind):
    """8 documents on 8 ranks: every rank starts a document, so no state crosses (the all-gather still runs)."""
    r = model_cp_step(model(name), hw(), 65536, 8, kernel_time=kt, docs=8)
    rows = {c["component"].split(":")[0]: c["seconds_per_layer"] for c in r.breakdown if c["layer"] == kind}
    assert rows["fold"] == 0 and rows["pre-process"] == 0 and rows["all_gather"] > 0


def test_mamba1_and_lightning_folds():
    """Jamba's Mamba-1: 8192 channels x d_state 16 fp32 (512 KiB) plus a decay per channel (32 KiB), priced with the
    borrowed Mamba2 op (said in the notes). MiniMax-M1's lightning attention: the decay slopes are fixed, so only
    the state moves, 64 x 128 x 128 x 4 B = 4 MiB."""
    mamba = shape_of(model("jamba-1.5-mini"), "mamba", tp=1)
    assert mamba.fragment_bytes == 8192 * 16 * 4 + 8192 * 4 == 557_056
    assert "proxy" in mamba.op_note and dict(mamba.op_params) == {"H": 128, "K": 16, "V": 64}
    light = shape_of(model("minimax-m1"), "lightning", tp=1)
    assert light.fragment_bytes == light.state_bytes == 4 * MIB and light.halo_bytes == 0
    assert fold_traffic(light, 8)[0].recv_bytes == 7 * 4 * MIB


def test_gqa_allgather_kv_bytes_of_qwen3_next():
    """2 KV heads x 256, K and V in bf16: 2 x 2 x 256 x 2 B = 2 KiB a token. S = 262 144 over 4 ranks: each
    gathers the other 3 x 65 536 tokens = 402 653 184 B (384 MiB); backward gathers again and reduce-scatters
    dK/dV, twice that."""
    m = model("qwen3-next-80b-a3b")
    a = shape_of(m, "gqa", tp=1)
    assert a.kv_bytes_per_token == 2048 and (a.q_heads, a.kv_heads, a.head_dim) == (16, 2, 256)
    r = model_cp_step(m, hw(), 262144, 4, kernel_time=kt)
    g = next(k for k in r.kinds if k.kind == "gqa")
    assert g.layer_recv_bytes_per_rank == 3 * 65536 * 2048 == 402_653_184
    assert g.layer.bwd.recv_bytes == 2 * 402_653_184 and g.scheme == "allgather-kv"
    # the attention by hand: zigzag, slowest rank's pairs x the fake op's seconds per pair at T = L
    from k3sim.cp import docs as D

    work = D.pair_matrix(None, 262144, 4, "zigzag").sum(axis=1).max()
    assert g.layer.fwd.compute_s == pytest.approx(work * 4 * 256 * 16 / SDPA_FLOPS, rel=1e-12)


def test_gqa_ulysses_replicates_the_kv_heads_it_cannot_split():
    """Qwen3-Next, P = 4 > 2 KV heads: each rank receives a copy of its KV head, so q, k, v move (16 + 2 x 4) x 256
    elements a token: 65 536 x 6144 x 2 B, 3/4 of it on the wire; o moves 16 x 256 x 2 B a token."""
    a = shape_of(model("qwen3-next-80b-a3b"), "gqa", tp=1)
    fwd, _ = attention_traffic("ulysses", a, 262144, 4)
    assert fwd.recv_bytes == 3 / 4 * 65536 * (6144 + 4096) * 2 == 1_006_632_960


def test_swa_halo_is_the_window_and_nothing_more():
    """Window 4096, 8 KV heads x 128: 4096 B a token. At S = 65 536, P = 8 a rank receives the K/V of the 4095
    tokens before its first: 16 773 120 B, one hop (the rest of the sequence never crosses). A window longer
    than a rank's 8192 tokens (20 000) spans 3 ranks: 19 999 tokens in 3 hops."""
    m = swa_toy()
    a = shape_of(m, "swa", tp=1)
    assert a.window == 4096 and a.kv_bytes_per_token == 4096
    fwd, bwd = attention_traffic("window-halo", a, 65536, 8)
    assert fwd.recv_bytes == bwd.recv_bytes == 4095 * 4096 == 16_773_120 and fwd.messages == 1
    wide = SimpleNamespace(**{**a.__dict__, "window": 20000})
    fwd, _ = attention_traffic("window-halo", wide, 65536, 8)
    assert fwd.recv_bytes == pytest.approx(19999 * 4096) and fwd.collectives[0].count == 3
    r = model_cp_step(m, hw(), 65536, 8, kernel_time=kt)
    assert [(k.kind, k.layers, k.scheme) for k in r.kinds] == [("gqa", 1, "allgather-kv"), ("swa", 2, "window-halo")]
    assert r.step_attention_time_s == pytest.approx(sum(k.layers * k.layer_time_s for k in r.kinds), rel=1e-12)


def test_window_pairs_with_documents_match_a_brute_force_count():
    S, P, W = 64, 4, 5
    bounds = np.array([0, 10, 37, 64])
    got = window_pairs_per_rank(bounds, S, P, W)
    doc = np.searchsorted(bounds, np.arange(S), side="right") - 1
    brute = [sum(1 for t in range(r * 16, (r + 1) * 16) for s in range(S) if t - W < s <= t and doc[s] == doc[t])
             for r in range(P)]
    assert list(got) == brute
    assert list(window_pairs_per_rank(None, S, P, W)) == [window_pairs(16 * (r + 1), W) - window_pairs(16 * r, W)
                                                          for r in range(P)]


def test_kda_and_mla_answers_are_cp_steps():
    """K3 through model_cp_step is cp_step on its geometry, number for number."""
    m = model("kimi-k3")
    a = model_cp_step(m, hw(), 131072, 8, kernel_time=kt)
    b = cp_step(geometry_from_model(m), hw(), 131072, 8, kernel_time=fake_kernel_time)
    assert a.step_attention_time_s == b.step_attention_time_s and a.breakdown == b.breakdown
    assert [(k.kind, k.scheme) for k in a.kinds] == [("kda", "kcp"), ("mla", "allgather-kv")]


def test_the_kda_mla_geometry_still_refuses_other_kinds():
    """Its consumers (training's CP overhead, the planner's CP sweep) read KDA and MLA only: a GDN model is
    refused there, not priced with its GDN layers free."""
    with pytest.raises(InputError, match="GDN layers"):
        geometry_from_model(model("qwen3-next-80b-a3b"))


# ---------------------------------------------------------------- through the CLI, in-process

def run_main(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `k3sim argv...` through the real entry point, in-process."""
    from k3sim.cli import main

    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_every_shipped_model_answers_at_1m_or_its_context(path, capsys):
    m = load_model(str(path))
    S = min(2 ** 20, m.max_context_tokens or 2 ** 20)
    code, out, err = run_main(capsys, "cp", "--model", path, "--seq-len", S, "--cp", 8, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert math.isfinite(r["step_attention_time_s"]) and r["step_attention_time_s"] > 0
    assert {k["kind"] for k in r["kinds"]} == set(m.mixer_kinds)
    for k in r["kinds"]:
        assert k["scheme"] in SCHEMES[k["kind"]] and k["layers"] == m.num_layers_with(k["kind"])
        assert math.isfinite(k["layer_time_s"]) and k["layer_time_s"] > 0
    assert r["step_attention_time_s"] == pytest.approx(sum(k["step_time_s"] for k in r["kinds"]), rel=1e-12)


def test_cli_table_names_each_kinds_scheme(capsys):
    code, out, err = run_main(capsys, "cp", "--model", ROOT / "models" / "nemotron-h-56b.yaml", "--seq-len", "8K",
                              "--cp", 8, "--strategy", "ring")
    assert code == 0, err
    assert "Mamba2: lasp2; GQA: ring" in out and "(54 Mamba2 + 10 GQA)" in out and "rank-prefix scan" in out


QWEN, LLAMA, NEMO = (ROOT / "models" / f"{n}.yaml" for n in ("qwen3-next-80b-a3b", "llama-3.3-70b", "nemotron-h-56b"))


@pytest.mark.parametrize("argv, needles", [
    ([LLAMA, "--strategy", "kcp"], ["--strategy:", "does not apply to GQA layers",
                                    "GQA: allgather-kv, ring, zigzag-ring, ulysses", "kcp runs on KDA, GDN layers"]),
    ([NEMO, "--seq-len", "8K", "--strategy", "kcp"], ["--strategy:", "does not apply to Mamba2 or GQA layers"]),
    ([QWEN, "--seq-len", "256K", "--strategy", "lasp2"], ["--strategy:", "GDN: kcp"]),
    ([QWEN, "--seq-len", "256K", "--strategy", "magic"], ["--strategy: unknown strategy 'magic'"]),
    ([QWEN, "--seq-len", "256K", "--mla-strategy", "ring"], ["--mla-strategy:", "no MLA layers",
                                                             "GDN or GQA layers' scheme with --strategy"]),
    ([LLAMA, "--seq-len", "128K", "--mla-kv", "latent"], ["--mla-kv:", "no MLA layers"]),
    ([LLAMA, "--seq-len", "128K", "--state-dtype", "bf16"], ["--state-dtype:", "no recurrent layers"]),
    ([QWEN, "--seq-len", "256K", "--tp", "4", "--strategy", "ulysses"], ["--cp:", "divide the 4 GQA query heads"]),
    ([QWEN, "--seq-len", "256K", "--tp", "3"], ["--tp:", "tp=3 does not divide the 16 GDN key heads"]),
    ([QWEN, "--sweep", "--out", "/tmp/k3sim-never"], ["--sweep:", "GDN and GQA layers", "--seq-len"]),
    ([ROOT / "models" / "deepseek-v3.yaml", "--seq-len", "128K", "--strategy", "ring"],
     ["--strategy:", "deepseek-v3", "--mla-strategy"]),
])
def test_bad_input_is_one_line_naming_the_option(argv, needles, capsys):
    code, out, err = run_main(capsys, "cp", "--model", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    for n in needles:
        assert n in err, err
