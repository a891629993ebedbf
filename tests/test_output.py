"""`k3sim.output.print_table` lays out plain tables itself (no rich import on a query's path): its text must be
rich's, character for character, wherever it does so, and rich must still render everything else."""

from __future__ import annotations

import io
import random
import sys

import pytest

from k3sim import output


def rich_text(title, columns, rows, width) -> str:
    """What rich prints for the same table on a plain (non-terminal) console `width` wide."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*r)
    buf = io.StringIO()
    Console(file=buf, width=width).print(table)
    return buf.getvalue()


ALPHABET = "abcdefghij ABC 0123456789 ,.;/()=~x-_+*%<>'\"!?#&|"


def random_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.08:
        return ""
    if kind < 0.12:
        return " " * rng.randint(1, 4)
    if kind < 0.2:  # one long word: folded in a title, cut with an ellipsis in a cell
        return "".join(rng.choice("abcdefghijklmnop_0123456789") for _ in range(rng.randint(10, 120)))
    words = ["".join(rng.choice(ALPHABET.replace(" ", "")) for _ in range(rng.randint(1, 14)))
             for _ in range(rng.randint(1, 14))]
    sep = [" "] * 6 + ["  ", "   "]
    text = "".join(w + rng.choice(sep) for w in words)
    return text if rng.random() < 0.7 else " " + text


@pytest.mark.parametrize("seed", range(40))
def test_plain_tables_are_richs_text(seed):
    """Generated tables (1-6 columns, empty / blank / long-word / many-word cells, widths 20-200): wherever
    the plain layout applies, it is rich's output exactly; it applies to most of them."""
    pytest.importorskip("rich")
    rng = random.Random(seed)
    applied = 0
    for _ in range(60):
        ncol = rng.randint(1, 6)
        columns = [random_text(rng) or "c" for _ in range(ncol)]
        rows = [[random_text(rng) for _ in range(ncol)] for _ in range(rng.randint(0, 8))]
        title = random_text(rng) if rng.random() < 0.9 else ""
        width = rng.choice([20, 33, 40, 57, 80, 80, 80, 100, 132, 200])
        mine = output.plain_table(title, columns, rows, width)
        if mine is not None:
            applied += 1
            assert mine == rich_text(title, columns, rows, width), (title, columns, rows, width)
    assert applied >= 30


@pytest.mark.parametrize("text", ["[bold]x[/bold]", "a [b] c", ":smile:", "x::y", "tab\there", "two\nlines",
                                  "caf\u00e9", "\u2264 1", "bell\a"])
def test_text_rich_would_interpret_goes_to_rich(text):
    """Markup, emoji codes, control characters and non-ASCII text (wide characters) are rich's to render."""
    assert output.plain_table("t", ["a", "b"], [["x", text]], 80) is None
    assert output.plain_table(text, ["a"], [["x"]], 80) is None


def test_print_table_prints_richs_text_on_a_plain_stream(monkeypatch):
    """The command path: a non-terminal stdout, COLUMNS set: the text rich prints, rich not imported for it."""
    rows = [("weights_routed_experts", "84.19 GiB", "1,361,370,415,104 params x mxfp4 / (ep=8 x expert_tp=1)"),
            ("kv_cache_and_state", "33.36 GiB", "18 requests x 1,897.62 MiB (each at the full 131,072-token "
                                                "context)")]
    monkeypatch.setenv("COLUMNS", "80")
    for var in output._RICH_ENV:
        monkeypatch.delenv(var, raising=False)
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    output.print_table("per-GPU breakdown", ["component", "size", "from"], rows)
    assert buf.getvalue() == rich_text("per-GPU breakdown", ["component", "size", "from"],
                                       [list(r) for r in rows], 80)
    assert "\u2502 kv_cache_and_state " in buf.getvalue()


def test_a_terminal_or_forced_colour_is_richs(monkeypatch):
    """Styles (bold headers) on a terminal, FORCE_COLOR, a non-UTF-8 stream: rich decides, not the plain path."""
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    assert output._plain_console_width() is None
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("COLUMNS", raising=False)
    for var in output._RICH_ENV:
        monkeypatch.delenv(var, raising=False)
    assert output._plain_console_width() is not None
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert output._plain_console_width() is None
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert output._plain_console_width() is None


def test_width_is_richs(monkeypatch):
    """COLUMNS wins (rich reads it as the width); without it the first terminal among stdin, stdout, stderr,
    else 80 columns."""
    from rich.console import Console

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    for columns in ("57", "132"):
        monkeypatch.setenv("COLUMNS", columns)
        assert output._plain_console_width() == Console().width == int(columns)
    monkeypatch.delenv("COLUMNS")
    assert output._plain_console_width() == Console().width


# ------------------------------------------------------------------------------------------ piped: whole rows
ROWS = [("weights_routed_experts", "84.19 GiB", "1,361,370,415,104 params x mxfp4 / (ep=8 x expert_tp=1)"),
        ("throughput_output_tokens_per_s_per_gpu", "11.51", "k3sim.serving on a seeded synthetic 'chat' sample "
                                                            "of 200 requests at the generator's own arrival times")]


def _piped(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    monkeypatch.delenv("COLUMNS", raising=False)
    for var in output._RICH_ENV:
        monkeypatch.delenv(var, raising=False)
    return buf


def test_a_piped_table_prints_every_row_whole(monkeypatch):
    """Off a terminal without COLUMNS (`k3sim ... | cat`): no cell cut with an ellipsis, none wrapped; the
    text is rich's at the width the widest row needs (hand count: 38 + 9 + 102 characters, 2 of padding per
    cell, 4 borders: 40 + 11 + 104 + 4 = 159)."""
    buf = _piped(monkeypatch)
    output.print_table("per-GPU breakdown", ["component", "size", "from"], ROWS)
    text = buf.getvalue()
    assert "\u2026" not in text
    for name, size, src in ROWS:
        assert any(f"\u2502 {name} " in line and f" {src} " in line for line in text.splitlines())  # one line
    assert output.natural_width(["component", "size", "from"], [list(r) for r in ROWS]) == 159
    body = text.splitlines()[1:]
    assert {len(line) for line in body} == {159}
    assert text == rich_text("per-GPU breakdown", ["component", "size", "from"], [list(r) for r in ROWS], 159)


def test_a_piped_table_rich_renders_is_whole_too(monkeypatch):
    """A cell rich must render (non-ASCII): rich's own measure widens its console off a terminal."""
    pytest.importorskip("rich")
    buf = _piped(monkeypatch)
    rows = [list(r) for r in ROWS] + [["p99 TTFT \u2264 SLO", "yes", "x" * 120]]
    output.print_table("t", ["component", "size", "from"], rows)
    text = buf.getvalue()
    assert "\u2026" not in text and "x" * 120 in text and "\u2264 SLO" in text


def test_columns_set_is_the_width_asked_for(monkeypatch):
    """COLUMNS in the environment is the caller's width, kept off a terminal too: the long cells wrap."""
    buf = _piped(monkeypatch)
    monkeypatch.setenv("COLUMNS", "80")
    output.print_table("t", ["component", "size", "from"], ROWS)
    assert max(map(len, buf.getvalue().splitlines())) == 80


def test_a_command_piped_cuts_no_cell():
    """`k3sim decode | cat`: its breakdown's sources were cut at 80 columns (`... calibr…`); now whole."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS" and k not in output._RICH_ENV}
    out = subprocess.run([sys.executable, "-m", "k3sim", "decode"], capture_output=True, text=True, env=env,
                         timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "\u2026" not in out.stdout and max(map(len, out.stdout.splitlines())) > 80
