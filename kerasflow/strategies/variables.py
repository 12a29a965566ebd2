"""Moves variables (and every optimizer's slots) to the devices a plan gives their groups, values kept.

An op that reads or writes a variable always runs where the variable lives, so moving a
layer's work means moving its variables. Keras 3 keeps the TensorFlow variable behind each
Keras variable in one attribute, so a new variable with the same value is created on the
target device and swapped in; every optimizer's index of its variables is rebuilt. tf-keras
variables are referenced from many places and are left where they are (the placement
report lists their ops as not moved).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.ir.plan import Plan
from kerasflow.devices import normalize_device
from kerasflow.profiling.capture import JOINED

__all__ = ["move_variables", "group_devices", "current_homes", "HomeVariables"]


def _swap(variable, device: str, creating, scope) -> bool:
    old = variable.value
    if normalize_device(old.device) == device:
        return False
    # Made in the model's strategy scope, as the variable it replaces: an optimizer compiled
    # later in that scope makes its slots beside it (TensorFlow refuses a variable from elsewhere).
    with tf.init_scope(), scope(), creating(device), tf.device(device):
        new = tf.Variable(old.read_value(), dtype=old.dtype, trainable=old.trainable,
                          name=old.name.split(":")[0], aggregation=old.aggregation,
                          synchronization=old.synchronization)
    _compat.set_backing_variable(variable, new)
    return True


def group_devices(plan: Plan, graph) -> dict[str, str]:
    """Colocation group (a variable's path; each path of a group of several variables an op reads
    together, ``"a|b"``) -> the device the plan gives its ops (with data parallelism: the first
    replica's, which holds the model's own variables).

    Example:
        >>> from kerasflow.planner import Op, OpGraph
        >>> graph = OpGraph([Op("loop", cost={"CPU": 1.0}, colocation="lstm/kernel|lstm/bias")], [])
        >>> group_devices(Plan(placement={"loop": "/CPU:1"}), graph)["lstm/bias"]
        '/CPU:1'
    """
    devices = {}
    if graph is None:
        return devices
    for op in graph.ops:
        if op.colocation is None:
            continue
        if plan.data_parallel is not None:
            device = plan.data_parallel.devices[0]
        elif op.name in plan.placement:
            device = plan.placement[op.name]
        else:
            continue
        for group in (op.colocation, *op.colocation.split(JOINED)):
            devices.setdefault(group, device)
    return devices


def _everything(model) -> list:
    return _compat.model_variables(model) + _compat.optimizer_variables(model) + _compat.metric_variables(model)


def current_homes(model) -> dict[str, str]:
    """Variable path -> the device it lives on now (to move variables back after a fallback)."""
    if not _compat.can_move_variables(model):
        return {}
    return {_compat.variable_path(v): normalize_device(v.value.device) for v in _everything(model)
            if _compat.is_movable(v)}


def move_variables(model, homes: dict[str, str], *, creating=None) -> int:
    """Puts each model variable and its optimizer slots on its group's device.

    Args:
        model: a Keras 3 model (tf-keras models are left as they are).
        homes: variable path -> device (from ``group_devices``).
        creating: a context manager factory ``f(device)`` the strategy uses to let a
            variable be created off its default device.

    Returns:
        How many variables were moved.
    """
    if not _compat.can_move_variables(model) or not homes:
        return 0
    creating = creating or (lambda device: contextlib.nullcontext())
    moved = 0
    owners = sorted(homes, key=len, reverse=True)
    for variable in _everything(model):
        path = _compat.variable_path(variable)
        device = homes.get(path)
        if device is None:  # an optimizer slot lives with the variable it belongs to
            flat = path.replace("/", "_")
            owner = next((o for o in owners if o in path or o.replace("/", "_") in flat), None)
            device = homes.get(owner) if owner else None
        if device is not None and _compat.is_movable(variable):
            moved += _swap(variable, device, creating, lambda: _compat.strategy_scope(model))
    _compat.reindex_optimizers(model)
    return moved


class HomeVariables:
    """The TensorFlow variables behind a model's variables before a plan moved them, kept beside
    the planned ones, so that ``fit`` can run a step of the default placement between planned
    ones (to time the plan beside it) and carry on from the same values.

    Outside ``at_home`` the model's variables are the planned ones, up to date, as everything
    else (evaluation, checkpoints, callbacks) expects; inside, they are the home ones, given the
    planned values on the way in, and on the way out the planned ones take back whatever the
    step inside changed.

    Args:
        model: the model, before its variables are moved.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> homes = HomeVariables(model)
        >>> kernel = model.layers[0].kernel
        >>> _ = move_variables(model, {kernel.path: "/CPU:1"})
        >>> with homes.at_home():
        ...     print(kernel.value.device.endswith("CPU:0"))
        True
    """

    def __init__(self, model):
        self.model = model
        self._homes = [(variable, _compat.backing_variable(variable)) for variable in _everything(model)
                       if _compat.is_movable(variable)]

    @contextlib.contextmanager
    def at_home(self):
        """While inside, every moved variable is its home variable, given the planned value."""
        moved = self.come_home()
        try:
            yield
        finally:
            for variable, planned, home in moved:
                planned.assign(home)
                _compat.set_backing_variable(variable, planned)
            if moved:
                _compat.reindex_optimizers(self.model)

    def come_home(self) -> list:
        """Every moved variable is its home variable again, given the current value (for good, or
        until ``at_home`` puts the planned ones back); a train function traced at home then runs
        on the model as it is. Returns ``(variable, planned, home)`` for each one moved."""
        moved = [(variable, current, home) for variable, home in self._homes
                 if (current := _compat.backing_variable(variable)) is not home]
        for variable, current, home in moved:
            home.assign(current)
            _compat.set_backing_variable(variable, home)
        if moved:
            _compat.reindex_optimizers(self.model)
        return moved
