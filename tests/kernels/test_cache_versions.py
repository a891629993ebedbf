"""The library versions in every kernel-cache key (k3sim.kernels.cache.library_version) are the installed
ones, read without importlib.metadata (~30 ms of a warm query): the same answer it gives."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from k3sim.kernels import cache


@pytest.mark.parametrize("module,dist", cache._LIBRARIES)
def test_versions_are_importlib_metadatas(module, dist):
    pytest.importorskip(module)
    assert cache.library_version(module, dist) == md.version(dist)


def test_a_missing_library_is_its_own_version():
    assert cache.library_version("k3sim_no_such_module", "k3sim-no-such-dist") == "none"


def test_source_digest_follows_the_code(tmp_path, monkeypatch):
    """`source_digest` (the code part of k3sim.cp's keys) reads the files: the same digest for the same
    source, another for another directory."""
    assert cache.source_digest("cp", "comm") == cache.source_digest("cp", "comm")
    assert cache.source_digest("cp") != cache.source_digest("comm")
    assert cache.source_digest("no/such/file.py") == cache.source_digest("no/such/file.py")
