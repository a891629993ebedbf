"""One step's cost on one GPU of a layout: the shared source of step time for decode, serving, pipeline
and training. See DEVELOPING.md (Contracts > Step)."""

from k3sim.step.batch import Batch
from k3sim.step.calls import Call, StepComponent, Timer
from k3sim.step.cost_model import StepCostModel
from k3sim.step.forward import StepResult, forward_step
from k3sim.step.layout import StepLayout


def training_layer_costs(*args, **kwargs):
    from k3sim.step.training import training_layer_costs as f

    return f(*args, **kwargs)


__all__ = ["Batch", "Call", "StepComponent", "StepCostModel", "StepLayout", "StepResult", "Timer",
           "forward_step", "training_layer_costs"]
