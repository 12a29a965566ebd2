"""Transfer learning, then fine-tuning after a recompile in the strategy's scope (the Keras guide's
pattern), with random augmentation in the ``tf.data`` pipeline: every output equals plain Keras'.

Under any ``tf.distribute`` strategy Keras 3 pulled one batch at the start of every ``fit`` to build
the model, running the pipeline's augmentation once more (12 draws in an 8-batch epoch where
plain Keras makes 8): every later batch was augmented otherwise, and the fine-tuning phase
differed from plain Keras' from its first step. ``FastTStrategy`` builds as the default strategy
does (``_compat.build_when_traced_under``).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import kerasflow
from kerasflow.strategies import Collaborators
from kerasflow.testing import ScriptedStopwatch
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


def two_phases(door: str | None, **options) -> dict:
    """A frozen base under a new head, fit; the base unfrozen, compiled again in the model's
    strategy scope, fit: the histories of both phases, every weight and the predictions."""
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
        features = layers.Dropout(0.2, name="dropout")(base(inputs, training=False))
        model = keras.Model(inputs, layers.Dense(1, name="logit")(features), name="transfer")
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.BinaryCrossentropy(from_logits=True))
    data = pipeline()
    outputs = {"transfer": model.fit(data, epochs=2, verbose=0, callbacks=callbacks).history["loss"]}
    base.trainable = True
    with model.distribute_strategy.scope():
        model.compile(keras.optimizers.Adam(1e-4), keras.losses.BinaryCrossentropy(from_logits=True))
    outputs["fine_tuning"] = model.fit(data, epochs=1, verbose=0, callbacks=callbacks).history["loss"]
    outputs.update({f"weights[{i}]": np.asarray(w) for i, w in enumerate(model.weights)})
    outputs["predict"] = model.predict(data.take(2), verbose=0)
    return outputs


@pytest.fixture(scope="module")
def plain_keras():
    return two_phases(None)


def kept(algorithm: str) -> dict:
    """A placement-only plan forced and kept for the rest of fit (only placement: exact)."""
    return {"collaborators": Collaborators(planner=paths.planner(algorithm),
                                           stopwatch=ScriptedStopwatch({None: 1.0, algorithm: 0.5}))}


@pytest.mark.parametrize("door", ["strategy", "callback"])
@pytest.mark.parametrize("configuration", ["default", "layerwise_model_parallel"])
def test_fine_tuning_after_a_recompile_equals_plain_keras(plain_keras, door, configuration):
    options = {} if configuration == "default" else kept(configuration)
    outputs = two_phases(door, **options)
    assert outputs.keys() == plain_keras.keys()
    apart = {name: float(np.max(np.abs(np.asarray(value) - np.asarray(plain_keras[name]))))
             for name, value in outputs.items() if not np.array_equal(value, plain_keras[name])}
    assert apart == {}
