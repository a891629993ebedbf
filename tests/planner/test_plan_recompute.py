"""`training.recompute` / `recompute_modules` / `precision` through the planner (issue 22 item 3): the memory
section and the step honour them, and a module the model lacks is refused naming the field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_helpers import ROOT, kl_train  # noqa: E402

from k3sim.errors import InputError  # noqa: E402
from k3sim.planner.plan import plan  # noqa: E402


def test_the_memory_section_honours_the_recompute_mode(tmp_path):
    def memory(training: str | None):
        return plan(kl_train(tmp_path, **({"training": training} if training else {})), sections=("memory",)).memory

    full, none = memory(None), memory("  recompute: none")
    sel = memory("  recompute: selective\n  recompute_modules: [norms, kda_core]")
    fp8 = memory("  recompute: selective\n  recompute_modules: [norms, kda_core]\n  precision: fp8")
    assert (full.recompute, none.recompute, sel.recompute) == ("full", "none", "selective")
    assert sel.recompute_modules == ("norms", "kda_core") and fp8.precision == "fp8" and fp8.fp8_tensors
    acts = [m.per_gpu_bytes["activations"] for m in (full, fp8, sel, none)]
    assert acts == sorted(acts) and len(set(acts)) == 4


def test_the_step_honours_the_recompute_mode(tmp_path):
    full = plan(kl_train(tmp_path), sections=("step",)).training
    sel = plan(kl_train(tmp_path, training="  recompute: selective"), sections=("step",)).training
    assert sel.step_time_s < full.step_time_s and sel.hardware_flop_per_step < full.hardware_flop_per_step


@pytest.mark.parametrize("training, words", [
    ("  recompute_modules: [norms]", "set training.recompute: selective"),
    ("  recompute: none\n  recompute_modules: [norms]", "set training.recompute: selective"),
    ("  recompute: selective\n  recompute_modules: [norms, norms]", "twice"),
])
def test_bad_recompute_modules_named(tmp_path, training, words):
    with pytest.raises(InputError, match=words) as e:
        plan(kl_train(tmp_path, training=training), sections=("memory",))
    assert e.value.field == "training.recompute_modules"


def test_a_module_the_model_lacks_is_refused(tmp_path):
    p = kl_train(tmp_path, training="  recompute: selective\n  recompute_modules: [kda_core]")
    p.write_text(p.read_text().replace(str(ROOT / "models/kimi-linear-48b.yaml"), str(ROOT / "models/deepseek-v3.yaml")))
    with pytest.raises(InputError, match="KDA layers and model 'deepseek-v3' has none") as e:
        plan(p, sections=("memory",))
    assert e.value.field == "training.recompute_modules"
