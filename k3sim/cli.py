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
    except Exception as err:
        # Usage errors from click, or from the copy of click that typer vendors: duck-typed, since
        # the two class hierarchies differ between typer releases.
        if callable(getattr(err, "format_message", None)) and hasattr(err, "exit_code"):
            print(f"error: {_usage_error_line(err)}", file=sys.stderr)
            sys.exit(2)
        if type(err).__name__ == "Abort":
            sys.exit(1)
        raise


def _usage_error_line(err: Exception) -> str:
    """One line: the option (when known) and the reason."""
    message = " ".join(str(err.format_message()).split())  # type: ignore[attr-defined]
    param = getattr(err, "param", None)
    opts = getattr(param, "opts", None) or []
    return f"{opts[0]}: {message}" if opts and opts[0] not in message else message

if __name__ == "__main__":  # pragma: no cover
    main()
