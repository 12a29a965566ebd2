"""Data-parallel replicas normalize with the whole batch's BatchNormalization statistics: the
same losses and moving averages as one device, a partial last batch included."""

import collections
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasflow
from kerasflow.planner import DataParallel, Plan, Shard
from kerasflow.strategies.batchstats import synchronized_layers
from kerasflow.testing.rounding import Spread, permuted_rows

DEVICES = ["/CPU:0", "/CPU:1", "/CPU:2"]
BATCH = 24


def image_classifier():
    """A small convolutional classifier as the Keras vision tutorials write one. Its convolutions
    have no bias: a bias before BatchNormalization has a zero gradient but for rounding, which
    Adam scales up to full steps, so its value (and the moving mean) would follow the rounding
    of any other order of summation, one device's included."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3)(x)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def images():
    """100 images in batches of 24: the last batch has 4, split 1, 1 and 2 over three replicas.
    Their mean is far from zero, so statistics of a share differ from the whole batch's."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(100, 8, 8, 3)).astype("float32") * 2 + 1
    y = (x[:, 0, 0, 0] > 1).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def trained(strategy, data=images):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = image_classifier()
    history = model.fit(data(), epochs=3, verbose=0).history
    return model, history


def outputs(model, history) -> dict:
    """What the replicas' test compares: the History, every weight and moving statistic (by
    position: the twins' variables are named apart)."""
    return {**{f"history.{key}": np.asarray(value) for key, value in history.items()},
            **{f"variables[{index}]": variable.numpy() for index, variable in enumerate(model.variables)}}


def moving_statistics(model):
    return [v.numpy() for v in model.variables if "moving_" in v.path]


@pytest.fixture(scope="module")
def one_device():
    return trained(tf.distribute.get_strategy())


@pytest.fixture(scope="module")
def spread(one_device):
    """Plain Keras' own spread when each batch's rows come permuted: the replicas' sums taken in
    another order (``kerasflow/testing/rounding.py``)."""
    return Spread.between(outputs(*one_device), outputs(*trained(tf.distribute.get_strategy(),
                                                                 lambda: permuted_rows(images()))))


def data_parallel(synchronized):
    plan = Plan(data_parallel=DataParallel(tuple(DEVICES), synchronized=synchronized), batch_size=BATCH,
                algorithm="data_parallel")
    return kerasflow.FastTStrategy(devices=DEVICES, plan=plan, verbose=0)


def test_replicas_train_as_one_device_does(one_device, spread):
    strategy = data_parallel(synchronized=True)
    model, history = trained(strategy)
    assert strategy.plan_in_force and strategy.placement_report() == []
    # Three replicas sum the gradients and the statistics in another order than one device: every
    # output within plain Keras' own spread under permuted rows (each replica's own statistics
    # move the moving averages 1e-3 apart, a dropped replica's gradient the losses by percents).
    actual, expected = outputs(model, history), outputs(*one_device)
    assert actual.keys() == expected.keys()
    apart = [name for name, value in expected.items() if not spread.within(actual[name], value, name)]
    assert apart == [], [f"{name} ({spread.describe(name)}): {np.max(np.abs(actual[name] - expected[name])):.3g} "
                         "apart" for name in apart]
    # Every copy normalized with the same statistics and applied the same update.
    assert strategy._driver_of().in_force_parts.replicas.differences() == 0.0
    # Summed by collectives: each device ran its part of four per synchronized layer and step
    # (the sum, the squared deviations and their gradients), and nothing went around a ring.
    summed = collections.Counter(c.device for c in strategy.placement_report().collectives
                                 if c.op.startswith("batch_statistics"))
    assert summed == {device: 4 * len(synchronized_layers(model)) for device in DEVICES}
    assert not [t for t in strategy.placement_report().transfers if t.tensor.startswith("batch_statistics")]


def test_each_replicas_own_statistics_change_the_losses(one_device):
    # What the test above would see without the rings (MirroredStrategy's math): not one device's.
    expected_model, expected = one_device
    strategy = data_parallel(synchronized=False)
    model, history = trained(strategy)
    assert strategy.plan_in_force
    assert not np.allclose(history["loss"], expected["loss"], rtol=1e-3)
    moving, expected_moving = moving_statistics(model)[0], moving_statistics(expected_model)[0]
    assert np.abs(moving - expected_moving).max() > 1e-3


def masked_classifier():
    """Embedding(mask_zero=True) hands BatchNormalization a mask, whose statistics the replicas
    cannot sum yet."""
    model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8, mask_zero=True),
                              keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def tokens():
    rng = np.random.default_rng(1)
    return tf.data.Dataset.from_tensor_slices((rng.integers(0, 50, (288, 6)).astype("int32"),
                                               rng.integers(0, 3, 288))).batch(BATCH)


def kerasflow_warnings_of_an_epoch(model):
    """An epoch of ``tokens()``: kerasflow's warnings, and the History's record."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(tokens(), epochs=1, verbose=0).history
    return [str(w.message) for w in caught if "kerasflow" in str(w.message)], history


def masked_classifier_trained_an_epoch(strategy):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = masked_classifier()
    model.fit(tokens(), epochs=1, verbose=0)
    return model


def test_auto_keeps_a_masked_normalization_on_one_replica():
    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0)
    masked_classifier_trained_an_epoch(strategy)
    assert strategy.profile.metadata["synchronized_layers"] == []
    assert "data_parallel" not in strategy._driver_of().report["candidates"]


def test_a_masked_normalization_under_a_given_data_parallel_plan_falls_back_with_the_reason():
    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], plan=Plan(
        data_parallel=DataParallel(tuple(DEVICES[:2])), batch_size=BATCH, algorithm="data_parallel"), verbose=0)
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = masked_classifier()
    messages, history = kerasflow_warnings_of_an_epoch(model)
    assert len(messages) == 1 and "masked BatchNormalization" in messages[0], messages
    assert "replicated='off'" in messages[0]
    assert np.isfinite(history["loss"][0]) and not strategy.plan_in_force


def test_a_split_masked_normalization_falls_back_with_the_reason():
    # The profile does not list a masked BatchNormalization, so the planner never splits one; a
    # plan given by hand that does is refused at its first trace, and training goes on.
    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0)
    model = masked_classifier_trained_an_epoch(strategy)
    graph = strategy.profile
    norm = next(layer.name for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    strategy.use_plan(Plan(placement={op.name: DEVICES[0] for op in graph.ops}, batch_size=BATCH,
                           splits={norm: (Shard(DEVICES[0], 0.5), Shard(DEVICES[1], 0.5))}))
    messages, history = kerasflow_warnings_of_an_epoch(model)
    assert len(messages) == 1 and "A split BatchNormalization layer cannot compute the whole batch's statistics " \
                                  "with a mask yet" in messages[0], messages
    assert np.isfinite(history["loss"][0]) and not strategy.plan_in_force
