"""`k3sim check ...`: the whole-step checks of `k3sim.validation`, predictions written before a measurement
run and predicted-vs-measured tables after it, the training glue fit and the training report.

Serving (`decode-predict`, `decode`) and training (`train-predict`, `train`, `fit-glue`, `train-report`)
whole steps on one GPU, measured by `python3 -m k3sim.calibration.wholestep.run`. Run directories and
prediction files are inputs (resolved from the working directory, else the project's copy); every output
goes through `k3sim.files` (single files atomically, directories as outputs of kind "check").
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

POINTS_HELP = "CONFIG:SEQxMB,... (configurations of calibration/wholestep/specs.json)"


def _input(path: Path) -> Path:
    """A run directory or prediction file as given, else the project's copy (any working directory)."""
    from k3sim.files import project_path

    return project_path(path)


def register(app: typer.Typer) -> None:
    chk = typer.Typer(help="Whole-step checks: predictions before a measurement run, predicted vs measured "
                           "after it, the training glue fit and report.", no_args_is_help=True)
    app.add_typer(chk, name="check")

    @chk.command("decode-predict")
    def decode_predict(
        out: Path = typer.Argument(..., metavar="OUT", help="CSV to write."),
        plan: Optional[str] = typer.Option(None, "--plan", help="The run's plan (CONFIG[@KERNEL]:PART=SECONDS,... "
                                           "or serve / train / all); default: the harness's default plan."),
    ) -> None:
        """Serving whole-step predictions for every point a run measures, written before the run."""
        from k3sim.validation.decode_step import write_predictions

        print(f"{write_predictions(out, plan)} predictions -> {out}")

    @chk.command("decode")
    def decode(
        run: Path = typer.Argument(..., metavar="RUN", help="Serving whole-step run directory."),
        out: Path = typer.Argument(..., metavar="OUT_DIR", help="Directory for wholestep_check.csv and "
                                   "wholestep_families.csv."),
        predictions: Path = typer.Option(Path("reports/decode/wholestep_predictions.csv"), "--predictions",
                                         help="Predictions committed before the run."),
    ) -> None:
        """Predicted vs measured serving whole steps, and the per-family split of the profiled points."""
        from k3sim.validation.decode_step import write_check

        print(write_check(_input(run), out, _input(predictions)))

    @chk.command("train-predict")
    def train_predict(
        out: Path = typer.Argument(..., metavar="OUT", help="CSV to write."),
        points: str = typer.Option(..., "--points", help=POINTS_HELP),
        glue: bool = typer.Option(False, "--glue", help="With the profile's glue calibration (default: plain)."),
        both: bool = typer.Option(False, "--both", help="Plain and glue-calibrated columns side by side."),
    ) -> None:
        """Training whole-step predictions (forward, forward+backward) of layer slices, written before a run."""
        from k3sim.validation.train_step import write_predictions

        print(write_predictions(out, points, glue=glue, both=both))

    @chk.command("train")
    def train(
        run: Path = typer.Argument(..., metavar="RUN", help="Training whole-step run directory."),
        out: Path = typer.Argument(..., metavar="OUT_DIR", help="Directory for check_RUN.csv and families_RUN.csv."),
    ) -> None:
        """Predicted (plain and glue-calibrated) vs measured training whole steps of one run."""
        from k3sim.validation.train_step import write_check

        print(write_check(_input(run), out))

    @chk.command("fit-glue")
    def fit_glue(
        runs: list[Path] = typer.Argument(..., metavar="RUN...", help="Profiled training whole-step run "
                                          "directories (a point is taken from the first that profiled it)."),
        out: Path = typer.Argument(..., metavar="OUT", help="Calibration file to write (training_glue.yaml)."),
        points: str = typer.Option(..., "--points", help=POINTS_HELP + ", of one or more configurations"),
    ) -> None:
        """Fit the training glue factors on profiled points (pooled over their configurations, each one's own
        factors beside) and write the calibration file."""
        from k3sim.validation.glue_fit import summary, write_glue_file

        print(summary(write_glue_file([_input(r) for r in runs], out, points)))

    @chk.command("train-report")
    def train_report(
        out: Optional[Path] = typer.Argument(None, metavar="OUT_DIR", help="Report directory; default "
                                             "./k3sim-out/train-report (the committed copy is reports/training)."),
    ) -> None:
        """README.md and figure of the training whole-step check from every committed training run."""
        from k3sim.files import default_out
        from k3sim.validation.train_report import build

        print(build(out if out is not None else default_out("train-report")))

    @chk.command("train-deployed")
    def train_deployed(
        out: Optional[Path] = typer.Option(None, "--out", help="Directory for deployed.md and deployed_predictions."
                                           "csv; default ./k3sim-out/train-deployed (the committed copy is "
                                           "reports/training)."),
    ) -> None:
        """Training as deployed (DeepSeek-V3 on 2048 H800, K3 at 32K and 1M): the recipe and each feature off."""
        from k3sim.files import check_output_dir, default_out
        from k3sim.validation.train_deployed import KIND, write_report

        target = out if out is not None else default_out("train-deployed")
        check_output_dir(target, kind=KIND)
        print(f"training deployed predictions -> {write_report(target)}")

    _register_at_scale(chk)


def _register_at_scale(chk: typer.Typer) -> None:
    """The serving-at-scale checks: the EP all-to-all on DeepEP's tables, predictions of deployments."""

    @chk.command("deepep")
    def deepep(as_json: bool = typer.Option(False, "--json", help="Stable JSON, SI units.")) -> None:
        """The EP all-to-all model on the DeepEP tables: fit, leave-one-out, leave-EP-out, held-out checks."""
        from k3sim.output import print_json, print_table
        from k3sim.validation.ep_comm import report, table

        rep = report()
        if as_json:
            print_json(rep)
            return
        cols, rows = table(rep)
        pr = rep["parameters"]
        lat = ", ".join(f"{ph} {v['a_s'] * 1e6:.1f} + {v['b_s_per_log2_ep'] * 1e6:.2f} x log2(EP) us"
                        for ph, v in pr["latency"].items())
        err = {k: f"{100 * rep[k]['mape']:.1f} % (max {100 * rep[k]['max_abs_rel_err']:.1f} %)"
               for k in ("leave_one_out", "leave_ep_out")}
        print_table(f"{rep['calibration']}: f_nvl {pr['f_nvl']:.3f}, f_rdma {pr['f_rdma']:.3f}; latency {lat}; "
                    f"LOO MAPE {err['leave_one_out']}, leave-EP-out {err['leave_ep_out']}", cols, rows)

    @chk.command("deployed")
    def deployed(
        out: Path = typer.Option(..., "--out", help="Directory (new, empty or a previous deployed output) for "
                                 "predictions.csv and the generated README.md; the committed one is "
                                 "reports/deployed."),
    ) -> None:
        """Predictions for deployments at scale (attention-DP, wide EP, DeepEP, FP8, TBO, redundant experts)."""
        from k3sim.files import check_output_dir
        from k3sim.validation.deployed import KIND, write_report

        check_output_dir(out, kind=KIND)
        print(f"deployed predictions -> {write_report(out)}")
