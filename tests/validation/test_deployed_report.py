"""The deployed-systems predictions (`k3sim check deployed`): the committed report is what the model answers
now, every public figure names a committed case, and the prediction columns are consistent."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from k3sim.validation import deployed

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_report_is_what_the_model_answers(tmp_path):
    out = deployed.write_report(tmp_path / "d")
    for name in ("predictions.csv", "README.md"):
        assert (out / name).read_text() == (ROOT / "reports" / "deployed" / name).read_text(), \
            f"{name}: regenerate with scripts/reports.sh deployed"


def test_every_public_figure_names_a_case_and_a_column():
    names = {c.name for c in deployed.cases()}
    for f in deployed.PUBLIC:
        assert f.case in names and f.metric in deployed.COLUMNS and f.value > 0


def test_per_node_is_eight_gpus_and_the_step_splits_into_compute_and_exposed_comm():
    with open(ROOT / "reports" / "deployed" / "predictions.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(deployed.cases())
    for r in rows:
        assert float(r["tokens_per_s_per_node"]) == pytest.approx(8 * float(r["tokens_per_s_per_gpu"]), rel=1e-5)
        assert float(r["compute_s"]) + float(r["comm_exposed_s"]) == pytest.approx(float(r["step_s"]), rel=1e-4)
        if r["phase"] == "decode":  # FlashMLA is never slower than the measured kernel (kernels.published)
            assert float(r["tokens_per_s_per_gpu"]) >= float(r["tokens_per_s_per_gpu_measured_mla"])
