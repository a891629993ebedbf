"""Output conventions shared by every command: a rich table by default, stable JSON with --json.

Models return dataclasses / dicts with SI units; this module only renders them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from typing import Any, Callable, Iterable, Iterator, Mapping


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, numpy scalars, pandas frames and paths to plain JSON types."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # pandas DataFrame
        return [to_jsonable(r) for r in obj.to_dict(orient="records")]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return obj.item()
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def print_json(obj: Any) -> None:
    print(json.dumps(to_jsonable(obj), indent=2, sort_keys=False))


def human_bytes(n: float) -> str:
    """Binary-prefixed size for tables (JSON keeps raw bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


# Words of a key that a reader knows as a name (`words`): acronyms and the projects' own spellings.
WORD_NAMES = {"kv": "KV", "kda": "KDA", "mla": "MLA", "gqa": "GQA", "swa": "SWA", "gdn": "GDN", "mamba2": "Mamba2",
              "mamba": "Mamba", "lm": "LM", "ffn": "FFN", "moe": "MoE", "mtp": "MTP", "tp": "TP", "pp": "PP",
              "ep": "EP", "cp": "CP", "dp": "DP", "hbm": "HBM", "ttft": "TTFT", "tpot": "TPOT", "gpu": "GPU",
              "sms": "SMs"}


def words(key: str) -> str:
    """A JSON key or a breakdown component in words, for a table or a report a person reads (JSON keeps the
    key): `weights_routed_experts` -> "weights: routed experts", `kv_cache_and_state` -> "KV cache and
    state", `attn_res_blocks` -> "AttnRes blocks", `optimizer_states` -> "optimizer states"."""
    text = str(key)
    if text.startswith("weights_"):
        return "weights: " + words(text[len("weights_"):])
    return " ".join(WORD_NAMES.get(p, p) for p in text.replace("attn_res", "AttnRes").split("_") if p)


def gib_with_gb(n: float) -> str:
    """A capacity compared with a datasheet (HBM): GiB as every table prints sizes, the datasheet's GB (10^9
    bytes) beside it: 150,109,880,320 -> "139.80 GiB (150.1 GB)"."""
    return f"{n / 2 ** 30:,.2f} GiB ({n / 1e9:,.1f} GB)"


def human_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:,.1f} us"
    if s < 1:
        return f"{s * 1e3:,.3f} ms"
    return f"{s:,.3f} s"


def print_table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> None:
    """Render rows as rich renders a default `Table` (values are printed as given: format them before).

    On a terminal the table fits its width (rich wraps cells); off a terminal, every row is printed whole
    (`_whole_rows`). Where rich would print plain text (stdout not a terminal, no colour forced, a UTF-8
    stream) and every cell is plain printable ASCII without markup or emoji codes, the same characters are
    laid out here (`plain_table`), without importing rich (~60 ms of a 0.3 s query); otherwise rich renders
    it."""
    cells = [[str(v) for v in r] for r in rows]
    columns = [str(c) for c in columns]
    width = _plain_console_width()
    if width is not None and _whole_rows():
        width = max(width, natural_width(columns, cells))
    text = None if width is None else plain_table(title, columns, cells, width)
    if text is not None:
        sys.stdout.write(text)
        sys.stdout.flush()  # rich flushes after each print: a full disk or a closed pipe shows up here
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in cells:
        table.add_row(*r)
    console = Console()
    if not console.is_terminal and not console.is_jupyter and _whole_rows():
        # rich measures its own cells here (wide characters, markup): the width that cuts none of them
        need = console.measure(table, options=console.options.update_width(WHOLE_ROWS_MAX)).maximum
        if need > console.width:
            console = Console(width=need)
    console.print(table)


# Widest table laid out whole off a terminal (columns): far beyond any real row (a 300-character error line in
# each of a few columns), a guard only against a runaway cell.
WHOLE_ROWS_MAX = 100_000


def _whole_rows() -> bool:
    """Off a terminal (a pipe, a file) a table is as wide as its widest row needs, so `k3sim ... | cat` or
    `> out.txt` never cuts a cell with an ellipsis nor wraps a row: the 80 columns rich falls back to there
    are no reader's width. `COLUMNS` set in the environment is a width the caller asked for, and is kept
    (as rich keeps it). Called only where stdout is not a terminal."""
    return "COLUMNS" not in os.environ


def natural_width(columns: list[str], rows: list[list[str]]) -> int:
    """Columns of a plain table whose every cell fits on one line: each column its widest cell plus rich's
    one-space padding each side, and the borders (ncol + 1); at most `WHOLE_ROWS_MAX`."""
    if not columns:
        return 0
    widths = [max(len(c) for c in col) + 2 for col in zip(columns, *rows)]
    return min(sum(widths) + len(columns) + 1, WHOLE_ROWS_MAX)


# ------------------------------------------------------------------------------------------ plain tables
# rich 13-15's layout of `Table(title=...)` with default columns (HEAVY_HEAD box, padding (0, 1), left-justified,
# word-wrapped, "ellipsis" overflow) and a centred, folded title, for the case it prints as plain text.
# tests/test_output.py holds it to rich's own output over thousands of generated tables and every command's.
_RICH_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES")
_WORD = re.compile(r"\s*\S+\s*")
_EMOJI = re.compile(r":\S*:")  # what rich's emoji codes need (it replaces only known names: this is wider)


def _plain_console_width() -> int | None:
    """The width rich's Console would use, when it would print plain text to `sys.stdout`; None otherwise."""
    import builtins

    out = sys.stdout
    if sys.platform == "win32" or any(v in os.environ for v in _RICH_ENV) or hasattr(builtins, "get_ipython"):
        return None
    try:
        if out.isatty() or not (getattr(out, "encoding", None) or "utf-8").lower().startswith("utf"):
            return None
    except (AttributeError, ValueError):
        return None
    if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) if columns.isascii() else None
    for fd in (0, 1, 2):  # rich's order: the first standard stream that is a terminal gives the width
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def _plain(text: str) -> bool:
    return text.isascii() and text.isprintable() and "[" not in text and not _EMOJI.search(text)


def _measure(text: str, width: int) -> tuple[int, int]:
    """(min, max) width of a padded cell in `width` columns: rich's Measurement of Padding(Text)."""
    if width - 2 < 1:
        return width, width
    words = text.split()
    hi = len(text) if text else 0
    lo = max(map(len, words)) if words else hi
    hi = min(hi, width - 2)
    lo = min(max(0, min(lo, width - 2)), hi)
    if hi < 1:
        lo = hi = 0
    return min(lo + 2, width), min(hi + 2, width)


def _column_widths(table: list[list[str]], max_width: int) -> list[int] | None:
    """rich's `Table._calculate_column_widths` (expand off, no fixed widths); None where it would go past its
    simple path (columns reduced evenly, or a column too narrow for one character)."""
    def measure(col: list[str], width: int) -> int:
        return min(max(_measure(c, width)[1] for c in col), width) if width >= 1 else 0

    cols = [list(c) for c in zip(*table)]
    widths = [measure(c, max_width) or 1 for c in cols]
    if sum(widths) > max_width:
        widths = _collapse(widths, max_width)
        if sum(widths) > max_width:
            return None
        widths = [measure(c, w) for c, w in zip(cols, widths)]
    return widths if min(widths) >= 2 else None


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """rich's `Table._collapse_widths` with every column wrapable: shave the widest columns first."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        top = max(widths)
        second = max((w for w in widths if w != top), default=0)
        if not top - second:
            break
        ratios = [1 if w == top else 0 for w in widths]
        widths = _ratio_reduce(excess, ratios, [min(excess, top - second)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """rich._ratio.ratio_reduce."""
    ratios = [r if m else 0 for r, m in zip(ratios, maximums)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    out = []
    for ratio, maximum, value in zip(ratios, maximums, values):
        if ratio and total_ratio > 0:
            d = min(maximum, round(ratio * total / total_ratio))
            out.append(value - d)
            total -= d
            total_ratio -= ratio
        else:
            out.append(value)
    return out


def _divide(text: str, width: int, fold: bool) -> list[str]:
    """rich's `divide_line` and `Text.divide`: the pieces a line wraps into (a word keeps its trailing
    spaces; a word wider than the line is folded, or kept whole to be cut with an ellipsis)."""
    breaks, offset = [], 0
    for m in _WORD.finditer(text) if text else ():
        start, word = m.start(), m.group(0)
        size = len(word.rstrip())
        if width - offset >= size:
            offset += len(word)
        elif size > width:
            if fold:
                chunks = [word[i:i + width] for i in range(0, len(word), width)]
                for i, chunk in enumerate(chunks):
                    if start:
                        breaks.append(start)
                    if i == len(chunks) - 1:
                        offset = len(chunk)
                    else:
                        start += len(chunk)
            else:
                if start:
                    breaks.append(start)
                offset = len(word)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    edges = [0, *breaks, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])] if breaks else [text]


def _rstrip_end(line: str, size: int) -> str:
    """rich's `Text.rstrip_end`: trailing whitespace beyond `size` columns removed."""
    if len(line) > size:
        trail = len(line) - len(line.rstrip())
        line = line[:len(line) - min(trail, len(line) - size)]
    return line


def _cut(line: str, width: int, ellipsis: bool) -> str:
    """rich's `Text.truncate` for ASCII text."""
    if len(line) > width:
        return line[:width - 1] + "\u2026" if ellipsis else line[:width]
    return line


def _cell_lines(text: str, width: int) -> list[str]:
    """A cell's lines in a column `width` wide (padding included), each exactly that wide."""
    inner = width - 2
    out: list[str] = []
    if inner < 1:  # rich renders nothing in no room: the row's blank lines fill the column
        return out
    for piece in _divide(text, inner, fold=False):
        line = _cut(_rstrip_end(piece, inner), inner, True)
        out.append(f" {line.ljust(inner)} ")
    return out


def _title_lines(title: str, width: int) -> list[str]:
    """The title centred over the table, folded where a word is wider (rich's "fold" overflow)."""
    out = []
    for piece in _divide(title, width, fold=True):
        line = _cut(_rstrip_end(piece, width).rstrip(), width, False)
        left = (width - len(line)) // 2
        out.append(" " * left + line + " " * (width - len(line) - left))
    return out


def plain_table(title: str, columns: list[str], rows: list[list[str]], console_width: int) -> str | None:
    """The text rich prints for `Table(title=title)` with `columns` and `rows` on a plain console
    `console_width` wide, or None where this layout does not apply (then rich renders it)."""
    if not columns or any(len(r) != len(columns) for r in rows):
        return None
    if not all(_plain(c) for c in (title, *columns, *(c for r in rows for c in r))):
        return None
    max_width = console_width - (len(columns) + 1)
    widths = _column_widths([columns, *rows], max_width) if max_width >= 1 else None
    if widths is None:
        return None
    table_width = sum(widths) + len(columns) + 1
    lines = _title_lines(title, table_width) if title else []
    lines.append("\u250f" + "\u2533".join("\u2501" * w for w in widths) + "\u2513")
    for i, row in enumerate([columns, *rows]):
        cells = [_cell_lines(c, w) for c, w in zip(row, widths)]
        height = max(1, *map(len, cells))
        blank = {w: " " * w for w in widths}
        # the header row is aligned to its bottom, body rows to their top
        cells = [([blank[w]] * (height - len(c)) + c) if i == 0 else (c + [blank[w]] * (height - len(c)))
                 for c, w in zip(cells, widths)]
        bar = "\u2503" if i == 0 else "\u2502"
        lines += [bar + bar.join(c[k] for c in cells) + bar for k in range(height)]
        if i == 0:
            lines.append("\u2521" + "\u2547".join("\u2501" * w for w in widths) + "\u2529")
    lines.append("\u2514" + "\u2534".join("\u2500" * w for w in widths) + "\u2518")
    return "".join(line[:console_width] + "\n" for line in lines)


def print_kv(title: str, pairs: Iterable[tuple[str, Any]]) -> None:
    print_table(title, ["quantity", "value"], pairs)


# ------------------------------------------------------------------------------------------ progress
def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


@contextlib.contextmanager
def progress(label: str, total: int | None = None, *, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """A transient rich progress bar on stderr while the block runs, for the runs that take seconds to minutes
    (`cp --sweep`, `decode --sweep-batch`, `calibrate validate`); yields `update(done, total=None)`.

    Drawn only when `enabled` (commands pass `not --json`: scripts read the JSON, logs want no bars) and
    stderr is a terminal; otherwise `update` does nothing. stdout never sees it (its bytes are the same
    either way), and it is gone from the terminal when the block ends. `total` None: a pulsing bar with the
    elapsed time, for work whose size is not known in advance."""
    if not enabled or not _stderr_is_terminal():
        yield lambda done=None, total=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int | None = None, total: int | None = None) -> None:
            bar.update(task, **({} if done is None else {"completed": done}),
                       **({} if total is None else {"total": total}))

        yield update
