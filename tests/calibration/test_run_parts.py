"""The one time-boxed driver of the calibration harnesses (`graph_parts.run_parts`), without a GPU: a failing
part is logged and the others still run, a part after the run budget is skipped, and the provenance carries
the elapsed time and the harness's extra fields."""

from __future__ import annotations

import yaml

from k3sim.calibration.graph_parts import run_parts


def test_a_failing_part_does_not_lose_the_others_and_the_budget_skips_the_rest(tmp_path, capsys, monkeypatch):
    from k3sim.calibration import records

    monkeypatch.setattr(records, "provenance", lambda command, gpus, parts: {"command": command})  # no torch here
    ran = []

    def part(name, out, deadline):
        ran.append(name)
        if name == "bad":
            raise RuntimeError("boom")
        return {"a": 3, "c": 1}[name]

    run_parts("t", tmp_path, ["a", "bad", "c"], 60.0, lambda p, left, i: 10.0, part,
              extra=lambda: {"chosen": "x"})
    out = capsys.readouterr().out
    assert ran == ["a", "bad", "c"]
    assert "[t] a: 3 rows" in out and "[t] bad: FAILED RuntimeError: boom" in out and "[t] c: 1 rows" in out
    info = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert info["chosen"] == "x" and info["elapsed_s"] >= 0 and "CUDA-graph replay" in info["timing"]

    ran.clear()
    run_parts("t", tmp_path / "b", ["a", "c"], 0.0, lambda p, left, i: 10.0, part)
    assert ran == [] and "[t] a: skipped, run budget spent" in capsys.readouterr().out
