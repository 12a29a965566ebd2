"""Variables moved by a plan and their homes: a step of the default placement on the home
variables starts from the planned values and leaves its own behind."""

import keras
import numpy as np
import tensorflow as tf

from kerasflow.strategies.variables import HomeVariables, move_variables


def dense_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_at_home_the_home_variables_hold_the_planned_values_and_give_back_theirs():
    model = dense_model()
    kernel = model.layers[0].kernel
    home = kernel.value
    homes = HomeVariables(model)
    layer = model.layers[0]
    assert move_variables(model, {layer.kernel.path: "/CPU:1", layer.bias.path: "/CPU:1"}) > 0
    planned = kernel.value
    assert planned is not home and planned.device.endswith("CPU:1")
    planned.assign(np.full((2, 3), 2.0, "float32"))  # a planned step changed it
    with homes.at_home():
        assert kernel.value is home and home.device.endswith("CPU:0")
        np.testing.assert_array_equal(home.numpy(), 2.0)
        home.assign_add(tf.ones((2, 3)))  # a default step changes it
    assert kernel.value is planned
    np.testing.assert_array_equal(planned.numpy(), 3.0)


def test_a_variable_the_plan_did_not_move_is_left_alone():
    model = dense_model()
    kernel = model.layers[0].kernel
    home = kernel.value
    homes = HomeVariables(model)
    with homes.at_home():
        assert kernel.value is home
        home.assign(tf.zeros((2, 3)))
    assert kernel.value is home
    np.testing.assert_array_equal(home.numpy(), 0.0)
