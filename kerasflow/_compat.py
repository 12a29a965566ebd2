"""The one place that knows Keras 3 from tf-keras (and TensorFlow versions).

Everything else in kerasflow asks these functions instead of testing module names.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import tensorflow as tf

from kerasflow.planner.errors import KerasflowError

__all__ = [
    "flavor", "is_keras_model", "variable_handle", "variable_path", "model_variables",
    "optimizer_names", "all_optimizers", "optimizer_state", "keyed_by", "reindex_optimizers", "print_line",
    "fit_verbosity", "optimizer_variables", "metric_variables", "all_layers", "uses_jit", "disable_jit", "is_compiled",
    "strategy_scope", "run_step", "op_determinism", "graph_mode", "TfKerasCallbackHooks", "GRAPH_MODE_LINE",
    "has_own_train_step", "model_of_step_function", "compute_loss", "track_loss", "step_metrics",
    "can_move_variables", "is_batch_normalization", "can_read_weights_per_copy",
    "weights_read_here", "override", "overridden", "is_movable", "backing_variable", "set_backing_variable",
    "forget_traced_functions", "one_replica_sums_forwarded", "watch_fits", "on_fit_end", "loss_trackers_counting",
    "custom_gradients_forgotten", "registered_custom_gradients", "moving_statistics_kept", "build_when_traced_under",
    "compiled_losses", "unpack_x_y_sample_weight",
]

try:  # tf-keras is optional (the `legacy` extra)
    import tf_keras as _tf_keras
except ImportError:  # pragma: no cover - depends on the environment
    _tf_keras = None

import keras as _keras

# ``(x, y, sample_weight)`` of a batch, as ``train_step`` unpacks it. tf-keras' function is the
# same code, so Keras' serves both. (It refuses a tuple of more than three, which plain Keras'
# own step refuses first: such data never reaches a planned step.)
unpack_x_y_sample_weight = _keras.utils.unpack_x_y_sample_weight


def flavor(model: Any) -> str:
    """``"keras3"`` or ``"tf_keras"`` for a model; anything else raises ``KerasflowError``."""
    if isinstance(model, _keras.Model):
        return "keras3"
    if _tf_keras is not None and isinstance(model, _tf_keras.Model):
        return "tf_keras"
    raise KerasflowError(f"Expected a Keras model (keras.Model or tf_keras.Model); received "
                         f"{type(model).__name__}. Pass the model itself, built with keras or tf_keras.")


def is_keras_model(model: Any) -> bool:
    """True for a Keras 3 or a tf-keras model."""
    try:
        flavor(model)
    except KerasflowError:
        return False
    return True


def variable_handle(variable: Any) -> tf.Tensor:
    """The TensorFlow resource handle behind a Keras 3 or tf-keras variable."""
    value = getattr(variable, "value", None)
    if value is not None and hasattr(value, "handle"):
        return value.handle
    return variable.handle


def variable_path(variable: Any) -> str:
    """A variable's path (``"dense/kernel"``) in either Keras."""
    path = getattr(variable, "path", None)
    if isinstance(path, str):
        return path
    return variable.name.split(":")[0]


def model_variables(model: Any) -> list:
    """The model's own variables (trainable and not)."""
    return list(model.variables)


def _is_optimizer(value: Any) -> bool:
    bases = [_keras.optimizers.Optimizer]
    if _tf_keras is not None:
        bases.append(_tf_keras.optimizers.Optimizer)
        legacy = getattr(getattr(_tf_keras.optimizers, "legacy", None), "Optimizer", None)
        if legacy is not None:
            bases.append(legacy)
    return isinstance(value, tuple(bases))


def all_optimizers(model: Any) -> list:
    """Every optimizer the model owns: ``model.optimizer`` and any kept as an attribute (a
    GAN's ``d_optimizer`` and ``g_optimizer``), once each, unwrapped from loss scaling."""
    found, seen = [], set()
    candidates = [getattr(model, "optimizer", None)] + list(vars(model).values())
    for value in candidates:
        if value is None or not _is_optimizer(value):
            continue
        inner = getattr(value, "inner_optimizer", None)  # mixed precision wraps the real one
        for optimizer in (value, inner) if inner is not None and _is_optimizer(inner) else (value,):
            if id(optimizer) not in seen:
                seen.add(id(optimizer))
                found.append(optimizer)
    return found


def optimizer_names(model: Any) -> list[str]:
    """The name scopes of every optimizer the model owns."""
    return [optimizer.name for optimizer in all_optimizers(model) if getattr(optimizer, "name", None)]


def optimizer_variables(model: Any) -> list:
    """The variables of every optimizer the model owns: slots, iteration counters, learning rates."""
    found, seen = [], set()
    for optimizer in all_optimizers(model):
        variables = optimizer.variables
        for variable in variables() if callable(variables) else variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def _wrapped(optimizer: Any) -> list:
    """``optimizer`` and every optimizer it wraps (a ``LossScaleOptimizer``'s inner one), outermost first."""
    chain = [optimizer]
    while _is_optimizer(getattr(chain[-1], "inner_optimizer", None)):
        chain.append(chain[-1].inner_optimizer)
    return chain


def optimizer_state(optimizer: Any) -> list:
    """The variables a Keras 3 optimizer's update writes (slots, iteration counts, a loss scale's
    state): all its variables and its wrapped ones' but the learning rates, which the update
    only reads (Keras keeps no other setting in a variable)."""
    rates = {id(o._learning_rate) for o in _wrapped(optimizer) if isinstance(getattr(o, "_learning_rate", None),
                                                                              _keras.Variable)}
    return [v for v in optimizer.variables if id(v) not in rates]


@contextlib.contextmanager
def keyed_by(optimizer: Any, own: Any):
    """While inside, a Keras 3 optimizer (and every one it wraps) knows each variable by the key of
    ``own(tf_variable)``, the TensorFlow variable it keyed its slots and settings by (slot
    indices, the variables excluded from weight decay): its update can be traced on other copies
    of its variables."""
    chained = []
    for wrapped in _wrapped(optimizer):
        key = type(wrapped)._var_key.__get__(wrapped)

        def keyed(variable, key=key):
            return key(own(variable._value if is_movable(variable) else variable))

        chained.append((wrapped, override(wrapped, "_var_key", keyed)))
    try:
        yield
    finally:
        for wrapped, previous in chained:
            override(wrapped, "_var_key", previous)


def reindex_optimizers(model: Any) -> None:
    """Rebuilds what each Keras 3 optimizer keys by TensorFlow variable after the TensorFlow variables
    behind its Keras ones were swapped: the index of its slots, and the variables excluded from weight
    decay (``exclude_from_weight_decay(var_list=...)``), whose cached answers it then forgets."""
    for optimizer in all_optimizers(model):
        indices = getattr(optimizer, "_trainable_variables_indices", None)
        variables = getattr(optimizer, "_trainable_variables", None)
        if indices is None or variables is None:
            continue
        new_keys = [optimizer._var_key(variable) for variable in variables]
        excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
        if excluded:
            optimizer._exclude_from_weight_decay = {new_keys[indices[key]] if key in indices else key
                                                    for key in excluded}
        if hasattr(optimizer, "_exclude_from_weight_decay_cache"):
            optimizer._exclude_from_weight_decay_cache = {}
        indices.clear()
        indices.update({key: i for i, key in enumerate(new_keys)})


def print_line(line: str) -> None:
    """One line where Keras prints its progress (stdout, or absl logging when Keras' interactive
    logging is off), so it shows in terminals, notebooks and logs alike."""
    from keras.src.utils import io_utils

    io_utils.print_msg(line)


def fit_verbosity() -> Any:
    """The ``verbose`` argument of the ``fit`` call running now (Keras 3 or tf-keras), or None.

    ``FastTStrategy`` sees no callback parameters, so it reads the running ``fit`` frame.
    """
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "fit" and "verbose" in frame.f_locals and "self" in frame.f_locals \
                and is_keras_model(frame.f_locals["self"]):
            return frame.f_locals["verbose"]
        frame = frame.f_back
    return None


def global_random_state() -> list:
    """The state of Keras 3's global seed generator, which every unseeded ``keras.random`` draw
    advances (a router's noise, ``keras.random.uniform(shape)``), once a draw has made it; empty
    for tf-keras, whose unseeded draws are stateful ops without a variable."""
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    generator = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    return [generator.state] if generator is not None else []


def metric_variables(model: Any) -> list:
    """Variables of the compiled loss trackers and metrics."""
    seen, found = set(), []
    for metric in getattr(model, "metrics", []):
        for variable in metric.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def all_layers(model: Any) -> list:
    """Every layer of the model, nested models' layers included (depth first)."""
    found = []

    def visit(layer):
        for child in getattr(layer, "layers", []) or []:
            found.append(child)
            visit(child)

    visit(model)
    return found


def uses_jit(model: Any) -> bool:
    """True when the model would compile its step with XLA."""
    value = getattr(model, "jit_compile", None)
    if value is None:
        value = getattr(model, "_jit_compile", None)
    return bool(value) and value != "auto"


def set_jit(model: Any, on: bool) -> None:
    """Compiles the model's next train function with XLA (``on``) or without; the function Keras
    made already is unchanged."""
    if flavor(model) == "keras3":
        model.jit_compile = on
    else:
        model._jit_compile = on


def graph_mode() -> bool:
    """Whether TensorFlow runs TF1-style graphs (``tf.compat.v1.disable_eager_execution()`` or
    ``disable_v2_behavior()``): tf-keras then trains with its v1 loop, which never calls a
    strategy's ``run`` nor runs a step kerasflow can wrap."""
    return not tf.compat.v1.executing_eagerly_outside_functions()


class TfKerasCallbackHooks:
    """What tf-keras' ``CallbackList`` asks of a callback beyond what Keras 3's ``Callback`` has: a
    Keras 3 callback with these is given tf-keras models' train-batch hooks too."""

    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


GRAPH_MODE_LINE = ("kerasflow: TensorFlow runs TF1-style graphs (tf.compat.v1.disable_eager_execution() or "
                   "disable_v2_behavior()), where tf-keras trains with its v1 loop, which kerasflow cannot join: "
                   "{what}, with nothing profiled or planned. Leave eager execution on to plan.")


def op_determinism() -> bool:
    """Whether TensorFlow's op determinism is on (``tf.config.experimental.enable_op_determinism()``,
    which ``keras.utils.set_random_seed`` does not switch on by itself)."""
    from tensorflow.python.framework import config

    return config.is_op_determinism_enabled()


def xla_by_default(model: Any, gpus: list) -> bool:
    """True when Keras would compile ``model``'s step with XLA by itself: Keras 3 resolves
    ``jit_compile="auto"`` to XLA on a host with a GPU (``gpus``, as ``devices.local_gpus()``)
    unless a ``tf.distribute`` strategy is in use; tf-keras never does."""
    return flavor(model) == "keras3" and bool(gpus)


def is_compiled(model: Any) -> bool:
    """True once ``model.compile(...)`` has run with an optimizer."""
    if getattr(model, "optimizer", None) is None:
        return False
    if flavor(model) == "keras3":
        return bool(getattr(model, "compiled", False))
    return bool(getattr(model, "_is_compiled", False))


def strategy_scope(model: Any):
    """The scope of the strategy the model was built under (its optimizer creates slots there)."""
    import contextlib

    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or strategy is tf.distribute.get_strategy() or _is_default(strategy):
        return contextlib.nullcontext()  # no strategy, or already inside its scope
    return strategy.scope()


def _is_default(strategy: Any) -> bool:
    return type(strategy).__name__ == "_DefaultDistributionStrategy"


def run_step(model: Any, data: Any):
    """Runs ``model.train_step(data)`` the way ``fit`` does: in its strategy's replica context, the
    only replica's sums forwarded as a planned step has them (``one_replica_sums_forwarded``)."""
    strategy = getattr(model, "distribute_strategy", None)

    def step(batch):
        with one_replica_sums_forwarded():
            return model.train_step(batch)

    if strategy is None or not isinstance(strategy, tf.distribute.Strategy) or _is_default(strategy):
        return step(data)

    step._kerasflow_internal = True  # FastTStrategy must not take this for the user's fit
    return strategy.run(step, args=(data,))


class _OneReplicaContext(tf.distribute.ReplicaContext):
    """The replica context of a strategy's only replica, whose all-reduce returns its values."""

    def all_reduce(self, reduce_op, value, options=None):
        return value  # the sum, or mean, over one replica: the values themselves, bit for bit


@contextlib.contextmanager
def one_replica_sums_forwarded():
    """While inside (a trace of the training step), an all-reduce over the only replica returns
    its values as they are. Both Keras' optimizers sum the gradients across replicas first
    (``get_replica_context().all_reduce``), which TensorFlow wraps in a custom gradient: one
    ``IdentityN`` op that takes every gradient and hands it on. With one replica that sum changes
    nothing, but a plan has to put that one op on one device, and every gradient computed
    elsewhere would go there and back (a 4 MiB gradient twice over a 1.4 GB/s link: 6 ms a step).
    """
    current = tf.distribute.get_replica_context()
    if current is None or current.num_replicas_in_sync != 1:
        yield
        return
    with _OneReplicaContext(current.strategy, replica_id_in_sync_group=0):
        yield


@contextlib.contextmanager
def custom_gradients_forgotten():
    """Unregisters, when the block ends, the custom gradients TensorFlow registered inside it.

    Each ``tf.custom_gradient`` traced into a graph (Keras' losses and GRU use them, and so does
    the optimizer's update) registers a gradient function under a new name in TensorFlow's
    global registry, which keeps it, and the whole graph it closes over, for the life of the
    process: megabytes a trace of a small model. Use this around a trace whose gradients are
    taken inside it (a training step, whose tape runs at trace time); never around a function
    differentiated after it was traced, which needs its gradient functions then.

    Example:
        >>> from tensorflow.python.framework import ops
        >>> @tf.custom_gradient
        ... def clipped(x):
        ...     return tf.identity(x), lambda dy: tf.clip_by_value(dy, -1.0, 1.0)
        >>> registered = len(ops._gradient_registry._registry)
        >>> with custom_gradients_forgotten():
        ...     _ = tf.function(clipped).get_concrete_function(tf.TensorSpec([], tf.float32))
        >>> len(ops._gradient_registry._registry) == registered
        True
    """
    from tensorflow.python.framework import ops

    before = registered_custom_gradients()
    try:
        yield
    finally:
        for name in registered_custom_gradients() - before:
            del ops._gradient_registry._registry[name]


def registered_custom_gradients() -> set[str]:
    """The names under which TensorFlow's gradient registry now keeps ``tf.custom_gradient``
    functions (see ``custom_gradients_forgotten``)."""
    from tensorflow.python.framework import ops

    # tf.custom_gradient's names, never those of a registered op type.
    return {name for name in ops._gradient_registry._registry if name.startswith("CustomGradient-")}


def has_own_train_step(model: Any) -> bool:
    """True when the model's class overrides Keras' ``train_step`` (a custom training step)."""
    module = getattr(type(model).train_step, "__module__", "") or ""
    return not module.startswith(("keras.", "tf_keras."))


def model_of_step_function(function: Any) -> Any:
    """The model whose training step ``function`` runs, or None.

    Keras 3 passes the bound ``model.train_step``; tf-keras passes a ``run_step(data)`` closure
    that calls ``model.train_step(data)``.
    """
    owner = getattr(function, "__self__", None) or getattr(function, "model", None)  # a bound method, or
    if getattr(function, "__name__", "") == "train_step" and is_keras_model(owner):  # kerasflow's PlannedStep
        return owner
    if getattr(function, "__name__", "") == "run_step":
        code = getattr(function, "__code__", None)
        if code is None or "train_step" not in code.co_names:
            return None  # tf-keras' evaluate/predict run_step
        for cell in getattr(function, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if is_keras_model(value):
                return value
    return None


def compute_loss(model: Any, x, y, prediction, sample_weight):
    """The compiled loss of one (micro-)batch, as ``train_step`` computes it."""
    if flavor(model) == "keras3":
        return model._compute_loss(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)
    return model.compute_loss(x, y, prediction, sample_weight)


def compiled_loss(model: Any) -> Any:
    """The object whose ``call(y_true, y_pred, sample_weight)`` computes the compiled loss, inside
    the ``compile_loss`` name scope its ``__call__`` opens: Keras 3's ``CompileLoss``. None for a
    model compiled without a loss, and for tf-keras, whose compiled loss kerasflow does not split."""
    return getattr(model, "_compile_loss", None) if flavor(model) == "keras3" else None


def compiled_losses(model: Any) -> list:
    """The loss objects the compiled loss sums (``profiling.splittable.losses_combine_by_share``
    judges them); empty where they cannot be read (no compiled loss, tf-keras)."""
    entries = getattr(compiled_loss(model), "_flat_losses", None)  # (path, loss, weight, name) in Keras 3.15
    return [entry[1] if isinstance(entry, tuple) else entry for entry in entries or ()]


def carries_mask(structure: Any) -> bool:
    """Whether a tensor of ``structure`` (a model's predictions) carries a Keras mask."""
    return any(getattr(t, "_keras_mask", None) is not None for t in tf.nest.flatten(structure))


_COUNTING = "_kerasflow_counting"  # a tracker's own update_state and the share it counts, while counting


@contextlib.contextmanager
def loss_trackers_counting(model: Any, share):
    """While inside (at trace time), the compiled loss' per-output trackers count an update Keras
    3 would count as one (a batch of unknown static size) as ``share`` of one: a wave or a
    replica computes the loss of ``share`` of the batch, and the shares of one step must count as
    plain Keras counts the step, once, or the per-output means over ``fit`` are weighted by the
    number of parts. Inside another (a shard of a wave's loss), the shares multiply. tf-keras
    weighs each update by its dynamic batch size already.
    """
    compile_loss = getattr(model, "_compile_loss", None) if flavor(model) == "keras3" else None
    trackers = [metric for metric in (getattr(compile_loss, "metrics", None) or []) if metric is not None]
    with contextlib.ExitStack() as stack:
        for tracker in trackers:
            # Nested (a shard of a wave's loss): the shares multiply.
            own, outer = tracker.__dict__.get(_COUNTING, (tracker.update_state, None))
            weight = share if outer is None else outer * share

            def counting(values, sample_weight=None, own=own, weight=weight):
                return own(values, sample_weight=weight if sample_weight is None else sample_weight)
            stack.enter_context(overridden(tracker, "update_state", counting))
            stack.enter_context(overridden(tracker, _COUNTING, (own, weight)))
        yield


def loss_for_gradients(model: Any, loss):
    """The loss the gradients are taken of: Keras 3 scales it by a ``LossScaleOptimizer``'s scale
    (its update divides the gradients by it again); tf-keras' ``apply_gradients`` does not
    unscale, so its loss stays as it is."""
    if flavor(model) == "keras3" and model.optimizer is not None:
        return model.optimizer.scale_loss(loss)
    return loss


def track_loss(model: Any, loss, x) -> None:
    """Updates the loss tracker with the loss of the batch ``x``, as Keras 3's ``train_step`` does
    before it takes the gradients, with the batch's size read off ``x`` as it reads it: so the
    step's top-level ops are made, and named, as in the profiled step, which the plan names
    them by. tf-keras' ``compute_loss`` already did."""
    if flavor(model) == "keras3":
        model._loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])


def step_metrics(model: Any, x, y, prediction, sample_weight):
    """The metrics ``train_step`` returns, updated with the step's predictions."""
    if flavor(model) == "keras3":
        return model.compute_metrics(x, y, prediction, sample_weight=sample_weight)
    return model.compute_metrics(x, y, prediction, sample_weight)


def is_batch_normalization(layer: Any) -> bool:
    """A Keras 3 BatchNormalization (or subclass) that reduces over the batch axis in training,
    whose ``_moments`` kerasflow can compute across replicas (tf-keras runs no replicas)."""
    return (isinstance(layer, _keras.layers.BatchNormalization) and hasattr(layer, "_moments")
            and 0 in (getattr(layer, "_reduction_axes", None) or ()))


@contextlib.contextmanager
def moving_statistics_kept(layer: Any):
    """While inside (at trace time), the Keras 3 BatchNormalization ``layer`` normalizes as its
    call does but leaves its moving statistics (and renormalization's) as they are: the shards
    of a split layer compute one statistic, which one of them adds to the moving averages."""
    def kept(*_args, **_kwargs):
        return None

    with contextlib.ExitStack() as patches:
        for variable in (layer.moving_mean, layer.moving_variance):
            patches.enter_context(overridden(variable, "assign", kept))
        patches.enter_context(overridden(layer, "_update_renorm_statistics", kept))
        yield


def can_move_variables(model: Any) -> bool:
    """Keras 3 keeps each TensorFlow variable behind one attribute, so it can be swapped;
    tf-keras variables are referenced from many places."""
    return flavor(model) == "keras3"


def steps_per_call(model: Any) -> int:
    """The train steps one call of the train function runs (``compile(steps_per_execution=)``):
    an int in Keras 3, a variable in tf-keras."""
    value = getattr(model, "steps_per_execution", None) or 1
    return int(value.numpy()) if hasattr(value, "numpy") else int(value)


def can_read_weights_per_copy(layer: Any) -> bool:
    """Whether ``weights_read_here`` can give ``layer`` its weights as values: a Keras 3 layer
    keeps each TensorFlow variable behind one attribute; tf-keras' are referenced from many places."""
    return isinstance(layer, _keras.layers.Layer)


@contextlib.contextmanager
def weights_read_here(layer: Any):
    """While inside (at trace time), ``layer``'s trainable weights are read once, here (under
    the current device and name scope), and the layer computes with those values instead of
    the variables: a recurrent loop then takes its weights as values and runs where it is
    placed, not where the variables live (TensorFlow runs an op that takes a variable's
    handle on the variable's device). Gradients still reach the variables through the reads.
    Keras 3 only (tf-keras variables are referenced from many places): elsewhere it does nothing.
    """
    weights = [w for w in layer.trainable_weights
               if is_movable(w) and isinstance(backing_variable(w), tf.Variable)]
    if not can_read_weights_per_copy(layer) or not weights:
        yield
        return
    own = [backing_variable(w) for w in weights]
    for weight, variable in zip(weights, own):
        # Read where the variable lives, copied here once: a loop then carries the copy.
        set_backing_variable(weight, tf.identity(tf.convert_to_tensor(variable)))
    try:
        yield
    finally:
        for weight, variable in zip(weights, own):
            set_backing_variable(weight, variable)


_ABSENT = object()


def override(owner: Any, name: str, value: Any) -> Any:
    """Sets ``owner.name`` on the instance past Keras' attribute tracking (a model's
    ``train_step`` or ``train_function``, a layer's ``call``); the one way kerasflow patches a
    Keras object. Returns what was there, for ``override(owner, name, previous)`` to restore:
    an instance attribute, or a marker that restoring removes the instance attribute again.
    """
    previous = owner.__dict__.get(name, _ABSENT)
    if value is _ABSENT:
        owner.__dict__.pop(name, None)
    else:
        object.__setattr__(owner, name, value)
    return previous


@contextlib.contextmanager
def overridden(owner: Any, name: str, value: Any):
    """``override`` while inside, restored on the way out."""
    previous = override(owner, name, value)
    try:
        yield
    finally:
        override(owner, name, previous)


def is_movable(variable: Any) -> bool:
    """Whether ``variable`` is a Keras 3 variable whose TensorFlow variable can be swapped."""
    return hasattr(variable, "_value")


def backing_variable(variable: Any) -> Any:
    """The TensorFlow variable (or, while ``weights_read_here`` runs, the tensor) behind a Keras 3 variable."""
    return variable._value


def set_backing_variable(variable: Any, backing: Any) -> None:
    """Points a Keras 3 variable at another TensorFlow variable (or a tensor read from one)."""
    variable._value = backing


def forget_traced_functions(model: Any) -> None:
    """Drops the test and predict functions Keras traced: they read the variables they saw
    when traced, so after variables were swapped the next ``evaluate`` or ``predict`` must
    trace them again (both Keras build them anew when they are None)."""
    for name in ("test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            override(model, name, None)


_FIT_END_HOOKS = "_kerasflow_fit_end_hooks"  # on a model: what runs when each of its fits ends


def watch_fits() -> None:
    """Wraps ``fit`` of every Keras model (Keras 3's, and tf-keras' when installed) so that the hooks
    ``on_fit_end`` gave a model run when each of its fits ends, normally or by an exception (Keras
    calls no callback when ``fit`` raises). Idempotent; made before any ``fit`` kerasflow joins,
    since a ``fit`` already running keeps the method it started with.
    """
    from keras.src.backend.tensorflow import trainer as tensorflow_trainer

    owners = [tensorflow_trainer.TensorFlowTrainer]
    if _tf_keras is not None:
        from tf_keras.src.engine import training as tf_keras_training

        owners.append(tf_keras_training.Model)
    for owner in owners:
        own = owner.__dict__["fit"]
        if getattr(own, "_kerasflow_watched", False):
            continue

        @functools.wraps(own)
        def fit(self, *args, own=own, **kwargs):
            try:
                return own(self, *args, **kwargs)
            finally:
                for hook in list(self.__dict__.get(_FIT_END_HOOKS, ())):
                    hook(self)

        fit._kerasflow_watched = True
        setattr(owner, "fit", fit)


def on_fit_end(model: Any, hook) -> None:
    """Calls ``hook(model)`` whenever a ``fit`` of ``model`` ends from now on, normally or by an
    exception, after Keras' own end of ``fit`` (``watch_fits``, which must have been called
    first). Adding a hook twice adds it once; a hook must not raise.
    """
    hooks = model.__dict__.get(_FIT_END_HOOKS)
    if hooks is None:
        hooks = []
        override(model, _FIT_END_HOOKS, hooks)
    if hook not in hooks:
        hooks.append(hook)


def build_when_traced_under(strategy_type: type) -> None:
    """Keras 3 models made under a ``strategy_type`` strategy are built as under no strategy:
    when their train function is first traced, not from a batch pulled at the start of ``fit``.

    Under any ``tf.distribute`` strategy, Keras 3 begins every ``fit`` (and ``evaluate``)
    by pulling a batch from a fresh iterator of the data to build the model symbolically,
    then starts the epoch's own iterator (``TensorFlowTrainer._maybe_symbolic_build``).
    That extra iterator runs the input pipeline once more, prefetch included: an augmentation
    layer in ``Dataset.map`` drew 12 times in an 8-batch epoch where plain Keras draws 8
    (``OneDeviceStrategy`` 15), so every later batch was augmented otherwise and a fine-tuning
    run drifted from plain Keras' from its first step. One replica needs no symbolic build:
    the model's and optimizer's variables are made at the first trace, as without a strategy.
    tf-keras has no such build. Idempotent.
    """
    from keras.src.backend.tensorflow import trainer as tensorflow_trainer

    owner = tensorflow_trainer.TensorFlowTrainer
    kept = getattr(owner, "_kerasflow_builds_when_traced", ())
    if strategy_type in kept or not hasattr(owner, "_maybe_symbolic_build"):
        return  # done, or a Keras that builds otherwise (FastTStrategy.scope names the fix there)
    symbolic_build = owner._maybe_symbolic_build

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if isinstance(getattr(self, "_distribute_strategy", None), strategy_type):
            return None  # as under no strategy: built when the train function is traced
        return symbolic_build(self, iterator=iterator, data_batch=data_batch)

    owner._maybe_symbolic_build = maybe_symbolic_build
    owner._kerasflow_builds_when_traced = (*kept, strategy_type)
