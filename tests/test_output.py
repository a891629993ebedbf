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
