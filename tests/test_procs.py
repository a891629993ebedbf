"""k3sim.procs: signals as exceptions, the one process pool, the descendant backstop (Linux /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from k3sim import procs
from k3sim.errors import InputError


def _square(x: int) -> int:
    return x * x


def _refuse(x: int) -> int:
    if x == 3:
        raise InputError("three is refused", source="--x", field="value")
    return x


def _die(x: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def _signal_self(sig: int) -> int:
    """A Ctrl-C or SIGTERM reaching a worker (a terminal signals the whole group): the worker carries on."""
    os.kill(os.getpid(), sig)
    time.sleep(0.05)
    return os.getpid()


def _sleep(x: float) -> float:
    time.sleep(x)
    return x


@pytest.fixture
def no_new_children():
    """The test leaves no child process of this one behind."""
    before = set(procs.children(os.getpid()))
    yield
    assert set(procs.children(os.getpid())) - before == set()


@pytest.fixture
def signal_soon():
    """Send `sig` to this process after `delay_s` (from a timer, so it lands while the test blocks)."""
    previous = signal.getsignal(signal.SIGALRM)

    def arm(sig: int, delay_s: float = 0.3) -> None:
        signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), sig))
        signal.setitimer(signal.ITIMER_REAL, delay_s)

    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("processes, tasks", [(1, 5), (3, 5), (8, 2)])
def test_pool_returns_every_result_on_at_most_one_worker_per_task(no_new_children, processes, tasks):
    with procs.ProcessPool(processes) as pool:
        got = sorted(pool.imap_unordered(_square, range(tasks)))
        assert len(procs.children(os.getpid())) <= min(processes, tasks)
    assert got == [i * i for i in range(tasks)]


def test_a_task_error_is_raised_in_the_parent_with_its_message(no_new_children):
    with pytest.raises(InputError, match="--x: field 'value': three is refused"):
        with procs.ProcessPool(2) as pool:
            list(pool.imap_unordered(_refuse, range(6)))


def test_a_worker_that_dies_is_an_error_not_a_hang(no_new_children):
    with pytest.raises(RuntimeError, match="killed by signal 9"):
        with procs.ProcessPool(2) as pool:
            list(pool.imap_unordered(_die, range(3)))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_workers_ignore_the_signals_the_parent_handles(no_new_children, sig):
    with procs.ProcessPool(2) as pool:
        assert len(list(pool.imap_unordered(_signal_self, [sig] * 4))) == 4


@pytest.mark.parametrize("sig, exc", [(signal.SIGINT, procs.Interrupted), (signal.SIGTERM, procs.Terminated)])
def test_a_signal_in_the_parent_stops_the_pool_at_once(no_new_children, signal_soon, sig, exc):
    """The workers are in a 30 s task; leaving the pool kills them instead of waiting for them."""
    before = signal.getsignal(sig)
    t0 = time.monotonic()
    signal_soon(sig, 0.5)
    with pytest.raises(exc):
        with procs.raising_signals():
            with procs.ProcessPool(2) as pool:
                list(pool.imap_unordered(_sleep, [30.0] * 4))
    assert time.monotonic() - t0 < 10  # not 30 s per task
    assert signal.getsignal(sig) is before  # the previous handler is back


@pytest.mark.parametrize("sig, exc, code", [(signal.SIGINT, procs.Interrupted, 130),
                                            (signal.SIGTERM, procs.Terminated, 143)])
def test_raising_signals_turns_the_first_signal_into_its_exception(signal_soon, sig, exc, code):
    signal_soon(sig)
    with pytest.raises(exc) as info:
        with procs.raising_signals():
            time.sleep(5)
    assert info.value.exit_code == code


def test_a_second_signal_cannot_cut_the_cleanup_short():
    cleaned = []
    with pytest.raises(procs.Terminated):
        with procs.raising_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # pragma: no cover - the signal lands first
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # a second signal while cleaning up: counted, not raised
                time.sleep(0.05)
                cleaned.append(True)
    assert cleaned == [True]


def test_a_signal_held_while_children_start_arrives_after():
    """In a fresh process: a signal mask is per thread, so in a process with other threads (a test runner's,
    a library's) the kernel may hand the signal to one of them and Python runs the handler at once. k3sim
    forks its pools from the main thread before it starts any other."""
    code = textwrap.dedent("""
        import os, signal, time
        from k3sim import procs
        held = False
        try:
            with procs.raising_signals():
                with procs.signals_blocked():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                    held = True  # still here: the signal waits
                time.sleep(1)
        except procs.Terminated:
            print("terminated after the block" if held else "terminated inside the block")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "terminated after the block", (proc.stdout, proc.stderr)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="the backstop walks Linux /proc")
def test_the_backstop_kills_what_appeared_in_the_block_and_spares_the_rest():
    old = subprocess.Popen(["sleep", "30"])
    try:
        with procs.reaped_children():
            new = subprocess.Popen(["sleep", "30"])
            grandchild_parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
            time.sleep(0.2)
            grandchildren = procs.descendants(grandchild_parent.pid)
        assert grandchildren and not procs.alive(new.pid) and not procs.alive(grandchild_parent.pid)
        deadline = time.monotonic() + 5
        while any(procs.alive(p) for p in grandchildren) and time.monotonic() < deadline:
            time.sleep(0.05)  # the grandchild was reparented; its new parent reaps it
        assert not any(procs.alive(p) for p in grandchildren)
        assert procs.alive(old.pid)
    finally:
        old.kill()
        old.wait()
        for p in (new, grandchild_parent):
            p.wait(timeout=5)


@pytest.mark.parametrize("requested, tasks, expected", [(None, 1, 1), (1000, 2, 2), (2, 100, 2), (4, 0, 1)])
def test_worker_count_never_exceeds_the_tasks(requested, tasks, expected):
    assert procs.worker_count(requested, tasks) == expected


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="the backstop walks Linux /proc")
def test_the_backstop_finds_an_orphan_whose_parent_was_killed_first():
    """`subprocess.run` kills its child on Ctrl-C; the child's own children (torchrun's ranks) were orphaned
    to init, out of reach of a walk from this process. As a subreaper, this process inherits them."""
    with procs.reaped_children():
        parent = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        orphan = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while orphan not in procs.children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert orphan in procs.children(os.getpid())  # re-parented here, not to init
    assert not procs.alive(orphan)


def test_a_signal_whose_exception_was_swallowed_still_ends_the_command_with_its_code():
    """A handler's exception raised inside a finaliser is printed as "ignored" and lost; the first signal is
    remembered so the CLI does not report success (a plan once ran to exit 0 after SIGTERM)."""
    with procs.raising_signals():
        class Finaliser:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs here and its Terminated is swallowed by __del__

        Finaliser()
        assert procs.received() is procs.Terminated
    with procs.raising_signals():
        assert procs.received() is None  # each command starts clean


def test_a_checkpoint_raises_a_signal_whose_exception_was_lost():
    """A handler's raise inside a finaliser is printed as "ignored" and lost; the next checkpoint of a long loop
    raises it again, once."""
    import signal

    from k3sim import procs

    with procs.raising_signals():
        class Finalised:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)  # the handler raises here, inside __del__: lost

        Finalised()
        assert procs.received() is procs.Interrupted
        with pytest.raises(procs.Interrupted):
            procs.checkpoint()
        procs.checkpoint()  # once only: the cleanup it started is not interrupted again
    procs.checkpoint()  # a new command (raising_signals) starts clean


def _in_fresh_python(code: str, stream: str = "stdout") -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return getattr(done, stream).strip()


def test_start_up_collections_deferred_then_frozen_and_restored():
    """Until the first collection the gen0 threshold is raised (no start-up collection); the first one freezes its
    survivors and restores CPython's thresholds, so a long command collects as usual afterwards."""
    out = _in_fresh_python(
        "import gc\n"
        "from k3sim import procs\n"
        "normal = gc.get_threshold()\n"
        "procs.defer_start_up_collections()\n"
        "procs.defer_start_up_collections()  # idempotent\n"
        "raised = gc.get_threshold()[0]\n"
        "junk = [[i] for i in range(50_000)]  # far beyond 700: no collection yet\n"
        "before = gc.get_count()[0]\n"
        "gc.collect()\n"
        "print(raised, before >= 50_000, gc.get_threshold() == normal, gc.get_freeze_count() > 50_000,\n"
        "      len(gc.callbacks))\n")
    from k3sim import procs

    raised, many, restored, frozen, callbacks = out.split()
    assert int(raised) == procs.START_UP_GEN0_THRESHOLD > 700
    assert (many, restored, frozen, callbacks) == ("True", "True", "True", "0")


def test_importing_k3sim_leaves_the_collector_alone():
    """Only the program's entry point defers collections: a library import (a test, a notebook) does not."""
    out = _in_fresh_python("import gc\nt = gc.get_threshold()\nimport k3sim.cli, k3sim.procs\n"
                           "print(gc.get_threshold() == t, len(gc.callbacks))")
    assert out == "True 0"


def test_entry_point_defers_collections():
    """`python -m k3sim` runs the CLI through `procs.defer_start_up_collections` (the console script too:
    pyproject's `k3sim = "k3sim.__main__:run"`)."""
    from pathlib import Path

    import k3sim
    import k3sim.procs

    pyproject = (Path(k3sim.__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'k3sim = "k3sim.__main__:run"' in pyproject
    out = _in_fresh_python("import gc, runpy, sys\nsys.argv = ['k3sim', '--version']\n"
                           "import k3sim.cli\n"
                           "orig = k3sim.cli.main\n"
                           "def spy(argv=None):\n"
                           "    print(gc.get_threshold()[0], file=sys.stderr)\n"
                           "    orig(argv)\n"
                           "k3sim.cli.main = spy\n"
                           "try:\n    runpy.run_module('k3sim', run_name='__main__')\nexcept SystemExit:\n    pass\n",
                           stream="stderr")
    assert out == str(k3sim.procs.START_UP_GEN0_THRESHOLD)  # the threshold the CLI's main() runs under
