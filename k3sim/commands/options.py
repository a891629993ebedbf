"""The one check, per command, that every option the user wrote changes the result (issue 19).

An option that has no effect in the chosen mode or combination (`serve --arrival-cv` without
`--arrival gamma`, a training sweep's `--max-batch`, `pipeline --tp` under `--uniform-costs` with a given
encoder cost) is refused with the reason and the fix, never ignored. Each command declares its rules in a
table below (`SERVE`, `SWEEP`, `PIPELINE`, `PLAN`, `CP`, `DECODE`, `PREFIX_CACHE`) and calls
`check(RULES, facts)` once, before any work; nothing else in a command decides whether an option has an effect.

A rule is built by one of:
- `requires(option, other, value=None)`: `option` has an effect only with `other` given (set to `value`);
- `requires_any(option, *others)`: only with one of `others` given;
- `only_in_mode(options, mode)`: only when the scenario's `workload.mode` is `mode`;
- `not_with(option, other)`: not together with `other`, which overrides it;
- `only_when(options, predicate, why, fix)`: only when `predicate(facts)` holds (anything else).

What the user wrote comes from click's parameter sources (an option left at its default is not "given"),
so defaults stay visible in `--help`; a flag written in its negative form (`--no-attn-res-cache`) is named so.
Scenario fields follow the same rule in their schemas (`k3sim.configs.parallel.Scenario`,
`k3sim.configs.serving`), which name the field path instead of an option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Union

import typer

from k3sim.errors import InputError

Text = Union[str, Callable[["Facts"], str]]


# ------------------------------------------------------------------------------------------ --set (model what-ifs)
MODEL_SET_HELP = ("model what-if, repeatable: KEY=VALUE set in the model file before it is validated (dotted keys "
                  "of the file: kda.num_heads=48, moe.num_active_experts=6, hidden_size=4096; "
                  "full_attn_layers=every:8 makes every 8th layer full attention and the rest linear; "
                  "docs/commands/diff.md)")


def _install_model_set(ctx, param, value):
    """`--set`'s callback: parse and check the overrides as soon as the option is read (an unknown key is refused
    before any work) and make them the overrides of every model this command loads (`configs.overrides.current`,
    read by `configs.loaders.load_model`), until the command ends. The planner's per-process scenario memos are
    keyed by the overrides in force, so a run never reuses a model loaded under other overrides."""
    if not value:
        return value
    from k3sim.configs import overrides

    overrides.install(overrides.parse(value, option="--set"))
    ctx.call_on_close(overrides.clear)
    return value


# The one `--set` of every command that takes a model (`model_set: list[str] = MODEL_SET` in its signature).
MODEL_SET = typer.Option(None, "--set", metavar="KEY=VALUE", help=MODEL_SET_HELP, callback=_install_model_set)


@dataclass
class Facts:
    """What a rule may look at: the options the user wrote (`given`: primary name -> the form written),
    every option's value (given or default), and facts the command derived (`mode`, the fleet's size...)."""

    given: dict[str, str]
    values: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)

    def has(self, option: str) -> bool:
        return option in self.given

    def value(self, option: str) -> Any:
        return self.values.get(option)

    def __getitem__(self, key: str) -> Any:
        return self.derived[key]


@dataclass(frozen=True)
class Rule:
    """`options` change the result only when `holds(facts)`; otherwise each one given is refused with
    `why` (the cause) and `fix` (what to write instead)."""

    options: tuple[str, ...]
    holds: Callable[[Facts], bool]
    why: Text
    fix: Text


def _text(t: Text, f: Facts) -> str:
    return t(f) if callable(t) else t


def _tuple(options: str | Iterable[str]) -> tuple[str, ...]:
    return (options,) if isinstance(options, str) else tuple(options)


def requires(option: str, other: str, value: Any = None, *, why: Text | None = None,
             fix: Text | None = None) -> Rule:
    """`option` has an effect only with `other` given (and set to `value`, when one is named)."""
    want = other if value is None else f"{other} {value}"

    def holds(f: Facts) -> bool:
        return f.has(other) and (value is None or f.value(other) == value)

    return Rule((option,), holds, why or f"has no effect without {want}", fix or f"add {want} or remove {option}")


def requires_any(option: str, *others: str, why: Text | None = None, fix: Text | None = None) -> Rule:
    """`option` has an effect only with at least one of `others` given."""
    names = " or ".join(others)
    return Rule((option,), lambda f: any(f.has(o) for o in others), why or f"has no effect without {names}",
                fix or f"add {names}, or remove {option}")


def only_in_mode(options: str | Iterable[str], mode: str, *, why: Text | None = None,
                 fix: Text | None = None) -> Rule:
    """`options` have an effect only when the scenario's workload mode is `mode` (facts['mode'])."""
    return Rule(_tuple(options), lambda f: f["mode"] == mode,
                why or (lambda f: f"applies to mode {mode} only and the scenario's workload.mode is {f['mode']}"),
                fix or f"remove it, or give a scenario whose workload.mode is {mode}")


def not_with(option: str, other: str, *, why: Text | None = None, fix: Text | None = None) -> Rule:
    """`option` has no effect when `other` is given (which overrides it)."""
    return Rule((option,), lambda f: not f.has(other), why or f"has no effect with {other}",
                fix or f"remove {option} or {other}")


def only_when(options: str | Iterable[str], predicate: Callable[[Facts], bool], why: Text, fix: Text) -> Rule:
    """`options` have an effect only when `predicate(facts)` holds."""
    return Rule(_tuple(options), predicate, why, fix)


def _current_context() -> Any:
    """The running click context: typer 0.29 runs commands on the click copy it vendors (`typer._click`),
    older releases on click itself; whichever holds one answers."""
    import importlib

    for name in ("typer._click.globals", "click.globals"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        ctx = module.get_current_context(silent=True)
        if ctx is not None:
            return ctx
    raise RuntimeError("options.check needs a running command (or explicit given/values)")


def given_options(ctx: Any = None) -> tuple[dict[str, str], dict[str, Any]]:
    """(given, values) of the running command: `given` maps each option the user wrote (primary name, e.g.
    '--attn-res-cache') to the form written ('--no-attn-res-cache'); `values` maps every option to its value,
    given or default. Duck-typed over click's classes (typer's vendored copy and click differ)."""
    ctx = ctx or _current_context()
    given: dict[str, str] = {}
    values: dict[str, Any] = {}
    for p in ctx.command.params:
        if getattr(p, "param_type_name", None) != "option":
            continue
        primary = p.opts[0]
        v = ctx.params.get(p.name)
        values[primary] = v
        source = ctx.get_parameter_source(p.name)
        if getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT"):
            negative = getattr(p, "is_flag", False) and p.secondary_opts and v is False
            given[primary] = p.secondary_opts[0] if negative else primary
    return given, values


def check(rules: Iterable[Rule], derived: dict[str, Any] | None = None, *, given: dict[str, str] | None = None,
          values: dict[str, Any] | None = None) -> None:
    """Refuse the first option the user wrote that `rules` say has no effect: one InputError line naming the
    option as written, the reason and the fix. `given`/`values` default to the running click command's."""
    if given is None:
        given, ctx_values = given_options()
        values = {**ctx_values, **(values or {})}
    f = Facts(given, values or {}, derived or {})
    for rule in rules:
        for option in rule.options:
            if f.has(option) and not rule.holds(f):
                raise InputError(f"{_text(rule.why, f)}; {_text(rule.fix, f)}", source=f.given[option])


# ------------------------------------------------------------------------------------------ serve
def serve_facts(setup: Any, scenario_path: Any) -> dict[str, Any]:
    """What the serve rules read from the built fleet: engines the router chooses among (the front pool:
    mixed or prefill replicas, times pp engines each with `pp_microbatches`), the deepest pipeline, and
    whether the scenario file itself sets `serving.router_load_cap` (from the setup: the scenario is read once,
    it may be a pipe)."""
    front = setup.pools[0]
    pp = front.parallelism.pp
    engines = pp if setup.serving.engine.pp_microbatches and pp > 1 else 1
    sv = setup.file_serving
    from k3sim.step import StepLayout
    from k3sim.step.layers import dispatches

    return {"front_engines": front.replicas * engines, "max_pp": max(p.parallelism.pp for p in setup.pools),
            "load_cap_set": sv is not None and "router_load_cap" in sv.model_fields_set,
            "ep_all_to_all": any(dispatches(StepLayout.from_parallelism(p.parallelism)) for p in setup.pools),
            "tbo": any(p.parallelism.tbo for p in setup.pools)}


def _front_engines(f: Facts) -> int:
    return f["front_engines"]


def ep_all_to_all_rules(options: tuple[str, ...], none: str, degrees: str) -> list[Rule]:
    """The rules of the options that shape the expert all-to-all (and of --tbo, which overlaps it), for a
    command whose facts say `ep_all_to_all`: it exists when attention-DP ranks meet in experts spread over
    EP ranks (`k3sim.step.layers.dispatches`). `none`: how the command says there is none; `degrees`: what
    its fix asks of --attention-dp / --ep."""
    return [
        only_when(options, lambda f: f["ep_all_to_all"],
                  why=f"shapes the expert-parallel all-to-all and {none} (attention DP 1: every rank holds all "
                      "tokens and the TP all-reduce combines the experts; EP 1: they are local)",
                  fix=f"add --attention-dp N and --ep N ({degrees}), or remove it"),
        only_when("--tbo", lambda f: not f.value("--tbo") or f["ep_all_to_all"],
                  why=f"overlaps one micro-batch's compute with the other's expert-parallel all-to-all and {none}",
                  fix=f"add --attention-dp N and --ep N ({degrees}), or remove --tbo"),
    ]


SERVE: list[Rule] = [
    # A trace serves its own requests: --limit takes its first N; --requests sizes a synthetic workload.
    requires("--requests", "--workload",
             why="sizes a synthetic --workload; a --trace serves its own requests",
             fix="use --limit N to serve the first N requests of the trace, or remove --requests"),
    requires("--limit", "--trace",
             why="takes the first N requests of a --trace; a synthetic --workload is sized by --requests",
             fix="use --requests N instead"),
    requires_any("--arrival", "--arrival-rate", "--sweep-rate",
                 why="draws new arrival times only at a rate; without one the requests keep their own times",
                 fix="add --arrival-rate R (or --sweep-rate), or remove --arrival"),
    requires("--arrival-cv", "--arrival", "gamma",
             why="is the coefficient of variation of gamma gaps; poisson gaps have cv 1",
             fix="add --arrival gamma (with --arrival-rate or --sweep-rate), or remove --arrival-cv"),
    requires("--processes", "--sweep-rate",
             why="sets the workers of a rate sweep; a single run is one simulation in this process",
             fix="add --sweep-rate, or remove --processes"),
    only_when("--seed", lambda f: f.has("--workload") or f.has("--arrival-rate") or f.has("--sweep-rate"),
              why="seeds synthetic workloads and new arrival times; a --trace at its own times draws nothing",
              fix="add --arrival-rate R (or --sweep-rate) to redraw the trace's arrivals, or remove --seed"),
    only_when("--router", lambda f: _front_engines(f) > 1,
              why=lambda f: "chooses among the fleet's replicas and the fleet has one (no choice to make)",
              fix="add replicas (--replicas N, or serving.replicas), or remove --router"),
    only_when("--router", lambda f: f.value("--router") == "prefix-aware" or not f["load_cap_set"],
              why=lambda f: f"--router {f.value('--router')} ignores the scenario's serving.router_load_cap "
                            "(the prefix-aware router's balance threshold)",
              fix="use --router prefix-aware, or remove serving.router_load_cap from the scenario"),
    only_when("--pp-microbatches", lambda f: f["max_pp"] > 1,
              why="keeps pp batches in flight per replica and every replica of this fleet has pp=1",
              fix="remove it, or serve a layout with parallelism.pp > 1"),
    *ep_all_to_all_rules(("--ep-kernel", "--dispatch-dtype", "--max-nodes-per-token"),
                         "no replica of this fleet runs one", "N > 1, or parallelism.dp / ep"),
    only_when("--tbo-variant", lambda f: f["tbo"],
              why="chooses the two-batch-overlap schedule and the fleet runs without two-batch overlap",
              fix="add --tbo (or parallelism.tbo: true), or remove --tbo-variant"),
]


# ------------------------------------------------------------------------------------------ sweep
TRAIN_SWEEP_OPTIONS = ("--tp", "--pp", "--virtual", "--ep", "--cp", "--dp", "--micro-batches", "--global-batch")
SERVE_SWEEP_OPTIONS = ("--max-batch", "--prefill-replicas", "--requests")

SWEEP: list[Rule] = [
    only_in_mode(TRAIN_SWEEP_OPTIONS, "train",
                 why="is a layout dimension of a training sweep; a serving sweep varies the batch limit and the "
                     "P:D split of the scenario's own layout",
                 fix="remove it (a serving sweep takes --max-batch and --prefill-replicas), or sweep a train "
                     "scenario"),
    only_in_mode(SERVE_SWEEP_OPTIONS, "serve",
                 why="applies to serving sweeps only and the scenario's workload.mode is train",
                 fix="remove it (a training sweep takes --tp --pp --virtual --ep --cp --dp --micro-batches "
                     "--global-batch), or sweep a serve scenario"),
    not_with("--set", "--scheduler",
             why="changes the model in this process and its forked workers, and with --scheduler a Dask "
                 "cluster's workers load the scenario's model from its file",
             fix="write the what-if into a model file the scenario names, or run locally (--workers N)"),
    only_when("--chunk-size", lambda f: f["parallel"],
              why="splits the points over workers and this sweep runs them one by one in this process",
              fix="add --workers N (N > 1) or --scheduler, or remove --chunk-size"),
]


# ------------------------------------------------------------------------------------------ pipeline
# Options read only to derive stage costs or the encoder from the model.
MODEL_OPTIONS = ("--model", "--set", "--hardware", "--tp", "--ep", "--cp", "--microbatch-tokens", "--seq-len",
                 "--attn-res-cache")
ENCODER_SAMPLER_OPTIONS = ("--encoder-cp", "--images-per-microbatch", "--seed")


def _model_unused(f: Facts) -> str:
    if f.value("--encoder-policy") == "none":
        return "--uniform-costs sets the stage costs and --encoder-policy none runs no encoder, so no model is read"
    return "--uniform-costs sets the stage costs and --encoder-cost the encoder's, so no model is read"


def _sampler_unused(f: Facts) -> str:
    if f.value("--encoder-policy") == "none":
        return "drives the model's ViT image sampler and --encoder-policy none runs no encoder"
    return "drives the model's ViT image sampler and --encoder-cost sets the encoder's cost instead"


PIPELINE: list[Rule] = [
    only_when(MODEL_OPTIONS, lambda f: f["model_used"], why=_model_unused,
              fix="remove it, or drop --uniform-costs (stage costs from the model)"),
    only_when("--encoder-cost", lambda f: f.value("--encoder-policy") != "none",
              why="is the encoder's cost and --encoder-policy none runs no encoder",
              fix="choose --encoder-policy serial | decoupled | bubble, or remove --encoder-cost"),
    only_when(ENCODER_SAMPLER_OPTIONS, lambda f: f["encoder_from_model"], why=_sampler_unused,
              fix=lambda f: "remove it, or choose --encoder-policy serial | decoupled | bubble"
              if f.value("--encoder-policy") == "none" else "remove it, or remove --encoder-cost"),
    only_when("--encoder-upfront", lambda f: f.value("--encoder-policy") == "bubble",
              why=lambda f: "counts the encodes run before the bubble placement; --encoder-policy "
                            f"{f.value('--encoder-policy')} does not place encodes in bubbles",
              fix="use --encoder-policy bubble, or remove --encoder-upfront"),
]


# ------------------------------------------------------------------------------------------ plan
BUDGET_OPTIONS = ("--tokens", "--days", "--max-gpus")


def _budget_has(f: Facts, what: str) -> bool:
    """The token budget's `what` ("tokens" or "days") is given: the option, or the scenario's training.<what>."""
    return f.has(f"--{what}") or f[f"scenario_{what}"]


PLAN: list[Rule] = [
    only_in_mode("--serving-requests", "serve",
                 why="sizes the serving simulation, which a training scenario does not run",
                 fix="remove it, or plan a serve scenario"),
    only_in_mode(BUDGET_OPTIONS, "train",
                 why=lambda f: "sizes a training cluster for a token budget and the scenario's workload.mode is "
                               f"{f['mode']} (nothing is trained)",
                 fix="remove it, or plan a train scenario"),
    only_when("--days", lambda f: _budget_has(f, "tokens"),
              why="is the wall-clock time of a token budget and no token count is given",
              fix="add --tokens N (or training.tokens in the scenario), or remove --days"),
    only_when("--tokens", lambda f: _budget_has(f, "days"),
              why="is a token budget and no wall-clock time is given to train it in",
              fix="add --days D (or training.days in the scenario), or remove --tokens"),
    only_when("--max-gpus", lambda f: _budget_has(f, "tokens") and _budget_has(f, "days"),
              why="caps the clusters a token budget's sweep tries and no token budget is given",
              fix="add --tokens N --days D (or training.tokens / training.days), or remove --max-gpus"),
]


# ------------------------------------------------------------------------------------------ cp, decode
CP: list[Rule] = [
    requires("--seq-lens", "--sweep", why="lists the sweep's lengths; without --sweep one --seq-len is run",
             fix="add --sweep, or give the length with --seq-len"),
    requires("--cps", "--sweep", why="lists the sweep's CP degrees; without --sweep one --cp is run",
             fix="add --sweep, or give the degree with --cp"),
    requires("--seed", "--doc-mean-tokens", why="seeds the sampled document lengths of --doc-mean-tokens",
             fix="add --doc-mean-tokens MEAN, or remove --seed"),
]


def _zero_shards(f: Facts) -> bool:
    """ZeRO shards over the data-parallel group (dp x cp for dense weights, tp x cp x dp / ep for experts:
    memory/plan.py); with one rank in both there is nothing to shard."""
    if f.value("--zero-stage") not in (0, 1, 2, 3) or f.value("--mode") != "train":
        return True  # not a stage at all, or a serve plan: the schema's range and mode checks say so
    tp, cp, dp, ep = (f.value(o) or 1 for o in ("--tp", "--cp", "--dp", "--ep"))
    return dp * cp > 1 or tp * cp * dp // ep > 1


MEMORY: list[Rule] = [
    only_when("--zero-stage", _zero_shards,
              why="shards optimizer state, gradients or weights over data-parallel ranks, and this layout has one",
              fix="raise --dp (or --cp), or remove --zero-stage"),
]


EP_ALL_TO_ALL_OPTIONS = ("--ep-kernel", "--dispatch-dtype")

DECODE: list[Rule] = [
    not_with("--batch", "--sweep-batch", why="is the batch of one decode step; --sweep-batch runs its own batches",
             fix="remove --batch, or remove --sweep-batch"),
    only_when(("--acceptance", "--rollback"), lambda f: (f.value("--mtp") or 0) > 0,
              why="needs --mtp N >= 1 (no draft tokens to verify or roll back)",
              fix="add --mtp N, or remove it"),
    only_when("--rollback", lambda f: f["recurrent_layers"] > 0,
              why=lambda f: f"rolls back recurrent state (KDA, GDN, Mamba2, Mamba, lightning) and {f['model']} has "
                            "no recurrent layers (attention layers truncate their KV cache on a rejected draft, at "
                            "no cost)",
              fix="remove --rollback"),
    *ep_all_to_all_rules(EP_ALL_TO_ALL_OPTIONS, "this layout runs none", "N > 1"),
    only_when("--max-nodes-per-token", lambda f: f["ep_nodes"] > 1,
              why=lambda f: f"limits the nodes a token's experts lie on and --ep {f['ep']} spans one node of "
                            f"{f['gpus_per_node']} GPUs",
              fix=lambda f: f"raise --ep above {f['gpus_per_node']} (with --attention-dp), or remove it"),
    requires("--tbo-variant", "--tbo", why="chooses the two-batch-overlap schedule", fix="add --tbo, or remove it"),
    only_when("--mla-kernel", lambda f: f["mla_layers"] > 0,
              why=lambda f: f"chooses the MLA decode kernel and {f['model']} has no MLA layers",
              fix="remove --mla-kernel"),
    only_when("--redundant-experts", lambda f: f["moe"] and f["ep"] > 1,
              why=lambda f: "adds expert copies to balance load over EP ranks and " + (
                  f"{f['model']} has no routed experts" if not f["moe"] else "--ep 1 holds every expert on one rank"),
              fix="raise --ep, or remove --redundant-experts"),
]

# The EP all-to-all's options of `k3sim prefill` (its chunks' tokens meet in experts spread over EP ranks only with
# attention DP, as decode's).
PREFILL: list[Rule] = [*ep_all_to_all_rules(EP_ALL_TO_ALL_OPTIONS, "this layout runs none", "N > 1")]

PREFIX_CACHE_SWEEP_OPTIONS = ("--policies", "--hash-blocks", "--physical-blocks", "--capacities")

PREFIX_CACHE: list[Rule] = [
    *[requires(o, "--sweep", why="is a dimension of the sweep; without --sweep one configuration is replayed",
               fix=f"add --sweep, or set the one configuration (--policy, --hash-block, --physical-block, "
                   f"--capacity-bytes) and remove {o}") for o in PREFIX_CACHE_SWEEP_OPTIONS],
    requires("--processes", "--sweep", why="sets the sweep's workers; one configuration replays in this process",
             fix="add --sweep, or remove --processes"),
    requires("--seed", "--workload", why="seeds a synthetic --workload; a --trace is replayed as recorded",
             fix="remove --seed, or replay a synthetic --workload"),
    requires("--strict", "--trace", why="stops at a trace's first malformed line; a synthetic --workload has none",
             fix="remove --strict"),
    only_when("--step-scenario", lambda f: not (f.has("--tokens-per-s") and f.has("--step-overhead-s"))
              or f.has("--host-pool-bytes") or f.has("--ssd-pool-bytes"),
              why="prices steps with the scenario's step model and --tokens-per-s with --step-overhead-s set the "
                  "step clock instead (an offload tier would still read its hardware's host link)",
              fix="remove --step-scenario, or one of --tokens-per-s / --step-overhead-s"),
]

