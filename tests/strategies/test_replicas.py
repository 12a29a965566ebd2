"""Data-parallel plans inside fit: a copy of the weights per device, the collective all-reduce, the
same losses and metrics as one device, and the cases that keep to one replica."""

import collections
import contextlib
import dataclasses
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasflow
from kerasflow import KerasflowError
from kerasflow.planner import DataParallel, Plan
from kerasflow.planner.parallel import ticktock
from kerasflow.planner.search import planning
from kerasflow.planner.sim.predict import with_prediction
from kerasflow.strategies import Collaborators
from kerasflow.strategies.options import Options
from kerasflow.strategies.replicas import Replicas, ring_all_reduce
from kerasflow.testing import rounding

DEVICES = ["/CPU:0", "/CPU:1", "/CPU:2"]
BATCH = 24


def classifier():
    """A small classifier, as the Keras tutorials write one."""
    model = keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def dataset(samples=250):
    """250 samples in batches of 24: the last batch has 10."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(samples, 12)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def history_under(strategy, epochs=3, callbacks=()):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = classifier()
    history = model.fit(dataset(), epochs=epochs, verbose=0, callbacks=list(callbacks))
    return model, history.history


def data_parallel_plan(devices=DEVICES):
    return Plan(data_parallel=DataParallel(tuple(devices)), batch_size=BATCH, algorithm="data_parallel")


def test_the_ring_sums_on_every_device_and_leaves_each_sum_there():
    parts = []
    for i, device in enumerate(DEVICES):
        with tf.device(device):
            parts.append(tf.reshape(tf.range(10, dtype=tf.float32), (2, 5)) * (i + 1))  # 10 elements: 4, 3, 3

    @tf.function
    def reduce(a, b, c):
        return ring_all_reduce([a, b, c], DEVICES)

    summed = reduce(*parts)
    expected = (np.arange(10, dtype=np.float32) * 6).reshape(2, 5)
    for tensor in summed:
        np.testing.assert_array_equal(tensor.numpy(), expected)
    traced = reduce.get_concrete_function(*parts).graph.structured_outputs
    assert [kerasflow.devices.normalize_device(t.op.inputs[0].op.device) for t in traced] == DEVICES
    assert ring_all_reduce([None, None, None], DEVICES) == [None, None, None]


def test_a_ring_of_unknown_length_cuts_its_chunks_when_it_runs():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)] * 2)
    def reduce(a, b):
        return ring_all_reduce([a, b], DEVICES[:2])

    first, second = reduce(tf.constant([1.0, 2.0, 3.0]), tf.constant([10.0, 20.0, 30.0]))
    assert first.numpy().tolist() == second.numpy().tolist() == [11.0, 22.0, 33.0]


def test_a_data_parallel_plan_trains_as_one_device_does_with_a_partial_last_batch():
    _, expected = history_under(tf.distribute.get_strategy())
    strategy = kerasflow.FastTStrategy(devices=DEVICES, plan=data_parallel_plan(), verbose=0)
    model, history = history_under(strategy)
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], expected["accuracy"], rtol=1e-5)
    assert strategy.plan_in_force and strategy.placement_report() == []
    # Every copy applied the same update from the same summed gradients.
    assert strategy._driver_of().in_force_parts.replicas.differences() == 0.0
    # The gradients were summed by collectives, no ring: what crossed (scalars left out: the
    # loss and metrics' bookkeeping) is each other replica's rows of x and y, cut on the host's
    # /CPU:0 (outside every replica's scope); the whole batch went nowhere.
    sent = collections.Counter((t.tensor.split("/")[0], t.src, t.dst) for t in strategy.placement_report().transfers
                               if t.bytes is None or t.bytes > 8)
    assert sent == {("waves", "/CPU:0", "/CPU:1"): 2, ("waves", "/CPU:0", "/CPU:2"): 2}, sent


def test_a_learning_rate_a_callback_sets_reaches_every_copy():
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.1 if epoch else rate)
    _, expected = history_under(tf.distribute.get_strategy(), callbacks=[schedule])
    strategy = kerasflow.FastTStrategy(devices=DEVICES, plan=data_parallel_plan(), verbose=0)
    _, history = history_under(strategy, callbacks=[schedule])
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    assert strategy._driver_of().in_force_parts.replicas.differences() == 0.0


def rates_that_change():
    """A LearningRateScheduler (halves the rate at the second epoch) and a ReduceLROnPlateau that
    finds no improvement (min_delta 1.0), so lowers the rate after every epoch: both set the rate
    on the model's optimizer during fit."""
    return [keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5 if epoch == 1 else rate),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.2, patience=0, min_delta=1.0)]


def two_fits(door, plan=None, nudge=0.0):
    """The mixed-precision classifier trained by two fits, the learning rate assigned between
    them, through ``door`` ("plain", "strategy" or "callback"; ``nudge``: each initial weight
    moved by that fraction of itself, up or down at random): every output by name (losses,
    weights), and the replicas of a data-parallel plan (None in plain Keras)."""
    keras.utils.set_random_seed(5)
    devices = list(plan.data_parallel.devices) if plan is not None else None
    strategy = kerasflow.FastTStrategy(devices=devices, plan=plan, verbose=0) if door == "strategy" else None
    callback = [kerasflow.callbacks.FastT(devices=devices, plan=plan, verbose=0)] if door == "callback" else []
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(3, dtype="float32")])
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    signs = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(weight * (1 + nudge * signs.choice([-1.0, 1.0], size=weight.shape)))
    data = dataset()
    first = model.fit(data, epochs=3, verbose=0, callbacks=rates_that_change() + callback).history["loss"]
    model.optimizer.learning_rate = 4e-3
    second = model.fit(data, epochs=2, verbose=0, callbacks=callback).history["loss"]
    outputs = {"loss": first + second, "learning_rate": float(model.optimizer.learning_rate),
               **{f"weights[{i}]": w.numpy() for i, w in enumerate(model.weights)}}
    driver = strategy._driver_of() if strategy else callback[0].driver if callback else None
    return outputs, driver.in_force_parts.replicas if driver else None


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_every_replica_reads_the_rate_a_callback_or_the_user_sets_from_the_users_optimizer(door, policy):
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer whose own rate is a
    # placeholder: a replica that followed the wrapper, not the optimizer it wraps, kept the old
    # rate (19 % apart from plain Keras by the fourth epoch with a LearningRateScheduler).
    keras.mixed_precision.set_global_policy(policy)
    try:
        expected, _ = two_fits("plain")
        # Replicas round their partial sums to the half type, which permuted rows summed whole do
        # not show; plain Keras' own spread after its weights moved by one step of that type does.
        step = 2.0 ** -(11 if policy == "mixed_float16" else 8)
        spread = rounding.Spread.between(expected, two_fits("plain", nudge=step)[0])
        outputs, replicas = two_fits(door, data_parallel_plan(DEVICES[:2]))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert replicas is not None and outputs["learning_rate"] == expected["learning_rate"]
    # Every copy applied the same update (a stale rate on one would part them) ...
    assert replicas.differences() == 0.0
    # ... and trained as one device does, within plain Keras' own spread under that rounding.
    for name, value in expected.items():
        assert spread.within(outputs[name], value, name), (spread.describe(name), outputs[name], value)


def test_weight_decay_spares_the_variables_excluded_from_it_wherever_they_are():
    # exclude_from_weight_decay(var_list=...) keys the variables by their TensorFlow variables:
    # once a plan moves them (or a replica traces its update on its copies), they are known
    # by the model's own.
    def build():
        model = classifier()
        optimizer = keras.optimizers.AdamW(1e-2, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_list=[model.layers[0].bias, model.layers[1].kernel])
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def weights(strategy):
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = build()
        model.fit(dataset(), epochs=2, verbose=0)
        return [w.numpy() for w in model.weights]

    def everything_on_the_second_device(request):
        plan = Plan(placement={op.name: DEVICES[1] for op in request.graph.ops}, batch_size=request.batch_size,
                    algorithm="moved")
        return [with_prediction(plan, request.graph, request.cluster.independent())]

    expected = weights(tf.distribute.get_strategy())
    moved = kerasflow.FastTStrategy(devices=DEVICES[:2], drop_slower_plan=False, verbose=0,
                                    collaborators=Collaborators(planner=everything_on_the_second_device))
    for value, own in zip(weights(moved), expected):  # placement only: bit for bit
        np.testing.assert_array_equal(value, own)
    assert moved.plan.algorithm == "moved" and moved.plan_in_force and moved.placement_report() == []
    replicated = kerasflow.FastTStrategy(devices=DEVICES[:2], plan=data_parallel_plan(DEVICES[:2]), verbose=0)
    for value, own in zip(weights(replicated), expected):
        np.testing.assert_allclose(value, own, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_sum_that_timed_out_goes_back_to_the_default_placement_naming_the_group(door):
    # As TensorFlow ends a collective whose group never completes: fit goes on, on the default
    # placement, and the one warning names the group and what to do (no retry without the order).
    def timing_out(step, plan):
        if plan is not None:
            raise tf.errors.DeadlineExceededError(None, None, "Collective has timed out waiting for other workers.")
        return step(), 1.0

    parts = Collaborators(planner=lambda request: planning.ranked_plans(dataclasses.replace(
        request, candidates=("data_parallel",), split=False, tick_tock="off")), stopwatch=timing_out)
    _, expected = history_under(tf.distribute.get_strategy(), epochs=1)
    keras.utils.set_random_seed(5)
    if door == "strategy":
        handle = kerasflow.FastTStrategy(devices=DEVICES[:2], collaborators=parts, verbose=0, warmup_steps=2,
                                         profile_steps=1)
        with handle.scope():
            model = classifier()
        callbacks = []
    else:
        model = classifier()
        handle = kerasflow.callbacks.FastT(devices=DEVICES[:2], collaborators=parts, verbose=0, warmup_steps=2,
                                           profile_steps=1)
        callbacks = [handle]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dataset(), epochs=1, verbose=0, callbacks=callbacks).history
    said = [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]
    assert len(said) == 1 and "A sum over ['/CPU:0', '/CPU:1'] (TensorFlow's ring) did not complete within 300 s" \
        in said[0], said
    assert not handle.plan_in_force
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)


def test_refresh_gives_every_copy_the_models_own_values():
    # As after a step of the default placement, which updates only the model's own variables.
    keras.utils.set_random_seed(5)
    model = classifier()
    model.optimizer.build(model.trainable_variables)
    replicas = Replicas(model, DEVICES)
    kernel = model.layers[0].kernel
    kernel.assign(kernel + 1.0)
    model.optimizer.iterations.assign(7)
    assert replicas.differences() == pytest.approx(1.0)
    replicas.refresh()
    assert replicas.differences() == 0.0
    for replica in range(1, len(DEVICES)):
        with replicas.swapped(replica):
            assert kernel.value.device.endswith(DEVICES[replica][1:])
            np.testing.assert_array_equal(kernel.value.numpy(), replicas.trainable(0)[0].numpy())
            assert int(model.optimizer.iterations.numpy()) == 7


def test_tick_tock_data_parallelism_runs_two_waves_per_replica_with_the_same_losses():
    _, expected = history_under(tf.distribute.get_strategy(), epochs=2)
    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0)
    model, _ = history_under(strategy, epochs=1)
    plan = ticktock.tick_tock_data_parallel(strategy.profile, strategy.cluster, batch=BATCH)
    assert plan.data_parallel is not None and plan.waves.count == 2
    strategy.use_plan(plan)
    history = model.fit(dataset(), epochs=1, verbose=0).history
    np.testing.assert_allclose(history["loss"][-1], expected["loss"][-1], rtol=1e-5)
    assert strategy.plan_in_force and strategy.placement_report() == []


def test_the_callback_runs_a_data_parallel_plan_too():
    _, expected = history_under(tf.distribute.get_strategy(), epochs=1)
    keras.utils.set_random_seed(5)
    model = classifier()
    callback = kerasflow.callbacks.FastT(devices=DEVICES[:2], plan=data_parallel_plan(DEVICES[:2]), verbose=0)
    history = model.fit(dataset(), epochs=1, verbose=0, callbacks=[callback]).history
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    assert callback.plan_in_force


def candidates_planned(strategy, build):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = build()
    model.fit(dataset(), epochs=1, verbose=0)
    return set(strategy._driver_of().report["candidates"])


def test_auto_lets_the_planner_replicate_a_model_without_batch_coupled_layers():
    assert "data_parallel" in candidates_planned(kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0), classifier)
    off = kerasflow.FastTStrategy(devices=DEVICES[:2], replicated="off", verbose=0)
    assert "data_parallel" not in candidates_planned(off, classifier)


def normalized():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
                              keras.layers.ReLU(), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def dropped_out():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_auto_replicates_batch_normalization_and_keeps_random_layers_on_one_replica():
    # BatchNormalization's replicas compute the whole batch's statistics together; a Dropout's
    # would each draw their own numbers, which only "on" allows, as it allows each replica's own
    # statistics.
    auto = kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0)
    planned = candidates_planned(auto, normalized)
    assert "data_parallel" in planned and "data_parallel_replica_statistics" not in planned
    auto = kerasflow.FastTStrategy(devices=DEVICES[:2], verbose=0)
    assert "data_parallel" not in candidates_planned(auto, dropped_out)
    on = kerasflow.FastTStrategy(devices=DEVICES[:2], replicated="on", verbose=0)
    assert "data_parallel" in candidates_planned(on, dropped_out)
    # "on" also tries MirroredStrategy's math: each replica's own statistics.
    on = kerasflow.FastTStrategy(devices=DEVICES[:2], replicated="on", verbose=0)
    assert {"data_parallel", "data_parallel_replica_statistics"} <= candidates_planned(on, normalized)


def test_replicas_that_change_the_math_say_so_once(capsys):
    # The planner made to choose data parallelism: on Dropout (allowed by "on") one line names
    # the layer; on BatchNormalization and the classifier, whose replicas keep the math, nothing;
    # on BatchNormalization under "on", whose replicas then keep their own statistics, one line.
    parts = Collaborators(planner=lambda request: planning.ranked_plans(dataclasses.replace(
        request, candidates=("data_parallel_replica_statistics", "data_parallel"))))
    said = {}
    for name, build, replicated in (("dropped_out", dropped_out, "on"), ("normalized", normalized, "auto"),
                                    ("classifier", classifier, "auto"), ("normalized_on", normalized, "on")):
        # tick_tock="off": no wave candidate beside the two (one of them can win on noise).
        strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], replicated=replicated, verbose=1,
                                           drop_slower_plan=False, tick_tock="off", collaborators=parts)
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = build()
        model.fit(dataset(), epochs=1, verbose=0)
        assert strategy.plan.data_parallel is not None and strategy.plan_in_force
        said[name] = [line for line in capsys.readouterr().out.splitlines() if "its own share of the batch" in line]
    assert len(said["dropped_out"]) == 1 and said["normalized"] == said["classifier"] == []
    line = said["dropped_out"][0]
    assert "each replica runs dropout" in line and "losses differ from one device's" in line
    assert len(said["normalized_on"]) == 1
    assert said["normalized_on"][0].startswith("kerasflow: data_parallel_replica_statistics: each replica runs "
                                               "batch_normalization")


def test_a_model_with_its_own_train_step_falls_back_with_the_reason():
    class OwnStep(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], plan=data_parallel_plan(DEVICES[:2]), verbose=0)
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = OwnStep([keras.Input((12,)), keras.layers.Dense(3)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dataset(), epochs=1, verbose=0).history
    messages = [str(w.message) for w in caught if "kerasflow" in str(w.message)]
    assert len(messages) == 1 and "its own train_step" in messages[0] and "replicated='off'" in messages[0]
    assert np.isfinite(history["loss"][0]) and not strategy.plan_in_force
    assert "its own train_step" in strategy.placement_report().summary()


def test_replicated_takes_auto_on_or_off():
    assert Options.from_arguments(devices=["/CPU:0"], replicated="ON").replicated == "on"
    for wrong in ("some", False):
        with pytest.raises(KerasflowError, match=rf"replicated must be one of \['auto', 'on', 'off'\]. "
                                                 rf"Received: replicated={wrong!r}"):
            Options.from_arguments(devices=["/CPU:0"], replicated=wrong)


def test_a_tf_keras_model_falls_back_with_the_reason():
    import tf_keras

    strategy = kerasflow.FastTStrategy(devices=DEVICES[:2], plan=data_parallel_plan(DEVICES[:2]), verbose=0)
    tf_keras.utils.set_random_seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.Input((12,)), tf_keras.layers.Dense(3)])
            model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            history = model.fit(dataset(), epochs=1, verbose=0).history
    messages = [str(w.message) for w in caught if "kerasflow" in str(w.message)]
    assert len(messages) == 1 and "only on Keras 3 models" in messages[0], messages
    assert np.isfinite(history["loss"][0]) and not strategy.plan_in_force
