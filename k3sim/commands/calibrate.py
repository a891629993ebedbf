"""`k3sim calibrate run|fit|validate`: measure kernels on a GPU, fit the models, report their error."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional

import typer

from k3sim.errors import InputError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPORT = Path("reports/calibration")


def _measured_dir(hardware: str):
    from k3sim.configs import load_hardware
    from k3sim.kernels.hardware import measured_dir, uncalibrated_reason

    hw = load_hardware(hardware)
    d = measured_dir(hw)
    if d is None:
        raise InputError(f"{uncalibrated_reason(hw)}; run `k3sim calibrate run` on a GPU first",
                         source="--hardware")
    return hw, d


def register(app: typer.Typer) -> None:
    cal = typer.Typer(help="Measure kernels on a GPU, fit the kernel-time models, validate them.",
                      no_args_is_help=True)
    app.add_typer(cal, name="calibrate")

    @cal.command("run")
    def run(
        profile: str = typer.Option("h200", "--profile", help="Profile the measurements belong to."),
        out: Optional[Path] = typer.Option(None, "--out", help="Run directory; default "
                                           "hardware_profiles/measured/<profile>/<UTC time>."),
        parts: str = typer.Option("all", "--parts", help="Comma-separated harness parts, or 'all'."),
        time_budget_s: float = typer.Option(3600.0, "--time-budget", help="Wall-clock budget, seconds."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Run the measurement harness (needs PyTorch and an NVIDIA GPU)."""
        from k3sim.output import print_json, print_kv

        # option checks come first: on a machine without a GPU they still answer, and nothing is written
        if not 0 < time_budget_s < float("inf"):  # NaN and inf too: the budget bounds every part's deadline
            raise InputError(f"must be a positive number of seconds, got {time_budget_s}", source="--time-budget")
        if not [p for p in parts.split(",") if p.strip()]:
            raise InputError("no part given (comma-separated harness parts, or 'all')", source="--parts")
        if not profile or profile in (".", "..") or "/" in profile or "\\" in profile:
            # it names the directory measured/<profile>/ the run goes to: a path would write elsewhere
            raise InputError(f"expected a profile name such as h200, got {profile!r}", source="--profile")
        if out is not None and Path(out).exists() and not Path(out).is_dir():
            raise InputError("exists and is not a directory (--out names the run directory)", source=str(out))
        if out is not None and (Path(out) / "provenance.yaml").exists():
            # the harness appends rows and rewrites provenance: old rows would carry the new run's provenance
            raise InputError("already holds a measurement run; give a new directory (runs are never mixed)",
                             source=str(out))
        try:
            from k3sim.calibration.runner import ALL_PARTS, run_calibration
        except ModuleNotFoundError as err:
            raise InputError(f"the calibration harness needs {err.name} (pip install 'k3sim[gpu]' on a GPU machine)",
                             source="calibrate run") from None
        from k3sim.kernels.hardware import profiles_dir

        run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out_dir = out or profiles_dir() / "measured" / profile / run_id
        part_list = [p.strip() for p in parts.split(",") if p.strip()]
        part_list = list(ALL_PARTS) if part_list == ["all"] else part_list
        run_dir = run_calibration(out_dir, part_list, profile, time_budget_s)
        if as_json:
            print_json({"run_dir": str(run_dir)})
        else:
            print_kv("calibration run", [("run directory", run_dir)])

    @cal.command("fit")
    def fit(
        hardware: str = typer.Option("h200", "--hardware", help="Profile name or path."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Fit every measured op and write <measured dir>/fitted.yaml."""
        from k3sim.kernels.fit import FITTED_NAME, fit_profile, to_dict, write_fitted
        from k3sim.kernels.store import load_store
        from k3sim.output import human_seconds, print_json, print_table

        hw, d = _measured_dir(hardware)
        fp = fit_profile(load_store(d), hw)
        path = write_fitted(d / FITTED_NAME, fp)
        if as_json:
            print_json({"path": str(path), **to_dict(fp)})
            return
        rows = []
        for op, f in fp.ops.items():
            if f.roofline is not None:
                r = f.roofline
                what = (f"launch {human_seconds(r.launch_s)}, eff FLOP {r.eff_flop:.2f}, eff bytes {r.eff_bytes:.2f}")
            else:
                what = "; ".join(f"{n} GPUs: alpha {human_seconds(ab.alpha_s)}, bus {ab.bus_bandwidth_bytes_per_s / 1e9:.0f} GB/s"
                                 for n, ab in sorted(f.alpha_beta.items()))
            rows.append([op, f.points_used, f"{100 * f.rms_log_error:.1f} %", what])
        print_table(f"fitted {fp.profile} -> {path}", ["op", "points", "rms log err", "parameters"], rows)

    @cal.command("validate")
    def validate(
        hardware: str = typer.Option("h200", "--hardware", help="Profile name or path."),
        out: Path = typer.Option(DEFAULT_REPORT, "--out", help="Report directory (the default is the "
                                 "project's reports/calibration from any working directory)."),
        refit: bool = typer.Option(True, "--refit/--no-refit", help="Refit the model without each left-out point."),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Leave-one-out error per kernel family (MAPE, max, count), and leave-shape-out per op;
        writes validation.md and CSVs."""
        from k3sim.kernels.validate import ensure_out_dir, validate_profile, write_report
        from k3sim.output import print_json, print_table

        from k3sim.files import output_dir

        hw, _ = _measured_dir(hardware)
        if out == DEFAULT_REPORT:
            out = REPO_ROOT / DEFAULT_REPORT
        with output_dir(out):  # a failed or interrupted run leaves no empty --out behind
            ensure_out_dir(out)
            loo, summary, meta, shapes = validate_profile(hw, refit=refit)
            paths = write_report(loo, summary, out, meta, shapes)
        if as_json:
            print_json({**meta, "files": [str(p) for p in paths], "summary": summary, "leave_shape_out": shapes})
            return
        rows = [[r.family if r.level == "family" else "", r.op, r.count, f"{100 * r.mape:.2f} %",
                 f"{100 * r.max_abs_err:.1f} %", r.interpolated, f"{100 * r.goal_mape:.0f} %",
                 "yes" if r.meets_goal else "no"] for r in summary.itertuples()]
        print_table(f"leave-one-out, {meta['profile']} (written to {paths[0]})",
                    ["family", "op", "count", "MAPE", "max", "interp.", "goal", "met"], rows)
