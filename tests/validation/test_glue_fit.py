"""The training glue fit (`validation/glue_fit.py`): the committed calibration file is what its fit gives
from the committed run, and the factors reproduce the fit point's profiled glue families."""

from __future__ import annotations

import pytest
import yaml

from k3sim.configs import load_hardware
from k3sim.configs.profiles import profiles_dir
from k3sim.step.glue import GLUE_FILE, load_glue
from k3sim.validation.glue_fit import fit_glue

RUNS = profiles_dir() / "measured" / "h200"


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


def test_glue_file_is_what_its_fit_gives_from_the_committed_run(h200):
    doc = yaml.safe_load((RUNS / GLUE_FILE).read_text())
    again = fit_glue(RUNS / doc["run"], doc["config"], [tuple(map(int, p.split("x"))) for p in doc["points"]], h200)
    assert float(again["fwd"]) == pytest.approx(doc["fwd"], rel=1e-3)
    assert float(again["bwd"]) == pytest.approx(doc["bwd"], rel=1e-3)
    # the implementation's glue is several times the bytes-only proxy: the reason it is calibrated
    assert doc["fwd"] > 3 and doc["bwd"] > 2


def test_fit_and_prediction_agree_on_the_glue_at_the_fit_point(h200):
    # The factors reproduce the fit point's profiled glue families exactly (the rule that picks the calls
    # the factors apply to is the one the fit counted).
    import pandas as pd

    from k3sim.step.families import PROXIED, kernel_family
    from k3sim.validation.train_step import family_prediction

    doc = yaml.safe_load((RUNS / GLUE_FILE).read_text())
    q, m = map(int, doc["points"][0].split("x"))
    K = pd.read_csv(RUNS / doc["run"] / "kernels.csv")
    K = K[(K.config == doc["config"]) & (K.seq == q) & (K.micro_batch == m)]
    K = K[K.kernel.map(kernel_family).isin(PROXIED)]
    pred = family_prediction(doc["config"], q, m, h200, glue=load_glue(h200))
    for phase in ("fwd", "fwd_bwd"):
        profiled = K[K.phase == phase].gpu_s.sum()
        assert sum(pred[phase].get(f, 0.0) for f in PROXIED) == pytest.approx(profiled, rel=2e-3)
