"""Crossover detection on hand-made series, and the KCP-vs-ring bytes crossover formula."""

from __future__ import annotations

import pytest

from cp_fakes import k3
from k3sim.cp.sweep import crossovers, kcp_vs_ring_bytes_crossover, winners


def row(S, strategy, t):
    return {"seq_len": S, "cp": 8, "layer": "kda", "strategy": strategy, "mla_kv": "-", "time_s": t, "skipped": ""}


def test_crossover_interpolates_in_log_length():
    """a: flat 4 s; b: 1, 4 ... grows 4x per 4x in S -> equal at S = 4096 exactly (a grid point)."""
    rows = [row(S, "kcp", 4.0) for S in (1024, 4096, 16384)] + \
           [row(S, "ulysses", S / 1024) for S in (1024, 4096, 16384)]
    x = crossovers(rows, 8, "kda")
    assert len(x) == 1 and x[0]["seq_len"] == pytest.approx(4096) and x[0]["faster_above"] == "kcp"
    w = winners(rows, 8, "kda")
    assert [v["fastest"] for v in w] == ["ulysses", "kcp"]


def test_near_ties_are_not_crossovers():
    rows = [row(S, "kcp", 1.0 + 0.01 * (i % 2)) for i, S in enumerate((1024, 2048, 4096))] + \
           [row(S, "ulysses", 1.005) for S in (1024, 2048, 4096)]
    assert crossovers(rows, 8, "kda") == []


def test_kcp_vs_ring_bytes_crossover():
    """(P-1) 96 x 128 x 256 x 2 B = (P-1)/P 4 S 7168 -> S = 8 x 6 291 456 / 28 672 = 1755.4 tokens."""
    assert kcp_vs_ring_bytes_crossover(k3(), 8, 2.0) == pytest.approx(8 * 6291456 / 28672)


def test_winner_keeps_lead_within_a_tie():
    rows = [row(S, "kcp", 1.0) for S in (1024, 2048, 4096)] + \
           [row(1024, "ulysses", 2.0), row(2048, "ulysses", 0.99), row(4096, "ulysses", 0.5)]
    assert [(w["fastest"], w["from_seq_len"]) for w in winners(rows, 8, "kda")] == [("kcp", 1024), ("ulysses", 4096)]
