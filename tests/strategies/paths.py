"""What ``test_every_path`` runs: four small models, the fit programs, the two doors, the seams
that force each path of the plan, and every output a user reads after ``fit``, flattened so that
a kerasflow run and plain Keras' compare output by output.

Nothing here decides a verdict by real timing: the stopwatch reports scripted seconds (every step
still runs for real), the planner returns the plans in the order a path needs, and a failure is
forced by a collaborator that raises.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import tempfile
import warnings
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import kerasflow
from kerasflow.planner import ranked_plans
from kerasflow.planner.search.planning import PLANNED_CANDIDATES
from kerasflow.strategies import Collaborators
from kerasflow.testing.rounding import Spread, permuted_rows
from tests.planned_cluster import CLUSTER_OPTION

BATCH = 16
EPOCHS = 3  # of 12 steps (the convnet): 36 steps, room for a plan and its runner-up (19 steps)
MORE_EPOCHS = 1  # the second fit of a two-fit program
INTERRUPTED_AT = 1  # the backup program's first fit stops as this epoch begins (step 12: mid-trial)
SEED = 7
# The plan is made after step 2 (warm-up 2, profile 1); its trial takes 8 steps: the first planned
# step (retracing, untimed), one untimed default step, then 3 rounds of a planned and a default step.
OPTIONS = dict(verbose=0, warmup_steps=2, profile_steps=1, **CLUSTER_OPTION)
# Where a plan adds no sum in another order, every variable equals plain Keras' bit for bit and
# every other output (logs, metrics, predictions) is within 1e-5 of it (1e-7 near 0). A
# data-parallel plan sums each gradient and BatchNormalization's statistics with collectives, and
# a split layer, loss or BatchNormalization sums its shards' parts, in another order than one
# device: there each output is held to ten times plain Keras' own spread under permuted rows,
# measured in the same run (``kerasflow/testing/rounding.py``). A missed or repeated step, a
# stale learning rate or the wrong variables differ by far more.
RTOL, ATOL = 1e-5, 1e-7


# ---------------------------------------------------------------------------------------- models
@dataclasses.dataclass(frozen=True)
class Spec:
    """One model: how to build it (compiled, under whatever scope is open), its data, its plans.

    ``first`` and ``second`` are the planner's candidates the paths put in force: the plan timed
    first and the runner-up.
    """

    name: str
    build: Callable[[], keras.Model]
    data: Callable[[], dict]  # fit's data arguments: x, y, validation_split or validation_data
    first: str
    second: str
    epochs: int = EPOCHS
    callable: bool = True  # has call(): evaluate and predict
    draws_by_row: bool = False  # a random layer draws numbers by row: permuted rows change its math
    all_callbacks: bool = False  # ModelCheckpoint, EarlyStopping and ReduceLROnPlateau
    optimizers: Callable[[keras.Model], list] = lambda model: [model.optimizer]


def convnet():
    """keras.io "Simple MNIST convnet", small; every layer named so that twins share one graph."""
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(8, kernel_size=(3, 3), activation="relu", name="conv_a"),
        layers.MaxPooling2D(pool_size=(2, 2), name="pool_a"),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu", name="conv_b"),
        layers.MaxPooling2D(pool_size=(2, 2), name="pool_b"),
        layers.Flatten(name="flatten"),
        layers.Dropout(0.5, name="dropout"),
        layers.Dense(10, activation="softmax", name="classes"),
    ], name="convnet")
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(1e-2, name="adam"),
                  metrics=["accuracy"])
    return model


def band_images(samples, size, classes):
    """Noise images with a brighter band of rows whose position is the label: learnable at once."""
    labels = np.arange(samples) % classes
    np.random.shuffle(labels)
    x = np.random.random((samples, size, size, 1)).astype("float32") * 0.5
    rows = size // classes
    for index, label in enumerate(labels):
        x[index, label * rows:(label + 1) * rows] += 0.5
    return x, labels


def convnet_data():
    # 192 to train (12 steps), 64 to validate: no partial batch, so no step is traced twice. The
    # labels are float32: to_categorical's float64 ones make profile_model trace another step than
    # fit's, and the given plan would be refused (test_a_plan_profile_model_made_fits_...).
    x, labels = band_images(256, 28, 10)
    return dict(x=x, y=keras.utils.to_categorical(labels, 10).astype("float32"), validation_split=0.25)


def bn_cnn():
    model = keras.Sequential([
        keras.Input(shape=(16, 16, 1)),
        layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv_a"),
        layers.BatchNormalization(momentum=0.8, name="bn_a"),
        layers.ReLU(name="relu_a"),
        layers.MaxPooling2D(2, name="pool_a"),
        layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv_b"),
        layers.BatchNormalization(momentum=0.8, name="bn_b"),
        layers.ReLU(name="relu_b"),
        layers.GlobalAveragePooling2D(name="gap"),
        layers.Dense(4, activation="softmax", name="classes"),
    ], name="bn_cnn")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(1e-2),
                  metrics=["accuracy"])
    return model


def bn_cnn_data():
    x, labels = band_images(192 + 32, 16, 4)  # 12 steps an epoch
    return dict(x=x[:192], y=labels[:192], validation_data=(x[192:], labels[192:]))


def gan():
    """keras.io "DCGAN": the tutorial models' ``GAN`` (its own train_step, two optimizers), its
    discriminator and generator smaller (8x8 images), every layer named."""
    from kerasflow.testing.tutorial_models import GAN

    discriminator = keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        layers.Conv2D(8, 3, strides=2, padding="same", name="d_conv"), layers.LeakyReLU(0.2, name="d_relu"),
        layers.GlobalMaxPooling2D(name="d_pool"), layers.Dense(1, name="d_logit"),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input(shape=(LATENT,)),
        layers.Dense(4 * 4 * 8, name="g_dense"), layers.LeakyReLU(0.2, name="g_relu"),
        layers.Reshape((4, 4, 8), name="g_reshape"),
        layers.Conv2DTranspose(8, 4, strides=2, padding="same", name="g_up"), layers.LeakyReLU(0.2, name="g_relu_up"),
        layers.Conv2D(1, 3, padding="same", activation="sigmoid", name="g_image"),
    ], name="generator")
    model = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT)
    model.compile(d_optimizer=keras.optimizers.Adam(3e-4, name="d_adam"),
                  g_optimizer=keras.optimizers.Adam(3e-4, name="g_adam"),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


LATENT = 8


def gan_data():
    """Images with a bright square at a random place (a ``tf.data`` pipeline, as the tutorial's)."""
    images = np.random.random((288, 8, 8, 1)).astype("float32") * 0.3
    for image, (row, column) in zip(images, np.random.randint(0, 5, (288, 2))):
        image[row:row + 3, column:column + 3] += 0.7
    return dict(x=tf.data.Dataset.from_tensor_slices(images).batch(BATCH))  # 18 steps an epoch


def pipeline_mlp():
    model = keras.Sequential([
        keras.Input(shape=(12,)),
        layers.Dense(32, activation="relu", name="hidden"),
        layers.Dense(3, activation="softmax", name="classes"),
    ], name="pipeline_mlp")
    model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(1e-2),
                  metrics=["accuracy"])
    return model


def pipeline_data():
    """``tf.data`` pipelines whose last batch is partial: 180 samples (11 steps of 16, then 4), 40."""
    x = np.random.normal(size=(220, 12)).astype("float32")
    labels = (np.argmax(x[:, :3], axis=1)).astype("int32")
    train = tf.data.Dataset.from_tensor_slices((x[:180], labels[:180])).batch(BATCH)
    validation = tf.data.Dataset.from_tensor_slices((x[180:], labels[180:])).batch(BATCH)
    return dict(x=train, validation_data=validation)


SPECS = {spec.name: spec for spec in [
    Spec("convnet", convnet, convnet_data, first="layerwise_model_parallel", second="heft", all_callbacks=True,
         draws_by_row=True),
    # The others without the callbacks; validation (which traces Keras' test function before the
    # first plan's verdict at step 16) ends each epoch of 12 steps, and the GAN has none.
    Spec("bn_cnn", bn_cnn, bn_cnn_data, first="layerwise_model_parallel", second="data_parallel"),
    Spec("gan", gan, gan_data, first="layerwise_model_parallel", second="heft", epochs=2, callable=False,
         draws_by_row=True,
         optimizers=lambda model: [model.d_optimizer, model.g_optimizer]),
    Spec("pipeline", pipeline_mlp, pipeline_data, first="data_parallel", second="heft"),
]}


def fresh() -> None:
    """Keras' names start afresh (``adam``, ``seed_generator``, not ``adam_7``): every build of a
    model then has the same op names, which a plan, its fingerprint and a profile are keyed by.
    (Only the names: ``keras.backend.clear_session`` also clears TensorFlow's kernel cache while the
    earlier tests' iterators still live, and the suite crashed twice in a later validation.)"""
    from keras.src.utils import naming

    naming.reset_uids()


def built(spec: Spec) -> keras.Model:
    """The model, built the same way every time (the seed set first; call ``fresh()`` first,
    outside any strategy scope)."""
    keras.utils.set_random_seed(SEED)
    model = spec.build()
    if not spec.callable:
        model.built = True  # no call(): Keras cannot build it under a strategy
    return model


def data_of(spec: Spec, rows_permuted: bool = False) -> dict:
    """The model's data; ``rows_permuted``: each training batch's rows permuted (the same
    sums in another order: ``kerasflow/testing/rounding.py``)."""
    assert not (rows_permuted and spec.draws_by_row), f"permuted rows change {spec.name}'s math"
    keras.utils.set_random_seed(SEED)
    data = spec.data()
    if rows_permuted and isinstance(data["x"], tf.data.Dataset):
        data["x"] = permuted_rows(data["x"])
    elif rows_permuted:  # the rows fit trains on; validation_split keeps the last ones as they are
        cut = math.ceil(len(data["x"]) * (1 - data.get("validation_split", 0.0)))
        for key in ("x", "y"):
            data[key] = np.concatenate([permuted_rows(data[key][:cut], BATCH), data[key][cut:]])
    return data


def steps_an_epoch(spec: Spec) -> int:
    data = data_of(spec)
    if isinstance(data["x"], tf.data.Dataset):
        return int(data["x"].cardinality())
    train = len(data["x"]) - int(len(data["x"]) * data.get("validation_split", 0.0))
    return -(-train // BATCH)


# ---------------------------------------------------------------------------------------- programs
@dataclasses.dataclass(frozen=True)
class Program:
    """What the user does: ``fits`` fits (the second one ``MORE_EPOCHS`` more), reading ``between``
    (``"evaluate"``, ``"predict"``) between them; with ``backup``, the first fit is interrupted as
    epoch ``INTERRUPTED_AT`` begins and the second resumes it with ``BackupAndRestore``.

    After each fit but the last, what a user reads without running the model (weights, optimizer
    state, learning rate, the checkpoint) is read too, under ``after_fit0.``.
    """

    fits: int = 1
    between: tuple = ()
    backup: bool = False


ONE, TWO, BACKUP = Program(), Program(2), Program(2, backup=True)
TWO_WITH_EVALUATE = Program(2, between=("evaluate",))
TWO_WITH_EVALUATE_AND_PREDICT = Program(2, between=("evaluate", "predict"))


class Recorder(keras.callbacks.Callback):
    """Every ``on_train_batch_end`` logs, as floats."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append({key: float(np.asarray(value)) for key, value in (logs or {}).items()})


class Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == INTERRUPTED_AT:
            raise Interrupted(f"interrupted as epoch {epoch} begins")


class Interrupted(RuntimeError):
    pass


class Door:
    """How kerasflow enters (``"strategy"`` or ``"callback"``), or None: plain Keras.

    Both doors read the same: ``handle`` is the strategy or the callback (``plan``,
    ``plan_in_force``, ``report``, ``placement_report()``).
    """

    def __init__(self, kind: str | None, collaborators: Collaborators | None = None, **options):
        self.kind = kind
        self.options = {**OPTIONS, **options, "collaborators": collaborators}
        self.handle = None

    def build(self, spec: Spec) -> keras.Model:
        fresh()
        collaborators = self.options["collaborators"]
        if collaborators is not None and collaborators.profiler is Collaborators.profiler:
            once = functools.partial(profiled_once, spec.name, collaborators.profiler)
            self.options["collaborators"] = dataclasses.replace(collaborators, profiler=once)
        if self.kind == "strategy":
            self.handle = kerasflow.FastTStrategy(**self.options)
            with self.handle.scope():
                return built(spec)
        if self.kind == "callback":
            self.handle = kerasflow.callbacks.FastT(**self.options)
        return built(spec)

    def callbacks(self) -> list:
        return [self.handle] if self.kind == "callback" else []

    def use_plan(self, plan) -> None:
        """The plan from the next fit on: ``strategy.use_plan``, or a new callback given ``plan=``."""
        if self.kind == "strategy":
            self.handle.use_plan(plan)
        elif self.kind == "callback":
            self.handle = kerasflow.callbacks.FastT(**{**self.options, "plan": plan})


# ---------------------------------------------------------------------------------------- runs
@dataclasses.dataclass(frozen=True)
class State:
    """What the door says after a fit: the plan, whether it is in force, the report, the placement
    report, the stopwatch's counts, kerasflow's warnings so far, and the steps that fit ran."""

    plan: Any
    plan_in_force: bool
    report: Any
    placement: Any
    counts: dict
    warnings: list
    steps: int


@dataclasses.dataclass
class Run:
    """A program's outputs (name -> value, in the order a user reads them), what each variable
    output is (its path), and the door's ``State`` after each fit."""

    outputs: dict
    names: dict
    states: list
    door: Door
    model: Any


def run(spec_name: str, program: Program = ONE, door: Door | None = None, between: Callable | None = None,
        directory: str | None = None, rows_permuted: bool = False) -> Run:
    """Runs ``program`` on the model ``spec_name`` through ``door`` (None: plain Keras) and reads
    every output. ``between(door)`` runs between two fits, after the reads (``use_plan``);
    ``rows_permuted``: see ``data_of``."""
    spec = SPECS[spec_name]
    door = door or Door(None)
    directory = directory or tempfile.mkdtemp(prefix=f"every_path_{spec_name}_")
    outputs, names, states = {}, {}, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = door.build(spec)
        data = data_of(spec, rows_permuted)
        for index in range(program.fits):
            recorder = Recorder()
            stateful = _stateful_callbacks(spec, directory)
            callbacks = door.callbacks() + [recorder] + list(stateful.values())
            epochs = spec.epochs if index == 0 or program.backup else spec.epochs + MORE_EPOCHS
            initial = spec.epochs if index and not program.backup else 0
            if program.backup:
                callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")))
                if index == 0:
                    callbacks.append(Interrupt())
            try:
                history = model.fit(**data, batch_size=None if isinstance(data["x"], tf.data.Dataset) else BATCH,
                                    epochs=epochs, initial_epoch=initial, shuffle=False, verbose=0,
                                    callbacks=callbacks)
                outputs.update(_flat(f"fit{index}.history", history.history))
            except Interrupted:
                assert program.backup and index == 0
            for step, logs in enumerate(recorder.steps):
                outputs.update(_flat(f"fit{index}.step{step}", logs))
            if "early_stopping" in stateful:
                outputs[f"fit{index}.early_stopping.stopped_epoch"] = stateful["early_stopping"].stopped_epoch
            if index + 1 < program.fits:
                outputs.update(_read_state(spec, model, directory, names, f"after_fit{index}."))
                if spec.callable and "evaluate" in program.between:
                    outputs.update(_flat(f"after_fit{index}.evaluate", _evaluate(model, data)))
                if spec.callable and "predict" in program.between:
                    outputs[f"after_fit{index}.predict"] = _predict(model, data)
            states.append(_state(door, caught, len(recorder.steps)))
            if index + 1 < program.fits and between is not None:
                between(door)
        if spec.callable:
            outputs.update(_flat("evaluate", _evaluate(model, data)))
            outputs["predict"] = _predict(model, data)
        outputs.update(_read_state(spec, model, directory, names))
    states[-1] = dataclasses.replace(states[-1], warnings=_kerasflow_warnings(caught))
    return Run(outputs, names, states, door, model)


def _kerasflow_warnings(caught) -> list:
    return [str(w.message) for w in caught if str(w.message).startswith("kerasflow")]


def _state(door: Door, caught, steps: int) -> State:
    handle = door.handle
    if handle is None:
        return State(None, False, None, None, {}, _kerasflow_warnings(caught), steps)
    collaborators = door.options.get("collaborators")
    counts = dict(getattr(collaborators.stopwatch, "counts", {})) if collaborators is not None else {}
    return State(handle.plan, handle.plan_in_force, copy.deepcopy(handle.report), handle.placement_report(),
                 counts, _kerasflow_warnings(caught), steps)


def _stateful_callbacks(spec: Spec, directory: str) -> dict:
    callbacks = {}
    if spec.all_callbacks:
        callbacks["checkpoint"] = keras.callbacks.ModelCheckpoint(
            os.path.join(directory, "best.weights.h5"), monitor="val_accuracy", save_best_only=True,
            save_weights_only=True)
        # EarlyStopping judges from epoch EPOCHS - 2 on, so it can stop only at the last epoch (every
        # path keeps its steps); ReduceLROnPlateau halves the rate after epoch 1, so the planned steps
        # of epoch 2 run with the rate it set; the checkpoint keeps epoch 1 (val_accuracy reaches 1).
        callbacks["early_stopping"] = keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=0, min_delta=0.3, start_from_epoch=EPOCHS - 2)
        callbacks["reduce_lr"] = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                                                   min_delta=1.5)
    return callbacks


def _evaluate(model, data) -> dict:
    x, y = _validation(data)
    return model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)


def _validation(data):
    if "validation_data" in data:
        validation = data["validation_data"]
        return (validation, None) if isinstance(validation, tf.data.Dataset) else validation
    cut = int(len(data["x"]) * (1 - data["validation_split"]))
    return data["x"][cut:], data["y"][cut:]


def _predict(model, data):
    x, _ = _validation(data)
    return model.predict(x, batch_size=BATCH, verbose=0)


def _read_state(spec: Spec, model, directory, names: dict, prefix: str = "") -> dict:
    """What a user reads without running the model: every weight, every optimizer variable, the
    learning rate, the checkpoint's weights loaded into a twin; ``names`` takes each variable's
    path."""
    outputs = {}

    def read(name, variable):
        outputs[prefix + name], names[prefix + name] = np.array(variable.numpy()), variable.path

    for index, variable in enumerate(model.weights):
        read(f"weights[{index}]", variable)
    for which, optimizer in enumerate(spec.optimizers(model)):
        for index, variable in enumerate(optimizer.variables):
            read(f"optimizer{which}[{index}]", variable)
    if spec.all_callbacks:
        outputs[prefix + "learning_rate"] = float(np.asarray(model.optimizer.learning_rate))
    best = os.path.join(directory, "best.weights.h5")
    if spec.all_callbacks and os.path.exists(best):
        twin = built(spec)
        twin.load_weights(best)
        for index, variable in enumerate(twin.weights):
            read(f"checkpoint[{index}]", variable)
    return outputs


def _flat(prefix: str, values: dict) -> dict:
    return {f"{prefix}.{key}": np.asarray(value, dtype="float64") if isinstance(value, (list, float, int))
            else value for key, value in values.items()}


@functools.lru_cache(maxsize=None)
def plain(spec_name: str, program: Program = ONE, rows_permuted: bool = False) -> Run:
    """Plain Keras' run (no kerasflow), once per model, program and order of rows."""
    return run(spec_name, program, Door(None), rows_permuted=rows_permuted)


def differences(actual: dict, expected: dict, names: dict | None = None, *, spread: Spread | None = None,
                limit: int = 5) -> list[str]:
    """The outputs of ``actual`` that differ from ``expected`` (the first ``limit``), in the order
    a user reads them; an output present in one run only is a difference too. ``names``: what
    each output is, for the message; ``spread``: a plan that sums in another order than one
    device ran a step, and plain Keras' own spread under permuted rows bounds each output
    (otherwise every variable bit for bit, the rest to ``RTOL`` and ``ATOL``)."""
    names = names or {}
    found = []
    for name in list(expected) + [name for name in actual if name not in expected]:
        if name not in actual or name not in expected:
            found.append(f"{name}: only in {'kerasflow' if name in actual else 'plain Keras'}'s run")
        else:
            a, e = np.asarray(actual[name]), np.asarray(expected[name])
            if spread is not None:
                same = spread.within(a, e, name)
            elif _is_variable(name):  # a placement-only plan runs plain Keras' kernels: bit for bit
                same = a.shape == e.shape and np.array_equal(a, e)
            else:
                same = a.shape == e.shape and np.allclose(a, e, rtol=RTOL, atol=ATOL)
            if not same:
                gap = np.max(np.abs(a - e)) if a.shape == e.shape else "shapes differ"
                found.append(f"{name}{' ' + names[name] if name in names else ''}: kerasflow {_show(a)} != plain "
                             f"{_show(e)} (max |diff| {gap})")
        if len(found) >= limit:
            break
    if found and spread is not None:
        found.append(spread.describe(found[0].split(':')[0].split(' ')[0]))
    return found


def _is_variable(name: str) -> bool:
    """Whether the output is a variable's value: a weight, an optimizer's, or a checkpoint's."""
    return name.split(".")[-1].startswith(("weights[", "optimizer", "checkpoint["))


def _show(value: np.ndarray) -> str:
    flat = value.ravel()
    return np.array2string(flat[:4], precision=8) + (f"... ({flat.size} values)" if flat.size > 4 else "")


# ---------------------------------------------------------------------------------------- seams
def planner(first: str, second: str | None = None, *, runner_up_predicted: float | Callable | None = None,
            change: Callable | None = None) -> Callable:
    """A planner returning the real plans ``first`` then ``second`` (both computed by
    ``ranked_plans`` on the in-fit profile). ``runner_up_predicted``: the runner-up's
    predicted seconds (a function of the first plan's predicted seconds, or seconds);
    ``change(plan)``: the first plan replaced by what it returns."""
    wanted = (first,) if second is None else (first, second)

    def plan(request):
        plans = {p.algorithm: p for p in ranked_plans(dataclasses.replace(request, candidates=wanted))}
        missing = [name for name in wanted if name not in plans]
        assert not missing, f"no {missing} among {sorted(plans)}"
        best = plans[first] if change is None else change(plans[first])
        if second is None:
            return [best]
        runner_up = plans[second]
        if runner_up_predicted is not None:
            seconds = runner_up_predicted(best.predicted_step_time) if callable(runner_up_predicted) \
                else runner_up_predicted
            runner_up = dataclasses.replace(runner_up, predicted_step_time=seconds)
        return [best, runner_up]

    return plan


def a_plan_whatever_it_gains(request):
    """kerasflow's planner on the logical CPUs taken as devices of their own, the default placement
    left out: a plan is always applied. For tests of what happens to a plan: on their shared host
    the real planner keeps the default placement (every plan ties with it there)."""
    return ranked_plans(dataclasses.replace(request, cluster=request.cluster.independent(),
                                            candidates=PLANNED_CANDIDATES))


# The collaborators of a door that applies a plan, whatever it gains, and times it for real.
PLANNING = Collaborators(planner=a_plan_whatever_it_gains)


def raising(what: str) -> Callable:
    def collaborator(*args, **kwargs):
        raise RuntimeError(f"no {what} today")

    return collaborator


_PROFILES: dict = {}


def profiled_once(key, profiler, model, batch, **settings):
    """The in-fit profile of the model ``key``, profiled by ``profiler`` the first time only: every
    later run of that model plans on the same real profile (a second or two saved a run; the op
    names agree, as ``fresh()`` made them, and both doors trace the same step)."""
    if key not in _PROFILES:
        _PROFILES[key] = profiler(model, batch, **settings)
    return _PROFILES[key]


@functools.lru_cache(maxsize=None)
def given_plan(spec_name: str, algorithm: str = "heft"):
    """A plan made before fit, as a user makes one: ``profile_model`` on a twin, then ``kerasflow.plan``."""
    from kerasflow.profiling import profile_model
    from kerasflow.profiling.links import planning_cluster
    from kerasflow.strategies.options import Options

    spec = SPECS[spec_name]
    data = data_of(spec)
    fresh()
    twin = built(spec)
    graph = profile_model(twin, (data["x"][:64], data["y"][:64]), batch_size=BATCH, steps=1, second_batch=False,
                          verbose=0)
    cluster = planning_cluster(Options(devices=("/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3")))
    return kerasflow.plan(graph, cluster, split=False, candidates=(algorithm,), replicated=False, verbose=0)

