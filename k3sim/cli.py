"""The `k3sim` command line: parse, call a model, print. No model code lives here.

Each command is a function in `k3sim/commands/<name>.py` that imports its model lazily,
so `k3sim --help` only pays for typer.
"""

from __future__ import annotations

import sys

import typer

from k3sim.errors import InputError

app = typer.Typer(
    help="k3sim: simulator and capacity planner for hybrid linear-attention MoE models (Kimi K3).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("version")
def version() -> None:
    """Print the k3sim version."""
    from k3sim import __version__

    print(__version__)


def _register() -> None:
    from k3sim.commands import register_all

    register_all(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line and exit code 2 for bad input, never a traceback for it."""
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as ex:  # pragma: no cover - typer control flow
        sys.exit(ex.exit_code)
    except SystemExit:
        raise
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(2)
        if isinstance(err, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
