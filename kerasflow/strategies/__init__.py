"""kerasflow.strategies: ``FastTStrategy`` and applying a plan to the traced training step.

Layering: ``options`` (settings) -> ``driver`` (the profile -> plan -> rebuild state
machine) -> ``steps`` and ``applier`` (the plan-applying step) and ``variables`` (moves);
``readback`` and ``reporting`` say what happened. ``fastt_strategy`` and the callback in
``kerasflow.callbacks`` are the thin doors that drive it.
"""

from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.driver import Driver
from kerasflow.strategies.fastt_strategy import FastTStrategy
from kerasflow.strategies.options import Options
from kerasflow.strategies.readback import PlacementMismatch, PlacementReport
from kerasflow.strategies.steps import PlannedStep

__all__ = ["FastTStrategy", "PlanApplier", "PlannedStep", "Driver", "Options", "PlacementMismatch",
           "PlacementReport"]
