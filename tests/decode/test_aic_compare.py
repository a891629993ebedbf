"""Smoke test of benchmarks/aiconfigurator_compare.py --k3sim-only (no AIConfigurator install needed).

It re-runs the k3sim half against the committed AIC CSV in a temporary directory and checks that the
component mapping neither drops nor double-counts time on either side, and that regenerating the report
keeps the hand-written part."""

import csv
import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/aiconfigurator_compare.py"
TOTALS = ("all communication (subtotal)", "one token through all stages", "TPOT")


def _load():
    spec = importlib.util.spec_from_file_location("aiconfigurator_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    mod = _load()
    out = tmp_path_factory.mktemp("aic")
    for name in (mod.AIC_CSV, mod.AIC_META):
        shutil.copy(ROOT / "reports/decode" / name, out / name)
    (out / mod.REPORT).write_text(f"# title\n\nhand-written intro\n\n{mod.BEGIN}\nstale\n{mod.END}\n\n## Why\nkept\n")
    mod.main(["--k3sim-only", "--out-dir", str(out)])
    with open(out / mod.CMP_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return mod, out, rows


def test_groups_add_up_to_the_whole_step_on_both_sides(run):
    mod, _, rows = run
    for B in mod.BATCHES:
        mine = [r for r in rows if int(r["batch"]) == B]
        parts = [r for r in mine if r["group"] not in TOTALS]
        whole = next(r for r in mine if r["group"] == "one token through all stages")
        assert sum(float(r["k3sim_s"]) for r in parts) == pytest.approx(float(whole["k3sim_s"]), rel=1e-4)
        assert sum(float(r["aic_s"]) for r in parts) == pytest.approx(float(whole["aic_s"]), rel=1e-4)
        # every AIC op has a k3sim counterpart group
        assert all(float(r["aic_s"]) == 0 for r in parts if r["group"] == "unmapped")


def test_no_k3sim_component_is_left_unmapped(run):
    _, _, rows = run
    left = {r["k3sim_components"] for r in rows if r["group"] == "unmapped" and float(r["k3sim_s"]) > 0}
    assert not left, f"add these k3sim components to GROUPS in {SCRIPT.name}: {left}"


def test_group_mapping_on_named_components():
    mod = _load()
    g = mod._group_of_k3
    assert g("kda_o_proj").startswith("KDA o_proj")
    assert g("kda_decay_gate").startswith("KDA input projections")
    assert g("kda_recurrent").startswith("KDA core")
    assert g("mla_qkv_a_all_gather").startswith("MLA q_a/kv_a")
    assert g("mla_decode_attention").startswith("MLA module")
    assert g("moe_latent_all_gather").startswith("MoE communication")  # not the latent down-projection
    assert g("moe_latent_down+router").startswith("router + latent down")
    assert g("moe_router_topk").startswith("routed experts")  # AIC's measured FusedMoE does its own top-k
    assert g("ep_dispatch_all_to_all").startswith("MoE communication")
    assert g("a_new_component") == "unmapped"
    assert mod._group_of_aic("generation_moe_post_dispatch").startswith("MoE communication")
    assert mod._group_of_aic("generation_kda_ar").startswith("TP all-reduce")


def test_report_block_regenerated_and_hand_text_kept(run):
    mod, out, _ = run
    text = (out / mod.REPORT).read_text()
    assert "hand-written intro" in text and "## Why\nkept" in text and "stale" not in text
    assert text.count(mod.BEGIN) == 1 and text.count(mod.END) == 1
    for B in mod.BATCHES:
        assert f"### B = {B}" in text
