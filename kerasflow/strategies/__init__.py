"""kerasflow.strategies: ``FastTStrategy``, and what its users read and pass in.

Layering, from the doors down: ``fastt_strategy`` (and the callback in ``kerasflow.callbacks``)
are thin doors that hand ``fit``'s steps to ``driver``, the state machine (warm-up, profiling,
trial, settled, default) over objects that each own one part of the state: ``options`` (frozen
settings), ``collaborators`` (profiler, planner, stopwatch, passed in), ``inputs`` (the recorded
batch), ``trial`` (the plan timed beside the default placement; its rule in ``verdict`` and
``side_by_side``, pure Python), ``retreat`` (the way back to the default placement). Below them:
``steps`` and ``applier`` (the plan-applying step), ``variables`` and ``replicas`` (moved and
copied variables); ``readback``, ``reporting`` and ``plan_report`` say what happened.
"""

from kerasflow.strategies.collaborators import Collaborators
from kerasflow.strategies.fastt_strategy import FastTStrategy
from kerasflow.strategies.plan_report import PlanReport
from kerasflow.strategies.readback import PlacementMismatch, PlacementReport

__all__ = ["FastTStrategy", "Collaborators", "PlanReport", "PlacementMismatch", "PlacementReport"]
