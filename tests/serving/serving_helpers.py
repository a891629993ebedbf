"""Helpers of the serving tests: a scenario file with a `serving:` section, and constant-cost step models."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "conversation_trace.jsonl"


def write_scenario(tmp_path: Path, serving: dict | None = None, *, num_gpus: int = 16, mode: str = "serve",
                   name: str = "scn.yaml", model: str = "kimi-k3", parallelism: dict | None = None) -> Path:
    doc = {
        "name": "test-serve",
        "model": str(ROOT / "models" / f"{model}.yaml"),
        "hardware": "h200",
        "cluster": {"num_gpus": num_gpus, "gpus_per_node": 8},
        "parallelism": parallelism or {"tp": 8, "pp": 2, "ep": 8},
        "workload": {"mode": mode, "context_tokens": 131072 if mode == "serve" else 4096},
    }
    if serving is not None:
        doc["serving"] = serving
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def constant(seconds: float = 1.0):
    """step_seconds factory for `simulate`: every step costs `seconds`."""
    return lambda i: (lambda nd, cs, pf: seconds)


def linear(base: float, per_token: float):
    """base + per_token x (decode + prefill tokens) per step."""
    return lambda i: (lambda nd, cs, pf: base + per_token * (nd + sum(c for c, _ in pf)))



@pytest.fixture
def scenario(tmp_path):
    """make(serving_section=None, **kw) -> path of a scenario file with that `serving:` section."""
    def make(serving: dict | None = None, **kw) -> Path:
        return write_scenario(tmp_path, serving, **kw)
    return make
