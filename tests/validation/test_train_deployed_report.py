"""Training as deployed (`k3sim check train-deployed`, reports/training/deployed.md): the committed report is what
the model answers now, every public figure names a committed case and column, and each headline feature moves
the step the way its mechanism says."""

from __future__ import annotations

import csv
from pathlib import Path

from k3sim.validation import train_deployed as td

ROOT = Path(__file__).resolve().parents[2]


def _rows() -> dict[tuple[str, str], dict]:
    with open(ROOT / "reports" / "training" / "deployed_predictions.csv") as fh:
        return {(r["case"], r["variant"]): r for r in csv.DictReader(fh)}


def test_the_committed_report_is_what_the_model_answers(tmp_path):
    out = td.write_report(tmp_path / "t")
    for name in ("deployed_predictions.csv", "deployed.md"):
        assert (out / name).read_text() == (ROOT / "reports" / "training" / name).read_text(), \
            f"{name}: regenerate with scripts/reports.sh train-deployed"


def test_every_public_figure_names_a_case_and_a_column():
    rows = _rows()
    for f in td.PUBLIC:
        assert (f.case, f.variant) in rows and f.metric in td.COLUMNS and f.value > 0
    assert td.PREDICTIONS_COMMIT  # the comparison names the commit the predictions were made in


def test_each_feature_toggles_the_way_its_mechanism_says():
    """Per case: FP8 GEMMs make the step shorter; full recompute instead of selective re-runs the whole forward
    (longer) and keeps less (smaller memory); every case has the recipe and one row per feature."""
    rows = _rows()
    for c in td.cases():
        labels = [v[0] for v in td.variants(c)]
        assert len(labels) == 1 + len(td.FEATURES) and all((c.name, lb) in rows for lb in labels)
        t = {lb: float(rows[(c.name, lb)]["step_time_s"]) for lb in labels}
        mem = {lb: float(rows[(c.name, lb)]["memory_per_gpu_bytes"]) for lb in labels}
        assert t["no fp8"] > t["recipe"]
        sel = "no selective recompute" if "no selective recompute" in t else "with selective recompute"
        full, selective = (sel, "recipe") if sel.startswith("no") else ("recipe", sel)
        assert t[full] > t[selective] and mem[full] < mem[selective]
