"""Tests of profile_model on logical CPUs: structure, costs, sizes, coverage, bad input."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasflow import ProfilingError
from kerasflow.planner import OpGraph
from kerasflow.planner.ir.graphtables import is_loss_op
from kerasflow.planner.search.planning import MAX_TIE_MARGIN, TIE_MARGIN, tie_margin_for
from kerasflow.profiling import capture_step, profile_model
from kerasflow.profiling.profiler import PLAIN_RUNS
from tests.profiling import models


@pytest.fixture(scope="module")
def mlp_graph():
    model = models.mlp(keras)
    return model, profile_model(model, models.mlp_data(), batch_size=16, steps=2)


def test_the_graph_holds_every_op_of_the_step(mlp_graph):
    model, graph = mlp_graph
    from kerasflow.profiling.profiler import first_batch

    step = capture_step(model, first_batch(models.mlp_data(), 16))
    assert {op.name for op in graph.ops} == {op.name for op in step.ops}
    assert len(graph.topological_order()) == len(graph)
    assert {"forward", "backward", "update", "other"} <= {op.phase for op in graph.ops}


def test_compute_ops_have_positive_costs(mlp_graph):
    _, graph = mlp_graph
    matmuls = [op for op in graph.ops if op.type == "MatMul"]
    assert len(matmuls) == 3 + 5  # three forward, five backward (no input gradient for the first layer)
    assert all(op.cost["CPU"].at(16) > 0 for op in matmuls)


def test_a_dense_output_edge_carries_batch_times_units_times_4(mlp_graph):
    _, graph = mlp_graph
    matmul = next(op for op in graph.ops if op.layer == "dense_0" and op.type == "MatMul" and op.phase == "forward")
    edge = next(e for e in graph.edges if e.src == matmul.name)
    assert graph.edge_bytes(edge) == 16 * 32 * 4
    assert graph.edge_bytes(edge, batch=7) == 7 * 32 * 4  # sizes are affine in the batch


def test_phases_layers_and_colocation(mlp_graph):
    _, graph = mlp_graph
    by_layer = {}
    for op in graph.ops:
        by_layer.setdefault((op.layer, op.phase), []).append(op)
    for layer in ("dense_0", "dense_1", "logits"):
        assert by_layer[(layer, "forward")] and by_layer[(layer, "backward")] and by_layer[(layer, "update")]
    kernel_ops = [op for op in graph.ops if op.colocation == "dense_0/kernel"]
    assert {op.phase for op in kernel_ops} >= {"other", "forward", "update"}
    variable = next(op for op in kernel_ops if op.persistent_bytes)
    assert variable.persistent_bytes == 8 * 32 * 4  # the kernel; its Adam slots have their own placeholders
    slots = [op for op in kernel_ops if op.persistent_bytes]
    assert sum(op.persistent_bytes for op in slots) == 3 * 8 * 32 * 4  # kernel + two Adam slots
    assert all(op.batch_axis == 0 for op in by_layer[("dense_0", "forward")] if not op.colocation)


def test_coverage_and_metadata(mlp_graph):
    _, graph = mlp_graph
    meta = graph.metadata
    assert meta["coverage"] >= 0.95
    assert meta["device_kind"] == "CPU" and meta["batch_sizes"] == [16, 8] and meta["flavor"] == "keras3"


def test_on_a_cpu_memory_is_the_tensors_sizes_only(mlp_graph):
    # TensorFlow's CPU allocator statistics leave out a small step's tensors (this one's peak
    # reads 0 bytes), so no peak is taken from them (a GPU's is: the next test).
    _, graph = mlp_graph
    assert "measured_peak_bytes" not in graph.metadata and "temporary_bytes" not in graph.metadata
    assert graph.metadata["memory"] == "tensor sizes (TensorFlow's allocator statistics on a CPU leave out most tensors)"


def test_on_a_gpu_the_peak_beyond_the_modelled_one_is_the_steps_temporary_memory():
    from kerasflow.profiling.profiler import memory_metadata

    said = memory_metadata("/GPU:1", 7 * 2**30, lambda: 5 * 2**30)
    assert (said["measured_peak_bytes"], said["temporary_bytes"]) == (7 * 2**30, 2 * 2**30)
    assert memory_metadata("/GPU:0", 2**30, lambda: 2.0 * 2**30)["temporary_bytes"] == 0  # the model overestimates
    assert "measured_peak_bytes" not in memory_metadata("/GPU:0", None, lambda: 1.0)


def test_the_plain_step_is_timed_ten_times_and_its_spread_kept_for_the_planner(mlp_graph):
    # The fixture profiles 2 steps; the plain step is timed PLAIN_RUNS times all the same.
    _, graph = mlp_graph
    meta = graph.metadata
    assert meta["plain_step_runs"] == PLAIN_RUNS == 10
    # Interquartile range over median: no upper bound on a loaded machine (CI measured 1.09).
    assert isinstance(meta["plain_step_spread"], float) and 0 <= meta["plain_step_spread"] < float("inf")
    assert TIE_MARGIN <= tie_margin_for(graph) <= MAX_TIE_MARGIN


def test_json_round_trip(mlp_graph, tmp_path):
    _, graph = mlp_graph
    graph.save(tmp_path / "profile.json")
    loaded = OpGraph.load(tmp_path / "profile.json")
    assert loaded.fingerprint() == graph.fingerprint() and loaded.to_dict() == graph.to_dict()


def test_profiling_does_not_change_the_weights():
    model = models.mlp(keras)
    before = [v.numpy().copy() for v in model.variables]
    profile_model(model, models.mlp_data(), batch_size=8, steps=1, warmup_steps=1, second_batch=False)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))


@pytest.mark.parametrize("build, data", [
    (models.inception_cnn, models.image_data),
    (models.lstm_model, models.token_data),
    (models.transformer_block, models.sequence_data),
    (lambda k: models.inception_cnn(k, batch_norm=True), models.image_data),
])
def test_layer_families(build, data):
    model = build(keras)
    graph = profile_model(model, data(), batch_size=8, steps=2)
    assert graph.metadata["coverage"] >= 0.95
    layers = {op.layer for op in graph.ops if op.phase == "forward"}
    expected = {layer.name for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)}
    assert expected - {"dropout"} <= layers | {"gap", "pool", "residual"}
    if "bn" in layers:  # BatchNormalization couples the batch: never split
        assert all(op.batch_axis is None for op in graph.ops if op.layer == "bn" and op.phase == "forward")


def test_sequential_and_subclassed_models():
    sequential = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="hidden"),
                                   keras.layers.Dense(2, name="out")], name="seq")
    sequential.compile(optimizer="sgd", loss="mse")

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="sub")
            self.hidden = keras.layers.Dense(4, name="hidden")
            self.out = keras.layers.Dense(2, name="out")

        def call(self, x):
            return self.out(self.hidden(x))

    subclassed = Subclassed()
    subclassed.compile(optimizer="sgd", loss="mse")
    x = np.random.rand(16, 8).astype("float32")
    y = np.random.rand(16, 2).astype("float32")
    subclassed(x[:1])
    for model in (sequential, subclassed):
        graph = profile_model(model, (x, y), batch_size=8, steps=1)
        assert {"hidden", "out"} <= {op.layer for op in graph.ops}


def test_multiple_inputs_and_outputs():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    merged = keras.layers.Concatenate(name="merge")([keras.layers.Dense(5, name="da")(a), keras.layers.Dense(5, name="db")(b)])
    out1, out2 = keras.layers.Dense(1, name="o1")(merged), keras.layers.Dense(2, name="o2")(merged)
    model = keras.Model([a, b], [out1, out2], name="two_heads")
    model.compile(optimizer="sgd", loss=["mse", "mse"])
    xa, xb = np.random.rand(16, 4).astype("float32"), np.random.rand(16, 3).astype("float32")
    ya, yb = np.random.rand(16, 1).astype("float32"), np.random.rand(16, 2).astype("float32")
    graph = profile_model(model, ((xa, xb), (ya, yb)), batch_size=8, steps=1)
    assert {"da", "db", "merge", "o1", "o2"} <= {op.layer for op in graph.ops}


def test_gradients_of_a_shared_layer_are_summed_in_its_backward_pass():
    inputs = keras.Input((6,), name="x")
    shared = keras.layers.Dense(6, name="shared")
    outputs = keras.layers.Dense(1, name="out")(shared(shared(inputs)))  # the kernel is used twice
    model = keras.Model(inputs, outputs, name="shared_twice")
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(16, 6).astype("float32"), np.random.rand(16, 1).astype("float32")
    step = capture_step(model, (x, y))
    sums = [op for op in step.ops if op.type == "AddN" and not op.name.startswith("gradient_tape/")]
    assert sums, "TensorFlow sums a twice-used weight's gradients with an AddN outside the tape scope"
    for op in sums:
        assert (op.phase, op.layer, op.batch_axis) == ("backward", "shared", 0)
    # The stem feeds parallel branches: its output's gradient is summed between layers, per sample.
    cnn = models.inception_cnn(keras)
    step = capture_step(cnn, models.image_data(16))
    glue = [op for op in step.ops if op.type == "AddN" and not op.name.startswith("gradient_tape/")]
    assert glue and all((op.phase, op.layer, op.batch_axis) == ("backward", None, 0) for op in glue)


def test_the_values_the_tape_starts_a_loops_gradient_with_belong_to_its_layer():
    # The LSTM's gradient loop starts from zeros the tape makes outside its scope (for the
    # final states nothing differentiates): they belong to the layer's backward pass, as each
    # of its shards makes its own; left without a layer, a split would send them over.
    step = capture_step(models.lstm_model(keras), models.token_data())
    loops = [op for op in step.ops if op.type in ("While", "StatelessWhile") and op.phase == "backward"]
    assert loops
    seeds = [op for op in step.ops if not op.name.startswith("gradient_tape/") and op.phase != "forward"
             and any(source == op.name for loop in loops for source, _ in loop.inputs)]
    assert seeds, "the gradient loop reads values made outside the tape's scope"
    assert all((op.phase, op.layer) == ("backward", "lstm") for op in seeds), [(o.name, o.phase, o.layer) for o in seeds]


def test_a_loop_that_reads_several_variables_keeps_them_in_one_group():
    # The LSTM's While reads its kernel, recurrent kernel and bias each step: with any of them
    # on another device than the loop, every iteration would read it from there (on
    # kerasflow.testbed a HEFT plan that did so took 1,070 ms a step where the default took 17).
    step = capture_step(models.lstm_model(keras), models.token_data())
    loops = [op for op in step.ops if op.type in ("While", "StatelessWhile") and op.phase == "forward"]
    weights = {op.colocation for op in step.ops if op.layer == "lstm" and op.persistent_bytes}
    assert loops and len(weights) == 1 and all(loop.colocation in weights for loop in loops), (
        weights, [(loop.name, loop.colocation) for loop in loops])


def _loss_axes(loss, *, mask: bool = False, one_hot: bool = False) -> set:
    """The batch axes of the compiled loss' ops (and its gradient's) in a sequence tagger's step."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4, mask_zero=mask),
                              keras.layers.Dense(3, name="tags")])
    model.compile(optimizer="sgd", loss=loss)
    x = np.random.randint(0, 20, (8, 5)).astype("int32")
    y = np.random.randint(0, 3, (8, 5)).astype("float32")
    step = capture_step(model, (x, np.eye(3, dtype="float32")[y.astype(int)] if one_hot else y))
    axes = {op.batch_axis for op in step.ops if is_loss_op(op.name) and op.layer is None and op.phase != "other"}
    assert axes, "the compiled loss made no ops"
    return axes


def test_a_loss_that_averages_each_sample_alone_is_split_and_no_other():
    assert _loss_axes("sparse_categorical_crossentropy") == {0}
    assert _loss_axes(keras.losses.SparseCategoricalCrossentropy(from_logits=True)) == {0}
    # Opted in, as a layer opts in.
    def per_sample(y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
    per_sample.kerasflow_splittable = True
    assert _loss_axes(per_sample) == {0}
    # Shards' losses weighted by their shares do not sum to these: a sum over the batch, a loss
    # of the whole batch at once, a mean over the unmasked entries of the whole batch, unknown code.
    assert _loss_axes(keras.losses.SparseCategoricalCrossentropy(reduction="sum")) == {None}
    assert _loss_axes(keras.losses.Dice(), one_hot=True) == {None}
    assert _loss_axes(keras.losses.CategoricalCrossentropy(from_logits=True), one_hot=True) == {0}
    assert _loss_axes("sparse_categorical_crossentropy", mask=True) == {None}
    assert _loss_axes(lambda y_true, y_pred: keras.ops.mean(keras.ops.square(y_pred))) == {None}


def test_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ProfilingError, match="not compiled: call model.compile"):
        profile_model(model, (np.zeros((4, 3)), np.zeros((4, 2))))


def test_wrong_data_shape_is_refused():
    with pytest.raises(ProfilingError, match=r"does not fit model 'mlp': kerasflow traced its training step on a batch "
                                             r"of 8 made from the data \(tensors of shapes \[\(8, 5\)"):
        profile_model(models.mlp(keras), (np.zeros((16, 5), "float32"), np.zeros(16, "int64")), batch_size=8)


class OneBatchSize(keras.layers.Layer):
    """Takes only the batch size it was built for, as a router that reshapes with it does: refused
    when traced (a reshape of the static shape) or only when run (a check of the dynamic one)."""

    def __init__(self, batch_size, when, **kwargs):
        super().__init__(**kwargs)
        self.batch_size, self.when = batch_size, when

    def call(self, x):
        if self.when == "traced":
            return keras.ops.reshape(keras.ops.reshape(x, (self.batch_size * x.shape[1],)), (self.batch_size, -1))
        tf.debugging.assert_equal(tf.shape(x)[0], self.batch_size, message="built for another batch size")
        return x


@pytest.mark.parametrize("when", ["traced", "run"])
def test_a_model_that_takes_one_batch_size_is_profiled_at_it_and_says_so(when):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="dense"),
                              OneBatchSize(16, when, name="router"), keras.layers.Dense(2, name="head")], name="fixed")
    model.compile(optimizer="adam", loss="mse")
    said = []
    graph = profile_model(model, (np.ones((16, 6), "float32"), np.ones((16, 2), "float32")), progress=said.append,
                          batch_size=16, steps=1, verbose=0)
    assert graph.metadata["batch_sizes"] == [16] and graph.metadata["refused_batch_sizes"] == [8]
    refusal = [line for line in said if "refuses" in line]
    assert len(refusal) == 1 and refusal[0].startswith("model 'fixed' refuses a batch of 8 (")
    assert refusal[0].endswith("profiled at its own batch of 16 only, and no plan hands a device fewer rows (no "
                               "data parallelism, waves or op splitting)")
    assert "\x1b" not in refusal[0] and "{{node" not in refusal[0]
    # Costs and sizes as measured at the batch, with no part per sample.
    assert all(cost.per_sample == 0 for op in graph.ops for cost in op.cost.values())
    assert sum(cost.fixed for op in graph.ops for cost in op.cost.values()) > 0
    assert graph.metadata["coverage"] > 0.5


def test_a_step_compiled_with_xla_is_profiled_without_it_and_said_once():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)  # what "auto" resolves to on a GPU host
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = profile_model(model, (np.zeros((4, 3)), np.zeros((4, 2))), verbose=0)
    said = [str(w.message) for w in caught if "XLA" in str(w.message)]
    assert len(said) == 1 and "is profiled without XLA" in said[0] and caught[0].filename == __file__
    assert {op.type for op in graph.ops} >= {"MatMul", "BiasAdd"}  # per-op, not XLA's clusters
    assert model.jit_compile is True  # the model is unchanged


def test_not_a_model_is_refused():
    with pytest.raises(ProfilingError, match="takes a Keras model"):
        profile_model("model", (np.zeros(2), np.zeros(2)))


def test_a_dataset_works():
    x, y = models.mlp_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    graph = profile_model(models.mlp(keras), dataset, steps=1)
    assert graph.batch_size == 16


def test_the_tf_keras_path():
    import tf_keras  # installed by the `legacy` extra, which CI installs
    model = models.mlp(tf_keras)
    graph = profile_model(model, models.mlp_data(), batch_size=16, steps=2)
    assert graph.metadata["flavor"] == "tf_keras" and graph.metadata["coverage"] >= 0.95
    for layer in ("dense_0", "dense_1", "logits"):
        phases = {op.phase for op in graph.ops if op.layer == layer}
        assert {"forward", "backward", "update"} <= phases
    kernel = [op for op in graph.ops if op.colocation == "dense_0/kernel" and op.persistent_bytes]
    assert sum(op.persistent_bytes for op in kernel) == 3 * 8 * 32 * 4


def test_links_between_logical_cpus_say_they_are_not_measured():
    from kerasflow import KerasflowError
    from kerasflow.profiling import cluster_of, measure_links

    result = measure_links(["/CPU:0", "/CPU:1"])
    assert not result.measured and "by reference" in result.note
    assert set(result.links) == {("/CPU:0", "/CPU:1"), ("/CPU:1", "/CPU:0")}
    cluster = cluster_of(["/CPU:0", "/CPU:1", "/CPU:2"])
    assert cluster.kinds() == ["CPU"] and len(cluster) == 3
    with pytest.raises(KerasflowError, match="'/GPU:7' does not exist"):
        measure_links(["/CPU:0", "/GPU:7"])


def test_copy_kernels_are_priced_at_the_device_measured_copy_rate():
    from kerasflow.profiling import cluster_of, copy_bandwidth
    from kerasflow.profiling.links import planning_cluster
    from kerasflow.strategies.options import Options

    rate = copy_bandwidth("/CPU:0")
    assert 1e8 < rate < 1e13  # bytes/s: no memory copies slower than 100 MB/s, nor faster than 10 TB/s
    cluster = planning_cluster(Options(devices=("/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3")))
    assert {cluster.device(d).memory_bandwidth for d in cluster.device_names} == {rate}
    assert cluster_of(["/CPU:0", "/CPU:1"]).device("/CPU:1").memory_bandwidth == copy_bandwidth("/CPU:1")
    given = cluster_of(["/CPU:0", "/CPU:1"], bandwidths={"/CPU:0": 5e9})
    assert [given.device(d).memory_bandwidth for d in given.device_names] == [5e9, 20e9]  # else the datasheet's


def test_estimates_for_gpus_from_a_cpu_profile(mlp_graph):
    from kerasflow.profiling import estimate_costs

    _, graph = mlp_graph
    estimated = estimate_costs(graph, ["V100", "H200"])
    matmul = next(op for op in estimated.ops if op.type == "MatMul" and op.layer == "dense_0" and op.phase == "forward")
    assert matmul.flops.per_sample == 2 * 8 * 32  # 2 x in x out per sample
    assert 0 < matmul.cost["H200"].at(16) <= matmul.cost["V100"].at(16)
    import kerasflow

    assert kerasflow.plan(estimated, "4xV100-nvlink", max_split_evaluations=2).predicted_step_time > 0


def test_a_string_lookup_is_profiled_host_only_and_planned_onto_a_gpu_clusters_host():
    # A model that looks its string inputs up (StringLookup), profiled on a CPU and planned for
    # two K80s: the lookup has no GPU kernel, so the plan puts it on the host's CPU, beside the
    # batch (strings and labels), every other op on a GPU, and the simulated step sends its ids
    # from the host to the GPU that reads them.
    from kerasflow.planner import Cluster, plan, simulate
    from kerasflow.planner.ir.costmodel import estimate_costs
    from kerasflow.planner.ir.graphtables import batch_inputs
    from kerasflow.planner.sim.tasknames import parse_copy_name

    words = [f"w{i}" for i in range(50)]
    inputs = keras.Input((8,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=words[:40], name="lookup")(inputs)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(42, 16, name="embed")(ids))
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(pooled))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    graph = profile_model(model, (rng.choice(words, (64, 8)), rng.integers(0, 4, 64)), batch_size=32, steps=2,
                          verbose=0)
    host_only = [op for op in graph.ops if op.host_only]
    assert [op.type for op in host_only] == ["LookupTableFindV2"] and not host_only[0].splittable
    cluster, priced = Cluster.preset("2xK80-pcie"), estimate_costs(graph, "K80")
    best = plan(priced, cluster)
    result = simulate(priced, cluster, best)
    ran_on = {}  # op -> the devices its tasks (a replica's, a shard's) ran on
    for name, device, role in zip(result.task_names, result.task_device, result.task_role):
        if role == "op":
            ran_on.setdefault(parse_copy_name(name)[0], set()).add(device)
    inputs = [graph.ops[i] for i in batch_inputs(graph)]
    assert sorted(op.output_bytes[0].per_sample for op in inputs) == [8.0, 8 * 8.0]  # labels, strings (pointers)
    assert all(ran_on[op.name] == {"/CPU:0"} for op in host_only + inputs), best.algorithm
    assert all(device.startswith("/GPU:") for op in graph.ops if not op.host_only and op not in inputs
               for device in ran_on[op.name])
    ids_bytes = host_only[0].output_bytes[0].at(32)
    assert sum(b for (src, _), b in result.link_bytes.items() if src == "/CPU:0") >= ids_bytes > 0
