"""Every `k3sim ...` example in README.md and docs/ is run, so the documentation cannot rot: each parses
against the real command tree (options, types, choices) and, unless it needs what CI lacks (a GPU, a Dask
cluster) or takes minutes, runs to exit 0 from a scratch working directory (its default outputs land
there, never in the project)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hostile"))  # the one in-process runner of the CLI contract tests
from hostile_helpers import run_main  # noqa: E402
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PLACEHOLDER = re.compile(r"<[^>]+>|\[[^\]]*\]|\bTRACE\b|\.\.\.")
# Parsed but not run, with the reason (each needs something CI lacks or runs for minutes on two cores).
NOT_RUN = {
    "calibrate run": "needs a GPU and torch",
    "--scheduler": "needs a running Dask cluster",
    "--sweep": "a whole sweep: minutes on two cores (the sweep's own tests run small grids)",
    "--sweep-rate": "a whole rate sweep: minutes on two cores",
    "--sweep-batch": "a whole batch sweep (tests/commands/test_decode_cli.py runs it)",
    "k3sim sweep": "a whole layout grid (tests/commands/test_sweep_cli.py runs small grids)",
    "--requests 1000000": "a million streamed requests",
    "--engines": "the engine-policy report: every policy on three models and both traces, over a minute on two "
                 "cores (tests/prefix_cache runs the generator on a 12-request slice)",
    "--offload-report": "the offload report: whole-trace serving runs per host tier, over a minute on two cores "
                        "(tests/prefix_cache/test_offload_cli.py runs the generator on a slice)",
    "--gpus 32": "a whole serving search on the conversation trace: minutes on two cores "
                 "(benchmarks/bench_serve_search.py; tests/planner/test_serve_search.py runs small spaces)",
    "calibrate validate": "the leave-one-out refit of every measured op: 4-5 minutes on two cores since the FP8 "
                          "and hybrid runs (tests/kernels/test_kernels_validate.py runs the validator; "
                          "scripts/reports.sh calibration writes the committed report)",
}


def examples() -> list[tuple[str, str]]:
    """(page, command line) for every line of a ```bash block that starts with `k3sim `, continuation lines
    joined and trailing comments dropped (a comment `# exit N` is kept as the expected exit code); lines with
    placeholders (<...>, [...], TRACE, ...) are skipped."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                command, _, comment = line.partition(" #")
                command = command.strip()
                code = re.match(r"\s*exit (\d+)", comment)
                if command.startswith("k3sim ") and not PLACEHOLDER.search(command):
                    found.append((str(page.relative_to(ROOT)), command + (f" #exit {code.group(1)}" if code else "")))
    return found


EXAMPLES = examples()


def test_the_pages_have_examples():
    assert len(EXAMPLES) >= 20, EXAMPLES


@pytest.mark.parametrize("page, line", EXAMPLES, ids=[f"{p}:{l[:60]}" for p, l in EXAMPLES])
def test_every_example_parses(page, line):
    """Options, types and choices as click checks them, without running the command."""
    import typer

    from k3sim.cli import app

    ctx = typer.main.get_group(app).make_context("k3sim", shlex.split(line.split(" #exit")[0])[1:])
    while hasattr(ctx.command, "resolve_command"):  # a group: `k3sim`, `calibrate`, `check`
        protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []
        rest = [*protected, *ctx.args]  # the subcommand name, then its arguments
        assert rest, f"{page}: {line!r} names no command"
        name, command, args = ctx.command.resolve_command(ctx, rest)
        ctx = command.make_context(name, args, parent=ctx)


RUN = [(p, l) for p, l in EXAMPLES if not any(k in l for k in NOT_RUN)]


@pytest.mark.parametrize("page, line", RUN, ids=[f"{p}:{l[:60]}" for p, l in RUN])
def test_every_runnable_example_exits_0(page, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default outputs land here; inputs resolve from the project
    command, _, expected = line.partition(" #exit ")
    code, out, err = run_main(capsys, *shlex.split(command)[1:])
    assert code == int(expected or 0), f"{page}: {line}\n{err}"
