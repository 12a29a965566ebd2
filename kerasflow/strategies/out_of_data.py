"""``OutOfData``: the call in which the data runs out, done as plain Keras does it while a plan is in force.

When a dataset's size is unknown, Keras calls its train function until the iterator raises
``OutOfRangeError``. In that last call plain Keras still runs what its step does without the
batch, before the failing read of it: the optimizer's iteration count goes up by one and every
seed generator moves on. A planned step cannot promise the same (whether those ops beat the
failure depends on where and in what order the plan runs them: an Adam model counted one
iteration short an epoch on some placements and its losses drifted by 2e-5 over three epochs),
so the planned step makes them wait for the batch (``effects_wait_for_the_batch``, called by
``PlannedStep``) and this call does them.

Its function reads the next element as an optional and traces the model's own ``train_step`` on
it; every op of that step with a lasting effect that does not need the batch (nor follows one
that does) runs before the element is taken, which then fails: the effects happen, the rest of
the step does not, and ``OutOfRangeError`` ends the epoch as Keras expects. It is traced at the
first such call on the variables where the plan put them and kept while the plan is in force.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.profiling.capture import last_op_id
from kerasflow.strategies.applier import automatic_dependencies

__all__ = ["OutOfData", "effects_wait_for_the_batch"]

# Stateful ops that change nothing: a step's batch need not wait for them, nor they for it.
_READS = frozenset({"ReadVariableOp", "ResourceGather", "VariableShape", "VarHandleOp", "LookupTableFindV2",
                    "LookupTableSizeV2"})


def _changes_state(op: tf.Operation) -> bool:
    """Whether ``op`` has a lasting effect: a variable written, a random state moved on."""
    return op._is_stateful and op.type not in _READS


def effects_wait_for_the_batch(data, ops: list[tf.Operation]) -> None:
    """Makes every op of ``ops`` (a planned step's) that changes state wait for the batch
    ``data``, so the call in which the data runs out changes nothing and ``OutOfData`` does
    what plain Keras' does instead: which of the effects that do not need the batch beat the
    failing read of it would otherwise depend on where the plan put them. One signal a device,
    so the batch's arrival crosses to each device once."""
    graph = tf.compat.v1.get_default_graph()
    batch = [t.op for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor) and t.graph is graph]
    if not batch:
        return
    arrived: dict[str, tf.Operation] = {}
    for op in ops:
        if _changes_state(op):
            if op.device not in arrived:
                with tf.device(op.device or None), tf.control_dependencies(batch):
                    arrived[op.device] = tf.no_op(name="batch_arrived")
            op._add_control_input(arrived[op.device])


class OutOfData:
    """Runs the calls in which the data runs out (see the module docstring).

    Args:
        model: the model with a plan in force.
        unplanned: a context manager factory inside which the model has its own ``train_step``.
        replicas: a data-parallel plan's ``Replicas`` (they take the model's values after the
            call), or None.

    Example:
        >>> import contextlib, keras, tensorflow as tf
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
        >>> model.compile("adam", "mse")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.ones((4, 2)), tf.ones((4, 1)))).batch(2)
        >>> _ = model.fit(data, verbose=0)  # 2 steps
        >>> ran_out = iter(data.take(0))
        >>> try:
        ...     OutOfData(model, contextlib.nullcontext, replicas=None).run(ran_out)
        ... except tf.errors.OutOfRangeError:
        ...     print(int(model.optimizer.iterations.numpy()))
        3
    """

    def __init__(self, model, unplanned: Callable, replicas):
        self._model, self._unplanned, self._replicas = model, unplanned, replicas
        self._function: Callable | None = None

    def run(self, iterator):
        """Does the batch-free part of one step and raises ``OutOfRangeError`` (``iterator`` ran out)."""
        try:
            with self._unplanned(), _compat.custom_gradients_forgotten():  # the step's gradients are in its trace
                if self._function is None:
                    self._function = tf.function(self._effects_then_the_batch)
                self._function(iterator)
        except tf.errors.InvalidArgumentError:
            pass  # the optional was empty: the effects ran, the step did not
        finally:
            if self._replicas is not None:
                self._replicas.refresh()
        raise tf.errors.OutOfRangeError(None, None, "End of sequence: the data ran out")

    def _effects_then_the_batch(self, iterator):
        graph = tf.compat.v1.get_default_graph()
        start = last_op_id(graph)
        batch = iterator.get_next_as_optional().get_value()
        self._model.distribute_strategy.run(self._model.train_step, args=(batch,))
        ops = [op for op in graph.get_operations() if op._id > start]
        taking = tf.nest.flatten(batch)[0].op
        needing = _needing(taking, ops)
        for op in ops:
            if _changes_state(op) and op not in needing:
                taking._add_control_input(op)


def _needing(first: tf.Operation, ops: list[tf.Operation]) -> set[tf.Operation]:
    """``first`` and every op of ``ops`` that runs after it: through data, control edges and the
    automatic control dependencies ``tf.function`` will add."""
    after: dict[tf.Operation, list[tf.Operation]] = {}
    for before, later in automatic_dependencies(ops):
        after.setdefault(before, []).append(later)
    needing, stack = {first}, [first]
    while stack:
        op = stack.pop()
        following = [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs) + after.get(op, [])
        for later in following:
            if later not in needing:
                needing.add(later)
                stack.append(later)
    return needing
