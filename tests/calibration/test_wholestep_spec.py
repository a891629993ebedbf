"""Whole-step shapes, manifest and CLI arguments (CPU, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from k3sim.calibration.wholestep import run as R
from k3sim.calibration.wholestep import spec as S
from k3sim.configs import load_model
from k3sim.errors import InputError


@pytest.fixture(scope="module")
def specs(request):
    return S.load_specs()


def test_specs_json_is_what_the_configs_give(root):
    # The GPU side reads specs.json (no pydantic there); it must not drift from the YAML configs.
    assert json.loads(S.SPECS_PATH.read_text()) == S.build_specs(root)


def test_kimi_linear_whole_model_shapes(specs):
    s = specs["kimi-linear-48b"]
    assert (s.num_kda, s.num_mla, len(s.layers)) == (20, 7, 27)
    assert s.layers[0] == {"index": 1, "attn": "kda", "ffn": "dense"} and s.dense_width == 9216
    assert [r["index"] for r in s.layers if r["attn"] == "mla"] == [4, 8, 12, 16, 20, 24, 27]
    assert s.embed_head and s.vocab_local == 163840
    assert (s.kda.heads, s.kda.gate_rank, s.kda.out_gate_rank) == (32, 128, 128)
    assert (s.moe.experts, s.moe.experts_local, s.moe.topk, s.moe.width, s.moe.shared_width) == (256, 256, 8, 1024, 1024)
    assert s.moe.latent is None and s.mla.q_lora is None


def test_k3_tp8_slice_per_rank_shapes(specs):
    s = specs["k3-tp8-ep8-l5-8"]
    assert [(r["index"], r["attn"], r["ffn"]) for r in s.layers] == [
        (5, "kda", "moe"), (6, "kda", "moe"), (7, "kda", "moe"), (8, "mla", "moe")]
    assert not s.embed_head and s.vocab_local == 0
    assert s.kda.heads == 96 // 8 and s.kda.gate_rank is None   # use_full_rank_gate
    assert (s.mla.heads, s.mla.q_lora, s.mla.out_gate) == (12, 1536, True)
    # 896 experts over EP8 = 112 per rank; 2 shared experts of 3072 split over TP8 = 768
    assert (s.moe.experts_local, s.moe.latent, s.moe.shared_width, s.moe.routed_format) == (112, 3584, 768, "mxfp4")


def test_weight_bytes_agree_with_the_parameter_count(specs, root):
    # Two independent counts: the builder's allocation (spec.weight_bytes) and memory.params.
    from k3sim.memory.params import layer_params

    m = load_model(root / "models/kimi-linear-48b.yaml")
    n = sum(sum(layer_params(m, i).values()) for i in range(m.num_layers)) + 2 * m.vocab_size * m.hidden_size
    assert S.weight_bytes(specs["kimi-linear-48b"]) == pytest.approx(2 * n, rel=2e-3)
    assert 97e9 < S.weight_bytes(specs["kimi-linear-48b"]) < 99e9   # the brief's "about 98 GB"


def test_cache_and_state_bytes_hand_worked(specs):
    s = specs["kimi-linear-48b"]
    assert S.cache_bytes(s, 64, 65536) == 7 * 64 * 65536 * 576 * 2
    # per sequence: 20 layers x (32 x 128 x 128 x 4 B state + 3 x 32 x 128 x 4 x 2 B conv state)
    assert S.state_bytes(s, 1) == 20 * (2097152 + 98304)
    free = 40 * 10 ** 9
    pts = S.decode_points(s, [1, 64, 256], [4096, 65536], free)
    assert (64, 65536) in pts and (256, 65536) not in pts   # 33.8 GB + 0.1 GB fits 40 GB; 135 GB does not


def test_decode_pools_cover_every_point_that_fits(specs):
    s = specs["kimi-linear-48b"]
    free = 40 * 10 ** 9
    B, C = [1, 64, 256], [4096, 65536]
    pools = S.plan_pools(s, B, C, free)
    covered = [p for pts, _, _ in pools for p in pts]
    assert sorted(covered) == sorted(S.decode_points(s, B, C, free))
    assert (64, 65536) in covered            # 33.8 GB of cache fits, but not beside B = 256's 11.2 GB of states
    for pts, mb, tokens in pools:            # each pool holds its states and its largest cache at once
        assert S.state_bytes(s, mb) + tokens * S.cache_bytes(s, 1, 1) <= free
        assert all(b <= mb and b * c <= tokens for b, c in pts)
    assert len(pools) == 2


def test_manifest_of_a_k3_decode_step(specs):
    s = specs["k3-tp8-ep8-l5-8"]
    man = S.manifest(s, S.StepShape(decodes=64, context=32768))
    assert man["layer_counts"] == {"kda": 3, "mla": 1, "moe": 4}
    moe = [(o["op"], o["params"]) for o in man["layers"]["moe"]]
    assert ("gemm_bf16", {"M": 64, "N": 3584 + 896, "K": 7168}) in moe     # latent + router fused
    assert ("moe_grouped_bf16", {"B": 64, "E": 112, "K": 3584, "N": 6144, "topk": 2}) in moe
    # 64 x 16 picks, 1/8 of them local: m = 128, gathered rows = ceil(128 + 6 sqrt(128) + 16) = 212
    assert ("moe_permute", {"T": 64, "topk": 16, "rows": 212, "D": 3584}) in moe
    mla = [(o["op"], o["params"]) for o in man["layers"]["mla"]]
    assert ("mla_decode", {"B": 64, "C": 32768, "H": 12}) in mla
    assert ("gemm_bf16", {"M": 64, "N": 2112, "K": 7168}) in mla            # q_a + kv_a, grids.GEMM_NK
    kda = [(o["op"], o["params"]) for o in man["layers"]["kda"]]
    assert ("gemm_bf16", {"M": 64, "N": 4608, "K": 7168}) in kda            # fused q/k/v at TP8
    assert ("recurrent_kda_decode", {"B": 64, "T": 1, "H": 12}) in kda
    mx = S.manifest(s, S.StepShape(decodes=64, context=32768), "mxfp4")["layers"]["moe"]
    assert [o["op"] for o in mx].count("moe_mxfp4_decode") == 1 and "moe_permute" not in [o["op"] for o in mx]


def test_moe_rows_hand_worked():
    assert S.moe_rows(64, 8, 256, 256) == 512                  # no EP: every pick
    assert S.moe_rows(1, 16, 112, 896) == 16                   # 2 + 8.5 + 16 > 16 picks: all of them
    assert S.moe_rows(8192, 16, 112, 896) == 16384 + 768 + 16  # K3 training slice, EP8


def test_manifest_of_a_mixed_prefill_step(specs):
    s = specs["kimi-linear-48b"]
    st = S.StepShape(decodes=32, context=4096, chunk=2048, prefix=8192)
    man = S.manifest(s, st)
    kda = [(o["op"], o["params"]) for o in man["layers"]["kda"]]
    assert kda[1] == ("gemm_bf16", {"M": 2048 + 32, "N": 3 * 32 * 128, "K": 2304})
    assert ("chunk_kda_fwd", {"T": 2048, "H": 32}) in kda and ("recurrent_kda_decode", {"B": 32, "T": 1, "H": 32}) in kda
    mla = [(o["op"], o["params"]) for o in man["layers"]["mla"]]
    assert ("sdpa_prefix_causal_fwd", {"Tq": 2048, "Tkv": 8192 + 2048, "H": 32, "D": 192}) in mla
    assert ("gemm_bf16", {"M": 8192 + 2048, "N": 32 * 256, "K": 512}) in mla  # kv_b over prefix + chunk
    # the LM head scores the chunk's last token and the 32 decodes
    assert man["layers"]["lm_head"][1]["params"] == {"M": 33, "N": 163840, "K": 2304}
    seq = S.sequence(s, st)
    assert seq[0]["op"] == "embedding" and seq[-1]["op"] == "gemm_bf16"
    assert sum(o["op"] == "chunk_kda_fwd" for o in seq) == 20 and sum(o["op"] == "mla_decode" for o in seq) == 7


def test_train_manifest_uses_fwd_bwd_ops(specs):
    st = S.StepShape(chunk=4096, seqs=2, train=True)
    man = S.manifest(specs["kimi-linear-48b-l5-8"], st)
    ops = [(o["op"], o["params"]) for o in man["layers"]["kda"] + man["layers"]["mla"]]
    assert ("chunk_kda_fwd_bwd", {"T": 4096, "H": 32, "B": 2}) in ops
    assert ("sdpa_causal_fwd_bwd", {"T": 4096, "H": 32, "D": 192, "B": 2}) in ops
    assert "kv_cache_write" not in [o for o, _ in ops]


def test_layout_that_does_not_divide_is_refused(root):
    m = load_model(root / "models/kimi-k3.yaml")
    with pytest.raises(InputError, match="--tp"):
        S.spec_from_config(m, tp=5)
    with pytest.raises(InputError, match="--ep"):
        S.spec_from_config(m, tp=8, ep=3)
    with pytest.raises(InputError, match="--layers"):
        S.spec_from_config(m, layers=(90, 99))


def test_parse_args_and_plan():
    a = R.parse_args(["--out", "x", "--batches", "1,64", "--contexts", "4096"])
    assert a.batches == [1, 64] and a.contexts == [4096]
    plan = R.parse_plan(R.DEFAULT_PLAN, S.load_specs())
    assert [p for _, _, p, _ in plan] == ["decode", "decode", "prefill", "decode", "train", "train"]
    assert [k for c, k, p, _ in plan if c.startswith("k3")] == ["mxfp4", "grouped_bf16", "grouped_bf16"]
    with pytest.raises(InputError, match="expert kernel"):
        R.parse_args(["--out", "x", "--plan", "k3-tp8-ep8-l5-8@fp3:decode=10"])
    with pytest.raises(InputError, match="unknown configuration"):
        R.parse_args(["--out", "x", "--plan", "nope:decode=10"])
    # the whole model trains too (weight gradients dropped as made: model.WholeStepModel free_grads)
    assert R.parse_plan("kimi-linear-48b:train=10", S.load_specs()) == [("kimi-linear-48b", "grouped_bf16", "train", 10.0)]
    with pytest.raises(InputError, match="positive"):
        R.parse_args(["--out", "x", "--plan", "kimi-linear-48b:decode=-1"])
    with pytest.raises(InputError, match="--batches"):
        R.parse_args(["--out", "x", "--batches", "0,4"])


def test_cli_bad_plan_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "k3sim.calibration.wholestep.run", "--out", str(tmp_path / "o"),
                        "--plan", "kimi-linear-48b:warp=5"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "--plan" in p.stderr and "warp" in p.stderr
    assert not (tmp_path / "o").exists()


def test_manifest_only_needs_no_gpu(tmp_path):
    # The lead's step model is checked against these lists before the device run.
    assert R.main(["--out", str(tmp_path), "--manifest-only"]) == 0
    doc = json.loads((tmp_path / "manifest.json").read_text())
    kl = doc["kimi-linear-48b"]
    assert len(kl["decode@grouped_bf16"]["points"]) == 9 * 4 and len(kl["prefill@grouped_bf16"]["points"]) == 5 * 2 * 2
    assert kl["prefill@grouped_bf16"]["points"][-1] == dict(decodes=32, context=4096, chunk=8192, prefix=8192, seqs=1,
                                                            train=False)
    k3 = doc["k3-tp8-ep8-l5-8"]
    assert set(k3) == {"decode@mxfp4", "decode@grouped_bf16", "train"}
    assert [p["context"] for p in k3["decode@mxfp4"]["points"]][::9] == [4096, 32768]
    assert "moe_mxfp4_decode" in [o["op"] for o in k3["decode@mxfp4"]["layers"]["moe"]]
    assert [p["seqs"] for p in doc["kimi-linear-48b-l5-8"]["train"]["points"]] == [1, 2]
