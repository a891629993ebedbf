"""Generated text is generated (issue 20, item 3): reports/calibration/README.md is written by hand and quotes no
figure of the current data (those are in the generated validation.md, stamped with the data fingerprint);
its only figures are history of the runs they name and the out-of-sample experiment, recomputed here from
the committed file they come from."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

DIR = Path(__file__).resolve().parents[2] / "reports" / "calibration"
README = DIR / "README.md"
# sections whose figures are of named past runs or of a fixed, committed experiment
HISTORY = ("History:", "Out of sample:")


def sections(text: str) -> dict[str, str]:
    """'## heading' -> body (the text before the first heading under '')."""
    out, head = {"": []}, ""
    for line in text.splitlines():
        if line.startswith("## "):
            head = line[3:].strip()
            out[head] = []
        else:
            out[head].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def percent_figures(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?\s?%", text)


def test_readme_quotes_no_current_figure():
    """Outside the history sections: no percentage and no goal-met table; the generated table is linked."""
    text = README.read_text()
    assert "(validation.md)" in text
    for head, body in sections(text).items():
        if head.startswith(HISTORY):
            continue
        assert not percent_figures(body), (head, percent_figures(body))
        assert "| met |" not in body, head


@pytest.mark.parametrize("text,n", [("MAPE 4.8 % and 12%", 2), ("no figure here", 0)])
def test_the_figure_finder_finds_figures(text, n):
    assert len(percent_figures(text)) == n


def test_out_of_sample_figures_are_those_of_the_committed_predictions():
    """MAPE, per-T MAPE and max of the committed decode extrapolation, as the README quotes them."""
    body = next(b for h, b in sections(README.read_text()).items() if h.startswith("Out of sample:"))
    with open(DIR / "decode_extrapolation.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    err = {int(r["T"]): [] for r in rows}
    for r in rows:
        err[int(r["T"])].append(abs(float(r["predicted_s"]) / float(r["measured_s"]) - 1))
    every = [e for v in err.values() for e in v]
    quoted = re.search(r"MAPE ([\d.]+) %\*\*\s*\(T = 16: ([\d.]+) %, T = 32: ([\d.]+) %\), max ([\d.]+) %", body)
    assert quoted, body
    want = (sum(every) / len(every), sum(err[16]) / len(err[16]), sum(err[32]) / len(err[32]), max(every))
    assert [float(q) for q in quoted.groups()] == [round(100 * w, 1) for w in want]


def test_generated_tables_carry_the_fingerprint_they_were_built_from():
    """validation.md names the fingerprint in its first lines; validation.csv carries the same on every row."""
    md = (DIR / "validation.md").read_text()
    stamped = re.search(r"data fingerprint `([0-9a-f]{16})`", md).group(1)
    with open(DIR / "validation.csv") as f:
        assert {r["data_fingerprint"] for r in csv.DictReader(f)} == {stamped}
