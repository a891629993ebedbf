"""Error bands carried through the simulators (issue 24 item 4): the step model's own measured whole-step errors
(`k3sim.configs.bands`) turned into `*_low` / `*_high` figures.

- A figure of one step kind (decode TPOT, a training step) scales directly: a time by the band's factors, a rate by
  their inverses (`figure_fields`).
- A serving figure (TTFT, TPOT percentiles, goodput) comes out of the DES, where a step's time feeds batching,
  queueing and the SLO count non-linearly, so the DES is run again at each end of the band (`simulate_end`):
  every step of a pool scaled by its kind's factor (`ScaledStep`: decode-only steps by the decode band, steps with
  a prefill chunk by the mixed-prefill band), the same requests, the same seeds. `*_low` is the smaller value of
  the three runs (point, fast end, slow end) and `*_high` the larger, so a band brackets its figure even where the
  DES is not monotone in the step time (Sarathi's budget, preemption). The serving search runs the ends for its
  finalists only (`with_bands`): two more DES runs of the whole traffic per finalist.
"""

from __future__ import annotations

from typing import Any, Callable

# the serving search row's figures the ends are run for (times and rates alike: min / max of the three runs)
SERVE_FIGURES = ("ttft_s", "tpot_s", "ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "goodput_requests_per_s",
                 "goodput_requests_per_s_per_gpu", "throughput_output_tokens_per_s_per_gpu")
ENDS = ("fast", "slow")


def figure_fields(band: Any, times: dict[str, float], rates: dict[str, float]) -> dict[str, float | None]:
    """`{name}_low` / `{name}_high` of each figure: times scaled by the band's factors, rates by their inverses;
    None for every field without a band."""
    out: dict[str, float | None] = {}
    for names, scale in ((times, "times"), (rates, "rates")):
        for k, v in names.items():
            lo, hi = (None, None) if band is None or v is None else getattr(band, scale)(v)
            out[f"{k}_low"], out[f"{k}_high"] = lo, hi
    return out


# ------------------------------------------------------------------------------------------ decode
def decode_band(hw: Any, model: Any, r: Any) -> dict:
    """Band fields of a decode step (`decode.DecodeResult`): tpot_s, step_s `_low` / `_high`, the tokens/s
    (replica, per GPU, per node) `_low` / `_high`, and `band` (its checks). The whole step is scaled: the checks
    timed one rank's compute, so the step's collectives are in the band only through this scaling."""
    from k3sim.configs.bands import step_band

    band = step_band(hw, "decode", model if isinstance(model, str) else model.name)
    out: dict = figure_fields(band, {"tpot_s": r.tpot_s, "step_s": r.step_s},
                              {"tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                               "tokens_per_s_per_node": r.tokens_per_s_per_node})
    out["band"] = None if band is None else band.to_json()
    return out


# ------------------------------------------------------------------------------------------ training
def training_caveat(options: dict, model: Any = None) -> str:
    """What a training step prices that the training checks (bf16, the calibrated unfused MoE glue, one GPU's
    compute) did not run: FP8 GEMMs, the fused permute path; empty when nothing."""
    from k3sim.errors import InputError
    from k3sim.step.glue import resolve_mode

    out = []
    if options.get("precision", "bf16") != "bf16":
        out.append(f"{options['precision']} GEMMs")
    try:
        mode = resolve_mode(options.get("moe_glue", "calibrated"), model)
    except (ValueError, InputError):  # 'auto' without a model, or a mode this reader does not know: said as given
        mode = str(options.get("moe_glue"))
    if mode != "calibrated":
        out.append(f"the {mode} MoE glue")
    return ("the checks ran bf16 with the calibrated unfused glue on one GPU; not in them: " + ", ".join(out)
            if out else "")


def training_band(hw: Any, model: Any, t: Any) -> dict:
    """Band fields of a training step (`TrainStepResult`): step_time_s, tokens_per_s, tokens_per_s_per_gpu, mfu,
    hfu `_low` / `_high` and `step_band` (the band's checks in words and numbers, and `not_checked`: what the
    step prices that the checks did not run). `model`: the ModelConfig (or its name: then an `auto` MoE glue is
    named as given). The whole step is scaled: the checks timed one GPU's compute, and the step's communication,
    bubble and optimizer are scaled with it."""
    from k3sim.configs.bands import step_band

    name = model if isinstance(model, str) else model.name
    band = step_band(hw, "train", name)
    out: dict = figure_fields(band, {"step_time_s": t.step_time_s},
                              {"tokens_per_s": t.tokens_per_s, "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
                               "mfu": t.mfu, "hfu": t.hfu})
    caveat = training_caveat(getattr(t, "options", {}) or {}, None if isinstance(model, str) else model)
    out["step_band"] = None if band is None else {**band.to_json(), "not_checked": caveat}
    return out


def plan_training_band(res: Any) -> dict:
    """`training_band` of a plan's training step (`planner.plan.PlanResult`), its model read from the plan's model
    file (the loaders' disk cache) so an `auto` MoE glue is resolved as the step resolved it."""
    from k3sim.configs import load_model
    from k3sim.errors import InputError

    try:
        model = load_model(res.model_path) if res.model_path else res.model
    except (InputError, OSError):
        model = res.model
    return training_band(res.hw, model, res.training)


# ------------------------------------------------------------------------------------------ serving
class ScaledStep:
    """A pool's step function with every step scaled by its kind's band factor: `decode` for a step without a
    prefill chunk, `prefill` for a step with one. Keeps the attention-DP split (`local` / `expert`, `q`, `group`,
    read by `serving.dp.GroupClock`) so a DP replica's lockstep clock is scaled the same way."""

    def __init__(self, fn: Callable, decode: float, prefill: float):
        self.fn, self.decode, self.prefill = fn, decode, prefill
        if getattr(fn, "expert", None) is not None:
            self.local = ScaledStep(fn.local, decode, prefill)
            self.expert = lambda has_prefill, tokens, most: fn.expert(has_prefill, tokens, most) * (
                prefill if has_prefill else decode)
            self.q, self.group = getattr(fn, "q", 1), getattr(fn, "group", 1)

    def __call__(self, num_decode: int, context_sum: int, prefill: tuple = ()) -> float:
        return self.fn(num_decode, context_sum, prefill) * (self.prefill if prefill else self.decode)

    def __getattr__(self, name: str):  # anything else the engine reads (`evaluations`): the step function's own
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)


def serve_bands(setup: Any) -> tuple[Any, Any]:
    """(decode band, mixed-prefill band) of a serving setup's model on its profile."""
    from k3sim.configs.bands import step_band

    return step_band(setup.hw, "decode", setup.model.name), step_band(setup.hw, "prefill", setup.model.name)


def end_factors(setup: Any, end: str) -> tuple[float, float]:
    """(decode factor, prefill factor) of one end ("fast": the low factors, "slow": the high ones); 1 without a band."""
    factors = []
    for band in serve_bands(setup):
        factors.append(1.0 if band is None else (band.low_factor if end == "fast" else band.high_factor))
    return factors[0], factors[1]


def simulate_end(setup: Any, requests: list, end: str) -> dict:
    """The serving summary of `requests` with every pool's steps scaled to the band's `end`."""
    from k3sim.serving.run import _step_fn, simulate

    d, p = end_factors(setup, end)
    return simulate(setup, requests, step_seconds=lambda i: ScaledStep(_step_fn(setup, setup.pools[i]), d, p)).summary


def band_end_task(args: tuple) -> tuple[int, str, dict | str]:
    """One end of one search row through the DES (top-level: picklable): (index, end, row figures or error)."""
    from k3sim.errors import InputError
    from k3sim.planner import serve_search as S

    path, p, end, n, slo_ttft_s, slo_tpot_s, percentile, traffic = args
    traffic = traffic or S._TRAFFIC["traffic"]
    try:
        setup = S.setup_of(path, p, slo_ttft_s, slo_tpot_s)
        s = simulate_end(setup, list(traffic.requests[:n]), end)
        return p["index"], end, S._row(p, s, setup.gpus, percentile, slo_ttft_s, slo_tpot_s)
    except (InputError, ValueError, ArithmeticError, KeyError, RuntimeError) as err:
        return p["index"], end, f"{type(err).__name__}: {err}"


def merge_ends(row: dict, ends: dict[str, dict | str], bands: tuple[Any, Any]) -> dict:
    """The row with `{figure}_low` / `_high` (min / max over the point and both ends), `meets_slo_slow_end`
    and `band` (which checks each step kind's factor comes from); `band_error` if an end failed."""
    out = dict(row)
    failed = {e: v for e, v in ends.items() if isinstance(v, str)}
    runs = [row] + [v for v in ends.values() if isinstance(v, dict)]
    for k in SERVE_FIGURES:
        vals = [r[k] for r in runs]
        out[f"{k}_low"], out[f"{k}_high"] = (None, None) if failed else (min(vals), max(vals))
    out["meets_slo_slow_end"] = None if failed else ends["slow"]["meets_slo"]
    out["band"] = {kind: (None if b is None else b.to_json()) for kind, b in zip(("decode", "prefill"), bands)}
    if failed:
        out["band_error"] = "; ".join(f"{e} end: {v}" for e, v in failed.items())
    return out


def with_bands(path: str, rows: list[dict], traffic: Any, slos: tuple, *, n: int | None = None, workers: int = 1,
               scheduler: str | None = None, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """The search rows (its finalists, which ran the first `n` requests of `traffic`: all of it by default) with
    their figures' bands: each row's DES run again at both ends of its model's decode and mixed-prefill bands on
    the same requests, locally or on Dask like the search."""
    from k3sim.planner import serve_search as S
    from k3sim.planner.sweep import map_tasks

    if not rows:
        return rows
    S._TRAFFIC["traffic"] = traffic
    ship = traffic if scheduler else None
    n = len(traffic.requests) if n is None else n
    tasks = [(path, S._dims(r), end, n, *slos, ship) for r in rows for end in ENDS]
    done: dict[int, dict] = {}
    for index, end, res in map_tasks(band_end_task, tasks, workers=workers, scheduler=scheduler, progress=progress):
        done.setdefault(index, {})[end] = res
    out = []
    for r in rows:
        setup = S.setup_of(path, S._dims(r), slos[0], slos[1])
        out.append(merge_ends(r, done[r["index"]], serve_bands(setup)))
    return out
