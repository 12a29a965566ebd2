"""FastTStrategy and the FastT callback on 4 logical CPUs: same losses as plain Keras,
the plan really applied, and every failure path keeps training."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasflow
from kerasflow import InvalidPlanError, KerasflowError
from kerasflow.planner import Cluster, Shard, heft
from kerasflow.planner.ir.graphtables import LOSS_GROUP
from kerasflow.planner.parallel.onecopy import one_copy_data_parallel
from kerasflow.planner.parallel.ticktock import with_waves
from tests.profiling import models
from tests.strategies import paths

STEPS, BATCH = 20, 16
CLUSTER = Cluster.preset("cpu-testbed:4")

BUILDERS = {
    "mlp": (lambda k: models.mlp(k, dropout=False), models.mlp_data, "dense_0"),
    "cnn": (models.inception_cnn, models.image_data, "branch_b"),
    "lstm": (models.lstm_model, models.token_data, "logits"),
    "transformer": (models.transformer_block, models.sequence_data, "ffn"),
    "cnn_bn": (lambda k: models.inception_cnn(k, batch_norm=True), models.image_data, None),
}


def data_for(name):
    x, y = BUILDERS[name][1](STEPS * BATCH)
    return x, y


def fit(model, x, y, **kwargs):
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, **kwargs)
    return history.history["loss"][-1]


def baseline(name):
    x, y = data_for(name)
    keras.utils.set_random_seed(7)
    with tf.distribute.get_strategy().scope():
        model = BUILDERS[name][0](keras)
    return fit(model, x, y)


def build_under(strategy, name):
    keras.utils.set_random_seed(7)
    with strategy.scope():
        return BUILDERS[name][0](keras)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_placement_only_matches_one_device(name):
    x, y = data_for(name)
    strategy = kerasflow.FastTStrategy(split=False, tick_tock="off", verbose=0, collaborators=paths.PLANNING)
    model = build_under(strategy, name)  # held: the strategy keeps its models' plans only while they live
    loss = fit(model, x, y)
    assert loss == pytest.approx(baseline(name), rel=1e-5)
    assert strategy.plan is not None, "the plan was never made"
    report = strategy.placement_report()
    assert report == [], [(m, strategy.profile.op(m.op).colocation if m.op in strategy.profile else None) for m in report[:8]]


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
@pytest.mark.parametrize("mode", ["splits", "waves"])
def test_splits_and_waves_match_one_device(name, mode):
    x, y = data_for(name)
    strategy = kerasflow.FastTStrategy(verbose=0)
    model = build_under(strategy, name)
    graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    if mode == "splits":
        layer = BUILDERS[name][2]
        plan = heft(graph, CLUSTER, splits={layer: [Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5)]})
    else:
        plan = with_waves(heft(graph, CLUSTER), graph, CLUSTER)
    strategy.use_plan(plan)
    loss = fit(model, x, y)
    assert loss == pytest.approx(baseline(name), rel=1e-5)
    assert strategy.plan is plan


def test_a_split_recurrent_layer_matches_one_device_and_runs_where_planned():
    # Each shard's time loop computes with the weights read for it on its device.
    x, y = data_for("lstm")
    strategy = kerasflow.FastTStrategy(verbose=0)
    model = build_under(strategy, "lstm")
    graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    plan = heft(graph, CLUSTER, splits={"lstm": [Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5)]})
    strategy.use_plan(plan)
    assert fit(model, x, y) == pytest.approx(baseline("lstm"), rel=1e-5)
    assert strategy.plan_in_force and strategy.placement_report() == []


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_one_copy_data_parallelism_matches_one_device(name):
    x, y = data_for(name)
    strategy = kerasflow.FastTStrategy(verbose=0)
    model = build_under(strategy, name)
    graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    plan = one_copy_data_parallel(graph, CLUSTER)
    strategy.use_plan(plan)
    assert fit(model, x, y) == pytest.approx(baseline(name), rel=1e-5)
    assert strategy.plan_in_force and strategy.placement_report() == []


def test_the_plan_is_applied_where_it_says():
    x, y = data_for("cnn")
    strategy = kerasflow.FastTStrategy(split=False, tick_tock="off", verbose=0, collaborators=paths.PLANNING)
    model = build_under(strategy, "cnn")
    graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    plan = heft(graph, CLUSTER)
    # Force a spread: every branch layer on its own device.
    placement = dict(plan.placement)
    homes = {"branch_a": "/CPU:1", "branch_b": "/CPU:2", "branch_pool": "/CPU:3"}
    for op in graph.ops:
        if op.layer in homes and (op.colocation is None or op.colocation.startswith(op.layer + "/")):
            placement[op.name] = homes[op.layer]
    from kerasflow.planner import Plan

    forced = Plan(placement=placement, batch_size=BATCH, graph_fingerprint=graph.fingerprint())
    forced.validate(graph, CLUSTER)
    strategy.use_plan(forced)
    fit(model, x, y)
    assert strategy.placement_report() == []
    kernel = next(v for v in model.variables if v.path == "branch_b/kernel")
    assert kernel.value.device.endswith("CPU:2")  # the variable moved with its layer


def test_callback_route_and_loss():
    x, y = data_for("mlp")
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(split=False, tick_tock="off", verbose=0, collaborators=paths.PLANNING)
    loss = fit(model, x, y, callbacks=[callback])
    assert loss == pytest.approx(baseline("mlp"), rel=1e-5)
    assert callback.plan is not None and callback.placement_report() == []


@pytest.mark.parametrize("waves", [False, True])
def test_a_split_loss_of_a_two_output_model_reports_every_loss_like_plain_keras(waves):
    # Each output's loss runs as two shards (of each wave); its tracker (history's "kind_loss",
    # "score_loss") counts the shards' updates as one, as plain Keras counts the step's.
    def build():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
        model = keras.Model(inputs, {"score": keras.layers.Dense(1, name="score")(hidden),
                                     "kind": keras.layers.Dense(3, name="kind")(hidden)})
        model.compile("adam", loss={"score": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                      loss_weights={"score": 0.5, "kind": 1.0})
        return model

    # A partial last batch: the step is traced again for a batch of unknown size, whose trackers
    # Keras counts once per update (not per sample).
    rng = np.random.default_rng(3)
    samples = STEPS * BATCH + 8
    x = rng.random((samples, 8), dtype=np.float32)
    y = {"score": rng.random((samples, 1), dtype=np.float32), "kind": rng.integers(0, 3, samples)}

    def trained(model, **kwargs):
        return model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, validation_split=0.25,
                         **kwargs).history

    expected = trained(build())
    model = build()
    graph = kerasflow.profiling.profile_model(model, (x[:BATCH], {k: v[:BATCH] for k, v in y.items()}),
                                              batch_size=BATCH, steps=1, second_batch=False)
    halves = [Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5)]
    plan = heft(graph, CLUSTER, splits={"score": halves, "kind": halves, LOSS_GROUP: halves})
    callback = kerasflow.callbacks.FastT(plan=with_waves(plan, graph, CLUSTER) if waves else plan, verbose=0)
    history = trained(model, callbacks=[callback])
    assert {"kind_loss", "score_loss", "val_kind_loss"} <= history.keys() == expected.keys()
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-5, err_msg=key)
    assert callback.plan_in_force and (waves or callback.placement_report() == [])


def test_plan_route_from_a_file(tmp_path):
    x, y = data_for("mlp")
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    heft(graph, CLUSTER).save(tmp_path / "plan.json")
    callback = kerasflow.callbacks.FastT(plan=str(tmp_path / "plan.json"), verbose=0)
    loss = fit(model, x, y, callbacks=[callback])
    assert loss == pytest.approx(baseline("mlp"), rel=1e-5)
    assert callback.placement_report() == []


def test_a_plan_for_another_model_is_a_clear_error():
    x, y = data_for("mlp")
    keras.utils.set_random_seed(7)
    other = models.mlp(keras, units=(8,), dropout=False)
    graph = kerasflow.profiling.profile_model(other, (x, y), batch_size=BATCH, steps=1, second_batch=False)
    plan = heft(graph, CLUSTER)
    model = models.mlp(keras, dropout=False)
    with pytest.raises(InvalidPlanError, match="made for another model"):
        fit(model, x, y, callbacks=[kerasflow.callbacks.FastT(plan=plan, verbose=0)])
    with pytest.warns(RuntimeWarning, match="Replanning"):
        fit(models.mlp(keras, dropout=False), x, y,
            callbacks=[kerasflow.callbacks.FastT(plan=plan, verbose=0, on_mismatch="replan")])


def test_tf_keras_models_train_the_same():
    import tf_keras

    for name in ("mlp", "cnn"):
        x, y = data_for(name)
        build = (lambda k: models.mlp(k, dropout=False)) if name == "mlp" else models.inception_cnn
        tf_keras.utils.set_random_seed(7)
        with tf.distribute.get_strategy().scope():
            expected = fit(build(tf_keras), x, y)
        strategy = kerasflow.FastTStrategy(split=False, tick_tock="off", verbose=0, drop_slower_plan=False, collaborators=paths.PLANNING)
        tf_keras.utils.set_random_seed(7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with strategy.scope():
                model = build(tf_keras)
                loss = fit(model, x, y)
        assert loss == pytest.approx(expected, rel=1e-5)
        assert strategy.plan is not None
        assert not [w for w in caught if "kerasflow" in str(w.message)], "the plan did not run"
        assert strategy.placement_report() is not None  # read back after the rebuild


def test_the_callback_plans_tf_keras_models_too():
    import tf_keras

    x, y = data_for("mlp")
    tf_keras.utils.set_random_seed(7)
    expected = fit(models.mlp(tf_keras, dropout=False), x, y)
    callback = kerasflow.callbacks.FastT(split=False, tick_tock="off", verbose=0, drop_slower_plan=False,
                                         collaborators=paths.PLANNING)
    tf_keras.utils.set_random_seed(7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = fit(models.mlp(tf_keras, dropout=False), x, y, callbacks=[callback])
    assert loss == pytest.approx(expected, rel=1e-5)
    assert callback.plan_in_force and not [w for w in caught if "kerasflow" in str(w.message)]


# Under TF1-style graphs tf-keras trains with its v1 loop; both doors say so once and train on.
GRAPH_MODE = """
import warnings, kerasflow
kerasflow.devices.virtual_cpus(4)
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import numpy as np, tf_keras
x, y = np.ones((64, 8), "float32"), np.ones((64, 1), "float32")
def build():
    model = tf_keras.Sequential([tf_keras.layers.Dense(4, input_shape=(8,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    strategy = kerasflow.FastTStrategy(verbose=0)
    with strategy.scope():
        model = build()
    for _ in range(2):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    callback = kerasflow.callbacks.FastT(verbose=0)
    model = build()
    for _ in range(2):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
for w in caught:
    if str(w.message).startswith("kerasflow:"):
        print("SAID", str(w.message))
print("PLANS", strategy.plan, callback.plan)
"""


def test_tf1_graph_mode_trains_as_one_device_and_says_so_once_per_door():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", GRAPH_MODE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stdout.splitlines() if line.startswith("SAID")]
    assert len(said) == 2 and all("TF1-style graphs" in line and "nothing profiled or planned" in line
                                  for line in said), said
    assert "FastTStrategy trains as tf.distribute.OneDeviceStrategy on /CPU:0" in said[0]
    assert "this fit trains as without the callback" in said[1]
    assert "PLANS None None" in run.stdout


def test_a_planning_failure_warns_once_and_training_goes_on():
    def broken(request):
        raise RuntimeError("planner exploded")

    x, y = data_for("mlp")
    strategy = kerasflow.FastTStrategy(verbose=0, collaborators=kerasflow.strategies.Collaborators(planner=broken))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = fit(build_under(strategy, "mlp"), x, y)
    messages = [str(w.message) for w in caught if "kerasflow" in str(w.message)]
    assert len(messages) == 1 and "planner exploded" in messages[0] and "training continues" in messages[0]
    assert loss == pytest.approx(baseline("mlp"), rel=1e-5)


def test_datasets_are_iterated_as_under_the_default_strategy():
    # OneDeviceStrategy's OwnedMultiDeviceIterator, dropped by Keras' epoch iterator while it
    # prefetches, crashes fit at random (docs/troubleshooting.md): the strategy never makes one.
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator

    strategy = kerasflow.FastTStrategy(verbose=0)
    dataset = tf.data.Dataset.range(10).batch(4)
    assert strategy.experimental_distribute_dataset(dataset) is dataset
    assert type(iter(strategy.experimental_distribute_dataset(dataset))) is OwnedIterator
    sharded = strategy.distribute_datasets_from_function(
        lambda context: dataset.shard(context.num_input_pipelines, context.input_pipeline_id))
    assert type(iter(sharded)) is OwnedIterator
    assert [batch.numpy().tolist() for batch in sharded] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_device_that_does_not_exist_is_refused():
    with pytest.raises(KerasflowError, match=r"\['/GPU:3'\] that do not exist.*virtual_cpus"):
        kerasflow.FastTStrategy(devices=["/CPU:0", "/GPU:3"])


def test_one_device_warns_and_trains():
    with pytest.warns(UserWarning, match="behaves like OneDeviceStrategy"):
        strategy = kerasflow.FastTStrategy(devices=["/CPU:0"])
    x, y = data_for("mlp")
    assert fit(build_under(strategy, "mlp"), x, y) == pytest.approx(baseline("mlp"), rel=1e-5)


def test_jit_compile_is_timed_first_with_the_reason(capsys):
    x, y = data_for("mlp")
    strategy = kerasflow.FastTStrategy(split=False, tick_tock="off", collaborators=paths.PLANNING)
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = models.mlp(keras, dropout=False)
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=2, shuffle=False)  # verbose=0 would silence kerasflow
    out = capsys.readouterr().out
    assert "the model compiles its step with XLA (jit_compile): its first 4 steps run as compiled" in out
    assert "kerasflow: 4 devices" in out and strategy.report.xla_step_time > 0


def test_custom_train_step_gets_placement_only(capsys):
    class Custom(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    x, y = data_for("mlp")
    strategy = kerasflow.FastTStrategy(tick_tock="on", collaborators=paths.PLANNING)
    keras.utils.set_random_seed(7)
    with strategy.scope():
        inputs = keras.Input((8,))
        model = Custom(inputs, keras.layers.Dense(4)(keras.layers.Dense(16, activation="relu")(inputs)))
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=2, shuffle=False)
    assert "placement and order are applied" in capsys.readouterr().out
    assert strategy.plan is not None and strategy.plan.waves is None and not strategy.plan.splits


def test_steps_per_execution_partial_batches_evaluate_predict_save(tmp_path):
    x, y = data_for("mlp")
    x, y = x[:-5], y[:-5]  # a partial last batch
    strategy = kerasflow.FastTStrategy(split=False, tick_tock="off", verbose=0, collaborators=paths.PLANNING)
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = models.mlp(keras, dropout=False)
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=2)
    fit(model, x, y)
    assert strategy.plan is not None
    loss = model.evaluate(x, y, verbose=0)
    assert np.isfinite(loss)
    predictions = model.predict(x[:10], verbose=0)
    model.save(tmp_path / "model.keras")
    restored = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(restored.predict(x[:10], verbose=0), predictions, rtol=1e-5, atol=1e-6)


def test_log_dir_files_and_existing_callbacks(tmp_path, capsys):
    import json

    x, y = data_for("mlp")
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callbacks = [
        kerasflow.callbacks.FastT(split=False, tick_tock="off", log_dir=str(tmp_path / "kf"), collaborators=paths.PLANNING),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras")),
        keras.callbacks.EarlyStopping(monitor="loss", patience=5),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
    ]
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
    assert "kerasflow" not in capsys.readouterr().out  # fit(verbose=0) silences the report line too
    for name in ("plan.json", "profile.json", "timeline.json"):
        assert (tmp_path / "kf" / name).exists()
    assert "traceEvents" in json.loads((tmp_path / "kf" / "timeline.json").read_text())
    kerasflow.Plan.load(tmp_path / "kf" / "plan.json").validate(kerasflow.OpGraph.load(tmp_path / "kf" / "profile.json"),
                                                               CLUSTER)
    assert (tmp_path / "best.keras").exists() and len((tmp_path / "log.csv").read_text().splitlines()) == 3
    tags = set()
    for events in (tmp_path / "kf" / "kerasflow").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            tags.update(value.tag for value in event.summary.value)
    assert {"step_time/predicted_seconds", "step_time/measured_seconds", "samples_per_second/measured"} <= tags
    assert any(tag.startswith("utilization/") for tag in tags)
