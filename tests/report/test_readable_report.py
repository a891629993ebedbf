"""A report a person reads (issue 24 item 10): no Python reprs or raw keys, sizes in GiB with the datasheet GB
beside HBM, each calibration family's own goal, no "not applicable" sections, the dominant cost of the step
and a faster CP scheme called out, figures not clipped."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from k3sim.report import figures as F
from k3sim.report import render

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = f"""name: kl-train-cp
model: {ROOT / 'models/kimi-linear-48b.yaml'}
hardware: h200
cluster:
  num_gpus: 16
  gpus_per_node: 8
parallelism:
  tp: 2
  pp: 2
  ep: 8
  cp: 2
  dp: 2
workload:
  mode: train
  context_tokens: 65536
  micro_batch_size: 1
  num_micro_batches: 4
  activation_checkpointing: true
"""


@pytest.fixture(scope="module")
def train_report(tmp_path_factory):
    from k3sim.planner.plan import plan
    from k3sim.report import write_report

    tmp = tmp_path_factory.mktemp("rep")
    (tmp / "s.yaml").write_text(SCENARIO)
    res = plan(tmp / "s.yaml")
    write_report(res, tmp / "out")
    return res, tmp / "out"


REPR = re.compile(r"\{'|\bNone\b|\bTrue\b|\bFalse\b|\bnan\b")
GB_ALONE = re.compile(r"(?<!GiB = )(?<!GiB \()(?<![\d.,])\d[\d.,]* GB\b")


def test_no_python_reprs_nor_raw_keys(train_report):
    res, out = train_report
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert not REPR.search(text), REPR.search(text)
        ours = re.split(r"Assumptions and their sources", text)[0]  # the sources quote datasheets as written
        alone = GB_ALONE.search(ours)  # a datasheet GB only beside its GiB
        assert not alone, ours[alone.start() - 80:alone.end() + 20]
    md = (out / "report.md").read_text()
    memory = md.split("## Memory per GPU")[1].split("\n## ")[0]
    rows = [line.split(" | ")[0].lstrip("| ") for line in memory.splitlines() if line.startswith("| ")][1:]
    assert rows and not any("_" in c for c in rows), rows   # components in words
    assert "| weights | " in memory and "| optimizer states | " in memory and " GiB |" in memory
    assert "HBM per GPU: 139.80 GiB (150.1 GB)" in memory       # 150,109,880,320 B / 2^30, / 10^9


def test_sections_that_do_not_apply_are_left_out(train_report):
    """A training plan has no serving, decode or prefix-cache section; plan.json keeps the notes saying why."""
    import json

    res, out = train_report
    md = (out / "report.md").read_text()
    assert "not applicable" not in md
    for title in ("## Serving latency", "## Decode roofline", "## Prefix-cache hit rate"):
        assert title not in md
    notes = json.loads((out / "plan.json").read_text())["notes"]
    assert notes["decode"] == notes["serving"] == "not applicable to a training scenario"
    assert "## Pipeline schedule (Gantt)" in md  # pp = 2: it applies


def test_calibration_goal_is_each_familys(train_report):
    from k3sim.kernels.validate import GOAL_MAPE

    res, out = train_report
    md = (out / "report.md").read_text()
    table = md.split("## Calibration error of the kernels used")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == ["op", "family", "points", "MAPE", "p90 abs. error", "max abs. error", "goal (MAPE)", "goal met"]
    body = rows[1:]  # the |---| line does not start with "| "
    assert body and {r[1] for r in body} >= {"gemm", "collective"}
    for r in body:
        assert r[6] == f"{100 * GOAL_MAPE[r[1]]:.0f} %"
    assert any(r[1] == "collective" and r[6] == "10 %" for r in body)
    assert any(r[1] == "gemm" and r[6] == "5 %" for r in body)


def test_dominant_cost_is_summed_by_kind():
    """Breakdown rows of one kind add up: compute 2 + 5, CP 100 + 16, bubble 27 = 150 s; CP is 116/150 = 77 %."""
    rows = [SimpleNamespace(kind=k, seconds=s) for k, s in (("compute", 2.0), ("compute", 5.0), ("cp", 100.0),
                                                             ("cp", 16.0), ("bubble", 27.0))]
    t = SimpleNamespace(breakdown=rows, step_time_s=150.0, seq_len_tokens=1048576)
    assert render.dominant_cost(t) == ("Dominant cost: context parallelism (CP) is 77 % of a 1,048,576-token step "
                                       "(116.000 s of 150.000 s).")


def test_the_step_section_says_its_dominant_cost(train_report):
    res, out = train_report
    md = (out / "report.md").read_text()
    assert render.dominant_cost(res.training) in md.split("## Training step-time breakdown")[1].split("\n## ")[0]


def _cp_res(kda: dict, mla: dict, cp: int = 8, seq: int = 1048576):
    rows = [{"seq_len": seq, "cp": cp, "layer": "kda", "strategy": s, "mla_kv": "-", "time_s": v, "skipped": ""}
            for s, v in kda.items()]
    rows += [{"seq_len": seq, "cp": cp, "layer": "mla", "strategy": s, "mla_kv": kv, "time_s": v, "skipped": ""}
             for (s, kv), v in mla.items()]
    rows.append({"seq_len": seq, "cp": cp, "layer": "kda", "strategy": "ulysses", "mla_kv": "-", "skipped": "P > heads"})
    t = SimpleNamespace(seq_len_tokens=seq, options={"kda_cp": "kcp", "mla_cp": "allgather-kv"})
    return SimpleNamespace(training=t, parallelism={"cp": cp}, cp_rows=rows, cp_degree=cp)


def test_a_faster_cp_scheme_is_called_out():
    """KDA: lasp2 at 10 ms against the scenario's kcp at 20 ms (50 % less) is said; MLA: zigzag-ring (latent)
    at 0.97 s against allgather-kv (latent) at 1 s is a near-tie (3 % < 5 %), not a better choice; the skipped
    row is not a candidate."""
    res = _cp_res({"kcp": 0.020, "lasp2": 0.010}, {("allgather-kv", "latent"): 1.0, ("zigzag-ring", "latent"): 0.97})
    lines = render.faster_cp_schemes(res)
    assert lines == ["A faster KDA scheme at this length: the plan's CP table has lasp2 at 10.000 ms per layer "
                     "(fwd + bwd, one rank) against 20.000 ms for kcp, which the scenario uses (50 % less), at "
                     "1,048,576 tokens and P=8; set training.kda_cp to try it."]
    res = _cp_res({"kcp": 0.020}, {("allgather-kv", "latent"): 1.0, ("zigzag-ring", "expanded"): 0.5})
    assert len(render.faster_cp_schemes(res)) == 1 and "zigzag-ring (expanded) at 500.000 ms" in \
        render.faster_cp_schemes(res)[0]
    res.parallelism = {"cp": 1}  # no CP in the scenario: the table is what CP would cost, nothing is "used"
    assert render.faster_cp_schemes(res) == []


def test_decode_dominant_cost_at_the_largest_batch_that_fits():
    import pandas as pd

    df = pd.DataFrame({"batch": [1, 8, 16], "tpot_s": [0.02, 0.046, 0.07], "fits_memory": [True, True, False],
                       "limiter": ["a", "routed-expert weights (46% of the busiest stage)", "c"]})
    assert render._decode_dominant(df, 131072) == (
        "Dominant cost of a decode step at batch 8, the largest batch that fits in memory, 131,072 tokens of "
        "context: routed-expert weights (46% of the busiest stage); TPOT 46.000 ms.")


def test_assumptions_and_layout_in_words():
    from k3sim.configs import load_hardware

    hw = load_hardware("h200")
    res = SimpleNamespace(hw=hw, training=None)
    assert render._assumption_words(res, f"h200 hbm_bytes = {hw.hbm_bytes}") == \
        "h200 HBM capacity per GPU: 139.80 GiB (150.1 GB)"
    assert render._assumption_words(res, f"h200 peak_flops_per_s = {hw.peak_flops_per_s}") == \
        "h200 dense peak: bf16 989 TFLOP/s, fp16 989 TFLOP/s, fp8 1,979 TFLOP/s"
    assert render._assumption_words(res, f"h200 scaleup_bandwidth_bytes_per_s = {hw.scaleup_bandwidth_bytes_per_s}") \
        == "h200 scale-up (NVLink) bandwidth per GPU, one direction: 450 GB/s"
    assert render._assumption_words(res, "model kimi-k3") == "model kimi-k3"
    assert render._layout({"tp": 8, "pp": 16, "virtual_stages": 2, "ep": 64, "cp": 32, "dp": 2, "zero_stage": 1}) \
        == "TP8 PP16 (2 virtual stages) EP64 CP32 DP2"
    assert render._fmt("sim_seconds", 344.4) == "344.400 s" and render._fmt("x", True) == "yes"
    assert render._fmt("x", None) == "-" and render._fmt("x", float("nan")) == "-"


# ------------------------------------------------------------------------------------------ figures
def _border_is_blank(path: Path, px: int = 2) -> bool:
    """No ink on the PNG's outer frame: a title, label or legend cut by the canvas edge leaves ink there."""
    import matplotlib.image as mpimg

    img = mpimg.imread(path)[..., :3]
    frame = [img[:px], img[-px:], img[:, :px], img[:, -px:]]
    return all((f > 0.95).all() for f in frame)


LONG = "a component whose name is far longer than any axis leaves room for, drawn at the left of its bar"


def test_figures_are_not_clipped(tmp_path):
    from k3sim.pipeline import build_schedule, run_pipeline, uniform_costs

    rows = [("weights_routed_experts", 84e9), ("kv_cache_and_state", 33e9), ("workspace_reserve", 15e9)]
    paths = [F.memory_figure(rows, 150.1e9, "kimi-k3 on h200: per-GPU memory, pipeline stage 1, a long title "
                             "that runs past the width of the axes", tmp_path / "m.png"),
             F.breakdown_figure([(LONG, 116.0), ("pipeline bubble", 27.0)], "training step 154 s (kimi-k3, TP8 PP16 "
                                "(2 virtual stages) EP64 CP32 DP2) with a title longer than the figure", tmp_path / "b.png"),
             F.prefix_cache_figure([{"policy": "coarse", "token_hit_rate": 0.02, "request_hit_rate": 0.01},
                                    {"policy": "decoupled", "token_hit_rate": 0.65, "request_hit_rate": 1.0}],
                                   "kimi-k3: prefix-cache hit rate by policy, with a long title", tmp_path / "p.png"),
             F.gantt_figure(run_pipeline(build_schedule("1f1b", 4, 8), uniform_costs(4, 1, 1.0, 2.0)).timeline,
                            "TP8 PP4: 8 micro-batches " + LONG, tmp_path / "g.png")]
    for p in paths:
        assert _border_is_blank(p), p
