"""``PlansThatRan``: kerasflow's own stopwatch, noting every plan a training step ran on.

In the default configuration the machine's timing decides which plans ``fit`` tries, keeps or
drops, so an equality test learns afterwards what its outputs must be held to: bit for bit
where only placement-only plans ran, a measured bound where a plan summed in another order
(``kerasflow.testing.rounding``).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["PlansThatRan"]


class PlansThatRan:
    """A stopwatch for ``Collaborators`` that times each step as kerasflow's own does and notes
    the plan of every planned step (the default configuration unchanged: real timing decides).

    Args:
        timed: the stopwatch that runs and times each step (default: kerasflow's own), e.g. a
            ``ScriptedStopwatch`` where the test chose the verdicts.

    Attributes:
        plans: the plan of each planned step, in the order they ran (the default placement's
            steps are not listed).

    Example:
        >>> from kerasflow.planner import Plan
        >>> watch = PlansThatRan()
        >>> outputs, seconds = watch(lambda: "planned outputs", Plan(placement={"dense/MatMul": "/CPU:1"}))
        >>> outputs, watch.placement_only
        ('planned outputs', True)
    """

    def __init__(self, timed: Callable[[Callable[[], Any], Any], tuple[Any, float]] | None = None):
        if timed is None:
            from kerasflow.strategies.collaborators import stopwatch as timed  # imports TensorFlow
        self.plans: list = []
        self._timed = timed

    def __call__(self, step: Callable[[], Any], plan) -> tuple[Any, float]:
        if plan is not None:
            self.plans.append(plan)
        return self._timed(step, plan)

    @property
    def placement_only(self) -> bool:
        """True when every planned step ran a placement-only plan (``Plan.placement_only``), or
        none ran: the outputs then equal plain Keras' bit for bit."""
        return all(plan.placement_only for plan in self.plans)

    def describe(self) -> str:
        """The plans that ran, for a failure message: each algorithm once, in the order first run."""
        names = dict.fromkeys(f"{plan.algorithm}{'' if plan.placement_only else ' (sums in another order)'}"
                              for plan in self.plans)
        return ", ".join(names) or "none (the default placement only)"
