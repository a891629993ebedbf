"""Engine step times from `k3sim.step.StepCostModel`, fast enough for a simulator that takes millions of steps.

One evaluation of the step model walks every kernel of every layer (~10-30 ms in Python); a serving run asks
for tens of thousands of distinct (decodes, context, prefill chunks) combinations. `SeparableStepCost` splits
the same model's step into parts that each depend on few variables, evaluates each part with the step model's
own calls and timer, and interpolates only the smooth ones:

    t(step) = base(M tokens, nd decodes) + sum over chunks chunk(c, p) + nd x decode-attention(nd, context)

- chunk(c, p): the per-chunk kernels (`step.layers.PER_CHUNK`: MLA latent expansion over prefix + chunk, MLA and
  GQA causal attention of the chunk against prefix + chunk, every recurrent kind's chunked kernel from the cached
  state), every layer, timed exactly (memo on c and the bucketed prefix);
- decode attention: the MLA and GQA decode attention over the KV of each sequence (`step.layers.DECODE_CONTEXT`;
  a sliding window caps it), timed exactly at a context grid (`GRID_PER_OCTAVE` points per octave) and
  interpolated linearly (its bytes are linear in the context);
- base: everything else (projections, experts, norms, communication, LM head, recurrent steps): it depends
  on the step's token count M and, through the decode-only kernels, on nd. base(M, nd) =
  base_prefill(M) + base_decode(nd) - base_prefill(nd), each a 1-D table of exact step-model evaluations
  (minus their chunk / decode-attention parts) on a grid exact to `GRID_EXACT` and `GRID_PER_OCTAVE` points
  per octave above, interpolated linearly. The additive split is exact for kernels that depend on M alone or nd alone;
  `tests/serving/test_stepcost.py` bounds the error against the full step model.

MTP (`tokens_per_decode` q = 1 + drafts): every part is evaluated with decodes feeding q tokens (M counts nd x q),
and the draft passes (`k3sim.decode.model.mtp_draft_seconds`) are one more part, exact on the decode-attention
context grid and linear in between.

Attention data parallelism (`DPStepCost`, layouts with attention_dp > 1): the `dp` ranks each run their own
batch and meet at every MoE layer, so a step of the replica is

    t = max over ranks of local(rank's batch) + routed(sum of the ranks' tokens) + dispatch(busiest rank's tokens)

- local: the separable form above over the rank-local components only (every component but the expert side,
  `EXPERT_SIDE`), its base tables being exact step-model evaluations minus their expert-side rows;
- routed: the routed-expert components of one MoE layer at the total tokens T of the ranks that share an EP
  group (`step.layers.ep_group_tokens`: all dp ranks when EP spans them), the calls the step model makes for a
  rank batch whose group holds T, made for T directly so that every total is exact, times the MoE layers
  (ranks in several EP groups: the slowest group's);
- dispatch: the all-to-all components (dispatch and combine) of the step model at a rank batch of the busiest
  rank's tokens (dispatch sends each rank's own tokens; the slowest rank holds the others at the combine).
Both expert-side parts have a decode-only form (low-latency kernels) and a form with prefill (normal kernels):
the ranks run one kernel family per step, the one with prefill when any rank prefills (SGLang's DeepEP `auto`
mode syncs the forward mode across DP ranks). At uniform load (every rank the same batch) the three parts
add up to the step model's own answer for that rank batch: the parts come from the same calls. Under two-batch
overlap (layout.tbo) the all-to-all hides behind the other micro-batch, attention included, so the expert side is
the step model's expert-side rows at the busiest rank's batch (`DPStepCost.expert`).
"""

from __future__ import annotations

import dataclasses
import math

from k3sim.serving.engine import bucket
from k3sim.step.layers import DECODE_CONTEXT, EXPERT_SIDE, PER_CHUNK  # noqa: F401 - the parts' names, re-exported
GRID_EXACT = 16  # modelling choice: below this, every integer is a grid point
GRID_PER_OCTAVE = 8  # modelling choice: 9 % spacing; the base parts are smooth in token count
# single kernels are less smooth (tile quantisation, measured points): a finer grid for GridKernelTime
KERNEL_GRID_PER_OCTAVE = 32  # modelling choice: 2.2 % spacing
REF_CONTEXT = 4096  # the decode context of base_decode's reference batches (any value: its attention is removed)
# the expert side of a MoE layer (`step.layers.EXPERT_SIDE`, component-name prefixes): what the attention-DP
# ranks share each step; ROUTED (the expert GEMMs) and DISPATCH (the all-to-all) split it.
ROUTED = tuple(p for p in EXPERT_SIDE if p.startswith("routed"))
DISPATCH = tuple(p for p in EXPERT_SIDE if not p.startswith("routed"))


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
    heads, experts, GPUs) stay exact, an attention window too unless it is full (window = T: it moves with T) or
    a grid point of T falls below it (then it is T's: a query sees at most the T keys there are). A run then asks
    the predictor about a few hundred shapes, not one per distinct token count."""

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
            if "window" in p:  # attention's window (gqa_prefill_fwd): follows T where full, never past it
                p["window"] = p["T"] if params["window"] >= params["T"] else min(params["window"], p["T"])
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
    """step_seconds(num_decode, decode_context_sum, prefill) from a `StepCostModel` (see module docstring).

    tokens_per_decode: the tokens each decoding sequence feeds a step (1 + MTP drafts); draft: None, or
    (num_decode, mean context) -> seconds of the step's MTP draft passes."""

    def __init__(self, scm, *, tokens_per_decode: int = 1, draft=None):
        self.scm = scm
        self.model, self.layout, self.timer = scm.model, scm.layout, scm.timer
        self.q = tokens_per_decode
        self.draft = draft
        self._chunk: dict[tuple[int, int], float] = {}
        self._dec: dict[tuple[int, int], float] = {}
        self._drafts: dict[tuple[int, int], float] = {}
        self.base_prefill = _Table(self._base_prefill_exact)
        self.base_decode = _Table(self._base_decode_exact)
        self.evaluations = 0

    # ----------------------------------------------------------------- parts from the step model's own calls
    def _parts(self, batch, names: tuple[str, ...]) -> float:
        """Seconds of the components `names` over every layer: per mixer kind, its body's calls of those names
        (`step.layers.kind_calls`: a kind's calls do not depend on the layer or on a parallel mixer beside it)
        times the layers holding the kind, parallel mixers included."""
        from k3sim.step.layers import kind_calls

        m, total = self.model, 0.0
        for kind in m.mixer_kinds:
            part = sum(self.timer.row(c, 0).seconds for c in kind_calls(m, kind, self.layout, batch)
                       if c.component in names and not c.hidden)
            total += m.num_layers_with(kind) * part
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

            v = self._dec[key] = self._parts(Batch(decode_contexts=(ctx,) * nd, tokens_per_decode=self.q),
                                             DECODE_CONTEXT)
        return v

    def decode_attention(self, nd: int, ctx: float) -> float:
        """Decode attention (MLA, GQA) of nd sequences at mean context ctx, all layers (s)."""
        lo, hi = _grid_points(max(ctx, 1.0))
        a = self._dec_exact(nd, lo)
        if lo == hi:
            return a
        return a + (self._dec_exact(nd, hi) - a) * (ctx - lo) / (hi - lo)

    def _draft_exact(self, nd: int, ctx: int) -> float:
        key = (nd, ctx)
        v = self._drafts.get(key)
        if v is None:
            v = self._drafts[key] = float(self.draft(nd, ctx))
        return v

    def draft_seconds(self, nd: int, ctx: float) -> float:
        """The MTP draft passes of nd sequences at mean context ctx (s): exact on the context grid, linear in
        between (the draft layer's attention, like the model's, is linear in the context)."""
        lo, hi = _grid_points(max(ctx, 1.0))
        a = self._draft_exact(nd, lo)
        if lo == hi:
            return a
        return a + (self._draft_exact(nd, hi) - a) * (ctx - lo) / (hi - lo)

    def _base_prefill_exact(self, M: int) -> float:
        self.evaluations += 1
        return self.scm.step_seconds(0, 0, ((M, 0),)) - self.chunk(M, 0)

    def _base_decode_exact(self, nd: int) -> float:
        self.evaluations += 1
        return (self.scm.step_seconds(nd, nd * REF_CONTEXT, tokens_per_decode=self.q)
                - self._dec_exact(nd, REF_CONTEXT))

    # ----------------------------------------------------------------- the step
    def __call__(self, num_decode: int, decode_context_sum: float, prefill: tuple = ()) -> float:
        t = 0.0
        if prefill:
            M = num_decode * self.q
            for c, p in prefill:
                M += c
                t += self.chunk(c, bucket(p) if p else 0)
            t += self.base_prefill(M)
            if num_decode:
                t += self.base_decode(num_decode) - self.base_prefill(num_decode * self.q)
        elif num_decode:
            t += self.base_decode(num_decode)
        else:
            return 0.0
        if num_decode:
            ctx = decode_context_sum / num_decode
            t += self.decode_attention(num_decode, ctx)
            if self.draft is not None:
                t += self.draft_seconds(num_decode, ctx)
        return t


class DPStepCost(SeparableStepCost):
    """An attention-DP replica's step from its ranks' batches (module docstring): `local` (one rank's own part),
    `expert` (the expert side its EP group shares), `__call__` (one rank's batch at uniform load: the step
    model's answer). `group`: the ranks whose tokens meet in one EP group's experts (`step.layers.ep_group_tokens`:
    ep / tp of them, at most dp); ranks 0..group-1 form the first group, and so on."""

    def __init__(self, scm, **kw):
        from k3sim.step.batch import Batch
        from k3sim.step.layers import ep_group_tokens

        super().__init__(scm, **kw)
        layout = scm.layout
        self.dp = layout.attention_dp
        self.group = ep_group_tokens(layout, Batch(prefill=((1, 0),)))
        # the routed experts of a group holding T tokens in all, for any T: the same layout with the group's
        # ranks as one (tp = ep: the routing distribution, expert slots and expert TP stay the layout's)
        self.pooled = layout if self.group == 1 else dataclasses.replace(layout, tp=layout.ep)
        if ep_group_tokens(self.pooled, Batch(prefill=((7, 0),))) != 7:
            raise RuntimeError("step.layers.ep_group_tokens no longer sees one rank in the pooled layout: "
                               "serving.stepcost.DPStepCost needs another way to price a group's total tokens")
        self._splits: dict[tuple[int, int], tuple[float, float, float]] = {}
        self.routed_prefill = _Table(lambda T: self._routed_exact(T, decode=False))
        self.routed_decode = _Table(lambda T: self._routed_exact(T, decode=True))
        self.dispatch_prefill = _Table(lambda M: self._split(0, M)[2])
        self.dispatch_decode = _Table(lambda nd: self._split(nd, 0)[2])

    def _split(self, nd: int, M: int) -> tuple[float, float, float]:
        """(step, routed, dispatch) seconds of the step model at a rank batch of nd decodes (reference context)
        or of one M-token chunk, every layer: the step and its expert-side rows."""
        key = (nd, M)
        v = self._splits.get(key)
        if v is None:
            if not nd and not M:
                v = (0.0, 0.0, 0.0)
            else:
                self.evaluations += 1
                res = self.scm.breakdown(nd, nd * REF_CONTEXT, ((M, 0),) if M else (), tokens_per_decode=self.q)
                routed = sum(r.seconds for r in res.rows if r.component.startswith(ROUTED))
                disp = sum(r.seconds for r in res.rows if r.component.startswith(DISPATCH))
                v = (res.seconds, routed, disp)
            self._splits[key] = v
        return v

    def _base_prefill_exact(self, M: int) -> float:
        t, routed, disp = self._split(0, M)
        return t - routed - disp - self.chunk(M, 0)

    def _base_decode_exact(self, nd: int) -> float:
        t, routed, disp = self._split(nd, 0)
        return t - routed - disp - self._dec_exact(nd, REF_CONTEXT)

    def _routed_exact(self, T: int, *, decode: bool) -> float:
        """Routed experts of every MoE layer when an EP group's ranks hold T tokens in all: the calls
        (`step.layers.moe_calls`) of one rank of the pooled layout holding all T."""
        m = self.model
        if T <= 0 or m.moe is None or not m.num_moe_layers:
            return 0.0
        from k3sim.step.batch import Batch
        from k3sim.step.forward import choose_expert_kernel
        from k3sim.step.layers import moe_calls

        b = Batch(decode_contexts=(REF_CONTEXT,) * T) if decode else Batch(prefill=((T, 0),))
        kernel = choose_expert_kernel(m, self.pooled, b, self.timer)
        per_layer = sum(self.timer.row(c, 0).seconds for c in moe_calls(m, self.pooled, b, kernel)
                        if c.component.startswith(ROUTED) and not c.hidden)
        return m.num_moe_layers * per_layer

    def local(self, num_decode: int, decode_context_sum: float, prefill: tuple = ()) -> float:
        """One rank's own part of a step: every component but the expert side (s)."""
        return SeparableStepCost.__call__(self, num_decode, decode_context_sum, prefill)

    def expert(self, prefill: bool, tokens: int, busiest: int) -> float:
        """The expert side of one EP group's step (s): routed experts at the group's `tokens` in all, the
        all-to-all at its `busiest` rank's tokens (prefill: any rank of the replica prefills, normal kernels)
        or decodes (decode-only, low-latency kernels: a rank's tokens are its decodes x q).

        Two-batch overlap hides the all-to-all behind the other micro-batch's work (attention included), so
        the expert side is not a function of the group's tokens alone: it is the step model's expert-side rows
        (routed, and the all-to-all at its exposed seconds) of a rank batch of the busiest rank's size, as if
        every rank carried it: exact at uniform load, an upper bound otherwise."""
        if self.layout.tbo:
            return self._split(0, busiest)[1] + self._split(0, busiest)[2] if prefill else \
                self._split(busiest, 0)[1] + self._split(busiest, 0)[2]
        if prefill:
            return self.routed_prefill(tokens) + self.dispatch_prefill(busiest)
        return self.routed_decode(tokens) + self.dispatch_decode(busiest)

    def __call__(self, num_decode: int, decode_context_sum: float, prefill: tuple = ()) -> float:
        """Every rank with this batch (uniform load): the step model's time of one rank's batch."""
        if not num_decode and not prefill:
            return 0.0
        tokens = num_decode * self.q + sum(c for c, _ in prefill)
        busiest = tokens if prefill else num_decode
        return self.local(num_decode, decode_context_sum, prefill) + self.expert(bool(prefill), self.group * tokens,
                                                                                 busiest)


def step_seconds_for(model, hw, par, *, gpus_per_node: int = 8, kernel_time=None, fast: bool = True,
                     mtp: int = 0):
    """The step-time function of a replica with layout `par` (a `configs.Parallelism`): the separable fast
    path over the step model (`DPStepCost` when par.dp > 1: attention DP), or (fast=False) the step model
    itself at one rank's batch (uniform load; a DP replica given it prices a step as its slowest rank's, with
    no shared expert side: for comparisons only). mtp: draft tokens per decode step (each decode feeds
    1 + mtp tokens; the drafts' passes, `k3sim.decode.model.mtp_draft_seconds`, are added to every step with
    decodes)."""
    from k3sim.step import StepCostModel, StepLayout

    layout = StepLayout.from_parallelism(par, gpus_per_node=gpus_per_node)
    q = 1 + mtp
    if fast:
        scm = StepCostModel(model, hw, layout, kernel_time=GridKernelTime(kernel_time))
        cls = DPStepCost if layout.attention_dp > 1 else SeparableStepCost
        return cls(scm, tokens_per_decode=q, draft=_draft_fn(model, hw, layout, mtp, scm.timer))
    scm = StepCostModel(model, hw, layout, kernel_time=kernel_time)
    draft = _draft_fn(model, hw, layout, mtp, scm.timer)
    if draft is None:
        return lambda nd, cs, pf: scm.step_seconds(num_decode=nd, decode_context_sum=cs, prefill=pf)
    return lambda nd, cs, pf: (scm.step_seconds(num_decode=nd, decode_context_sum=cs, prefill=pf,
                                                tokens_per_decode=q) + (draft(nd, cs / nd) if nd else 0.0))


def _draft_fn(model, hw, layout, mtp: int, timer):
    """(num_decode, mean context) -> seconds of the mtp draft passes, through the decode model's one formula."""
    if not mtp:
        return None
    from k3sim.decode.model import mtp_draft_seconds

    return lambda nd, ctx: mtp_draft_seconds(model, hw, layout, nd, timer=timer, mtp=mtp, context=max(1, int(ctx)))
