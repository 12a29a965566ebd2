"""``InForce``: a plan put in force on a model — its variables moved, its replicas made, its applier — held together."""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner import OpGraph, Plan
from kerasflow.planner.errors import KerasflowError
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.out_of_data import OutOfData
from kerasflow.strategies.replicas import Replicas
from kerasflow.strategies.variables import group_devices, move_variables

__all__ = ["InForce"]


@dataclasses.dataclass(frozen=True)
class InForce:
    """The plan in force and what runs it: the applier, for data parallelism the replicas, and
    what does the call in which the data runs out. The plan's one home while it is in force: the
    driver, the plan-applying step and the read-back take it from here.

    Attributes:
        plan: the plan.
        applier: places, orders and splits the traced step as the plan says.
        replicas: the per-device copies of a data-parallel plan (None otherwise).
        out_of_data: runs the call in which the data runs out (``OutOfData``).
    """

    plan: Plan
    applier: PlanApplier
    replicas: Replicas | None
    out_of_data: OutOfData

    @classmethod
    def put(cls, model, plan: Plan, graph: OpGraph | None, devices, creating: Callable | None,
            unplanned: Callable) -> "InForce":
        """Moves ``model``'s variables to the plan's devices and copies them per replica;
        ``unplanned()`` is a context inside which the model has its own ``train_step``.

        Raises:
            KerasflowError: a data-parallel plan for a model with its own ``train_step``.
        """
        if plan.data_parallel is not None and _compat.has_own_train_step(model):
            raise KerasflowError("A data-parallel plan runs kerasflow's own step per replica, and this model has "
                                 f"its own train_step. Received: a plan of {plan.algorithm!r}. Plan with "
                                 "replicated='off' for this model.")
        move_variables(model, group_devices(plan, graph), creating=creating)
        replicas = None
        if plan.data_parallel is not None:
            with _compat.strategy_scope(model):
                replicas = Replicas(model, list(plan.data_parallel.devices), creating=creating)
        return cls(plan, PlanApplier(plan, graph, list(devices)), replicas, OutOfData(model, unplanned, replicas))

    def run(self, planned: Callable, iterator):
        """One call of ``planned`` (the train function traced with the plan); the call in which the
        data runs out does what plain Keras' does (``OutOfData``)."""
        try:
            return planned(iterator)
        except tf.errors.OutOfRangeError:  # the planned step changed nothing (it waits for the batch)
            return self.out_of_data.run(iterator)
