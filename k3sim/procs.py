"""Process trees: signals become exceptions, children are started and stopped in one place.

The CLI contract (`k3sim.cli.main`) says Ctrl-C (SIGINT) and SIGTERM end every command promptly with one line
and exit 130 / 143, and leave no child process behind. Three pieces make that true wherever a command starts
processes:

- `raising_signals()` (installed by `cli.main`): SIGINT raises `Interrupted`, SIGTERM raises `Terminated`.
  Both are BaseExceptions, so no `except Exception` in a model swallows them and every `finally` (staging
  directories, temp files, pools) runs. After the first signal the next ones are only counted: a second
  Ctrl-C cannot cut the cleanup of the first short.
- `ProcessPool`: forked workers that ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
  group; the parent alone reports it). They are forked with both signals blocked, so a signal that arrives
  while they start is neither missed by the parent nor run by a worker as the parent's handler. Each worker
  has its own pipe (no lock shared between processes, so a killed worker cannot leave one held); leaving
  the pool, on any path, kills and reaps every worker within a bounded wait. Workers also die with the
  parent (`PR_SET_PDEATHSIG`), so even `kill -9` of the command leaves no computing orphan.
- `reaped_children()` (also around every command in `cli.main`): the backstop. It kills every descendant
  process that appeared during the block and is still alive when it ends, whoever started it (a library's
  pool, a Dask worker, torchrun's ranks), orphans included (the command is their subreaper meanwhile).
  Descendants are found by walking `/proc/<pid>/task/*/children`, which is Linux only; elsewhere the
  backstop does nothing and the pools' own teardown is what stops the workers.

Only the standard library (and `k3sim.errors`) is imported here: it is the ground layer under the CLI.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

# Seconds the teardown waits for killed processes to be reaped. SIGKILL cannot be caught, so a process is
# gone as soon as the kernel schedules it; the margin covers a loaded machine while keeping the whole exit
# well inside the contract's 2 s.
KILL_WAIT_S = 1.0

EXIT_INTERRUPTED = 130  # 128 + SIGINT(2): what a shell reports for a process stopped by Ctrl-C
EXIT_TERMINATED = 143   # 128 + SIGTERM(15): what a shell reports for `kill PID`

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised by the SIGINT handler. Not a KeyboardInterrupt, so click does not turn it into an Abort with an
    extra blank stderr line, and not an Exception, so no `except Exception` in a model swallows it."""

    exit_code = EXIT_INTERRUPTED
    line = "interrupted"


class Terminated(BaseException):
    """Raised by the SIGTERM handler (`kill PID`, a job scheduler, `timeout`): unwinds like Ctrl-C, so staging
    directories and pools are cleaned up, instead of the default action that killed the process mid-write."""

    exit_code = EXIT_TERMINATED
    line = "terminated"


_RAISES = {signal.SIGINT: Interrupted, signal.SIGTERM: Terminated}
_stopping = False  # set by the first signal: the cleanup it starts must not be interrupted again


_received: int | None = None  # the first signal of the command, kept even if its exception was swallowed
_rearmed = False  # a checkpoint raised the lost signal again


# Start-up collections. A query's start allocates ~70,000-150,000 container objects net (CPython's gen0 counter:
# a warm `decode` ran 101 gen0 collections at the default threshold of 700, 111 in all, one of them full; `cp`
# 214, 234 in all), nearly all long-lived (modules, classes, pydantic schemas, numpy). The collections traverse
# them in vain: 36-61 ms of a 0.33 s warm `decode`, 86 ms of a `cp` query on the 2-core machine (each collection
# timed with gc.callbacks). Until the first collection the gen0 threshold is raised; that collection (any,
# explicit ones too) is followed by `gc.freeze()`, which moves every survivor to the permanent generation, and by
# CPython's own thresholds again, so a long command (a serving DES, a search) collects as usual and never
# rescans start-up objects. The raised threshold is a choice, not a fit: above the largest what-if measured
# (cp's ~150,000), and it bounds the container objects allocated (net) before the first collection.
START_UP_GEN0_THRESHOLD = 200_000
_deferred: list = []  # the installed callback, once: a second call is a no-op


def defer_start_up_collections() -> None:
    """Raise the gen0 threshold until the first collection, then freeze the survivors and restore the thresholds
    (see START_UP_GEN0_THRESHOLD). Called once by the program's entry point (`k3sim/__main__.py`), never by a
    library import: a test or a notebook running k3sim keeps its own collector settings."""
    import gc

    if _deferred:
        return
    normal = gc.get_threshold()

    def settle(phase: str, info: dict) -> None:  # noqa: ARG001 - gc callback signature
        if phase == "stop" and settle in gc.callbacks:
            gc.callbacks.remove(settle)
            gc.freeze()
            gc.set_threshold(*normal)

    _deferred.append(settle)
    gc.callbacks.append(settle)
    gc.set_threshold(max(START_UP_GEN0_THRESHOLD, normal[0]), *normal[1:])


def _raise_for(signum, frame):  # noqa: ARG001 - signal handler signature
    global _stopping, _received
    if _stopping:
        return  # a second Ctrl-C or SIGTERM while the first one's cleanup runs: already stopping
    _stopping = True
    _received = signum
    raise _RAISES[signum]()


def received() -> type[BaseException] | None:
    """The exception of the first signal the command received, or None. A handler's exception raised while
    Python runs a finaliser or a C callback is printed as "ignored" and lost; the CLI still ends with that
    signal's exit code (`cli.main`), so a swallowed Ctrl-C never reads as success."""
    return None if _received is None else _RAISES[_received]


def checkpoint() -> None:
    """Raise the received signal's exception again if its first raise was lost (a handler that raises while
    Python runs a finaliser or a C callback, e.g. a simpy generator closed by the garbage collector, is
    printed as "ignored"): long loops call this once per iteration (a serving replica's engine step), so
    Ctrl-C stops the work and leaves the previous output, instead of only changing the exit code at the end.
    A signal whose exception propagated never reaches a checkpoint: its stack is unwinding."""
    global _rearmed
    if _received is not None and not _rearmed:
        _rearmed = True  # once: the cleanup this raise starts runs undisturbed
        raise _RAISES[_received]()


@contextmanager
def raising_signals(*, restore: bool = True) -> Iterator[None]:
    """For the block, SIGINT raises `Interrupted` and SIGTERM `Terminated` in the main thread.

    `restore`: put the previous handlers back afterwards (main() inside another program, e.g. pytest); without
    it the handlers stay, settled (`settle`), so a signal during the interpreter's shutdown changes nothing."""
    global _stopping, _received, _rearmed
    _stopping, _received, _rearmed = False, None, False
    previous = {s: signal.signal(s, _raise_for) for s in _SIGNALS}
    try:
        yield
    finally:
        if restore:
            for s, handler in previous.items():
                signal.signal(s, handler)
            _stopping = False
        else:
            settle()


def settle() -> None:
    """The command is over (or stopping): from now on SIGINT and SIGTERM are ignored by `raising_signals`'
    handlers, so the last line and the cleanup cannot be interrupted."""
    global _stopping
    _stopping = True


@contextmanager
def signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held (pending, not lost) in this thread for the block: fork children inside it, so a
    child starts with them blocked and ignores them (`quiet_child`) before it could run the parent's handler;
    the parent receives a held signal when the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def quiet_child() -> None:
    """First thing in a forked worker: ignore SIGINT and SIGTERM (a signal pending since the fork is discarded
    by SIG_IGN), then unblock them; and die when the parent dies (Linux `PR_SET_PDEATHSIG`)."""
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    _die_with_parent()


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux only; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


# ------------------------------------------------------------------------------------------ the pool
def _worker_main(fn: Callable, conn, inherited: list) -> None:
    """A worker's loop: task in, ("ok", result) or ("err", exception) out, until the pipe closes (the parent
    closed its end or died). Nothing escapes it: multiprocessing would print a traceback for it."""
    quiet_child()
    for c in inherited:  # the parent's ends of the pipes, this worker's own included, copied by fork
        c.close()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", fn(task))
        except Exception as err:  # the parent re-raises it
            reply = ("err", err)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception as err:  # an unpicklable result or exception
            try:
                conn.send(("err", RuntimeError(f"{type(err).__name__}: {err}")))
            except Exception:  # noqa: BLE001 - the parent sees the worker end without a result
                return


class ProcessPool:
    """Up to `processes` forked workers, each running `fn` on tasks sent over its own pipe.

    Use as a context manager; `imap_unordered(fn, tasks)` yields results as workers finish them (task order is
    the caller's business: return an index with each result). A task's exception is re-raised in the parent;
    a worker that dies (killed, out of memory) raises RuntimeError. Leaving the `with` block on any path
    (results done, an exception, Ctrl-C, SIGTERM) kills and reaps every worker. Fork only: workers inherit the
    parent's modules and data (a parsed trace, warm step-cost tables), nothing is re-imported or pickled but
    the tasks and results."""

    def __init__(self, processes: int):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes = processes
        self._workers: list[tuple[object, object]] = []  # (Process, parent's end of its pipe)

    def __enter__(self) -> "ProcessPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, fn: Callable, n: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        with signals_blocked():
            for _ in range(n):
                mine, theirs = ctx.Pipe(duplex=True)
                inherited = [c for _, c in self._workers] + [mine]  # fork: passed in memory, not pickled
                p = ctx.Process(target=_worker_main, args=(fn, theirs, inherited), daemon=True)
                self._workers.append((p, mine))  # before start(): close() reaches it whatever happens next
                p.start()
                theirs.close()

    def imap_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        """Results of `fn(task)` in completion order, on min(processes, tasks) workers started here."""
        from multiprocessing.connection import wait

        queue = list(tasks)
        n = min(self.processes, len(queue))
        if n == 0:
            return
        self._start(fn, n)
        queue.reverse()  # pop() from the end: tasks go out in the caller's order
        busy = {}
        for p, conn in self._workers[-n:]:
            if queue:
                conn.send(queue.pop())
                busy[conn] = p
        while busy:
            ready = wait([*busy, *(p.sentinel for p in busy.values())])
            for conn in [c for c in busy if c in ready]:
                p = busy.pop(conn)
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    raise RuntimeError(_died(p)) from None
                if kind == "err":
                    raise value
                if queue:
                    conn.send(queue.pop())
                    busy[conn] = p
                yield value
            for conn, p in list(busy.items()):
                if p.sentinel in ready and not conn.poll():
                    raise RuntimeError(_died(p))

    def close(self) -> None:
        """Kill every worker and reap it (bounded by `KILL_WAIT_S`); idempotent."""
        workers, self._workers = self._workers, []
        for p, conn in workers:
            try:
                if p.pid is not None and p.exitcode is None:
                    p.kill()
            except (OSError, ValueError):
                pass
            conn.close()
        deadline = time.monotonic() + KILL_WAIT_S
        for p, _ in workers:
            if p.pid is not None:
                p.join(max(0.0, deadline - time.monotonic()))


def _died(p) -> str:
    p.join(KILL_WAIT_S)
    how = f"killed by signal {-p.exitcode}" if p.exitcode is not None and p.exitcode < 0 else f"exit code {p.exitcode}"
    return f"a worker process ended without its result ({how}; out of memory?)"


def worker_count(requested: int | None, tasks: int) -> int:
    """Processes to start for `tasks` tasks: the request (default: one per core), never more than the tasks
    (an idle process only costs memory and start-up time), at least 1."""
    want = requested if requested is not None else (os.cpu_count() or 1)
    return max(1, min(want, tasks))


# ------------------------------------------------------------------------------------------ the backstop
def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux: `/proc/<pid>/task/*/children`; [] where that does not exist)."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (default: this one), parents before their children."""
    seen: list[int] = []
    frontier = [os.getpid() if pid is None else pid]
    while frontier:
        nxt = []
        for p in frontier:
            for c in children(p):
                if c not in seen:
                    seen.append(c)
                    nxt.append(c)
        frontier = nxt
    return seen


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has ended; only its exit status waits to be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def kill_descendants(keep: Iterable[int] = ()) -> list[int]:
    """SIGKILL every descendant of this process except `keep` and theirs; wait (bounded) until they have
    ended and reap those that are our own children. Returns the pids killed."""
    keep = set(keep)
    spared = set(keep)
    for k in keep:
        spared.update(descendants(k))
    victims = [p for p in descendants() if p not in spared]
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + KILL_WAIT_S
    while any(alive(p) for p in victims) and time.monotonic() < deadline:
        time.sleep(0.01)
    _reap(victims)
    return victims


def _reap(pids: list[int]) -> None:
    """Collect the exit status of our killed children (multiprocessing's own first, so it does not find a
    child that vanished under it), leaving no zombie."""
    try:
        multiprocessing = sys.modules.get("multiprocessing")  # never imported: it started no child to reap
        if multiprocessing is not None:
            multiprocessing.active_children()
    except Exception:  # noqa: BLE001 - a best-effort backstop
        pass
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except OSError:  # not our child (a grandchild: its new parent reaps it) or already reaped
            pass


@contextmanager
def reaped_children() -> Iterator[None]:
    """Around a whole command: on leaving the block, kill every descendant that appeared inside it (the
    processes that were already there, e.g. a test runner's, are spared). For the block this process is a
    child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a grandchild whose parent dies first (torchrun's ranks
    when `subprocess.run` kills torchrun on Ctrl-C) is re-parented here instead of to init, so the walk still
    finds it."""
    before = children(os.getpid())
    previous = _subreaper(True)
    try:
        yield
    finally:
        try:
            if sys.platform.startswith("linux"):
                kill_descendants(keep=before)
        finally:
            if previous is not None:
                _subreaper(previous)


def _subreaper(on: bool) -> bool | None:
    """Set this process's child-subreaper flag; returns the previous value (None where unsupported)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper, pr_get_child_subreaper = 36, 37  # <linux/prctl.h>
        old = ctypes.c_int(0)
        if libc.prctl(pr_get_child_subreaper, ctypes.byref(old), 0, 0, 0) != 0:
            return None
        libc.prctl(pr_set_child_subreaper, int(on), 0, 0, 0)
        return bool(old.value)
    except (OSError, AttributeError):
        return None
