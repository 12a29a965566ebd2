"""One execution order, three enforcers: the plan's per-device order is accepted by the task
graph's validation, replayed as is by the simulator, and chained as control edges by the
TensorFlow applier, for every plan kind that carries an order."""

import contextlib
import dataclasses

import pytest
import tensorflow as tf

from kerasflow.planner import Cluster, Op, OpGraph, Plan, cpop, heft, plan, simulate, synthetic
from kerasflow.planner.sim.tasknames import parse_copy_name
from kerasflow.planner.sim.taskgraph import build_task_graph
from kerasflow.planner.parallel.ticktock import tick_tock_model_parallel, with_waves
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.scopes import shard_scope, wave_scope


def ordered_plans():
    graph, cluster = synthetic.build("transformer"), Cluster.preset("4xV100-nvlink")
    placed = heft(graph, cluster)
    split = plan(graph, cluster, tick_tock="off", candidates=("heft",), max_split_evaluations=6, verbose=0)
    yield "heft", graph, cluster, placed
    yield "cpop", graph, cluster, cpop(graph, cluster)
    yield "layer affinity", graph, cluster, heft(graph, cluster, affinity="layer")
    yield "splits", graph, cluster, split
    yield "waves", graph, cluster, with_waves(placed, graph, cluster)
    yield "tick-tock model parallel", graph, cluster, tick_tock_model_parallel(graph, cluster)


def traced_copies(order):
    """The ops of a TensorFlow graph with one op per task of ``order``, named as the
    plan-applying step names the copies (wave and shard scopes around the profiled name).
    Each is a Neg (an op that runs a kernel; the order goes around metadata ops): the applier
    is given the profile retyped to match (``as_negations``)."""
    graph = tf.Graph()
    by_task = {}
    with graph.as_default():
        # Each op reads a placeholder: a constant would be folded before the step runs, and
        # the applier leaves such ops out of the order.
        source = tf.compat.v1.placeholder(tf.float32, name="source")
        for tasks in order.values():
            for task in tasks:
                base, _, wave, shard = parse_copy_name(task)
                scopes = [wave_scope(wave)] * (wave >= 0) + [shard_scope(shard)] * (shard >= 0)
                # A trailing "/" re-enters the scope as is (the step enters it once per copy).
                with graph.name_scope("/".join(scopes) + "/") if scopes else contextlib.nullcontext():
                    by_task[task] = tf.math.negative(source, name=base)
    return [op for op in graph.get_operations() if op is not source.op], by_task


@pytest.mark.parametrize("kind, graph, cluster, candidate", list(ordered_plans()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_validation_simulation_and_the_applier_run_the_same_order(kind, graph, cluster, candidate):
    assert candidate.order, f"{kind}: the plan carries no order"
    if kind == "splits":
        assert candidate.splits, "the split search found nothing to split"
    build_task_graph(graph, cluster, candidate)  # validation accepts the order
    simulated = simulate(graph, cluster, candidate).start_order()
    assert simulated == {device: list(tasks) for device, tasks in candidate.order.items()}
    ops, by_task = traced_copies(candidate.order)
    applier = PlanApplier(candidate, as_negations(graph), cluster.device_names)
    report = applier.apply(ops, {})
    assert applier.not_applied() == [] and report.order_skipped == ""
    for tasks in candidate.order.values():
        for before, after in zip(tasks, tasks[1:]):
            assert by_task[before].op in by_task[after].op.control_inputs, (kind, before, after)


def as_negations(graph):
    return graph.with_ops(dataclasses.replace(op, type="Neg") for op in graph.ops)


def test_a_planned_op_missing_from_the_trace_or_of_another_type_is_left_out_and_reported():
    # Planned on /D:0 in the order a, b, c, d: four MatMuls. The trace has a and d as
    # MatMuls, no b, and a "c" that is a Relu (an extra op shifted TensorFlow's numbering).
    # The order keeps a -> d; b and c are named; the Relu "c" is placed by its layer
    # (dense: two of its three planned ops are on /D:1), not as the planned MatMul c (/D:0).
    profiled = OpGraph([Op(name, "MatMul", "dense" if name in "cef" else "first", cost={"X": 1.0})
                        for name in "abcdef"], [])
    placement = {"a": "/D:0", "b": "/D:0", "c": "/D:0", "d": "/D:0", "e": "/D:1", "f": "/D:1"}
    applier = PlanApplier(Plan(placement=placement, order={"/D:0": list("abcd")}), profiled, ["/D:0", "/D:1"])
    graph = tf.Graph()
    with graph.as_default():
        source = tf.compat.v1.placeholder(tf.float32, [2, 2], name="source")
        a, d = tf.matmul(source, source, name="a"), tf.matmul(source, source, name="d")
        c = tf.nn.relu(source, name="c")
    report = applier.apply([a.op, c.op, d.op], {})
    assert report.order_missing == ["b", "c"]
    assert [op.name for op in d.op.control_inputs] == ["a"] and not c.op.control_inputs
    assert c.op.device == "/D:1" and d.op.device == "/D:0"
    assert applier.not_applied() == [
        "the per-device order of 2 planned ops this trace does not have as planned (b, c); they run in "
        "data-flow order"]
