"""``GuardedTrainFunction``: the planned train function as Keras calls it, which never lets a plan's failure end ``fit``."""

from __future__ import annotations

from typing import Callable

__all__ = ["GuardedTrainFunction"]


class GuardedTrainFunction:
    """One call of the train function, as the driver runs it (``Driver.run_step``): on the plan
    in force, timed by its trial while it runs; a failure drops the plan's per-device order, then
    the plan, and the default placement runs that same call.

    Args:
        planned: the train function Keras traced with the plan-applying step.
        driver: the ``Driver`` that runs each call.

    Example:
        >>> class Driver:
        ...     def run_step(self, planned, iterator):
        ...         return planned(iterator)
        >>> GuardedTrainFunction(lambda iterator: next(iterator), Driver())(iter([{"loss": 0.5}]))
        {'loss': 0.5}
    """

    def __init__(self, planned: Callable, driver):
        self.planned, self.driver = planned, driver

    def __call__(self, iterator):
        return self.driver.run_step(self.planned, iterator)
