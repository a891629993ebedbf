"""Pipeline schedules on a discrete-event engine, and the vision encoder in the pipeline bubbles.

schedules (static per-device op orders + the dependency DAG) -> placement (encoder policy, program)
-> engine (simpy) -> result (step time, bubble, hidden share, in-flight); costs/encoder give
model-derived stage and ViT costs; trace writes the Gantt PNG and the Perfetto JSON. See DEVELOPING.md.
"""

from k3sim.pipeline.engine import Deadlock, Program, Timeline, simulate
from k3sim.pipeline.placement import POLICIES, EncoderWork, place, text_program
from k3sim.pipeline.result import PipelineResult, run_pipeline
from k3sim.pipeline.run import LayoutSpec, simulate_layout
from k3sim.pipeline.schedules import SCHEDULES, Schedule, build_schedule, validate_schedule
from k3sim.pipeline.stagecosts import StageCosts, parse_uniform_costs, uniform_costs

__all__ = ["Deadlock", "Program", "Timeline", "simulate", "POLICIES", "EncoderWork", "place", "text_program",
           "PipelineResult", "run_pipeline", "LayoutSpec", "simulate_layout", "SCHEDULES", "Schedule",
           "build_schedule", "validate_schedule", "StageCosts", "parse_uniform_costs", "uniform_costs"]
