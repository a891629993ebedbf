"""The top-level command table (k3sim.commands.COMMANDS) that lets `k3sim --help` and a single command start
without importing every command module: it must say what the modules register."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from k3sim.commands import COMMAND_MODULES, COMMANDS, register_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from hostile_helpers import run_main  # noqa: E402


def eager_group():
    """The tree as registering every module up front builds it (the CLI before lazy loading)."""
    from k3sim.cli import root, version

    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command("version")(version)
    app.callback()(root)  # the group's own options (--version)
    register_all(app)
    return typer.main.get_group(app)


def test_table_names_every_command_in_the_listed_order():
    eager = [n for n in eager_group().commands if n != "version"]
    assert list(COMMANDS) == eager
    assert sorted({e.module for e in COMMANDS.values()}) == sorted(COMMAND_MODULES)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_table_help_is_the_commands_own(name):
    """The one-line help `k3sim --help` shows comes from the table: it must be the command's first paragraph."""
    cmd = eager_group().commands[name]
    assert COMMANDS[name].help == cmd.help.split("\n\n")[0]
    sub = typer.Typer()
    importlib.import_module(f"k3sim.commands.{COMMANDS[name].module}").register(sub)
    assert name in typer.main.get_group(sub).commands  # the module the table names registers it


def test_lazy_help_listing_equals_the_eager_one(capsys):
    code, lazy, _ = run_main(capsys, "--help")
    assert code == 0
    from k3sim.cli import app

    group = eager_group()
    group.help = app.info.help
    group.main(["--help"], prog_name="k3sim", standalone_mode=False)
    eager = capsys.readouterr().out
    assert "kernel-time" in lazy and lazy == eager


@pytest.mark.parametrize("argv,loaded", [
    (["--help"], []),
    (["kernel-time", "--help"], ["kernel_time"]),
    (["model-info", "--help"], ["model_info", "options"]),  # options: the shared --set (MODEL_SET)
])
def test_a_command_imports_only_its_module(argv, loaded):
    """A real process (imports are per process): `--help` imports no command module and no pydantic schema."""
    code = ("import sys\nfrom k3sim.cli import main\ntry:\n    main(" + repr(argv) + ")\nexcept SystemExit:\n    pass\n"
            "mods = sorted(m.split('.')[-1] for m in sys.modules if m.startswith('k3sim.commands.'))\n"
            "print('MODULES=' + ','.join(mods), 'PYDANTIC=' + str('pydantic' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    mods, pyd = out.strip().splitlines()[-1].split()
    assert [m for m in mods.removeprefix("MODULES=").split(",") if m] == loaded
    if argv == ["--help"]:
        assert pyd == "PYDANTIC=False"


@pytest.mark.parametrize("typo,hint", [("kernel-tim", "'kernel-time'"), ("prefix_cache", "'prefix-cache'"),
                                       ("versio", "'version'"), ("calibrat", "'calibrate'")])
def test_a_typo_is_told_the_command_it_resembles(capsys, typo, hint):
    """The suggestion looks at every command, not only the loaded ones (typer's own looks at those)."""
    code, out, err = run_main(capsys, typo)
    assert code == 2 and out == "" and f"No such command '{typo}'. Did you mean {hint}?" in err
