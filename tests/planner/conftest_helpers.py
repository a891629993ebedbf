"""Small scenarios written into a temp dir (absolute model paths) for planner tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kl_train(tmp: Path, **extra: str) -> Path:
    """Kimi-Linear-48B training on 16 H200s at 4K: small, every layout evaluates in milliseconds."""
    text = f"""name: kl-train-test
model: {ROOT / 'models/kimi-linear-48b.yaml'}
hardware: h200
cluster:
  num_gpus: 16
  gpus_per_node: 8
parallelism:
  tp: 2
  pp: 2
  ep: 8
  dp: 4
workload:
  mode: train
  context_tokens: 4096
  micro_batch_size: 1
  num_micro_batches: 4
  activation_checkpointing: true
"""
    for k, v in extra.items():
        text += f"{k}:\n{v}\n"
    p = tmp / "kl-train.yaml"
    p.write_text(text)
    return p
