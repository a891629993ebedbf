"""Parsed YAML config files from the disk cache (k3sim.configs.diskcache): a hit is the mapping a parse gives,
keyed by the bytes (an edit of the same size is parsed again), only clean mappings of plain values are kept,
and a damaged or planted entry is never used."""

from __future__ import annotations

import datetime
import sys

import pytest

from k3sim.configs import diskcache
from k3sim.configs.loaders import load_model, read_mapping
from k3sim.errors import InputError

MODEL = """name: tiny
hidden_size: 1024
num_layers: 4
vocab_size: 32000
layer_kinds: [kda, kda, kda, mla]
kda: {num_heads: 8, head_dim_k: 128, head_dim_v: 128}
mla: {num_heads: 8, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128}
dense_ffn_width: 4096
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(diskcache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def entries(root):
    return sorted(root.rglob("*.pkl"))


def test_a_hit_is_the_parse(cache, tmp_path, monkeypatch):
    path = tmp_path / "m.yaml"
    path.write_text(MODEL)
    first = read_mapping(path)
    assert len(entries(cache)) == 1
    import yaml

    calls = []
    want = yaml.safe_load(MODEL)
    monkeypatch.setattr(yaml, "load", lambda *a, **k: calls.append(1))  # a hit must not parse
    second = read_mapping(path)
    assert second == first == want and second is not first and not calls


def test_an_edit_of_the_same_size_is_parsed_again(cache, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MODEL)
    assert read_mapping(path)["num_layers"] == 4
    path.write_text(MODEL.replace("num_layers: 4", "num_layers: 5"))
    assert read_mapping(path)["num_layers"] == 5
    assert len(entries(cache)) == 2


def test_a_validation_error_is_reported_on_a_hit_too(cache, tmp_path):
    """The cache holds the parse, not the validation: a bad field is refused on every call."""
    path = tmp_path / "m.yaml"
    path.write_text(MODEL.replace("num_layers: 4", "num_layers: 0"))
    for _ in range(2):
        with pytest.raises(InputError, match="num_layers"):
            load_model(path)


def test_only_plain_mappings_are_kept(cache, tmp_path):
    """A YAML date is not a builtin the cache holds: parsed every time, never saved; an alias is refused every
    time (nothing was saved for it)."""
    dated = tmp_path / "d.yaml"
    dated.write_text("when: 2026-12-02\nx: 1\n")
    assert read_mapping(dated)["when"] == datetime.date(2026, 12, 2)
    assert read_mapping(dated)["when"] == datetime.date(2026, 12, 2)
    alias = tmp_path / "a.yaml"
    alias.write_text("a: &x 1\nb: *x\n")
    for _ in range(2):
        with pytest.raises(InputError, match="aliases"):
            read_mapping(alias)
    assert entries(cache) == []


@pytest.mark.parametrize("how", ["bit flip", "truncated", "other value"])
def test_a_damaged_entry_is_ignored(cache, tmp_path, how):
    path = tmp_path / "m.yaml"
    path.write_text(MODEL)
    want = read_mapping(path)
    (entry,) = entries(cache)
    blob = entry.read_bytes()
    if how == "bit flip":
        entry.write_bytes(blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:])
    elif how == "truncated":
        entry.write_bytes(blob[:20])
    else:  # a well-formed entry of another text, moved here: its key does not match
        other = tmp_path / "o.yaml"
        other.write_text("x: 1\n")
        read_mapping(other)
        moved = [e for e in entries(cache) if e != entry][0]
        entry.write_bytes(moved.read_bytes())
    assert read_mapping(path) == want


def test_json_is_not_cached(cache, tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"a": 1}')
    assert read_mapping(path) == {"a": 1} and entries(cache) == []


def test_is_plain():
    assert diskcache.is_plain({"a": [1, 2.5, None, True, {"b": "c"}], 3: float("nan")})
    assert not diskcache.is_plain({"a": datetime.date(2026, 1, 1)})
    assert not diskcache.is_plain({"a": (1, 2)})  # a tuple: YAML gives lists
    deep: list = []
    node = deep
    for _ in range(sys.getrecursionlimit() // 4):
        node.append([])
        node = node[0]
    assert not diskcache.is_plain(deep)


def test_pruning_keeps_the_keys_that_are_read(tmp_path, monkeypatch):
    """A key made first and read ever since (the h200 store a derived profile stands on) outlived by newer keys
    was pruned first, so a warm derived profile parsed the CSVs again; a read now counts as a use."""
    import os
    import time

    from k3sim.configs import diskcache

    monkeypatch.setenv(diskcache.ENV, str(tmp_path))
    assert diskcache.save("space", "old", "v", 1, keep=3)
    past = time.time() - 100
    for i in range(2):
        assert diskcache.save("space", f"k{i}", "v", i, keep=3)
        os.utime(tmp_path / "space" / f"k{i}", (past + i, past + i))
    os.utime(tmp_path / "space" / "old", (past - 10, past - 10))
    assert diskcache.load("space", "old", "v") == 1  # read: now the most recently used
    assert diskcache.save("space", "new", "v", 9, keep=3)  # makes a key: prunes to 3
    assert diskcache.load("space", "old", "v") == 1 and diskcache.load("space", "k0", "v") is None
