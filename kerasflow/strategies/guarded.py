"""``GuardedTrainFunction``: the planned train function as Keras calls it, which never lets a plan's failure end ``fit``."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from kerasflow.strategies.retreat import describe
from kerasflow.strategies.trial import NOT_OURS

__all__ = ["GuardedTrainFunction"]


class GuardedTrainFunction:
    """Runs one call of the train function on the driver's plan in force.

    While a trial runs, the trial chooses the plan's step or the default placement's; otherwise
    the driver's stopwatch runs the plan's. A failure first drops the plan's per-device order
    (the placement stays; TensorFlow may refuse an order), then makes the driver go back to the
    default placement, which runs that same call. A lost cluster task is not the order's doing.
    The call in which the data runs out does what plain Keras' does (``OutOfData``).

    Args:
        planned: the train function Keras traced with the plan-applying step.
        driver: the ``Driver`` whose plan, trial and way back it uses.
    """

    def __init__(self, planned: Callable, driver):
        self.planned, self.driver = planned, driver

    def __call__(self, iterator):
        driver = self.driver
        if not driver.in_force:
            return driver.run_on_default(iterator)
        parts = driver.in_force_parts

        def planned(iterator):
            try:
                return self.planned(iterator)
            except tf.errors.OutOfRangeError:  # the planned step changed nothing (it waits for the batch)
                return parts.out_of_data.run(iterator)

        try:
            if driver.trial is not None:
                return driver.trial.run(planned, iterator, parts.plan, parts.replicas)
            return driver.collaborators.stopwatch(lambda: planned(iterator), parts.plan)[0]
        except NOT_OURS:
            raise
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            lost_task = isinstance(error, tf.errors.UnavailableError)
            if parts.plan.order and not parts.applier.skip_order and not lost_task:
                parts.applier.refuse_order(describe(error))
                driver.reporter.warn(f"kerasflow: the planned order could not run ({describe(error)}); "
                                     "keeping the placement without it.")
                driver.rebuild()
                return driver.model.train_function(iterator)  # guarded again
            driver.fail("running the planned step", error)
            return driver.run_on_default(iterator)
