"""Unit tests of the plan applier on hand-built TensorFlow graphs: devices by name, by layer
scope, by shard and wave; the per-device order as control edges; what it could not apply."""

import tensorflow as tf

from kerasflow.devices import normalize_device
from kerasflow.planner import Op, OpGraph, Plan, Shard, Waves
from kerasflow.strategies.applier import PlanApplier


def traced(build):
    """The ops ``build`` creates in a fresh graph."""
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.get_operations()


def chain():
    a = tf.constant(1.0, name="dense/a")
    b = tf.math.square(a, name="dense/b")
    tf.math.sqrt(b, name="dense/c")


def profile(names, layer="dense"):
    """A profile of ``names`` in ``layer``, without op types (the applier then matches by name alone)."""
    return OpGraph([Op(n, layer=layer) for n in names], [])


def test_ops_go_to_their_planned_device_and_others_to_their_layers_device():
    ops = traced(chain)
    plan = Plan(placement={"dense/a": "/CPU:1", "dense/b": "/CPU:1"})
    applier = PlanApplier(plan, profile(["dense/a", "dense/b"]), ["/CPU:0", "/CPU:1"])
    report = applier.apply(ops, {})
    devices = {op.name: op.device for op in ops}
    # dense/c is not in the plan: it follows the layer "dense", whose ops the plan put on CPU:1.
    assert devices == {"dense/a": "/CPU:1", "dense/b": "/CPU:1", "dense/c": "/CPU:1"}
    assert (report.placed, report.by_layer, report.unplaced) == (3, 1, [])
    assert applier.not_applied() == []


def test_shard_and_wave_copies_take_their_shard_device_and_wave_stage():
    def build():
        with tf.name_scope("wave1"), tf.name_scope("dense"), tf.name_scope("shard1"):
            tf.constant(1.0, name="a")
    ops = traced(build)
    plan = Plan(placement={"dense/a": "/CPU:0"}, splits={"dense": (Shard("/CPU:0", 0.5), Shard("/CPU:1", 0.5))},
                waves=Waves(2, stage_maps=({}, {"/CPU:0": "/CPU:1", "/CPU:1": "/CPU:0"})))
    PlanApplier(plan, profile(["dense/a"]), ["/CPU:0", "/CPU:1"]).apply(ops, {})
    # Shard 1 of the split layer is on CPU:1, and wave 1 swaps the two devices.
    assert ops[0].name == "wave1/dense/shard1/a" and ops[0].device == "/CPU:0"


def two_branches(extra=lambda p: None):
    """``x = p^2`` and ``y = sqrt(p)`` of a placeholder ``p`` of shape [2] (plus ``extra(p)``)."""
    def build():
        p = tf.compat.v1.placeholder(tf.float32, shape=[2], name="p")
        tf.math.square(p, name="x")
        tf.math.sqrt(p, name="y")
        extra(p)
    return {op.name: op for op in traced(build)}


def test_the_per_device_order_becomes_control_edges():
    ops = two_branches()
    plan = Plan(placement={"x": "/CPU:0", "y": "/CPU:0"}, order={"/CPU:0": ["y", "x"]})
    report = PlanApplier(plan, None, ["/CPU:0"]).apply(list(ops.values()), {})
    assert [op.name for op in ops["x"].control_inputs] == ["y"] and report.ordered_edges == 1


def test_ops_folded_into_constants_are_left_out_of_the_order():
    # Grappler computes these before the step runs; a constant with control inputs is folded
    # otherwise (a HEFT plan's order made MobileNetV2's step round differently from plain
    # Keras). The order goes around them.
    def folded(p):
        k = tf.constant(2.0, name="k")
        tf.math.multiply(k, tf.cast(tf.size(p, name="n"), tf.float32, name="n_float"), name="kn")
    ops = two_branches(folded)
    order = ["y", "k", "n", "n_float", "kn", "x"]
    plan = Plan(placement={name: "/CPU:0" for name in order}, order={"/CPU:0": order})
    report = PlanApplier(plan, None, ["/CPU:0"]).apply(list(ops.values()), {})
    assert [op.name for op in ops["x"].control_inputs] == ["y"] and report.ordered_edges == 1
    assert all(not ops[name].control_inputs for name in ("k", "n", "n_float", "kn"))


def test_metadata_ops_are_left_out_of_the_order():
    # Grappler removes a Reshape -> Squeeze pair that cancels out and hands their control
    # edges to their neighbours: on the mnist convnet that closed a cycle. The order goes
    # around such ops (they take no time).
    def reshaped(p):
        tf.squeeze(tf.reshape(p, [1, 2], name="r"), name="s")
    ops = two_branches(reshaped)
    order = ["y", "r", "s", "x"]
    plan = Plan(placement={name: "/CPU:0" for name in order}, order={"/CPU:0": order})
    report = PlanApplier(plan, None, ["/CPU:0"]).apply(list(ops.values()), {})
    assert [op.name for op in ops["x"].control_inputs] == ["y"] and report.ordered_edges == 1
    assert not ops["r"].control_inputs and not ops["s"].control_inputs


def test_an_order_against_the_data_flow_is_skipped_and_reported():
    def chain_of_an_input():
        p = tf.compat.v1.placeholder(tf.float32, name="dense/p")
        b = tf.math.square(tf.math.abs(p, name="dense/a"), name="dense/b")
        tf.math.sqrt(b, name="dense/c")
    ops = [op for op in traced(chain_of_an_input) if op.type != "Placeholder"]
    plan = Plan(placement={n: "/CPU:0" for n in ("dense/a", "dense/b", "dense/c")},
                order={"/CPU:0": ["dense/c", "dense/b", "dense/a"]})
    applier = PlanApplier(plan, profile(["dense/a", "dense/b", "dense/c"]), ["/CPU:0"])
    report = applier.apply(ops, {})
    assert report.ordered_edges == 0 and all(not op.control_inputs for op in ops)
    assert applier.not_applied() == [
        "the per-device order (the plan's order contradicts this trace's data flow (the step differs from the "
        "profiled one); ops run in data-flow order)"]


def test_ops_the_plan_cannot_place_are_reported():
    ops = traced(lambda: tf.constant(1.0, name="elsewhere/k"))
    applier = PlanApplier(Plan(placement={"dense/a": "/CPU:0"}), profile(["dense/a"]), ["/CPU:0"])
    applier.apply(ops, {})
    assert applier.not_applied() == ["devices for 1 ops the plan does not name, placed by TensorFlow (elsewhere/k)"]


def test_a_refused_order_is_remembered_with_its_reason():
    applier = PlanApplier(Plan(placement={"a": "/CPU:0"}, order={"/CPU:0": ["a"]}), None, ["/CPU:0"])
    applier.refuse_order("InvalidArgumentError: a cycle")
    assert applier.skip_order
    assert applier.not_applied() == ["the per-device order (TensorFlow could not run it: InvalidArgumentError: "
                                     "a cycle)"]


def updates_of_two_variables(order, same_variable=False):
    """Traces ``v1 = v1 * 2; v2 = v2 + 1`` (or both on v1) with the applier ordering the two
    math ops as ``order`` says; returns the applier's report and the variables after one run."""
    v1, v2 = tf.Variable(3.0), tf.Variable(5.0)
    second = v1 if same_variable else v2
    plan = Plan(placement={"m1": "/CPU:0", "m2": "/CPU:0"}, order={"/CPU:0": order})
    applier = PlanApplier(plan, None, ["/CPU:0"])
    reports = []

    @tf.function
    def step():
        graph = tf.compat.v1.get_default_graph()
        v1.assign(tf.multiply(v1.read_value(), 2.0, name="m1"))
        second.assign(tf.add(second.read_value(), 1.0, name="m2"))
        reports.append(applier.apply(graph.get_operations(), {}))

    step()
    return reports[0], applier, (float(v1.numpy()), float(v2.numpy()))


def test_an_order_across_independent_variables_is_applied():
    # tf.function orders ops per variable only: m2 (on v2) may run before m1 (on v1). A check
    # that chained every stateful op in program order (v1's write before v2's read) saw a cycle.
    report, applier, values = updates_of_two_variables(["m2", "m1"])
    assert report.ordered_edges == 1 and report.order_skipped == ""
    assert values == (6.0, 6.0)


def test_an_order_against_one_variables_program_order_is_skipped():
    # Both on v1: the second read waits for the first write, which needs m1; m2 before m1 is a cycle.
    report, applier, values = updates_of_two_variables(["m2", "m1"], same_variable=True)
    assert report.ordered_edges == 0 and report.order_skipped.startswith("the plan's order contradicts")
    assert values == (7.0, 5.0)


def test_a_join_used_on_two_devices_is_made_on_each_and_cuts_run_where_their_input_is():
    def build():
        with tf.device("/CPU:0"):
            x = tf.constant([[1.0], [2.0]], name="dense/x")
        with tf.name_scope("dense"), tf.name_scope("shard_inputs"):
            top, bottom = tf.split(x, [1, 1], axis=0)
        with tf.name_scope("dense"), tf.name_scope("shard_outputs"):
            joined = tf.concat([top, bottom], axis=0)
        tf.math.square(joined, name="next/square")
        tf.math.sqrt(joined, name="other/sqrt")
    ops = traced(build)
    plan = Plan(placement={"dense/x": "/CPU:0", "next/square": "/CPU:1", "other/sqrt": "/CPU:2"})
    report = PlanApplier(plan, None, ["/CPU:0", "/CPU:1", "/CPU:2"]).apply(ops, {})
    by_name = {op.name: op for op in ops}
    # The cut runs where x is made; each consumer reads a join made on its own device.
    assert by_name["dense/shard_inputs/split"].device == "/CPU:0"
    square, sqrt = by_name["next/square"], by_name["other/sqrt"]
    assert {normalize_device(square.inputs[0].op.device), normalize_device(sqrt.inputs[0].op.device)} == {
        "/CPU:1", "/CPU:2"}
    assert square.inputs[0].op.type == sqrt.inputs[0].op.type == "ConcatV2"
    assert "dense/shard_outputs/concat" not in report.unplaced
