"""Transfer learning, then fine-tuning after a recompile in the strategy's scope (the Keras guide's
pattern), with random augmentation in the ``tf.data`` pipeline: every output equals plain Keras'
(bit for bit where only placement-only plans ran; where the machine's timing let a plan that sums
in another order run, within plain Keras' own spread under that reordering, measured in the test).

Under any ``tf.distribute`` strategy Keras 3 pulled one batch at the start of every ``fit`` to build
the model, running the pipeline's augmentation once more (12 draws in an 8-batch epoch where
plain Keras makes 8): every later batch was augmented otherwise, and the fine-tuning phase
differed from plain Keras' from its first step. ``FastTStrategy`` builds as the default strategy
does (``_compat.build_when_traced_under``).
"""

import dataclasses
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import kerasflow
from kerasflow.planner import Shard
from kerasflow.planner.ir.graphtables import LOSS_GROUP
from kerasflow.strategies import Collaborators
from kerasflow.testing import PlansThatRan, ScriptedStopwatch
from kerasflow.testing.rounding import Spread, permuted_rows
from tests.strategies import paths

BATCH = 16


def pipeline():
    """Images through augmentation layers in ``Dataset.map``, prefetched and cached, as the guide's."""
    rng = np.random.default_rng(0)
    x = rng.random((128, 16, 16, 3)).astype("float32")
    y = (x[:, :8, :, 0].mean(axis=(1, 2)) > 0.5).astype("float32")
    augment = keras.Sequential([layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return dataset.map(lambda images, labels: (augment(images, training=True), labels)).prefetch(2).cache()


def two_phases(door: str | None, dropout: float = 0.2, rows_permuted: bool = False, **options) -> dict:
    """A frozen base under a new head, fit; the base unfrozen, compiled again in the model's
    strategy scope, fit: the losses of both phases, every weight and the predictions.
    ``rows_permuted``: each batch's rows permuted after augmentation (the same sums in another
    order: only without dropout, which draws its mask by row)."""
    paths.fresh()
    keras.utils.set_random_seed(paths.SEED)
    handle, callbacks = None, []
    if door == "strategy":
        handle = kerasflow.FastTStrategy(**paths.OPTIONS, **options)
        scope = handle.scope()
    else:
        scope = tf.distribute.get_strategy().scope()
        if door == "callback":
            handle = kerasflow.callbacks.FastT(**paths.OPTIONS, **options)
            callbacks = [handle]
    with scope:
        base = keras.Sequential([keras.Input((16, 16, 3)), layers.Conv2D(8, 3, activation="relu", name="conv"),
                                 layers.BatchNormalization(name="norm"), layers.GlobalAveragePooling2D(name="pool")],
                                name="base")
        base.trainable = False
        inputs = keras.Input((16, 16, 3))
        features = layers.Dropout(dropout, name="dropout")(base(inputs, training=False))
        model = keras.Model(inputs, layers.Dense(1, name="logit")(features), name="transfer")
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.BinaryCrossentropy(from_logits=True))
    data = trained_on = pipeline()
    if rows_permuted:
        assert dropout == 0, "permuted rows change the dropout masks' rows: another model's math"
        trained_on = permuted_rows(data)  # after the cache: predict reads its rows as trained, in order
    outputs = {"transfer.loss": model.fit(trained_on, epochs=2, verbose=0, callbacks=callbacks).history["loss"]}
    base.trainable = True
    with model.distribute_strategy.scope():
        model.compile(keras.optimizers.Adam(1e-4), keras.losses.BinaryCrossentropy(from_logits=True))
    outputs["fine_tuning.loss"] = model.fit(trained_on, epochs=1, verbose=0, callbacks=callbacks).history["loss"]
    outputs.update({f"weights[{i}]": np.asarray(w) for i, w in enumerate(model.weights)})
    outputs["predict"] = model.predict(data.take(2), verbose=0)
    return outputs


@pytest.fixture(scope="module")
def plain_keras():
    return two_phases(None)


def the_head_split(plan):
    """The plan with the new head and the compiled loss split in halves over two devices (its
    order left out: it names the unsplit ops): sums in another order than one device."""
    halves = (Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5))
    return dataclasses.replace(plan, splits={"logit": halves, LOSS_GROUP: halves}, order={})


# How each configuration runs: "default" as users run it, the machine's timing deciding which
# plans run a step (planned for independent devices, KERASFLOW_TEST_CLUSTER=cpu-testbed:4, that
# may be a split layer's plan); the others force a plan and keep it for the rest of fit.
CONFIGURATIONS = {"default": (None, None), "layerwise_model_parallel": ("layerwise_model_parallel", None),
                  "split_head": ("layerwise_model_parallel", the_head_split)}


def watched(configuration: str) -> tuple[PlansThatRan, dict]:
    """A stopwatch noting the plans that ran, and the door's options for ``configuration``."""
    algorithm, change = CONFIGURATIONS[configuration]
    if algorithm is None:
        watch = PlansThatRan()
        return watch, {"collaborators": Collaborators(stopwatch=watch)}
    watch = PlansThatRan(ScriptedStopwatch({None: 1.0, algorithm: 0.5}))
    return watch, {"collaborators": Collaborators(planner=paths.planner(algorithm, change=change), stopwatch=watch)}


@functools.lru_cache(maxsize=None)
def spread_under_reordering() -> Spread:
    """Plain Keras' own spread when each batch's rows come permuted, measured on the model without
    its dropout (a mask drawn by row would move with the rows: another model's math, not a
    reordering of the same sums); the architecture, data and arithmetic are the test's own."""
    return Spread.between(two_phases(None, dropout=0.0), two_phases(None, dropout=0.0, rows_permuted=True))


@pytest.mark.parametrize("door", ["strategy", "callback"])
@pytest.mark.parametrize("configuration", list(CONFIGURATIONS))
def test_fine_tuning_after_a_recompile_equals_plain_keras(plain_keras, door, configuration):
    watch, options = watched(configuration)
    outputs = two_phases(door, **options)
    assert outputs.keys() == plain_keras.keys()
    assert configuration == "default" or watch.plans, "the forced plan ran no step"
    assert configuration != "split_head" or not watch.placement_only, watch.describe()
    if watch.placement_only:  # every variable and output bit for bit
        apart = {name: float(np.max(np.abs(np.asarray(value) - np.asarray(plain_keras[name]))))
                 for name, value in outputs.items() if not np.array_equal(value, plain_keras[name])}
        assert apart == {}, f"plans that ran: {watch.describe()}"
    else:
        spread = spread_under_reordering()
        beyond = [spread.describe(name) for name, value in outputs.items()
                  if not spread.within(value, plain_keras[name], name)]
        assert beyond == [], f"plans that ran: {watch.describe()}"
