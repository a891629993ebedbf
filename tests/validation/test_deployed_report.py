"""The deployed-systems predictions (`k3sim check deployed`): the committed report is what the model answers
now, every public figure names a committed case, and the prediction columns are consistent."""

from __future__ import annotations

import csv
from pathlib import Path

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


def test_overlap_hides_communication_and_flashmla_is_never_slower():
    """Every case runs two-batch overlap over a DeepEP all-to-all: some of its communication must be hidden
    (a schedule that serialised the micro-batches would hide none); FlashMLA from its published throughput is
    capped by the measured kernel, so a decode case is never slower with it (k3sim.kernels.published)."""
    with open(ROOT / "reports" / "deployed" / "predictions.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(deployed.cases()) and all(c.layout["tbo"] for c in deployed.cases())
    for r in rows:
        assert float(r["comm_hidden_s"]) > 0, r["case"]
        if r["phase"] == "decode":
            assert float(r["tokens_per_s_per_gpu"]) >= float(r["tokens_per_s_per_gpu_measured_mla"])
