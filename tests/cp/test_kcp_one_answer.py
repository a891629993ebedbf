"""One answer for KCP (issue 20, item 2): the kernel registry holds no `chunk_kda_cp_fwd[_bwd]` (a roofline
fit of the whole call answered 39.6 ms where `k3sim cp` answered 100 ms), its measured CSVs stay validation
data of the KCP parts model, and `kernel-time` refuses with the `k3sim cp` command whose answer is the parts
model's (`k3sim.cp.kcp_parts.kcp_time`)."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import assert_one_line, run_main  # noqa: E402

from k3sim.configs.profiles import load_profile, measured_dir  # noqa: E402
from k3sim.kernels.ops import OPS, PRICED_BY_CP, get_op  # noqa: E402
from k3sim.errors import InputError  # noqa: E402

REAL = measured_dir(load_profile("h200"))


@pytest.mark.parametrize("op", sorted(PRICED_BY_CP))
def test_kcp_is_no_kernel_op_and_stays_validation_data(op):
    """Not in the registry nor the store's ops; the store lists every measured file as ignored (not an op,
    no failure); `cp.validate.load_op` still reads the rows (one per measured shape, all on 2 GPUs)."""
    from k3sim.cp.validate import load_op
    from k3sim.kernels.store import load_store

    assert op not in OPS
    with pytest.raises(InputError, match="k3sim cp --strategy kcp"):
        get_op(op)
    store = load_store(REAL)
    files = sorted(str(p.relative_to(REAL)) for p in REAL.glob(f"*/{op}.csv"))
    assert files and set(files) <= set(store.ignored) and op not in store.ops()
    df = load_op(REAL, op)
    assert len(df) >= 5 and set(df["gpus"]) == {2} and (df["seconds"] > 0).all()
    assert not df.duplicated(["T", "H", "gpus", "docs"]).any()


def _conv_halo_s(phase: dict) -> float:
    """The conv halo send of a KDA layer: part of the layer `k3sim cp` prices, not of fla's KCP call."""
    return sum(r["seconds"] for r in phase["rows"] if "conv halo" in r["component"])


@pytest.mark.parametrize("op,shape", [
    ("chunk_kda_cp_fwd", dict(T=1048576, H=96, gpus=8, docs=1)),
    ("chunk_kda_cp_fwd", dict(T=262144, H=12, gpus=2, docs=1)),
    ("chunk_kda_cp_fwd_bwd", dict(T=131072, H=96, gpus=4, docs=4)),
    ("chunk_kda_cp_fwd_bwd", dict(T=65536, H=48, gpus=2, docs=1)),
])
def test_kernel_time_refuses_with_the_cp_command_whose_answer_is_the_parts_model(capsys, op, shape):
    """The refusal is one line, exit 2, and names a `k3sim cp` command; that command runs and its answer (the
    key the refusal names, less the conv halo) is the KCP parts model's within 1 %."""
    from k3sim.cp.kcp_parts import kcp_time, load_parts

    sets = [a for k, v in shape.items() for a in ("--set", f"{k}={v}")]
    line = assert_one_line(*run_main(capsys, "kernel-time", op, *sets), "k3sim cp --strategy kcp")
    cmd, key = re.search(r"the equivalent: `k3sim ([^`]+)`, key (\S+)", line).groups()
    code, out, err = run_main(capsys, *shlex.split(cmd))
    assert code == 0, err
    res = json.loads(out)
    fwd_bwd = op.endswith("_bwd")
    if fwd_bwd:
        got = res[key] - _conv_halo_s(res["kda"]["fwd"]) - _conv_halo_s(res["kda"]["bwd"])
    else:
        assert key == "kda.fwd.time_s"
        got = res["kda"]["fwd"]["time_s"] - _conv_halo_s(res["kda"]["fwd"])
    hw = load_profile("h200")
    parts = load_parts(REAL, int(hw.num_sms))
    want = kcp_time(parts, hw, shape["T"], shape["H"], shape["gpus"], shape["docs"], fwd_bwd=fwd_bwd,
                    fixed_s=parts.fixed_s(hw, fwd_bwd)).seconds
    assert got == pytest.approx(want, rel=0.01)
