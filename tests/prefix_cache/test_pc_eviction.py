"""Flop-aware (Marconi-style) eviction: the prefill FLOP model, its configuration, and a whole replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim.errors import InputError
from k3sim.kernels.ops import kda_fwd_flop_per_token_head
from k3sim.prefix_cache.config import CacheConfig
from k3sim.prefix_cache.flops import PrefillFlops, prefill_flops

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "tests" / "data" / "traces" / "conversation_head300.jsonl")


def test_k3_prefill_flops_from_its_config():
    """Linear: 2 FLOP per active weight, LM head excluded, plus chunk KDA's own work on 69 layers x 96
    heads; quadratic: 24 MLA layers x 96 heads x (128 + 64 + 128) per causal (query, key) pair."""
    from k3sim.configs import load_model
    from k3sim.memory.params import count_params

    m = load_model(str(ROOT / "models" / "kimi-k3.yaml"))
    rep = count_params(m)
    lm_head = next(r.active_params for r in rep.rows if r.component == "lm_head")
    f = prefill_flops(m)
    assert f.linear_flop_per_token == pytest.approx(2 * (rep.active_params - lm_head)
                                                    + 69 * 96 * kda_fwd_flop_per_token_head())
    assert f.attention_flop_per_token_pair == 24 * 96 * 320
    assert 200e9 < f.linear_flop_per_token < 215e9  # about 2 x 104B active
    assert f(0) == 0 and f.span(1000, 3000) == pytest.approx(f(3000) - f(1000))
    t = 65536  # doubling a prefix adds the attention term 2 t^2 x pair on top of twice the linear work
    assert f(2 * t) - 2 * f(t) == pytest.approx(f.attention_flop_per_token_pair * 2 * t * t)


@pytest.mark.parametrize("kw, field", [
    (dict(eviction="lfu"), "eviction"),
    (dict(eviction_alpha=-1.0), "eviction_alpha"),
    (dict(eviction_alpha=float("nan")), "eviction_alpha"),
    (dict(eviction_window=0), "eviction_window"),
    (dict(eviction="flop-aware"), "eviction"),  # without the model's FLOP per token there is nothing to weigh
])
def test_bad_eviction_settings_name_their_field(kw, field):
    with pytest.raises(InputError) as err:
        CacheConfig("decoupled", 2, 4, 1, 4, 1, None, **kw)
    assert err.value.field == field


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "k3sim", "prefix-cache", "--trace", CONV, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_flop_aware_replay_reports_flop_saved_and_bad_options_exit_2():
    lru = json.loads(_cli("--capacity-bytes", "20e9", "--json").stdout)
    fa = _cli("--capacity-bytes", "20e9", "--eviction", "flop-aware", "--eviction-alpha", "0.5", "--json")
    assert fa.returncode == 0, fa.stderr
    fa = json.loads(fa.stdout)
    assert fa["eviction"] == "flop-aware" and lru["eviction"] == "lru"
    for r in (lru, fa):
        assert 0 < r["prefill_flop_saved_fraction"] < 1 and r["evictions"] > 0
        assert r["stale_reads"] == r["evicted_hits"] == r["partial_restores"] == 0
    for args, needle in ((("--eviction", "lfu"), "--eviction:"),
                         (("--eviction", "flop-aware", "--eviction-alpha", "-2"), "--eviction-alpha: must be"),
                         (("--eviction-alpha", "2"), "flop-aware only")):  # LRU has no alpha to weigh
        proc = _cli(*args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_flop_aware_replay_keeps_every_invariant():
    """A tight pool under flop-aware eviction: cache.check (refcounts, index, the chain links both ways)
    after every step, and no consistency-rule failure."""
    from k3sim.prefix_cache.run import make_config
    from k3sim.prefix_cache.serving import replay
    from k3sim.workloads import read_mooncake

    cfg = make_config(ROOT / "models" / "kimi-k3.yaml", "decoupled", 512, 6144, 20e9, eviction="flop-aware",
                      eviction_alpha=0.5)
    res = replay(read_mooncake(CONV), cfg, check_every=1, keep_cache=True)
    cache = res.extra["cache"]
    assert res.evictions > 0 and res.stale_reads == res.evicted_hits == res.partial_restores == 0
    assert cache.mla_parent  # chains were tracked, and checked at every step
    assert 0 < res.prefill_flop_saved_fraction < 1


def test_prefill_flops_is_a_plain_polynomial():
    f = PrefillFlops(10.0, 1.0)
    assert f(3) == 10 * 3 + 3 * 4 and f.span(1, 3) == f(3) - f(1)
