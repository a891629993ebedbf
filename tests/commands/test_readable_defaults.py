"""One default per option name across the commands (issue 24 item 10: `--tp`, `--model`, `--hardware`,
`--context`): every command's option gives the same default, or is in EXCEPTIONS with the reason, and the
commands' help says it (`[default: ...]` with the why)."""

from __future__ import annotations

import re

import pytest
import typer

from k3sim.commands import register_all

EXPECTED = {"--model": "models/kimi-k3.yaml", "--hardware": "h200", "--tp": "8", "--context": "32768"}

# (command, option) -> why it differs. A stale entry (the default agrees now) fails too.
EXCEPTIONS = {
    ("memory", "--tp"): "every layout degree defaults to the scenario schema's 1: the plan starts from one GPU and a "
                        "misfit names the single changes that fit",
    ("memory", "--context"): "131072, the default scenario's requests: memory sizes the longest request admitted",
    ("cp", "--tp"): "CP alone, every head on each rank, as the committed reports/cp",
    ("sweep", "--tp"): "a list of TP degrees to sweep; none given: the scenario's sweep grid",
    ("compare", "--hardware"): "the profiles to compare, a required list",
    # prefix-cache is helper D's (commands/prefix_cache.py): its per-GPU cache study runs at TP 1 and its help
    # does not yet say why; reported to the lead rather than changed here
    ("prefix-cache", "--tp"): "the per-GPU prefix-cache study at TP 1 (its reports/prefix_cache)",
}
UNEXPLAINED_IN_HELP = {("prefix-cache", "--tp"), ("sweep", "--tp"), ("compare", "--hardware")}


def _commands():
    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    register_all(app)

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    return list(walk(typer.main.get_group(app), []))


def effective_default(param) -> str:
    """What a command uses when the option is not given: its default, else the `[default: X]` its help writes
    (an option whose default is computed is None in the signature), else "required" / "none"."""
    if param.required:
        return "required"
    if param.default not in (None, [], ()):
        return str(param.default)
    m = re.search(r"\[default: ([^,\]\s]+)", param.help or "")
    return m.group(1) if m else "none"


def _table() -> dict[tuple[str, str], tuple[str, str]]:
    out = {}
    for path, cmd in _commands():
        for p in cmd.params:
            for opt in set(p.opts) & set(EXPECTED):
                out[(path, opt)] = (effective_default(p), p.help or "")
    return out


def test_one_default_per_option_name():
    table = _table()
    assert len({c for c, _ in table}) >= 8  # the walk found the commands
    wrong = {k: v[0] for k, v in table.items() if k not in EXCEPTIONS and v[0] != EXPECTED[k[1]]}
    assert not wrong, wrong
    assert table[("model-info", "--model")][0] == table[("memory", "--model")][0] == "models/kimi-k3.yaml"


@pytest.mark.parametrize("key", sorted(EXCEPTIONS))
def test_each_exception_still_differs_and_its_help_says_why(key):
    table = _table()
    assert key in table, key
    default, help_text = table[key]
    assert default != EXPECTED[key[1]], f"{key} agrees now: drop it from EXCEPTIONS"
    if key not in UNEXPLAINED_IN_HELP:
        assert "[default:" in help_text and len(help_text.split("[default:", 1)[1]) > 20, help_text
