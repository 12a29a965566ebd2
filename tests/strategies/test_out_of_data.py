"""Data of unknown size under a plan: the call in which it runs out does what plain Keras' does.

Keras calls the train function until a dataset of unknown size runs out; in that last call plain
Keras still counts an optimizer iteration and moves the seed generators on (the ops that do not
need the batch run before the failing read of it). Under a plan whether they did depended on
where the plan put them: an Adam model's iteration count fell one short an epoch on some
placements and its losses drifted from plain Keras' by 2e-5 over three epochs. The plans here
are forced through the seams (a planner returning the named plan, a stopwatch that keeps it).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import kerasflow
from kerasflow.strategies import Collaborators
from kerasflow.strategies.guarded import GuardedTrainFunction
from kerasflow.testing import ScriptedStopwatch
from kerasflow.testing.rounding import Spread, permuted_rows
from tests.strategies import paths

EPOCHS = 3


def dropout_mlp(rate: float):
    model = keras.Sequential([
        keras.Input(shape=(12,)),
        layers.Dense(32, activation="relu", name="hidden"),
        layers.Dropout(rate, name="dropout"),
        layers.Dense(3, name="logits"),
    ], name="dropout_mlp")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(1e-2))
    return model


def unknown_size_data() -> tf.data.Dataset:
    """200 samples in batches of 16 (the last one partial), through a filter: Keras cannot tell the
    number of batches and reads until the data runs out."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 12)).astype("float32")
    y = np.argmax(x[:, :3], axis=1).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).filter(lambda *_: True)
    assert int(dataset.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    return dataset


def trained(door: str | None, algorithm: str | None = None, rate: float = 0.3, rows_permuted: bool = False):
    """(model, losses) after ``EPOCHS`` epochs of the MLP with dropout ``rate``: plain Keras
    (``door`` None), or through a door with the plan ``algorithm`` kept; ``rows_permuted``: each
    batch's rows permuted (``kerasflow/testing/rounding.py``)."""
    paths.fresh()
    keras.utils.set_random_seed(paths.SEED)
    options = dict(paths.OPTIONS, collaborators=Collaborators(
        planner=paths.planner(algorithm), stopwatch=ScriptedStopwatch({None: 1.0, algorithm: 1e-3})))
    callbacks = []
    if door == "strategy":
        with kerasflow.FastTStrategy(**options).scope():
            model = dropout_mlp(rate)
    else:
        model = dropout_mlp(rate)
        if door == "callback":
            callbacks = [kerasflow.callbacks.FastT(**options)]
    data = permuted_rows(unknown_size_data()) if rows_permuted else unknown_size_data()
    history = model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=callbacks)
    if door is not None:
        in_force = model.distribute_strategy.plan_in_force if door == "strategy" else callbacks[0].plan_in_force
        assert in_force, "the plan was not kept"
    return model, history.history["loss"]


def state_of(model, optimizers=None) -> dict:
    """Every variable of the model and of its optimizers (by default ``model.optimizer``; the
    seed generators' states among them)."""
    values = {f"model/{v.path}": np.array(v.numpy()) for v in model.variables}
    for optimizer in optimizers or [model.optimizer]:
        values.update({f"optimizer/{v.path}": np.array(v.numpy()) for v in optimizer.variables})
    return values


@pytest.mark.parametrize("door", ["strategy", "callback"])
# Replicas would each draw their own dropout masks: the data-parallel plan trains the MLP without.
@pytest.mark.parametrize("algorithm, rate", [("layerwise_model_parallel", 0.3), ("heft", 0.3), ("data_parallel", 0.0)])
def test_training_on_data_of_unknown_size_equals_plain_keras(door, algorithm, rate):
    plain_model, plain_losses = trained(None, rate=rate)
    model, losses = trained(door, algorithm, rate)
    plain_state, state = state_of(plain_model), state_of(model)
    iterations = next(key for key in plain_state if key.endswith("/iteration"))
    assert int(plain_state[iterations]) == EPOCHS * (13 + 1)  # 13 batches, and the call that ran out
    assert int(state[iterations]) == int(plain_state[iterations])
    assert sorted(state) == sorted(plain_state)
    if algorithm == "data_parallel":  # the replicas sum the gradients in another order than one device
        permuted_model, permuted_losses = trained(None, rate=rate, rows_permuted=True)
        spread = Spread.between({**plain_state, "loss": plain_losses},
                                {**state_of(permuted_model), "loss": permuted_losses})
        apart = [key for key, value in {**plain_state, "loss": plain_losses}.items()
                 if not spread.within({**state, "loss": losses}[key], value, key)]
        assert apart == [], f"{apart} ({spread.describe(apart[0])})"
        return
    for key, value in plain_state.items():
        np.testing.assert_allclose(state[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)


def test_a_planned_call_on_data_that_ran_out_changes_nothing():
    model, _ = trained("callback", "layerwise_model_parallel")
    assert isinstance(model.train_function, GuardedTrainFunction)
    before = state_of(model)
    exhausted = iter(unknown_size_data())
    for _ in exhausted:
        pass
    with pytest.raises(tf.errors.OutOfRangeError):
        model.train_function.planned(exhausted)
    after = state_of(model)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_a_custom_train_step_on_data_of_unknown_size_equals_plain_keras():
    """keras.io's DCGAN (its own train_step, two optimizers, latent noise from a seed generator)."""

    def trained_gan(algorithm: str | None) -> tuple[dict, dict]:
        paths.fresh()
        keras.utils.set_random_seed(paths.SEED)
        data = paths.gan_data()["x"].filter(lambda *_: True)
        strategy = None
        if algorithm is None:
            model = paths.gan()
        else:
            strategy = kerasflow.FastTStrategy(**paths.OPTIONS, collaborators=Collaborators(
                planner=paths.planner(algorithm), stopwatch=ScriptedStopwatch({None: 1.0, algorithm: 1e-3})))
            with strategy.scope():
                model = paths.gan()
                model.built = True  # no call(): Keras cannot build it under a strategy
        history = model.fit(data, epochs=2, verbose=0)
        assert strategy is None or strategy.plan_in_force, "the plan was not kept"
        return state_of(model, [model.d_optimizer, model.g_optimizer]), history.history

    plain_state, plain_history = trained_gan(None)
    state, history = trained_gan("layerwise_model_parallel")
    assert int(plain_state["optimizer/g_adam/iteration"]) == 2 * (18 + 1)  # 18 batches, and the call that ran out
    assert sorted(state) == sorted(plain_state)
    for key, value in plain_state.items():
        np.testing.assert_allclose(state[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    for key, values in plain_history.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
