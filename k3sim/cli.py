"""The `k3sim` command line: parse, call a model, print. No model code lives here.

Each command is a function in `k3sim/commands/<name>.py` that imports its model lazily,
so `k3sim --help` only pays for typer.

The CLI contract lives here, in `main`, so a command gets it just by being registered:
- bad input (`InputError`, a click usage error): one line `error: ...` on stderr, exit 2;
- Ctrl-C (SIGINT): one line `interrupted` on stderr, exit 130 (128 + SIGINT, the shell convention); output
  files are written through `k3sim.files`, so an interrupted run leaves no partial file;
- a closed pipe (`k3sim ... | head`) or a full disk (`> /dev/full`): one line (none for a closed pipe, the
  reader is gone), exit 1, no traceback; any other OSError (a path too long, no permission) is the user's
  input: one line, exit 2;
- every error line is capped at `MAX_ERROR_CHARS` characters (an echoed input value can be megabytes);
- help is plain click help: rich markup would swallow `[default: ...]` written in help texts, and rich
  help prints a `<bool>` type on every flag;
- `k3sim` or `k3sim <group>` without arguments prints the help on stdout and exits 0.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

import typer

from k3sim.errors import InputError, shorten

# Longest error line printed (characters). A modelling choice: two terminal lines' worth keeps the cause
# and the fix readable while an echoed input value (a YAML alias bomb, a 1e6-digit number) is cut.
MAX_ERROR_CHARS = 300
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT(2): what a shell reports for a process stopped by Ctrl-C
EXIT_OUTPUT_FAILED = 1

app = typer.Typer(
    help="k3sim: simulator and capacity planner for hybrid linear-attention MoE models (Kimi K3).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.command("version")
def version() -> None:
    """Print the k3sim version."""
    from k3sim import __version__

    print(__version__)


class Interrupted(BaseException):
    """Raised by our SIGINT handler. Not a KeyboardInterrupt, so click does not turn it into an Abort with an
    extra blank stderr line, and not an Exception, so no `except Exception` in a model swallows it."""


def _on_sigint(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Interrupted()


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Whitespace collapsed to single spaces and cut to `limit` characters (an ellipsis marks the cut)."""
    return shorten(" ".join(str(text).split()), limit)


def _fail(message: str, code: int, *, output_broken: bool = False) -> None:
    try:
        print(one_line(message), file=sys.stderr, flush=True)
    except OSError:
        pass
    if output_broken:
        _silence_stdout()
    sys.exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again (closed pipe, full disk)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _plain_help(command) -> None:
    """Plain click help for every command and group (see the module docstring), set on the built tree so
    sub-apps registered by any command module get it too."""
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


_registered = False


def _register() -> None:
    """Register every command module once (main() may run several times in one process, e.g. in tests)."""
    global _registered
    if _registered:
        return
    from k3sim.commands import register_all

    register_all(app)
    _registered = True


def main(argv: list[str] | None = None) -> None:
    """Entry point: the CLI contract of the module docstring, for every registered command."""
    import warnings

    # k3sim itself never warns (it refuses or labels); library notices (matplotlib's empty legend, pandas
    # deprecations) would add stderr lines to the one-line contract. `python -W ...` / PYTHONWARNINGS still
    # show them to whoever asks.
    saved_filters = warnings.filters[:]  # restored below: main() may run inside another program (tests)
    if not sys.warnoptions:
        warnings.simplefilter("ignore")
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        _register()
        command = typer.main.get_command(app)
        _plain_help(command)
        rc = command.main(args=argv, prog_name="k3sim", standalone_mode=False)
        sys.stdout.flush()  # a full disk shows up here for buffered output
        if isinstance(rc, int) and rc:
            # click returns (not raises) a command's typer.Exit(code) when standalone_mode is off: e.g.
            # `plan --json` of a layout that does not fit prints its data, then exits 2
            sys.exit(rc)
    except InputError as err:
        _fail(f"error: {err}", EXIT_BAD_INPUT)
    except (Interrupted, KeyboardInterrupt):
        _fail("interrupted", EXIT_INTERRUPTED)
    except typer.Exit as ex:  # pragma: no cover - typer control flow
        sys.exit(ex.exit_code)
    except SystemExit:
        raise
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`): nothing to say to it
        sys.exit(EXIT_OUTPUT_FAILED)
    except OSError as err:
        what = f"{err.strerror or err.__class__.__name__}" + (f": {err.filename}" if err.filename else "")
        if err.errno in (errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EFBIG, errno.EDQUOT):
            _fail(f"error: cannot write output ({what})", EXIT_OUTPUT_FAILED, output_broken=True)
        # anything else (a name too long, a permission, a missing path) came from what the user gave
        _fail(f"error: {what}", EXIT_BAD_INPUT)
    except Exception as err:
        # Usage errors from click, or from the copy of click that typer vendors: duck-typed, since
        # the two class hierarchies differ between typer releases.
        if type(err).__name__ == "NoArgsIsHelpError":
            print(err.format_message())  # type: ignore[attr-defined]  # the help text itself
            sys.exit(0)
        if callable(getattr(err, "format_message", None)) and hasattr(err, "exit_code"):
            _fail(f"error: {_usage_error_line(err)}", EXIT_BAD_INPUT)
        if type(err).__name__ == "Abort":
            _fail("interrupted", EXIT_INTERRUPTED)
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        warnings.filters[:] = saved_filters


def _usage_error_line(err: Exception) -> str:
    """One line: the option (when known) and the reason."""
    message = " ".join(str(err.format_message()).split())  # type: ignore[attr-defined]
    param = getattr(err, "param", None)
    opts = getattr(param, "opts", None) or []
    return f"{opts[0]}: {message}" if opts and opts[0] not in message else message


if __name__ == "__main__":  # pragma: no cover
    main()
