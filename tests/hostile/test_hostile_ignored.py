"""No ignored input (issue 19 item 5): an option or scenario field that has no effect in the chosen mode or
combination is refused in one line naming it, with the fix, exit 2, before any computation; the same option
in a valid combination is accepted and changes the result.

Refusals go through each command's rule table (`k3sim.commands.options`) or the scenario schemas; the
positive cases check that the table lets the valid combination through (the same `check` the command calls)
and that the option moves the answer of the model it feeds, on inputs small enough to take milliseconds.
"""

from __future__ import annotations

import json

import pytest

from hostile_helpers import ROOT, assert_one_line, run_main

from k3sim.commands import options
from k3sim.errors import InputError

K3 = "models/kimi-k3.yaml"
CONV = ROOT / "tests/data/traces/conversation_head300.jsonl"
DEFAULT = ROOT / "scenarios/default.yaml"            # serve, 16 GPUs, one replica of TP8 x PP2
TRAIN = ROOT / "scenarios/k3-h200-train-32k.yaml"     # train, 8,192 GPUs, TP8 PP16 v2 EP64 DP64
ONE_NODE = ROOT / "scenarios/k3-h200-1node.yaml"      # serve, pp=1
KL = ROOT / "scenarios/kimi-linear-48b-h200.yaml"     # serve, one GPU (pp=1) that fits
UNIFORM = ("--uniform-costs", "1,2")


def scenario(tmp_path, base, *edits: tuple[str, str]):
    """A copy of a shipped scenario with `edits` (old, new) applied and its model path made absolute."""
    text = base.read_text().replace("../models/kimi-k3.yaml", str(ROOT / K3))
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------ options
# (argv, the option as written, a word of the fix): one case per rule of each command's table
REFUSED = [
    # serve
    (["serve", "--trace", CONV, "--requests", "50"], "--requests", "--limit N"),
    (["serve", "--workload", "chat", "--limit", "5"], "--limit", "--requests N"),
    (["serve", "--workload", "chat", "--arrival", "gamma"], "--arrival", "add --arrival-rate"),
    (["serve", "--workload", "chat", "--arrival-rate", "1", "--arrival-cv", "3"], "--arrival-cv",
     "add --arrival gamma"),
    (["serve", "--workload", "chat", "--processes", "2"], "--processes", "add --sweep-rate"),
    (["serve", "--trace", CONV, "--seed", "3"], "--seed", "add --arrival-rate"),
    (["serve", "--scenario", KL, "--workload", "chat", "--router", "round-robin"], "--router", "--replicas N"),
    (["serve", "--scenario", KL, "--workload", "chat", "--pp-microbatches"], "--pp-microbatches",
     "parallelism.pp > 1"),
    (["serve", "--scenario", KL, "--workload", "chat", "--no-pp-microbatches"], "--no-pp-microbatches",
     "parallelism.pp > 1"),
    # sweep: the other mode's dimensions, and chunks without workers
    (["sweep", DEFAULT, "--tp", "8"], "--tp", "sweep a train scenario"),
    (["sweep", DEFAULT, "--pp", "2"], "--pp", "sweep a train scenario"),
    (["sweep", DEFAULT, "--dp", "2"], "--dp", "sweep a train scenario"),
    (["sweep", DEFAULT, "--virtual", "2"], "--virtual", "sweep a train scenario"),
    (["sweep", TRAIN, "--max-batch", "16"], "--max-batch", "sweep a serve scenario"),
    (["sweep", TRAIN, "--prefill-replicas", "0"], "--prefill-replicas", "sweep a serve scenario"),
    (["sweep", TRAIN, "--requests", "10"], "--requests", "sweep a serve scenario"),
    (["sweep", TRAIN, "--tp", "8", "--chunk-size", "3"], "--chunk-size", "add --workers N"),
    # pipeline: the model is not read under uniform costs with a given encoder cost or no encoder
    (["pipeline", *UNIFORM, "--encoder-policy", "none", "--tp", "4"], "--tp", "drop --uniform-costs"),
    (["pipeline", *UNIFORM, "--encoder-cost", "0.5", "--ep", "4"], "--ep", "drop --uniform-costs"),
    (["pipeline", *UNIFORM, "--encoder-cost", "0.5", "--model", "models/kimi-linear-48b.yaml"], "--model",
     "drop --uniform-costs"),
    (["pipeline", *UNIFORM, "--encoder-policy", "none", "--no-attn-res-cache"], "--no-attn-res-cache",
     "drop --uniform-costs"),
    (["pipeline", "--encoder-policy", "none", "--encoder-cost", "0.5"], "--encoder-cost",
     "choose --encoder-policy"),
    (["pipeline", *UNIFORM, "--encoder-cost", "0.5", "--images-per-microbatch", "3"], "--images-per-microbatch",
     "remove --encoder-cost"),
    (["pipeline", *UNIFORM, "--encoder-policy", "none", "--seed", "2"], "--seed", "choose --encoder-policy"),
    (["pipeline", *UNIFORM, "--encoder-policy", "serial", "--encoder-cost", "0.5", "--encoder-upfront", "2"],
     "--encoder-upfront", "use --encoder-policy bubble"),
    # plan, cp, decode, prefix-cache
    (["plan", TRAIN, "--serving-requests", "10", "--no-report"], "--serving-requests", "plan a serve scenario"),
    (["cp", "--seq-len", "32K", "--seq-lens", "4K"], "--seq-lens", "add --sweep"),
    (["cp", "--seq-len", "32K", "--cps", "2"], "--cps", "add --sweep"),
    (["cp", "--seq-len", "32K", "--seed", "3"], "--seed", "add --doc-mean-tokens"),
    (["decode", "--sweep-batch", "--batch", "8"], "--batch", "remove --batch"),
    (["decode", "--mtp", "0", "--acceptance", "0.5"], "--acceptance", "add --mtp N"),
    (["decode", "--model", "models/kimi-k2.yaml", "--mtp", "1", "--acceptance", "0.5", "--rollback", "snapshot"],
     "--rollback", "remove --rollback"),
    (["decode", "--ep-kernel", "low-latency"], "--ep-kernel", "add --attention-dp N and --ep N"),
    (["decode", "--tp", "8", "--attention-dp", "2", "--ep", "1", "--dispatch-dtype", "bf16"], "--dispatch-dtype",
     "add --attention-dp N and --ep N"),
    (["decode", "--tbo"], "--tbo", "remove --tbo"),
    (["decode", "--tp", "1", "--attention-dp", "8", "--ep", "8", "--max-nodes-per-token", "1"],
     "--max-nodes-per-token", "raise --ep above 8"),
    (["decode", "--tp", "8", "--ep", "1", "--redundant-experts", "16"], "--redundant-experts", "raise --ep"),
    (["prefix-cache", "--trace", CONV, "--policies", "coarse"], "--policies", "add --sweep"),
    (["prefix-cache", "--trace", CONV, "--processes", "2"], "--processes", "add --sweep"),
    (["prefix-cache", "--trace", CONV, "--seed", "4"], "--seed", "remove --seed"),
    (["prefix-cache", "--workload", "chat", "--requests", "20", "--strict"], "--strict", "remove --strict"),
    (["prefix-cache", "--trace", CONV, "--tokens-per-s", "1e5", "--step-overhead-s", "0.01", "--step-scenario",
      DEFAULT], "--step-scenario", "remove --step-scenario"),
]


@pytest.mark.parametrize("argv, option, fix", REFUSED, ids=[f"{a[0]} {o}" for a, o, _ in REFUSED])
def test_an_option_without_effect_is_refused_with_the_fix(capsys, tmp_path, argv, option, fix):
    out = tmp_path / "never"
    argv = [*argv, "--out", out] if argv[0] == "sweep" else argv
    assert_one_line(*run_main(capsys, *argv), f"{option}:", fix)
    assert not out.exists()


def test_serve_router_of_the_cli_that_drops_the_scenarios_load_cap(tmp_path, capsys):
    """The scenario's prefix-aware router with its balance threshold, overridden by --router round-robin on a
    two-replica fleet: the threshold would be ignored."""
    path = scenario(tmp_path, DEFAULT, ("workload:", "serving: {router: prefix-aware, router_load_cap: 8}\nworkload:"))
    assert_one_line(*run_main(capsys, "serve", "--scenario", path, "--workload", "chat", "--replicas", "2",
                              "--router", "round-robin"), "--router:", "round-robin ignores the scenario's "
                    "serving.router_load_cap", "use --router prefix-aware")


# ------------------------------------------------------------------------------------------ positives
def _accepts(rules, given: dict, values: dict | None = None, derived: dict | None = None) -> None:
    """The table lets `given` through (the same check the command runs, fed explicitly)."""
    options.check(rules, derived or {}, given={o: o for o in given}, values={**given, **(values or {})})


@pytest.mark.parametrize("given, derived", [
    ({"--requests": 50, "--workload": "chat"}, {}),
    ({"--limit": 5, "--trace": "t.jsonl"}, {}),
    ({"--arrival": "gamma", "--arrival-rate": 1.0}, {}),
    ({"--arrival-cv": 3.0, "--arrival": "gamma", "--sweep-rate": "1,2"}, {}),
    ({"--processes": 2, "--sweep-rate": "1,2"}, {}),
    ({"--seed": 3, "--trace": "t.jsonl", "--arrival-rate": 1.0}, {}),
    ({"--router": "round-robin"}, {"front_engines": 2, "load_cap_set": False}),
    ({"--router": "prefix-aware"}, {"front_engines": 2, "load_cap_set": True}),
    ({"--pp-microbatches": True}, {"max_pp": 2}),
])
def test_serve_table_accepts_the_valid_combination(given, derived):
    _accepts(options.SERVE, given, derived={"front_engines": 1, "load_cap_set": False, "max_pp": 1, **derived})


def test_serve_options_change_the_requests_served():
    """--limit cuts a trace, --arrival-cv reshapes gamma gaps, --seed redraws them, --requests sizes a
    synthetic workload: each moves what the fleet is given."""
    from k3sim.serving.run import request_source

    def arrivals(**kw):
        base = dict(trace=None, workload=None, n_requests=30, seed=0, arrival="poisson", cv=2.0, limit=None)
        return [r.arrival_s for r in request_source(**{**base, **kw})(kw.pop("rate", 1.0))]

    assert len(arrivals(trace=CONV, limit=7)) == 7 < len(arrivals(trace=CONV))
    assert arrivals(trace=CONV, arrival="gamma", cv=3.0) != arrivals(trace=CONV, arrival="gamma", cv=1.5)
    assert arrivals(trace=CONV, seed=1) != arrivals(trace=CONV, seed=2)
    assert len(arrivals(workload="chat", n_requests=12)) < len(arrivals(workload="chat", n_requests=40))


@pytest.mark.parametrize("given, mode, parallel", [
    ({"--tp": "8"}, "train", False), ({"--dp": "64"}, "train", False), ({"--virtual": "2"}, "train", False),
    ({"--max-batch": "16"}, "serve", False), ({"--prefill-replicas": "0"}, "serve", False),
    ({"--requests": 10}, "serve", False), ({"--chunk-size": 3}, "train", True),
])
def test_sweep_table_accepts_the_dimensions_of_the_scenarios_mode(given, mode, parallel):
    _accepts(options.SWEEP, given, derived={"mode": mode, "parallel": parallel})


@pytest.mark.parametrize("argv, key, values", [
    # the encoder cost moves the step of uniform costs; up-front encodes move the bubble placement
    ([*UNIFORM, "--encoder-policy", "serial", "--encoder-cost"], "step_time_s", ["0.5", "2"]),
    ([*UNIFORM, "--encoder-cost", "0.5", "--encoder-upfront"], "encoder_placed_in_bubbles", ["0", "8"]),
    (["--encoder-policy", "none", "--uniform-costs"], "step_time_s", ["1,2", "1,3"]),
])
def test_pipeline_option_in_a_valid_combination_changes_the_result(capsys, argv, key, values):
    results = []
    for v in values:
        code, out, err = run_main(capsys, "pipeline", *argv, v, "--json")
        assert code == 0, err
        results.append(json.loads(out)[key])
    assert results[0] != results[1], results


def test_pipeline_model_options_count_when_the_model_is_read():
    """With model-derived costs (no --uniform-costs) every model option is read: the table lets them through,
    and the TP degree moves a stage's cost (toy model, fake kernels: milliseconds)."""
    _accepts(options.PIPELINE, {o: 1 for o in options.MODEL_OPTIONS},
             values={"--encoder-policy": "bubble"}, derived={"model_used": True, "encoder_from_model": True})
    _accepts(options.PIPELINE, {"--seed": 2, "--encoder-cp": "fixed"}, values={"--encoder-policy": "bubble"},
             derived={"model_used": True, "encoder_from_model": True})
    import sys

    sys.path.insert(0, str(ROOT / "tests/pipeline"))
    from pipeline_toys import fake_kernel_time, fake_layer_costs, toy_gpu, toy_model

    from k3sim.pipeline import LayoutSpec, simulate_layout

    def step(tp):  # the ViT encoder runs on the tp x cp GPUs of a stage
        spec = LayoutSpec(stages=2, microbatches=4, tp=tp, ep=1, encoder_policy="serial")
        return simulate_layout(spec, toy_model(), toy_gpu(), kernel_time=fake_kernel_time,
                               layer_costs=fake_layer_costs).step_time_s

    assert step(1) != step(2)


def test_other_tables_accept_the_valid_combination():
    _accepts(options.PLAN, {"--serving-requests": 10}, derived={"mode": "serve"})
    _accepts(options.CP, {"--seq-lens": "4K", "--cps": "2", "--sweep": True})
    _accepts(options.CP, {"--seed": 3, "--doc-mean-tokens": 100.0})
    _accepts(options.DECODE, {"--batch": 8})
    _accepts(options.DECODE, {"--acceptance": 0.8, "--rollback": "replay", "--mtp": 2, "--ep-kernel": "normal",
                              "--dispatch-dtype": "bf16", "--tbo": True, "--max-nodes-per-token": 4,
                              "--redundant-experts": 32},
             derived={"recurrent_layers": 69, "model": "kimi-k3", "moe": True, "ep_all_to_all": True, "ep": 32,
                      "gpus_per_node": 8, "ep_nodes": 4})
    _accepts(options.PREFIX_CACHE, {"--policies": "coarse", "--processes": 2, "--sweep": True})
    _accepts(options.PREFIX_CACHE, {"--seed": 3, "--workload": "chat", "--tokens-per-s": 1e5})


def test_a_flag_written_in_its_negative_form_is_named_so():
    with pytest.raises(InputError) as err:
        options.check(options.SERVE, {"front_engines": 1, "load_cap_set": False, "max_pp": 1},
                      given={"--pp-microbatches": "--no-pp-microbatches"}, values={"--pp-microbatches": False})
    assert str(err.value).startswith("--no-pp-microbatches: ")


# ------------------------------------------------------------------------------------------ scenario fields
FIELDS = [
    (DEFAULT, ("workload:", "training: {seed: 1}\nworkload:"), "field 'training'", "remove the section"),
    (DEFAULT, ("  ep: 8", "  ep: 8\n  virtual_stages: 2"), "field 'parallelism.virtual_stages'", "remove it"),
    (DEFAULT, ("workload:", "sweep: {tp: [8]}\nworkload:"), "field 'sweep.tp'", "remove it"),
    (TRAIN, ("workload:", "sweep: {max_batch: [8]}\nworkload:"), "field 'sweep.max_batch'", "remove it"),
    (DEFAULT, ("workload:", "serving: {router: round-robin, router_load_cap: 8}\nworkload:"),
     "field 'serving.router_load_cap'", "set router: prefix-aware"),
    (ONE_NODE, ("workload:", "serving: {engine: {pp_microbatches: true}}\nworkload:"),
     "field 'serving.engine.pp_microbatches'", "remove it"),
    (TRAIN, ("workload:", "training: {kda_cp: lasp2}\nworkload:"), "field 'training.kda_cp'",
     "raise parallelism.cp"),
]


@pytest.mark.parametrize("base, edit, field, fix", FIELDS, ids=[f[2] for f in FIELDS])
def test_a_scenario_field_without_effect_is_refused(tmp_path, capsys, base, edit, field, fix):
    path = scenario(tmp_path, base, edit)
    assert_one_line(*run_main(capsys, "plan", path, "--no-report"), str(path), field, fix)


def test_the_same_fields_in_their_own_mode_are_read(tmp_path):
    """A train scenario's training: and sweep: sections, a pipeline's virtual stages, a prefix-aware router's
    threshold and pp_microbatches at pp=2 all load; the sweep section becomes the grid."""
    from k3sim.configs.loaders import resolve_scenario
    from k3sim.planner.inputs import load
    from k3sim.planner.sweep import grid

    path = scenario(tmp_path, TRAIN, ("workload:", "training: {kda_cp: lasp2}\nsweep: {tp: [8], pp: [16], "
                                                   "virtual_stages: [2], ep: [64], cp: [1, 2], dp: [32]}\nworkload:"))
    inp = load(path)
    assert inp.training.kda_cp == "lasp2" and sorted({p["cp"] for p in grid(inp, inp.sweep.model_dump())}) == [1, 2]
    path = scenario(tmp_path, DEFAULT, ("workload:", "serving: {router: prefix-aware, router_load_cap: 8, "
                                                     "engine: {pp_microbatches: true}}\nworkload:"))
    sv = resolve_scenario(path)[0].serving
    assert sv.router_load_cap == 8 and sv.engine.pp_microbatches


def test_the_plan_refuses_a_knob_idle_in_its_layout_while_a_sweep_varies_it(tmp_path, capsys):
    """`training.kda_cp` at the scenario's cp=1 is refused by `plan`; a sweep over cp takes it (cp=2 points)."""
    from k3sim.planner.inputs import load

    path = scenario(tmp_path, TRAIN, ("workload:", "training: {kda_cp: lasp2}\nworkload:"))
    with pytest.raises(InputError, match="parallelism.cp=1"):
        load(path, own_layout=True)
    assert load(path).training.kda_cp == "lasp2"


@pytest.mark.parametrize("layout, refused", [
    (("--tp", "8", "--ep", "8", "--dp", "1"), True),    # one rank in the dense and the expert DP groups
    (("--tp", "8", "--ep", "8", "--dp", "4"), False),   # dense weights shard over 4
    (("--tp", "8", "--ep", "1", "--dp", "1"), False),   # experts shard over the 8 TP ranks (tp x dp / ep)
])
def test_memory_zero_stage_without_a_data_parallel_group_is_refused(capsys, layout, refused):
    argv = ("memory", "--model", "models/kimi-k3.yaml", "--hardware", "h200", "--mode", "train", "--pp", "16",
            *layout, "--context", "32768", "--zero-stage", "1", "--json")
    code, out, err = run_main(capsys, *argv)
    if refused:
        assert_one_line(code, out, err, "--zero-stage", "remove --zero-stage")
    else:
        assert "--zero-stage:" not in err  # it may not fit, but the option is not the complaint
