"""The committed validation table the planner reads carries the data fingerprint it was built from, and the
plan labels its calibration section stale when the measurements have changed since (issue 20, item 3);
the plan goes on either way."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_helpers import ROOT, kl_train  # noqa: E402

from k3sim.planner.plan import STALE_LABEL, plan, validation_staleness  # noqa: E402

TABLE = ROOT / "reports" / "calibration" / "validation.csv"


def _committed_fingerprints() -> set[str]:
    with open(TABLE) as f:
        return {r["data_fingerprint"] for r in csv.DictReader(f)}


def test_the_committed_table_carries_one_fingerprint():
    """Written by `k3sim calibrate validate` (scripts/reports.sh calibration) on every row."""
    built = _committed_fingerprints()
    assert len(built) == 1 and len(next(iter(built))) == 16


@pytest.mark.parametrize("now,stale", [("0123456789abcdef", True), ("", True), (None, False)])
def test_plan_labels_a_stale_table(tmp_path, monkeypatch, now, stale):
    """A store fingerprint other than the table's gives the label (with both fingerprints) and the table is
    still shown; the table's own fingerprint gives no label. `None`: the table's fingerprint."""
    import k3sim.kernels.validate as V

    now = next(iter(_committed_fingerprints())) if now is None else now
    monkeypatch.setattr(V, "data_fingerprint", lambda hw: now)
    res = plan(kl_train(tmp_path), sections=("step", "calibration"))
    note = res.notes["calibration"]
    assert note.startswith(STALE_LABEL) is stale, note
    if stale:
        assert f"the measurements now have {now or 'none'}" in note
    assert res.calibration  # the rows are shown either way
    assert ("stale" in res.to_json()["notes"]["calibration"]) is stale


@pytest.mark.parametrize("rows,now,why", [
    ([{"data_fingerprint": "aaaa"}], "bbbb", "built from data fingerprint aaaa"),
    ([{"level": "op"}], "bbbb", "built from data fingerprint none"),  # a table from before the column
    ([{"data_fingerprint": "aaaa"}, {"data_fingerprint": "cccc"}], "aaaa", "fingerprint none"),
])
def test_staleness_of_a_table(monkeypatch, rows, now, why):
    import k3sim.kernels.validate as V

    monkeypatch.setattr(V, "data_fingerprint", lambda hw: now)
    label = validation_staleness(rows, hw=None)
    assert label.startswith(STALE_LABEL) and why in label and now in label
