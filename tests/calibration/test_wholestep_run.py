"""run.py end to end on CPU (skipped without torch): a tiny spec file, stand-in fla kernels, and the
GPU-only timers replaced by fixed timings. Checks the orchestration the device run depends on: plan
items in order, decode pools, skipped points recorded, one CSV row per point and timer with the
manifest check, manifest.json and provenance.yaml written."""

from __future__ import annotations

import csv
import functools
import json

import pytest

torch = pytest.importorskip("torch")

from k3sim.calibration import records  # noqa: E402
from k3sim.calibration.timing import Timing  # noqa: E402
from k3sim.calibration.wholestep import decode_step, model, prefill_step, train_step  # noqa: E402
from k3sim.calibration.wholestep import run as R  # noqa: E402
from k3sim.calibration.wholestep import spec as S  # noqa: E402
from k3sim.errors import InputError  # noqa: E402

from test_wholestep_model import _fake_fla, _inp, _tiny  # noqa: E402  (same directory; pytest puts it on sys.path)

T = Timing(1e-3, 0.9e-3, 1.1e-3, 20, 5e-4)


@pytest.fixture
def cpu_run(monkeypatch, tmp_path, root):
    specs = {
        "tiny": S.spec_from_config(_tiny(root, "models/kimi-linear-48b.yaml"), layers=(1, 4), head=True, name="tiny"),
        "tinyk3": S.spec_from_config(_tiny(root, "models/kimi-k3.yaml"), tp=2, ep=4, layers=(5, 8), name="tinyk3"),
    }
    path = tmp_path / "specs.json"
    path.write_text(json.dumps({k: v.to_dict() for k, v in specs.items()}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(records, "provenance", lambda command, gpus, parts: {"command": command, "parts": ",".join(parts)})
    monkeypatch.setattr(model, "WholeStepModel", functools.partial(model.WholeStepModel, fla=_fake_fla(), device="cpu"))
    # room for B = 8 at C = 16 and B = 1 at C = 32, not for B = 8 at C = 32
    per_tok, st8 = S.cache_bytes(specs["tiny"], 1, 1), S.state_bytes(specs["tiny"], 8)
    monkeypatch.setattr(decode_step, "free_bytes", lambda: st8 + 8 * 16 * per_tok)

    def decode_point(m, st, pool, trace=True, profile=None):
        if profile is not None:
            profile.append({"kernel": "fake_kernel", "calls": 2, "gpu_s": 1e-6})
        states = m.alloc_states(st, pool)
        return {"graph": T, "eager_events": T, "eager_wall": T}, m.trace(_inp(m, st), st, states)

    def prefill_point(m, st, trace=True, profile=None):
        states = m.alloc_states(st)
        return T, m.trace(_inp(m, st), st, states)

    def train_point(m, st, trace=True, profile=None):
        if profile is not None:
            profile["fwd"] = [{"kernel": "fake_fwd", "calls": 1, "gpu_s": 1e-6}]
            profile["fwd_bwd"] = [{"kernel": "fake_bwd", "calls": 3, "gpu_s": 3e-6}]
        x = torch.randn((st.tokens, m.spec.hidden)).to(torch.bfloat16).requires_grad_(True)
        m.forward(x, st).float().sum().backward()
        return {"fwd": T, "fwd_bwd": T}, m.trace(x, st)

    monkeypatch.setattr(decode_step, "measure_point", decode_point)
    monkeypatch.setattr(prefill_step, "measure_point", prefill_point)
    monkeypatch.setattr(train_step, "measure_point", train_point)
    return path, tmp_path / "out"


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_run_writes_rows_manifest_and_provenance(cpu_run):
    specs, out = cpu_run
    rc = R.main(["--out", str(out), "--specs", str(specs), "--check",
                 "--plan", "tiny:decode=60,tiny:prefill=60,tinyk3:train=60",
                 "--batches", "1,8", "--contexts", "16,32", "--chunks", "16", "--prefixes", "0,16",
                 "--ride-decodes", "2", "--ride-context", "8", "--seq", "16,32", "--micro-batches", "1,2",
                 "--profile-train", "32x2"])
    assert rc == 0
    dec = _rows(out / "decode_step.csv")
    ok = [r for r in dec if r["status"] == "ok"]
    # 3 of 4 points fit (B = 8 at C = 32 does not), 3 timers each
    assert [(r["B"], r["C"]) for r in dec if r["status"] == "failed"] == [("8", "32")]
    assert len(ok) == 3 * 3
    assert {r["timer"] for r in ok} == {"graph", "eager_events", "eager_wall"}
    assert all(r["manifest_ok"] == "True" and r["seconds"] == "0.001" for r in ok)
    pre = _rows(out / "prefill_step.csv")
    assert [(r["prefix"], r["decodes"], r["status"]) for r in pre] == [("0", "2", "ok"), ("16", "2", "ok")]
    assert all(r["manifest_ok"] == "True" for r in pre)
    tr = _rows(out / "train_step.csv")
    assert [(r["seq"], r["micro_batch"], r["phase"]) for r in tr] == [
        (q, m, p) for q in ("16", "32") for m in ("1", "2") for p in ("fwd", "fwd_bwd")]
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["tiny"]) == {"checks", "decode@grouped_bf16", "prefill@grouped_bf16"}
    assert set(man["tinyk3"]) == {"checks", "train"}
    assert man["tiny"]["decode@grouped_bf16"]["layer_counts"] == {"kda": 3, "dense_ffn": 1, "mla": 1, "moe": 3,
                                                                   "embedding": 1, "lm_head": 1}
    assert "plan" in (out / "provenance.yaml").read_text()
    # B = 1 and 8 are profiled once per configuration (first context): their kernels land in kernels.csv
    prof = _rows(out / "kernels.csv")
    assert [(r["B"], r["C"], r["kernel"]) for r in prof if r["part"] == "decode"] == [
        ("1", "16", "fake_kernel"), ("8", "16", "fake_kernel")]
    # the one training point asked for is profiled in both phases
    assert [(r["seq"], r["micro_batch"], r["phase"], r["kernel"]) for r in prof if r["part"] == "train"] == [
        ("32", "2", "fwd", "fake_fwd"), ("32", "2", "fwd_bwd", "fake_bwd")]


def test_train_points_per_configuration(cpu_run):
    specs, out = cpu_run
    rc = R.main(["--out", str(out), "--specs", str(specs), "--plan", "tinyk3:train=60",
                 "--train-points", "tinyk3:32x1,tinyk3:16x3"])
    assert rc == 0
    tr = _rows(out / "train_step.csv")
    assert [(r["seq"], r["micro_batch"]) for r in tr if r["phase"] == "fwd"] == [("32", "1"), ("16", "3")]


@pytest.mark.parametrize("argv", [
    ["--train-points", "k3-tp8-ep8-l5-8:4096"],                                  # no micro-batch
    ["--train-points", "k3-tp8-ep8-l5-8:0x1"],
    ["--train-points", "k3-tp8-ep8-l5-9:4096x1"],                                # not a configuration
    ["--plan", "k3-tp8-ep8-l5-8:train=10", "--train-points", "kimi-linear-48b-l5-8:4096x1"],  # not in the plan
    ["--profile-train", "0x0"],
])
def test_train_and_profile_points_refuse_what_would_be_silently_skipped(argv):
    with pytest.raises(InputError, match="--train-points|--profile-train"):
        R.parse_args(["--out", "x", *argv])


def test_time_box_records_the_rest_as_skipped(cpu_run, monkeypatch):
    specs, out = cpu_run
    rc = R.main(["--out", str(out), "--specs", str(specs), "--plan", "tinyk3:decode=0.000001",
                 "--batches", "1,2", "--contexts", "16"])
    assert rc == 0
    dec = _rows(out / "decode_step.csv")
    assert [(r["B"], r["status"], r["error"]) for r in dec] == [
        ("1", "failed", "skipped: part time budget exhausted"), ("2", "failed", "skipped: part time budget exhausted")]
