"""Training step model: a parallel layout's step time with breakdown, tokens/s, MFU and memory per GPU."""

from k3sim.training.step import TrainOptions, TrainStepResult, TrainingContext, memory_verdict, train_step

__all__ = ["TrainOptions", "TrainStepResult", "TrainingContext", "train_step", "memory_verdict"]
