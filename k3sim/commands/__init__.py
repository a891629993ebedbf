"""CLI commands, one module each. Every module exposes `register(app)` and imports its model lazily."""

from __future__ import annotations

import importlib

import typer

# Module names under k3sim.commands; each owns one top-level command or sub-app.
COMMAND_MODULES = ["decode", "plan", "model_info", "memory", "calibrate", "kernel_time", "cp", "prefix_cache", "pipeline", "sweep", "serve", "check"]


def register_all(app: typer.Typer) -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"k3sim.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"k3sim.commands.{name}":
                continue  # command not built yet
            raise
        module.register(app)
