"""The package graph is layered: no import (module-level or inside a function) points from a lower layer to a
higher one, and no two packages import each other. The table is DEVELOPING.md's "Layers"; this test reads it
from there, so the document and the check cannot drift apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "k3sim"


def layer_table() -> dict[str, int]:
    """{unit: layer index} from the fenced `layers` block of DEVELOPING.md (one line per layer, bottom first;
    units separated by spaces)."""
    text = (ROOT / "DEVELOPING.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "DEVELOPING.md has no ```layers block"
    table = {}
    for index, line in enumerate(l for l in block.group(1).splitlines() if l.strip()):
        for unit in line.split(":", 1)[1].split():
            table[unit] = index
    return table


def unit_of(module: str) -> str:
    """The layer unit of a dotted module name: `k3sim.<pkg>` for a subpackage or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "k3sim"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every k3sim module `path` imports, anywhere in the file (lazy imports count), with its line."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name) for line, name in found if name == "k3sim" or name.startswith("k3sim.")]


def edges() -> list[tuple[str, str, str]]:
    """(from unit, to unit, 'file:line module') for every import between different units."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = unit_of(module_name(path))
        for line, name in imports_of(path):
            dst = unit_of(name)
            if dst != src:
                out.append((src, dst, f"{path.relative_to(ROOT)}:{line} {name}"))
    return out


def test_every_unit_is_in_the_table():
    table = layer_table()
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert units - set(table) == set(), "add these to DEVELOPING.md's layers block"


def test_no_import_points_up_or_sideways_into_a_cycle():
    table = layer_table()
    bad = [f"{a} (layer {table[a]}) -> {b} (layer {table[b]}): {where}" for a, b, where in edges()
           if table.get(b, -1) > table.get(a, -1)]
    assert bad == [], "\n".join(bad)


def test_no_cycle_between_units_of_one_layer():
    import networkx as nx

    graph = nx.DiGraph((a, b) for a, b, _ in edges())
    cycles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_the_model_never_imports_calibration_or_validation():
    table = layer_table()
    side = {u for u in ("calibration", "validation") if u in table}
    bad = [where for a, b, where in edges() if b in side and a not in side | {"commands", "cli", "k3sim"}]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("from k3sim.kernels import predict\n", ["k3sim.kernels"]),
    ("def f():\n    from k3sim.step import glue\n", ["k3sim.step"]),
    ("import k3sim.comm.model as m\n", ["k3sim.comm.model"]),
])
def test_the_walker_sees_lazy_and_plain_imports(tmp_path, source, expected, monkeypatch):
    """The check is only as good as its walker: a function-local import must be found."""
    pkg = tmp_path / "k3sim" / "x"
    pkg.mkdir(parents=True)
    f = pkg / "m.py"
    f.write_text(source)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [n for _, n in imports_of(f)] == expected


def test_every_module_imports_on_its_own():
    """Each module imported first, in a fresh module table (lazy package exports change which module loads
    first: `configs.serving` before `configs.parallel` once hid a cycle between them). One subprocess, the
    k3sim modules dropped from `sys.modules` between imports; the GPU harness modules that need torch are
    skipped when torch is absent."""
    import subprocess
    import sys

    names = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    for m in [m for m in sys.modules if m == 'k3sim' or m.startswith('k3sim.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if not (e.name or '').startswith('k3sim'):\n"
        "            continue  # torch / triton / fla: the GPU harness\n"
        "        bad.append(f'{n}: {e!r}')\n"
        "    except Exception as e:\n"
        "        bad.append(f'{n}: {e!r}')\n"
        "print('\\n'.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", proc.stdout
