"""The list of collective ops lives in one place, the registry's kind (issue 20, item 2): every other module
derives its list from `k3sim.kernels.ops.COLLECTIVE_OPS`. The check walks the source of `k3sim/` (every
module, with the abstract syntax tree, so a tuple split over lines counts too) for a literal tuple, list or
set that names two or more collectives."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from k3sim.kernels.ops import COLLECTIVE_OPS, OPS

PACKAGE = Path(__file__).resolve().parents[2] / "k3sim"
REGISTRY = PACKAGE / "kernels" / "ops.py"  # the one place: the registry and its bus-factor formula
# The GPU harness runs on a bare GPU machine with torch and without pydantic, which the registry's bounds
# need (k3sim.configs.bounds); it imports nothing from k3sim outside `calibration/` and keeps the list of
# the NCCL collectives it measures itself.
HARNESS = PACKAGE / "calibration"


def literal_collective_lists(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple, list or set literal in `source` holding two or more collective names."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in COLLECTIVE_OPS]
            if len(names) >= 2:
                out.append((node.lineno, names))
    return out


def test_the_registry_kind_is_the_list():
    assert COLLECTIVE_OPS == tuple(n for n, s in OPS.items() if s.kind == "collective")
    assert {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv"} <= set(COLLECTIVE_OPS)


def test_no_module_writes_the_collective_list_out():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY or HARNESS in path.parents:
            continue
        for line, names in literal_collective_lists(path.read_text()):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {names}")
    assert not found, "derive from k3sim.kernels.ops.COLLECTIVE_OPS instead:\n" + "\n".join(found)


@pytest.mark.parametrize("source,hits", [
    ('X = ("all_gather", "reduce_scatter")', 1),
    ('if op in ["all_reduce",\n            "send_recv", "gemm_bf16"]: pass', 1),
    ('S = {"all_to_all", "custom_all_reduce"}', 1),
    ('f("all_gather", "reduce_scatter")', 0),    # call arguments, not a list
    ('X = ("all_gather", "gemm_bf16")', 0),     # one collective
])
def test_the_check_sees_a_literal_list(source, hits):
    """The walker flags what it should (so the test above cannot pass by seeing nothing)."""
    assert len(literal_collective_lists(source)) == hits
