"""The op registry is built explicitly (issue 20, item 1): `ops.build_registry` assembles `OPS` from the tables
that define ops; no module adds ops to another's by being imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from k3sim.kernels import ops, ops_decode
from k3sim.kernels.ops import OPS, REGISTRY_TABLES, build_registry


def test_ops_is_the_tables_in_order():
    """Every table's ops, each once, in table order (the store and `kernel-time`'s list follow it)."""
    expected = [name for _, table in REGISTRY_TABLES for name in table]
    assert list(OPS) == expected and len(set(expected)) == len(expected)
    assert list(build_registry()) == expected
    assert REGISTRY_TABLES[-1][1] is ops_decode.DECODE_OPS
    assert {"gemm_bf16", "all_reduce", "ep_dispatch", "mla_decode", "rmsnorm"} <= set(OPS)
    assert all(OPS[n] is spec for _, t in REGISTRY_TABLES for n, spec in t.items())


def test_a_name_in_two_tables_or_keyed_wrongly_is_refused():
    gemm = ops.BASE_OPS["gemm_bf16"]
    with pytest.raises(ValueError, match="defined twice: a and b"):
        build_registry((("a", {"gemm_bf16": gemm}), ("b", {"gemm_bf16": gemm})))
    with pytest.raises(ValueError, match="keyed as 'gemm'"):
        build_registry((("a", {"gemm": gemm}),))


def test_the_decode_table_registers_nothing_on_import():
    """ops_decode builds its table over the shared vocabulary (`kernels.opspec`) and imports the registry module
    nowhere: importing it alone loads no registry."""
    code = ("import sys, k3sim.kernels.ops_decode as d; "
            "assert 'k3sim.kernels.ops' not in sys.modules, 'ops_decode imported the registry'; "
            "assert 'rmsnorm' in d.DECODE_OPS; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-400:]
