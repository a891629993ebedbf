"""Output conventions shared by every command: a rich table by default, stable JSON with --json.

Models return dataclasses / dicts with SI units; this module only renders them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterable, Mapping


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


def human_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:,.1f} us"
    if s < 1:
        return f"{s * 1e3:,.3f} ms"
    return f"{s:,.3f} s"


def print_table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> None:
    """Render rows with rich; values are printed as given (format them before)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(v) for v in r])
    Console().print(table)


def print_kv(title: str, pairs: Iterable[tuple[str, Any]]) -> None:
    print_table(title, ["quantity", "value"], pairs)
