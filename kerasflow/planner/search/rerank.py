"""Re-ranks the runners-up of a plan once that plan's step has been measured.

The simulator can be wrong about a whole kind of plan at once: on logical CPUs that share
a machine's cores, data parallelism of a model of many small ops, and its one-copy variant with
it, measured far slower than predicted (docs/planner.md gives the figures).
A measured step says how far the cost model was off for the plan's kind, so the predictions
of the plans of that kind (those that replicate the step, or those that do not) are scaled by
the measured plan's measured / predicted ratio; the other kind's predictions stand, the
measurement saying nothing about them.
"""

from __future__ import annotations

import math
from typing import Iterable

from ..errors import InvalidPlanError
from ..ir.plan import Plan

__all__ = ["rerank", "same_kind"]


def same_kind(first: Plan, second: Plan) -> bool:
    """Whether both plans replicate the step, or neither does: what one's measurement says
    about the other's prediction.

    Example:
        >>> from kerasflow.planner import DataParallel, Plan
        >>> same_kind(Plan(placement={}), Plan(placement={}, data_parallel=DataParallel(("/CPU:0", "/CPU:1"))))
        False
    """
    return (first.data_parallel is None) == (second.data_parallel is None)


def rerank(others: Iterable[Plan], measured_plan: Plan, measured_seconds: float) -> list[tuple[Plan, float]]:
    """The other plans with the step each is now expected to take, fastest first.

    Args:
        others: the candidates left (each with a ``predicted_step_time``; those without one
            are left out).
        measured_plan: the plan whose step was measured (with a ``predicted_step_time``).
        measured_seconds: its measured step, in seconds.

    Returns:
        ``(plan, expected seconds)`` pairs, by expected seconds (ties keep ``others``' order).

    Raises:
        InvalidPlanError: ``measured_plan`` has no prediction, or ``measured_seconds`` is
            not a positive number.

    Example:
        >>> from kerasflow.planner import DataParallel, Plan
        >>> measured = Plan(placement={}, data_parallel=DataParallel(("/CPU:0", "/CPU:1")),
        ...                 predicted_step_time=0.020, algorithm="data_parallel")
        >>> one_copy = Plan(placement={}, data_parallel=DataParallel(("/CPU:0", "/CPU:1")),
        ...                 predicted_step_time=0.021, algorithm="one_copy_data_parallel")
        >>> heft = Plan(placement={}, predicted_step_time=0.025, algorithm="heft")
        >>> [(p.algorithm, round(s, 4)) for p, s in rerank([one_copy, heft], measured, 0.034)]
        [('heft', 0.025), ('one_copy_data_parallel', 0.0357)]
    """
    predicted = measured_plan.predicted_step_time
    if not predicted or predicted <= 0:
        raise InvalidPlanError(f"The measured plan needs a positive predicted_step_time to scale the others "
                               f"by. Received: predicted_step_time={predicted!r}")
    if isinstance(measured_seconds, bool) or not isinstance(measured_seconds, (int, float)) \
            or not measured_seconds > 0 or not math.isfinite(measured_seconds):
        raise InvalidPlanError(f"measured_seconds must be a positive number of seconds. "
                               f"Received: measured_seconds={measured_seconds!r}")
    ratio = measured_seconds / predicted
    expected = [(plan, plan.predicted_step_time * (ratio if same_kind(plan, measured_plan) else 1.0))
                for plan in others if plan.predicted_step_time]
    return sorted(expected, key=lambda pair: pair[1])
