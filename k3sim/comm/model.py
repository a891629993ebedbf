"""The one collective model: every collective's time in k3sim comes from `collective_time`.

    t = steps(algorithm, n) x alpha_step + bus_bytes(op, n) / (f x link_bandwidth)

- bus bytes: nccl-tests' bus-bandwidth convention (`kernels.ops.wire_bytes`, doc/PERFORMANCE.md), the
  bytes each rank moves, so one achieved fraction `f` of a link holds across GPU counts;
- link bandwidth: the narrowest hop of the ring over the placement's links (`topology.py`: NVSwitch
  domain of `scaleup_domain_gpus`, one NIC per GPU, or a topology file);
- algorithms, as NCCL picks among them (the lowest predicted time wins): ring (every op; n-1 steps,
  2(n-1) for all_reduce); tree for all_reduce across nodes (NCCL's double binary tree: 2 log2(nodes)
  inter-node steps plus the intra-node chain; each rank moves 2 x the buffer, reduce up and broadcast
  down, more than the ring's 2(n-1)/n x, so the tree wins on latency only); NVLS for all_reduce inside one
  NVSwitch domain (NVLink SHARP reduces in the switch: each GPU sends and receives the buffer once,
  bus bytes n/(2(n-1)) of the ring's). NVLS is modelled and reported but not chosen while the
  profile marks it off (`nvls` argument; on the lent H200 machines NCCL_NVLS_ENABLE=0 by policy, so
  no measurement could include it);
- calibration: the measured 2-GPU runs (alpha-beta fit per op in `fitted.yaml`) give alpha_step (the
  fit's alpha over its ring steps) and f = fitted bus bandwidth / the profile's scale-up bandwidth.
  A link without its own measurement (the NIC fabric) gets the same fraction of its datasheet
  bandwidth and the same per-step latency: a modelling choice, said in `detail`.
- measured points: a call at a measured GPU count inside one scale-up domain on the default
  placement answers from the measurements (exact or interpolated), as every other kernel does.

Conventions (`convention`): "barrier" (each call starts from a host barrier: the 2026-11-30 H200 runs, rows
without a `timer` column, "events" to the store), "stream" (back-to-back calls in one stream, as nccl-tests
times), "graph" (captured in a CUDA graph: rows with `timer` graph, e.g. the AIConfigurator import). Each is
its own series of measured rows (`ProfilePredictor.series`): no row of one timer is shifted into another's.
The caller's convention picks the series in the order of `SERIES`: its own rows where they exist at the
call's GPU count, else another series' rows there (graph rows are a lower bound of a barrier-started call,
barrier rows an upper bound of a graph or stream one). Off the measured GPU counts the model answers,
calibrated on the profile's one alpha-beta fit, whose convention is that of the rows it was made on
(`fit_convention`: graph where the op has graph rows, barrier for an op measured barrier-started only). The
answer's `convention` is that of the rows (or fit) it came from, and `detail` says which and why. The
harness (`calibration/distributed.py`) times all three.
"""

from __future__ import annotations

import math
from typing import Any

from k3sim.configs.bounds import BOUNDS, check_range
from k3sim.errors import InputError
from k3sim.kernels.ops import COLLECTIVE_OPS

COLLECTIVES = COLLECTIVE_OPS  # the registry's collective kind (k3sim.kernels.ops), the one list
CONVENTIONS = ("graph", "stream", "barrier")
# The store's timer name of each convention's rows (a row without a `timer` column is "events": barrier-started).
TIMERS = {"graph": "graph", "stream": "stream", "barrier": "events"}
# Which series answers a caller's convention, best first: its own, then the nearest measured one (a stream
# call is bounded above by a barrier-started one, below by a graph replay).
SERIES = {"graph": ("graph", "barrier"), "stream": ("stream", "barrier", "graph"), "barrier": ("barrier", "graph")}
# What another series' rows are to the caller's convention (said in `detail`)
_BOUND = {("graph", "barrier"): "an upper bound: a host barrier, its skew and the launch included",
          ("stream", "barrier"): "an upper bound: a host barrier, its skew and the launch included",
          ("stream", "graph"): "a lower bound: no launch between calls",
          ("barrier", "graph"): "a lower bound: no host barrier and no launch"}
MAX_GPUS = int(BOUNDS["collective_gpus"].hi)  # the bounds table's (and so the kernel registry's) `gpus`


def ring_steps(op: str, n: int) -> int:
    """Dependent communication steps of the ring algorithm (NCCL ring; pairwise exchange for all_to_all)."""
    if op == "send_recv":
        return 1
    if op == "custom_all_reduce":  # vLLM two-shot: reduce-scatter then all-gather through IPC buffers
        return 2
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def _check(op: str, nbytes: Any, gpus: Any, convention: str) -> tuple[int, int]:
    """The call's arguments, checked before any work: `bytes` and `gpus` inside the bounds table's
    `kernel_bytes` and `collective_gpus` (placement and routing are linear in GPUs up to that maximum)."""
    if op not in COLLECTIVES:
        raise InputError(f"unknown collective '{op}' (known: {', '.join(COLLECTIVES)})", field="op")
    if convention not in CONVENTIONS:
        raise InputError(f"convention must be one of {', '.join(CONVENTIONS)}, got '{convention}'",
                         field="convention")
    for name, v, kind in (("bytes", nbytes, "kernel_bytes"), ("gpus", gpus, "collective_gpus")):
        r = BOUNDS[kind]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) \
                or not r.lo <= v <= r.hi:
            raise InputError(f"{op}: {name}={v!r} must be a whole number in {r.text()} ({r.why})", field=name)
    return int(nbytes), int(gpus)


def _series_note(series: str, convention: str, what: str = "rows") -> str:
    """Which rows (or fit) an answer stands on, and what they are to the caller's convention."""
    rows = f"{series}-timed {what}" if series != "barrier" else f"barrier-started {what}"
    if series == convention:
        return f"convention {convention}: {rows}"
    return f"convention {convention}: no {convention}-timed {what} here, {rows} ({_BOUND[(convention, series)]})"


def fit_convention(opp: Any) -> str:
    """The convention of an op's alpha-beta fit (`fitted.yaml`), which the model path's answers are in: the fit is
    made on the graph-preferred points (`MeasurementStore.points`): graph rows where a shape has them, a
    barrier-only shape shifted by the timers' offset ("events-shifted"), so "graph" when the op has any graph row;
    "barrier" when all its rows are barrier-started (send_recv on the H200 runs)."""
    return "barrier" if set(opp.timers.values()) <= {"events"} else "graph"


def _calibration(hw: Any, op: str):
    """(alpha_step_s, achieved fraction of the scale-up link, note, n_ref, the fit's convention) from the profile's
    fit at its smallest measured GPU count (one link, no topology in it), or None."""
    from k3sim.kernels.predict import profile_predictor

    opp = profile_predictor(hw).op(op)
    if opp is None or not opp.fit.alpha_beta:
        return None
    n_ref = min(opp.fit.alpha_beta)
    ab = opp.fit.alpha_beta[n_ref]
    frac = ab.bus_bandwidth_bytes_per_s / float(hw.scaleup_bandwidth_bytes_per_s)
    note = f"alpha-beta fit of {n_ref} GPUs ({opp.fit_note})"
    if frac > 1.0:  # a profile slower than the measuring machine: no link runs above its bandwidth (issue 21)
        note += f"; achieved fraction {frac:.3f} of this profile's scale-up bandwidth clamped to 1"
        frac = 1.0
    return ab.alpha_s / ring_steps(op, n_ref), frac, note, n_ref, fit_convention(opp)


def _measured(hw: Any, op: str, nbytes: int, n: int, convention: str):
    """The answer from the first series in `SERIES[convention]` with rows at `n` GPUs (exact or interpolated, as
    every kernel), labelled with that series' convention; None when no series has rows at `n`."""
    from k3sim.kernels.predict import KernelTime, profile_predictor

    pp = profile_predictor(hw)
    for series in SERIES[convention]:
        opp = pp.series(op, TIMERS[series])
        if opp is not None and (n,) in opp.groups:
            kt = opp.predict({"bytes": nbytes, "gpus": n})
            return KernelTime(kt.seconds, kt.source, f"{kt.detail}; {_series_note(series, convention)}", kt.method,
                              series)
    return None


def collective_time(op: str, nbytes: int, gpus: int, hardware: Any = "h200", *, gpus_per_node: int | None = None,
                    topology: Any = None, convention: str = "graph", link_bandwidth: float | None = None,
                    nvls: bool = False):
    """Seconds of one collective of a per-rank shard of `nbytes` (as nccl-tests counts it) over `gpus`.

    `gpus_per_node`: ranks sharing a scale-up domain (default the profile's `scaleup_domain_gpus`);
    `topology`: a `Topology`, or a path to a topology file, instead of the default placement;
    `link_bandwidth`: every link at this bandwidth (e.g. the H800's NVLink on H200-measured latency);
    `nvls`: whether NCCL may use NVLink SHARP (off on the measured machines).
    Returns `kernels.predict.KernelTime` (seconds, source, detail, method)."""
    from k3sim.comm.topology import Topology, load_topology, placement_topology
    from k3sim.configs.profiles import load_profile
    from k3sim.kernels.ops import wire_bytes
    from k3sim.kernels.predict import KernelTime

    nbytes, n = _check(op, nbytes, gpus, convention)
    hw = load_profile(hardware)
    if topology is not None and gpus_per_node:
        raise InputError(f"gpus_per_node={gpus_per_node} applies to the default placement only; a topology "
                         "file gives its own (gpus_per_node: N in the file)", field="gpus_per_node")
    if topology is not None and not isinstance(topology, Topology):
        topology = load_topology(topology, int(getattr(hw, "scaleup_domain_gpus", 0) or 0) or None)
    if topology is not None and n > topology.gpus:
        raise InputError(f"{op} on {n} GPUs, but the topology has {topology.gpus}: ask for at most "
                         f"{topology.gpus} GPUs or describe more in the file", source=topology.source, field="gpus")
    default_place = topology is None and link_bandwidth is None
    domain = int(getattr(hw, "scaleup_domain_gpus", 0) or 0)
    if default_place and gpus_per_node in (None, 0, domain) and n <= max(domain, 1):
        kt = _measured(hw, op, nbytes, n, convention)
        if kt is not None:
            return kt
    topo = topology or placement_topology(n, hw, gpus_per_node or None)
    bw, multi_node = topo.ring_bottleneck(n)
    if link_bandwidth is not None:
        bw = float(check_range(link_bandwidth, "bandwidth", field="link_bandwidth"))
    cal = _calibration(hw, op)
    if cal is None:
        alpha, frac, cal_note, source = 0.0, 1.0, "no measured collective: datasheet link bandwidth, no latency " \
                                                   "(a lower bound)", "datasheet-roofline"
        series, conv_note = convention, ""
    else:
        alpha, frac, cal_note, _, series = cal
        source, conv_note = "model", f"; {_series_note(series, convention, 'fit')}"
    eff_bw = frac * bw
    wire = wire_bytes(op, nbytes, n)
    steps = {"ring": ring_steps(op, n)}
    cands = {"ring": steps["ring"] * alpha + wire / eff_bw}
    nodes = math.ceil(n / topo.gpus_per_node)
    if op == "all_reduce" and nodes > 1:
        local = min(n, topo.gpus_per_node)
        steps["tree"] = 2 * (math.ceil(math.log2(nodes)) + local - 1)
        cands["tree"] = steps["tree"] * alpha + 2.0 * nbytes / eff_bw
    nvls_t = None
    if op == "all_reduce" and not multi_node and topo.nvswitch and n > 2:
        nvls_t = 2 * alpha + nbytes / eff_bw  # push to the switch, pull the reduced buffer
        if nvls:
            cands["nvls"], steps["nvls"] = nvls_t, 2
    algo = min(cands, key=cands.get)
    link = "scale-out (NIC fabric)" if multi_node else "scale-up (NVSwitch)"
    if link_bandwidth is not None:
        link = f"override {bw:.3g} B/s"
    detail = (f"{algo} over {n} GPUs ({nodes} node(s) of {topo.gpus_per_node}, {topo.source}); narrowest hop "
              f"{bw:.3g} B/s [{link}] x achieved fraction {frac:.3f}; {steps[algo]} steps x alpha_step {alpha * 1e6:.2f} us; {cal_note}")
    if multi_node and cal is not None:
        detail += "; the NIC link takes the NVLink-measured fraction and latency (not measured across nodes)"
    if nvls_t is not None and not nvls:
        detail += f"; NVLS would take {nvls_t:.3g} s (disabled by policy: NCCL_NVLS_ENABLE=0 on the measured machines)"
    # the time is in the convention of the series it was calibrated on; the field says so
    return KernelTime(float(cands[algo]), source, detail + conv_note, algo, series)
