"""The `k3sim` command line: parse, call a model, print. No model code lives here.

Each command is a function in `k3sim/commands/<name>.py` that imports its model lazily,
so `k3sim --help` only pays for typer.

The CLI contract lives here, in `main`, so a command gets it just by being registered:
- bad input (`InputError`, a click usage error): one line `error: ...` on stderr, exit 2;
- Ctrl-C (SIGINT): one line `interrupted` on stderr, exit 130 (128 + SIGINT, the shell convention); SIGTERM:
  one line `terminated`, exit 143 (128 + SIGTERM). Both become exceptions (`k3sim.procs`), so every
  `finally` runs: output files are written through `k3sim.files`, so an interrupted run leaves no partial
  file nor staging directory; worker processes are killed and reaped, and any descendant process still
  alive when the command ends is killed (`procs.reaped_children`, Linux);
- a closed pipe (`k3sim ... | head`), a closed stdout (`k3sim ... >&-`) or a full disk (`> /dev/full`): one
  line (none for a closed pipe or stdout, the reader is gone), exit 1, no traceback, also at interpreter
  exit; any other OSError (a path too long, no permission) is the user's input: one line, exit 2;
- every error line is capped at `MAX_ERROR_CHARS` characters (an echoed input value can be megabytes);
- help is plain click help: rich markup would swallow `[default: ...]` written in help texts, and rich
  help prints a `<bool>` type on every flag;
- `k3sim` or `k3sim <group>` without arguments prints the help on stdout and exits 0.
"""

from __future__ import annotations

import errno
import io
import os
import sys

import typer

from k3sim import procs
from k3sim.commands import LazyGroup, plain_help
from k3sim.errors import InputError, shorten
from k3sim.procs import Interrupted, Terminated  # noqa: F401 - the signals' exceptions, re-exported

# Longest error line printed (characters). A modelling choice: two terminal lines' worth keeps the cause
# and the fix readable while an echoed input value (a YAML alias bomb, a 1e6-digit number) is cut.
MAX_ERROR_CHARS = 300
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = procs.EXIT_INTERRUPTED  # 130 = 128 + SIGINT(2): what a shell reports after Ctrl-C
EXIT_TERMINATED = procs.EXIT_TERMINATED  # 143 = 128 + SIGTERM(15)
EXIT_OUTPUT_FAILED = 1

app = typer.Typer(
    help="k3sim: simulator and capacity planner for hybrid linear-attention MoE models (Kimi K3).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=LazyGroup,  # a command's module is imported when that command runs, not at start (k3sim.commands)
)


@app.command("version")
def version() -> None:
    """Print the k3sim version."""
    from k3sim import __version__

    print(__version__)


def _print_version(value: bool) -> None:
    """`k3sim --version`: the version on one line, exit 0, before any command module loads (eager)."""
    if value:
        version()
        raise typer.Exit()


@app.callback()
def root(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="Print the k3sim version and exit."),
) -> None:
    """The `k3sim` group's options (`--version`); the group's help is the app's."""


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Whitespace collapsed to single spaces and cut to `limit` characters (an ellipsis marks the cut)."""
    return shorten(" ".join(str(text).split()), limit)


def _say(line: str | None) -> None:
    """The one stderr line of an ending command (nothing if stderr is gone)."""
    if not line:
        return
    try:
        print(one_line(line), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again (closed pipe, full disk)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class _ClosedStdout(io.TextIOBase):
    """`sys.stdout` when the caller closed descriptor 1 (`k3sim ... >&-`): a reader that is gone, as a closed
    pipe's is, so the first write raises BrokenPipeError and the command exits 1 without a word. (Python
    sets `sys.stdout` to None then; a print to None is silently dropped and `sys.stdout.flush()` raised.)"""

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise BrokenPipeError(errno.EPIPE, "stdout is closed")
        return 0

    def fileno(self) -> int:
        return 1  # /dev/null by then (`_guard_std_streams`)

    def isatty(self) -> bool:
        return False


def _guard_std_streams() -> None:
    """A standard descriptor the caller closed (`<&-`, `>&-`, `2>&-`) is reopened on /dev/null, so no file this
    command opens takes number 0-2 (a library writing to "stderr" would write into a report, a child process
    would inherit it as its output). A closed stdout then acts as a closed pipe (`_ClosedStdout`); a closed
    stderr swallows the error line (the exit code still tells)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            devnull = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        except OSError:
            continue
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


# Library settings a command line sets for itself unless the caller chose (environment variables, read when the
# library loads):
# - no pydantic plugin (observability hooks found through package entry points): k3sim's schemas report to
#   none, and finding them scans the metadata of every installed distribution (~10 ms of each query);
# - one OpenBLAS thread: numpy's OpenBLAS starts its thread pool when numpy is imported, 50-90 ms of a 0.3 s
#   query on a 2-core machine, and k3sim's linear algebra is least squares over tens of points (the answers
#   are the same bits either way; tests/test_cli_env.py compares them). OpenBLAS also reads GOTO_NUM_THREADS
#   and OMP_NUM_THREADS: any of the three set by the caller is left to decide.
PYDANTIC_PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"  # pydantic's documented switch ("__all__": every plugin)
BLAS_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def _start_up_env() -> list[str]:
    """Set the settings above that the caller left unset (OpenBLAS only while numpy is not loaded yet: it reads
    them once); the names set."""
    wanted = {PYDANTIC_PLUGINS_ENV: "__all__"}
    if "numpy" not in sys.modules and not any(name in os.environ for name in BLAS_THREADS_ENV):
        wanted[BLAS_THREADS_ENV[0]] = "1"
    set_now = [name for name in wanted if name not in os.environ]
    for name in set_now:
        os.environ[name] = wanted[name]
    return set_now


def main(argv: list[str] | None = None) -> None:
    """Entry point: the CLI contract of the module docstring, for every registered command.

    `argv` None is the program itself (`k3sim ...`): once the command has ended, a late signal is ignored
    until the process exits, so nothing can interrupt the last line or the interpreter's shutdown. With
    `argv` given, main() runs inside another program (tests) and restores its signal handlers."""
    import warnings

    _guard_std_streams()
    # k3sim itself never warns (it refuses or labels); library notices (matplotlib's empty legend, pandas
    # deprecations) would add stderr lines to the one-line contract. `python -W ...` / PYTHONWARNINGS still
    # show them to whoever asks.
    saved_filters = warnings.filters[:]  # restored below: main() may run inside another program (tests)
    if not sys.warnoptions:
        warnings.simplefilter("ignore")
    set_env = _start_up_env()
    try:
        with procs.raising_signals(restore=argv is not None):
            try:
                code, line, stdout_text, broken = _run(argv)
                procs.settle()  # inside the try: a signal arriving here is still caught just below
                stop = procs.received()
                if stop is not None and code == 0:  # its exception was swallowed (a finaliser): still a stop
                    code, line, stdout_text, broken = stop.exit_code, stop.line, None, False
            except (Interrupted, Terminated) as stop:  # arrived after the command's own handling
                procs.settle()
                code, line, stdout_text, broken = stop.exit_code, stop.line, None, False
            if stdout_text is not None:
                try:
                    print(stdout_text, flush=True)
                except (OSError, ValueError):
                    code, broken = EXIT_OUTPUT_FAILED, True
            _say(line)
            if broken:
                _silence_stdout()
    finally:
        warnings.filters[:] = saved_filters
        _forget_model_overrides()
        if argv is not None:  # inside another program: its environment as it was
            for name in set_env:
                os.environ.pop(name, None)
    if argv is None:
        # The process ends now. Objects moved to the permanent generation are not traversed by the collections
        # the interpreter runs while it tears its modules down: with pandas, numpy and dask loaded those took
        # 0.5-1.5 s on a loaded 2-core machine, most of the 2 s a signal may take to end a command (0.1 s with
        # this). Every file k3sim writes is closed by then (`with` blocks); atexit handlers still run.
        import gc

        gc.freeze()
    if code:
        sys.exit(code)


def _forget_model_overrides() -> None:
    """The command's `--set` model overrides (`k3sim.configs.overrides`) end with it, on every path: its option
    callback installs them and the command's context removes them, but a usage error found after that option
    was read never enters the command (main() may run again in this process: tests)."""
    what_if = sys.modules.get("k3sim.configs.overrides")
    if what_if is not None:
        what_if.clear()


def _run(argv: list[str] | None) -> tuple[int, str | None, str | None, bool]:
    """Run the command; (exit code, stderr line or None, text for stdout or None, stdout broken).

    Every descendant process the command started is gone when this returns (`procs.reaped_children`), on
    every path: success, bad input, Ctrl-C, SIGTERM, a crash."""
    try:
        with procs.reaped_children():
            command = typer.main.get_group(app)  # a group even before any command module is loaded
            plain_help(command)  # plain click help on the tree; LazyGroup sets it on each module it loads
            rc = command.main(args=argv, prog_name="k3sim", standalone_mode=False)
            sys.stdout.flush()  # a full disk shows up here for buffered output
        # click returns (not raises) a command's typer.Exit(code) when standalone_mode is off: e.g.
        # `plan --json` of a layout that does not fit prints its data, then exits 2
        return (rc if isinstance(rc, int) else 0), None, None, False
    except InputError as err:
        return EXIT_BAD_INPUT, f"error: {err}", None, False
    except (Interrupted, Terminated) as stop:
        return stop.exit_code, stop.line, None, False
    except KeyboardInterrupt:  # a SIGINT handled by Python's default handler (before ours, or a library's)
        return EXIT_INTERRUPTED, Interrupted.line, None, False
    except typer.Exit as ex:  # pragma: no cover - typer control flow
        return ex.exit_code, None, None, False
    except SystemExit as ex:
        if ex.code is None or isinstance(ex.code, int):
            return ex.code or 0, None, None, False
        return 1, str(ex.code), None, False
    except BrokenPipeError:
        return EXIT_OUTPUT_FAILED, None, None, True  # the reader went away (`| head`): nothing to say to it
    except OSError as err:
        what = f"{err.strerror or err.__class__.__name__}" + (f": {err.filename}" if err.filename else "")
        if err.errno in (errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EFBIG, errno.EDQUOT):
            return EXIT_OUTPUT_FAILED, f"error: cannot write output ({what})", None, True
        # anything else (a name too long, a permission, a missing path) came from what the user gave
        return EXIT_BAD_INPUT, f"error: {what}", None, False
    except Exception as err:
        # Usage errors from click, or from the copy of click that typer vendors: duck-typed, since
        # the two class hierarchies differ between typer releases.
        if type(err).__name__ == "NoArgsIsHelpError":
            return 0, None, err.format_message(), False  # type: ignore[attr-defined]  # the help text itself
        if callable(getattr(err, "format_message", None)) and hasattr(err, "exit_code"):
            return EXIT_BAD_INPUT, f"error: {_usage_error_line(err)}", None, False
        if type(err).__name__ == "Abort":
            return EXIT_INTERRUPTED, Interrupted.line, None, False
        raise


def _usage_error_line(err: Exception) -> str:
    """One line: the option (when known) and the reason."""
    message = " ".join(str(err.format_message()).split())  # type: ignore[attr-defined]
    param = getattr(err, "param", None)
    opts = getattr(param, "opts", None) or []
    return f"{opts[0]}: {message}" if opts and opts[0] not in message else message


if __name__ == "__main__":  # pragma: no cover
    main()
