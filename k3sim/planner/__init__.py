"""Plan orchestration (`plan`: every report section of one scenario) and layout sweeps (`sweep`)."""

from k3sim.planner.plan import PlanResult, plan

__all__ = ["PlanResult", "plan"]
