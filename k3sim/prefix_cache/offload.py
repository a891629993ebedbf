"""Offload tiers under the GPU pool: pinned host DRAM and, optionally, a local SSD below it, holding the KV pages
and state checkpoints the GPU pool evicts, so that a later request can restore them over the host link instead
of prefilling them again.

What production systems do, and what is modelled here:
- SGLang HiCache (`--enable-hierarchical-cache`, python/sglang/srt/mem_cache/hiradix_cache.py): a host pool of
  pinned memory under the device pool; with `--hicache-write-policy write_back` a node is written to the host
  when the device evicts it, the host pool evicts LRU, a device miss that hits the host loads the pages back
  ("load_back") before the prefill reads them; a third level (`--hicache-storage-backend`: file, Mooncake) sits
  under the host pool.
- vLLM's KV offloading connector (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py, the
  CPU backend with LRU eviction) and LMCache's CPU tier (LocalCPUBackend, LRU) keep evicted blocks in CPU memory;
  a hit is loaded asynchronously and the request waits for it (vLLM's WAITING_FOR_REMOTE_KVS state) while the
  rest of the batch runs.
- Mooncake (Qin et al., FAST'25, "Mooncake: a KVCache-centric disaggregated architecture for LLM serving",
  the serving platform of Kimi) pools the CPU DRAM and SSDs of the GPU nodes into one KV cache; K3's serving keeps
  KV and state in that CPU-DRAM pool.

The rules (`HybridPrefixCache` drives them):
- Eviction GPU -> host -> SSD -> drop. An entry the GPU pool evicts is written to the top tier (write-back on
  eviction, HiCache's write_back policy); a tier full evicts its least recently used entry to the tier below,
  the last one drops it. An entry larger than a whole tier passes it by.
- Entries: a KV page (every key registered on the page: its prefix endpoints) or a checkpoint (all state groups
  of one position: a checkpoint moves down whole, so rule 3 of the cache still holds: one restores with every
  group or not at all). KV pages are exclusive: a restored page is a GPU page again (indexed there, gone from
  its tier), and a key the GPU registers again leaves the tier. A checkpoint is copied into the restoring
  request's private state wherever it is, as a GPU checkpoint is, so it stays in its tier (made most recent).
- A restore moves its bytes over the GPU's host link at the tier's achieved bandwidth, one restore after another
  (the link is one resource), and the request's prefill waits for it (`ReqState.ready_s`); the write-back of an
  eviction goes the other way on the duplex link and is not charged (its bytes are counted).
Bytes and capacities are the cache's own units: per GPU with `--tp` (one TP rank's share of every layer).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from k3sim.errors import InputError

KV, CKPT = 0, 1
TIER_NAMES = ("gpu", "host", "ssd")  # tier 0 is the GPU pool; offload level i is tier i + 1

# The achieved share of a host link's one-direction datasheet peak that a restore sees: a pinned-memory copy on
# the copy engine (cudaMemcpyAsync / torch copy_, as vLLM's offloading connector, LMCache and HiCache's direct
# backend issue it). Measured, per profile; a profile with a host link figure but no entry here is priced at its
# peak and says so (`host_link`).
HOST_LINK_ACHIEVED = {
    # median of 10 pinned 1 GiB host-to-device copies, CUDA events, on the lent H200 (PCIe Gen5 x16, 2026-12-02):
    # reports/prefix_cache/host_link/h200_host_link.json (measure_host_link.py beside it); device-to-host 55.10,
    # both directions at once 46.5 GB/s each (host wall clock)
    "h200": (55.05e9, "measured: pinned 1 GiB host-to-device copy on the lent H200 (PCIe Gen5 x16), 55.05 GB/s, "
                      "reports/prefix_cache/host_link/h200_host_link.json"),
    # the copy-engine ceiling of a Grace-Blackwell NVLink-C2C host link, ~210 GB/s host-to-device (~192 GB/s back)
    # per GPU, measured on GB300 by sglang PR 40278 ([HiCache] TMA-staged host<->device KV transfer kernel); a
    # GH200 (one GPU per Grace) reaches 342-346 GB/s (nvbandwidth host_to_device_memcpy_ce, vllm PR 6496 and
    # NVIDIA/nvbandwidth issue 23)
    "gb200-nvl72": (210e9, "measured elsewhere: Grace-Blackwell C2C copy-engine ceiling ~210 GB/s host-to-device "
                           "per GPU (GB300, sglang-project/sglang PR 40278)"),
}


@dataclass(frozen=True)
class HostLink:
    """A GPU's host link as the offload tiers use it: the achieved bytes/s (one direction) and where it comes
    from (the profile's datasheet peak and the measured share)."""

    achieved_bytes_per_s: float
    peak_bytes_per_s: float
    source: str

    @property
    def efficiency(self) -> float:
        return self.achieved_bytes_per_s / self.peak_bytes_per_s


def host_link(hw, *, source: str, field: str | None = None) -> HostLink:
    """The host link of profile `hw`: its datasheet peak (`host_link_bandwidth_bytes_per_s`) at the measured share
    of `HOST_LINK_ACHIEVED`. A profile without the figure cannot price a restore: refused, naming `source` (the
    option or field that asked for an offload tier)."""
    peak = getattr(hw, "host_link_bandwidth_bytes_per_s", None)
    if peak is None:
        raise InputError(f"profile '{hw.name}' has no host link figure (host_link_bandwidth_bytes_per_s), so a "
                         "restore from host memory cannot be priced: use a profile that has one (h200, "
                         "gb200-nvl72) or remove the offload tier", source=source, field=field)
    measured = HOST_LINK_ACHIEVED.get(hw.name)
    if measured is None:
        return HostLink(peak, peak, f"{hw.sources.get('host_link_bandwidth_bytes_per_s', 'profile')}; no measured "
                                    "share for this profile: the datasheet peak (a lower bound on restore times)")
    achieved, why = measured
    return HostLink(min(achieved, peak), peak, f"peak: {hw.sources['host_link_bandwidth_bytes_per_s']}; {why}")


def check_tier_bytes(value, option: str, field: str | None = None) -> float:
    """A tier's capacity: a finite number of bytes >= 0 (0: no tier)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 2 ** 60):
        raise InputError(f"must be a finite number of bytes >= 0 (0: no tier), got {value}", source=option,
                         field=field)
    return v


class Entry:
    """One offloaded item: a KV page (`keys`: the prefix endpoints registered on it) or a checkpoint (`ck`: a
    `cache.Ckpt` with no GPU slots, `keys` its one key). `level`: the offload level holding it."""

    __slots__ = ("eid", "kind", "keys", "ck", "nbytes", "level")

    def __init__(self, eid: int, kind: int, keys: list, nbytes: int, ck=None):
        self.eid, self.kind, self.keys, self.nbytes, self.ck, self.level = eid, kind, keys, nbytes, ck, -1


class Level:
    """One offload tier: capacity, achieved restore bandwidth, its entries oldest first, and what it saw."""

    def __init__(self, name: str, capacity_bytes: float, bandwidth_bytes_per_s: float):
        self.name = name
        self.capacity = capacity_bytes
        self.bandwidth = bandwidth_bytes_per_s
        self.lru: OrderedDict[int, Entry] = OrderedDict()
        self.used = 0
        self.peak = 0
        self.held = 0  # bytes of entries taken out of the LRU while a restore reads them
        self.demoted_entries = self.demoted_bytes = 0
        self.evicted_entries = self.evicted_bytes = 0  # passed down (or dropped by the last tier)
        self.restored_entries = self.restored_bytes = 0
        self.restore_s = 0.0
        self.hit_tokens = 0

    def summary(self) -> dict:
        return {"capacity_bytes": self.capacity, "bandwidth_bytes_per_s": self.bandwidth,
                "bytes_peak": self.peak, "demoted_entries": self.demoted_entries,
                "demoted_bytes": self.demoted_bytes, "evicted_entries": self.evicted_entries,
                "evicted_bytes": self.evicted_bytes, "restored_entries": self.restored_entries,
                "restored_bytes": self.restored_bytes, "restore_s": self.restore_s, "hit_tokens": self.hit_tokens}


class OffloadStore:
    """The offload levels under one GPU pool and their one index (`kv`, `ck`: key -> entry)."""

    def __init__(self, levels: list[Level]):
        self.levels = levels
        self.kv: dict = {}
        self.ck: dict = {}
        self.entries: dict[int, Entry] = {}
        self._next = 1  # ids from 1: a lookup marks an offloaded page as ~eid <= -2 (-1 means "no page")

    @staticmethod
    def from_config(cfg) -> "OffloadStore | None":
        levels = [Level(name, cap, bw) for name, cap, bw in cfg.offload_levels]
        return OffloadStore(levels) if levels else None

    def __len__(self) -> int:
        return len(self.entries)

    # ------------------------------------------------------------------ eviction from the GPU
    def demote_kv(self, keys: list, nbytes: int) -> None:
        """A KV page the GPU evicted: its keys not held below already become one entry of the top tier."""
        kv = self.kv
        new = [k for k in keys if k not in kv]
        if new:
            e = self._new(KV, new, nbytes)
            for k in new:
                kv[k] = e
            self._put(e, 0)

    def demote_ckpt(self, ck, nbytes: int) -> None:
        """A checkpoint the GPU dropped (one of its groups was evicted): all its groups to the top tier, unless a
        tier holds one at least as deep under the same key."""
        from k3sim.prefix_cache.cache import Ckpt

        old = self.ck.get(ck.key)
        if old is not None:
            if old.ck.tok >= ck.tok:
                return
            self._remove(old)
        c = Ckpt(ck.key, 0, True, ck.tok)
        e = self._new(CKPT, [ck.key], nbytes, c)
        self.ck[ck.key] = e
        self._put(e, 0)

    def _new(self, kind: int, keys: list, nbytes: int, ck=None) -> Entry:
        e = Entry(self._next, kind, keys, nbytes, ck)
        self._next += 1
        self.entries[e.eid] = e
        return e

    def _put(self, e: Entry, lvl: int, counted: bool = True) -> None:
        """Place `e` at the most recent end of level `lvl`, pushing that level's oldest entries down (or out);
        `counted`: an arrival in the level (an eviction from above), not a held entry put back."""
        if lvl >= len(self.levels):
            self._forget(e)
            return
        L = self.levels[lvl]
        if e.nbytes + L.held > L.capacity:  # larger than what the tier can ever free: it passes the tier by
            self._put(e, lvl + 1, counted)
            return
        lru = L.lru
        while L.used + L.held + e.nbytes > L.capacity:
            old = lru.popitem(last=False)[1]
            L.used -= old.nbytes
            L.evicted_entries += 1
            L.evicted_bytes += old.nbytes
            self._put(old, lvl + 1)
        lru[e.eid] = e
        L.used += e.nbytes
        if L.used + L.held > L.peak:
            L.peak = L.used + L.held
        e.level = lvl
        if counted:
            L.demoted_entries += 1
            L.demoted_bytes += e.nbytes

    def _forget(self, e: Entry) -> None:
        """Out of every index (dropped by the last tier, or restored)."""
        self.entries.pop(e.eid, None)
        if e.kind == KV:
            kv = self.kv
            for k in e.keys:
                if kv.get(k) is e:
                    del kv[k]
        elif self.ck.get(e.keys[0]) is e:
            del self.ck[e.keys[0]]

    def _remove(self, e: Entry) -> None:
        """Out of its level (bytes freed) and out of the index."""
        L = self.levels[e.level]
        if L.lru.pop(e.eid, None) is not None:
            L.used -= e.nbytes
        self._forget(e)

    # ------------------------------------------------------------------ the GPU takes content back
    def forget_kv_key(self, key) -> None:
        """The GPU registered `key` again: its copy below is not needed (KV pages are exclusive)."""
        e = self.kv.pop(key, None)
        if e is not None:
            e.keys.remove(key)
            if not e.keys:
                self._remove(e)

    def forget_ckpt(self, key, tok: int) -> None:
        """The GPU indexed a checkpoint at `key` at least as deep as the one below: that one is superseded."""
        e = self.ck.get(key)
        if e is not None and e.ck.tok <= tok:
            self._remove(e)

    def take(self, e: Entry) -> None:
        """A KV page restored to the GPU: it leaves its tier."""
        self._remove(e)

    def hold(self, e: Entry) -> None:
        """A restore reads `e` (a checkpoint, or a partial page copied into private memory): out of the LRU until
        `release`, so that what the restore's own allocations evict cannot push it out (its bytes still count)."""
        L = self.levels[e.level]
        del L.lru[e.eid]
        L.used -= e.nbytes
        L.held += e.nbytes

    def release(self, e: Entry) -> None:
        """Back at the most recent end of its level (the room it holds is its own)."""
        L = self.levels[e.level]
        L.held -= e.nbytes
        self._put(e, e.level, counted=False)

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        seen = 0
        for L in self.levels:
            assert L.used == sum(e.nbytes for e in L.lru.values()), f"{L.name}: bytes drifted"
            assert L.used + L.held <= L.capacity, f"{L.name}: over capacity"
            assert L.held == 0, f"{L.name}: an entry still held after its restore"
            seen += len(L.lru)
            for e in L.lru.values():
                assert self.levels[e.level] is L and self.entries.get(e.eid) is e, "entry in the wrong level"
        assert seen == len(self.entries), "an entry in no level"
        for k, e in self.kv.items():
            assert e.kind == KV and k in e.keys and e.eid in self.entries, "stale KV index"
        for k, e in self.ck.items():
            assert e.kind == CKPT and e.keys == [k] and e.eid in self.entries, "stale checkpoint index"
