"""kerasflow.strategies: ``FastTStrategy`` and applying a plan to the traced training step."""

from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.driver import Driver, Options, PlacementMismatch
from kerasflow.strategies.fastt_strategy import FastTStrategy
from kerasflow.strategies.steps import PlannedStep

__all__ = ["FastTStrategy", "PlanApplier", "PlannedStep", "Driver", "Options", "PlacementMismatch"]
