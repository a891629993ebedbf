"""First run (issue 11): the README's examples and the documented defaults work from a fresh clone in another
working directory; the shipped Mooncake traces are the ones the README names."""

from __future__ import annotations

import hashlib
import json

from hostile_helpers import ROOT, assert_one_line, run_main


def test_readme_examples_run_from_another_directory(tmp_path, capsys, monkeypatch):
    """Run outside the repository, cp, prefix-cache and memory failed on their documented default --model, and
    the prefix-cache example read a trace a user's clone did not have."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "prefix-cache", "--trace", "data/traces/conversation_trace.jsonl",
                              "--limit", "200", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["requests"] + res["requests_rejected"] == 200
    memory = ("memory", "--model", "models/kimi-k3.yaml", "--tp", "8", "--pp", "2", "--ep", "8", "--json")
    code, out, err = run_main(capsys, *memory)
    assert code == 0, err
    elsewhere = json.loads(out)
    monkeypatch.chdir(ROOT)  # the same plan as from the checkout itself: the same files were found
    code, out, err = run_main(capsys, *memory)
    assert code == 0 and json.loads(out) == elsewhere and elsewhere["max_concurrent_requests"] >= 1, err
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "cp", "--seq-len", "32K", "--json")
    assert code == 0 and json.loads(out)["cp"] == 8, err
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory


def test_a_nonexistent_relative_path_still_names_what_was_typed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line(*run_main(capsys, "model-info", "--model", "models/nope.yaml"), "models/nope.yaml",
                    "file not found")


def test_shipped_traces_are_the_published_files():
    """data/traces/README.md records the sha256 of each Mooncake file; the shipped copies match it."""
    readme = (ROOT / "data/traces/README.md").read_text()
    for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):
        digest = hashlib.sha256((ROOT / "data/traces" / name).read_bytes()).hexdigest()
        assert f"`{name}`" in readme and digest in readme, name
    assert "Apache" in readme
