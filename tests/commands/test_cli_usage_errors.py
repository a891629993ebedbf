"""Usage errors (wrong type, unknown option or command) are one line on stderr and exit code 2."""

from __future__ import annotations

import pytest

from conftest import run_cli


@pytest.mark.parametrize("argv, needle", [
    (["memory", "--tp", "abc"], "--tp"),
    (["model-info", "--bogus"], "--bogus"),
    (["no-such-command"], "no-such-command"),
])
def test_usage_error_is_one_line_exit_2(argv, needle):
    proc = run_cli(*argv)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("error: ") and needle in err
    assert "\n" not in err and "Traceback" not in proc.stderr
