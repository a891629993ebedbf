"""The planning report: every section rendered, written atomically (a failure leaves the old report)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "planner"))
from conftest_helpers import kl_train  # noqa: E402

from k3sim.planner.plan import plan  # noqa: E402
from k3sim.report import render, write_report  # noqa: E402


@pytest.fixture(scope="module")
def train_plan(tmp_path_factory):
    return plan(kl_train(tmp_path_factory.mktemp("s")), sections=("memory", "step", "calibration"))


def test_report_files_and_sections(train_plan, tmp_path):
    out = tmp_path / "rep"
    files = write_report(train_plan, out)
    names = {p.relative_to(out).as_posix() for p in files}
    assert {"report.md", "report.html", "plan.json", "figures/memory.png", "figures/step_breakdown.png",
            "figures/pipeline_gantt.png"} <= names
    md = (out / "report.md").read_text()
    for title in ("## Memory per GPU", "## Training step-time breakdown", "## Pipeline schedule (Gantt)",
                  "## Calibration error of the kernels used", "## Assumptions and their sources"):
        assert title in md
    assert f"| step time | {render._s(train_plan.training.step_time_s)} |" in md
    html = (out / "report.html").read_text()
    assert html.count("<img src=\"figures/") == 3
    assert not list(tmp_path.glob(".rep.*"))  # no temp dir left beside it


def test_failed_render_leaves_previous_report(train_plan, tmp_path, monkeypatch):
    out = tmp_path / "rep"
    write_report(train_plan, out)
    before = (out / "report.md").read_text()

    def boom(*a, **k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr("k3sim.report.figures.gantt_figure", boom)
    with pytest.raises(RuntimeError):
        write_report(train_plan, out)
    assert (out / "report.md").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_out_is_a_file(train_plan, tmp_path):
    from k3sim.errors import InputError

    f = tmp_path / "x"
    f.write_text("")
    with pytest.raises(InputError, match="not a directory"):
        write_report(train_plan, f)


def test_rates_are_not_printed_as_times():
    assert render._fmt("ttft_p99_s", 0.25) == "250.000 ms"
    assert render._fmt("goodput_requests_per_s", 0.25) == "0.25"
    assert render._fmt("requests", 200) == "200"
