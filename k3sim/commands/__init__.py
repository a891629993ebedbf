"""CLI commands, one module each. Every module exposes `register(app)` and imports its model lazily.

A command's module is imported only when that command runs (or its help is shown): `LazyGroup`, the class of
the top-level `k3sim` group, knows each command's name, module and one-line help (`COMMANDS`) and registers
the module on first use. `k3sim --help` therefore imports no command module (memory's registration alone
built the pydantic schemas, ~0.15 s), and `k3sim kernel-time ...` imports kernel_time only.
`tests/commands/test_command_table.py` checks that the table matches what the modules register.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import typer
from typer.core import TyperGroup


class Entry(NamedTuple):
    """A top-level command: the module under k3sim.commands that registers it, and the first paragraph of its
    help (its docstring or its sub-app's help), which `k3sim --help` shortens as click does."""

    module: str
    help: str


# In the order `k3sim --help` lists them (typer lists a module's commands before its sub-apps' groups).
COMMANDS: dict[str, Entry] = {
    "decode": Entry("decode", "Decode step: TPOT, tokens/s per GPU, bytes per step and what limits it "
                              "(optionally with MTP)."),
    "plan": Entry("plan", "Plan a scenario: memory, step time or serving latency, CP, decode, prefix cache, report. "
                          "With a\nserving scenario and --trace / --workload, a search for the cheapest layout "
                          "meeting the SLOs."),
    "prefill": Entry("prefill", "Prefill: TTFT of an N-token prompt (cached prefix P, chunks of C) on a layout, by "
                                "component."),
    "diff": Entry("diff", "Diff two models (or one and a what-if of it): params, memory, decode, prefill, training, "
                          "side by side."),
    "compare": Entry("compare", "Compare hardware profiles on one question (decode, prefill or train) on the same "
                                "footing."),
    "model-info": Entry("model_info", "Parameter counts (total, active per token, by component), layer mix, "
                                      "KV/state sizes."),
    "memory": Entry("memory", "Per-GPU memory: weights, KV cache, KDA state (serve) or grads, optimizer, "
                              "activations (train)."),
    "kernel-time": Entry("kernel_time", "Predicted time of one kernel: measured, interpolated, fitted model or "
                                        "datasheet roofline."),
    "cp": Entry("cp", "Context parallelism per layer kind: the state folds of recurrent layers (KCP on KDA and GDN, the\n"
                      "decayed sum on Mamba2, Mamba and lightning) vs ring / zigzag / all-gather / Ulysses on attention "
                      "layers."),
    "prefix-cache": Entry("prefix_cache", "Prefix-cache hit rate for a trace under the K3 design's policies or the "
                                          "engines' own."),
    "pipeline": Entry("pipeline", "Simulate a pipeline schedule: step time, bubble ratio, idle per stage, "
                                  "encoder hidden share."),
    "sweep": Entry("sweep", "Sweep layouts of a scenario; Pareto front of tokens/s per GPU vs step time (serving: "
                            "goodput per GPU\nvs p99 TTFT over batch limits and P:D splits, on a synthetic sample or "
                            "the --trace)."),
    "serve": Entry("serve", "Serve a trace on the scenario's fleet: continuous batching, chunked prefill, hybrid "
                            "prefix cache."),
    "calibrate": Entry("calibrate", "Measure kernels on a GPU, fit the kernel-time models, validate them."),
    "check": Entry("check", "Whole-step checks: predictions before a measurement run, predicted vs measured after "
                            "it, the training glue fit and report."),
}

# Module names under k3sim.commands; each owns one top-level command or sub-app.
COMMAND_MODULES = ["decode", "plan", "prefill", "diff", "compare", "model_info", "memory", "calibrate", "kernel_time", "cp", "prefix_cache",
                   "pipeline", "sweep", "serve", "check"]

# Click commands built from a module's registration, by command name; shared by every LazyGroup instance (the
# CLI builds a new group per `main()` call; tests call it thousands of times in one process).
_LOADED: dict[str, Any] = {}


def plain_help(command: Any) -> None:
    """Plain click help for a command and everything under it (cli.py says why)."""
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


def load_module(module: str) -> None:
    """Register one command module on a private app and keep the click commands it makes."""
    sub = typer.Typer(rich_markup_mode=None)
    importlib.import_module(f"k3sim.commands.{module}").register(sub)
    for name, cmd in typer.main.get_group(sub).commands.items():
        plain_help(cmd)
        _LOADED.setdefault(name, cmd)


class LazyGroup(TyperGroup):
    """The `k3sim` group: commands in `COMMANDS` are built from their module on first lookup."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*self.commands, *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name in COMMANDS and cmd_name not in _LOADED:
            load_module(COMMANDS[cmd_name].module)
        return _LOADED.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """click's lookup; an unknown name gets typer's "Did you mean" from every command, loaded or not."""
        from difflib import get_close_matches

        from typer import _click

        suggest, self.suggest_commands = self.suggest_commands, False  # typer's would see loaded ones only
        try:
            return super().resolve_command(ctx, args)
        except _click.exceptions.UsageError as err:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if suggest and args else []
            if matches:
                err.message = f"{err.message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise
        finally:
            self.suggest_commands = suggest

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The listing of `k3sim --help` from the table, without importing a module (a loaded command's own
        help when it is loaded: the same text, `test_command_table` checks)."""
        from typer._click.utils import make_default_short_help  # what click's Command.get_short_help_str calls

        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name) or _LOADED.get(name)
            if cmd is None:
                text = COMMANDS[name].help
                rows.append((name, lambda limit, text=text: make_default_short_help(text, limit).strip()))
            elif not cmd.hidden:
                rows.append((name, cmd.get_short_help_str))
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)  # click's: 3 times the default spacing
        with formatter.section("Commands"):
            formatter.write_dl([(name, short(limit)) for name, short in rows])


def register_all(app: typer.Typer) -> None:
    """Every command module registered on `app` at once (for code that walks the whole command tree)."""
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"k3sim.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"k3sim.commands.{name}":
                continue  # command not built yet
            raise
        module.register(app)
