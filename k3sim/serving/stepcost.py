"""Engine step times from `k3sim.step.StepCostModel`, fast enough for a simulator that takes millions of steps.

One evaluation of the step model walks every kernel of every layer (~10-30 ms in Python); a serving run asks
for tens of thousands of distinct (decodes, context, prefill chunks) combinations. `SeparableStepCost` splits
the same model's step into parts that each depend on few variables, evaluates each part with the step model's
own calls and timer, and interpolates only the smooth ones:

    t(step) = base(M tokens, nd decodes) + sum over chunks chunk(c, p) + nd x decode-attention(nd, context)

- chunk(c, p): the per-chunk kernels (MLA latent expansion over prefix + chunk, MLA causal attention of the
  chunk against prefix + chunk, chunk_kda from the cached state), every layer, timed exactly (memo on c and
  the bucketed prefix);
- decode attention: the MLA decode attention over the KV of each sequence, timed exactly at a context grid
  (`GRID_PER_OCTAVE` points per octave) and interpolated linearly (its bytes are linear in the context);
- base: everything else (projections, experts, norms, communication, LM head, KDA recurrent step): it depends
  on the step's token count M and, through the decode-only kernels, on nd. base(M, nd) =
  base_prefill(M) + base_decode(nd) - base_prefill(nd), each a 1-D table of exact step-model evaluations
  (minus their chunk / decode-attention parts) on a grid exact to `GRID_EXACT` and `GRID_PER_OCTAVE` points
  per octave above, interpolated linearly. The additive split is exact for kernels that depend on M alone or nd alone;
  `tests/serving/test_stepcost.py` bounds the error against the full step model.
"""

from __future__ import annotations

import math

from k3sim.serving.engine import bucket

PER_CHUNK = ("mla_kv_b_expand", "mla_prefill_attention", "kda_chunk_prefill")
DECODE_CONTEXT = ("mla_decode_attention",)
GRID_EXACT = 16  # modelling choice: below this, every integer is a grid point
GRID_PER_OCTAVE = 8  # modelling choice: 9 % spacing; the base parts are smooth in token count
# single kernels are less smooth (tile quantisation, measured points): a finer grid for GridKernelTime
KERNEL_GRID_PER_OCTAVE = 32  # modelling choice: 2.2 % spacing
REF_CONTEXT = 4096  # the decode context of base_decode's reference batches (any value: its attention is removed)


def _grid_points(x: float, per_octave: int = GRID_PER_OCTAVE) -> tuple[int, int]:
    """The grid points around x (equal when x is one)."""
    if x <= GRID_EXACT:
        return int(math.floor(x)), int(math.ceil(x))
    k = math.log2(x) * per_octave
    lo, hi = round(2 ** (math.floor(k) / per_octave)), round(2 ** (math.ceil(k) / per_octave))
    return lo, hi


VARYING = ("M", "T", "B", "C", "bytes")  # the token- or size-like parameters of the registered ops


class GridKernelTime:
    """`kernel_time` on a grid: each token-like parameter (`VARYING`) is taken at the grid points around it and
    the predictions are interpolated linearly (multilinearly if several vary); the shape parameters (widths,
    heads, experts, GPUs) stay exact. A run then asks the predictor about a few hundred shapes, not one per
    distinct token count."""

    def __init__(self, kernel_time=None):
        if kernel_time is None:
            from k3sim.predict import predict_kernel_time as kernel_time
        self.kernel_time = kernel_time
        self.memo: dict[tuple, tuple[float, str]] = {}
        self.predictions = 0

    def _exact(self, op: str, params: dict, hardware) -> tuple[float, str]:
        key = (op, *sorted(params.items()))
        v = self.memo.get(key)
        if v is None:
            kt = self.kernel_time(op, params, hardware=hardware)
            self.predictions += 1
            v = self.memo[key] = (float(kt.seconds), str(kt.source))
        return v

    def __call__(self, op: str, params, hardware=None):
        params = dict(params)
        axes = []
        for name in VARYING:
            v = params.get(name)
            if isinstance(v, int) and v > GRID_EXACT:
                lo, hi = _grid_points(v, KERNEL_GRID_PER_OCTAVE)
                if lo != hi:
                    axes.append((name, lo, hi, (v - lo) / (hi - lo)))
        if not axes:
            s, src = self._exact(op, params, hardware)
            return _KT(s, src)
        total, source = 0.0, ""
        for corner in range(1 << len(axes)):
            w = 1.0
            p = dict(params)
            for i, (name, lo, hi, f) in enumerate(axes):
                if corner >> i & 1:
                    p[name], w = hi, w * f
                else:
                    p[name], w = lo, w * (1 - f)
            s, source = self._exact(op, p, hardware)
            total += w * s
        return _KT(total, f"{source} (grid-interpolated)")


class _KT:
    __slots__ = ("seconds", "source")

    def __init__(self, seconds: float, source: str):
        self.seconds, self.source = seconds, source


class _Table:
    """f on the grid, exact evaluations memoised, linear interpolation in between."""

    def __init__(self, f):
        self.f = f
        self.memo: dict[int, float] = {}

    def at(self, x: int) -> float:
        v = self.memo.get(x)
        if v is None:
            v = self.memo[x] = self.f(x)
        return v

    def __call__(self, x: float) -> float:
        lo, hi = _grid_points(x)
        if lo == hi:
            return self.at(lo)
        a, b = self.at(lo), self.at(hi)
        return a + (b - a) * (x - lo) / (hi - lo)


class SeparableStepCost:
    """step_seconds(num_decode, decode_context_sum, prefill) from a `StepCostModel` (see module docstring)."""

    def __init__(self, scm):
        self.scm = scm
        self.model, self.layout, self.timer = scm.model, scm.layout, scm.timer
        self._chunk: dict[tuple[int, int], float] = {}
        self._dec: dict[tuple[int, int], float] = {}
        self.base_prefill = _Table(self._base_prefill_exact)
        self.base_decode = _Table(self._base_decode_exact)
        self.evaluations = 0

    # ----------------------------------------------------------------- parts from the step model's own calls
    def _parts(self, batch, names: tuple[str, ...]) -> float:
        from k3sim.step.layers import kda_calls, mla_calls

        m, total = self.model, 0.0
        if m.mla is not None and m.num_mla_layers:
            total += m.num_mla_layers * sum(self.timer.row(c, 0).seconds for c in mla_calls(m, self.layout, batch)
                                            if c.component in names and not c.hidden)
        if m.kda is not None and m.num_kda_layers:
            total += m.num_kda_layers * sum(self.timer.row(c, 0).seconds for c in kda_calls(m, self.layout, batch)
                                            if c.component in names and not c.hidden)
        return total

    def chunk(self, c: int, p: int) -> float:
        """Per-chunk kernels of a prefill chunk of c tokens after p cached tokens, all layers (s)."""
        key = (c, p)
        v = self._chunk.get(key)
        if v is None:
            from k3sim.step.batch import Batch

            v = self._chunk[key] = self._parts(Batch(prefill=((c, p),)), PER_CHUNK)
        return v

    def _dec_exact(self, nd: int, ctx: int) -> float:
        key = (nd, ctx)
        v = self._dec.get(key)
        if v is None:
            from k3sim.step.batch import Batch

            v = self._dec[key] = self._parts(Batch(decode_contexts=(ctx,) * nd), DECODE_CONTEXT)
        return v

    def decode_attention(self, nd: int, ctx: float) -> float:
        """MLA decode attention of nd sequences at mean context ctx, all layers (s)."""
        lo, hi = _grid_points(max(ctx, 1.0))
        a = self._dec_exact(nd, lo)
        if lo == hi:
            return a
        return a + (self._dec_exact(nd, hi) - a) * (ctx - lo) / (hi - lo)

    def _base_prefill_exact(self, M: int) -> float:
        self.evaluations += 1
        return self.scm.step_seconds(0, 0, ((M, 0),)) - self.chunk(M, 0)

    def _base_decode_exact(self, nd: int) -> float:
        self.evaluations += 1
        return self.scm.step_seconds(nd, nd * REF_CONTEXT) - self._dec_exact(nd, REF_CONTEXT)

    # ----------------------------------------------------------------- the step
    def __call__(self, num_decode: int, decode_context_sum: float, prefill: tuple = ()) -> float:
        t = 0.0
        if prefill:
            M = num_decode
            for c, p in prefill:
                M += c
                t += self.chunk(c, bucket(p) if p else 0)
            t += self.base_prefill(M)
            if num_decode:
                t += self.base_decode(num_decode) - self.base_prefill(num_decode)
        elif num_decode:
            t += self.base_decode(num_decode)
        else:
            return 0.0
        if num_decode:
            t += self.decode_attention(num_decode, decode_context_sum / num_decode)
        return t


def step_seconds_for(model, hw, par, *, gpus_per_node: int = 8, kernel_time=None, fast: bool = True):
    """The step-time function of a replica with layout `par` (a `configs.Parallelism`): the separable fast
    path over the step model, or (fast=False) the step model itself."""
    from k3sim.step import StepCostModel, StepLayout

    layout = StepLayout(tp=par.tp, pp=par.pp, ep=par.ep, attention_dp=par.dp, gpus_per_node=gpus_per_node)
    if fast:
        return SeparableStepCost(StepCostModel(model, hw, layout, kernel_time=GridKernelTime(kernel_time)))
    scm = StepCostModel(model, hw, layout, kernel_time=kernel_time)
    return lambda nd, cs, pf: scm.step_seconds(num_decode=nd, decode_context_sum=cs, prefill=pf)
