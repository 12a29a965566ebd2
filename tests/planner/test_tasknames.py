"""The task-name grammar: what the task graph writes, the parser reads back."""

import itertools

from kerasflow.planner import Cluster, plan, simulate, synthetic
from kerasflow.planner.sim.tasknames import copy_name, parse_copy_name, with_replica


def test_every_copy_name_parses_back_to_its_parts():
    for replica, wave, shard in itertools.product((-1, 0, 3), (-1, 1), (-1, 0, 12)):
        name = copy_name("model/dense_1/MatMul", replica=replica, wave=wave, shard=shard)
        assert parse_copy_name(name) == ("model/dense_1/MatMul", replica, wave, shard)


def test_a_name_with_an_auxiliary_role_is_not_taken_for_a_shard():
    # "@split" starts with "s" but is not a shard index.
    assert parse_copy_name("dense/MatMul:0@split") == ("dense/MatMul:0", -1, -1, -1)


def test_with_replica_changes_only_the_replica():
    assert with_replica("a/b@r0@w1@s2", 5) == "a/b@r5@w1@s2"
    assert with_replica("a/b:0@sum@r0@/GPU:0", 1) == "a/b:0@sum@r1@/GPU:0"


def test_the_simulators_op_tasks_name_ops_of_the_graph():
    graph, cluster = synthetic.build("transformer"), Cluster.preset("4xV100-nvlink")
    names = {op.name for op in graph.ops}
    for candidate in (plan(graph, cluster, max_split_evaluations=4, verbose=0),
                      plan(graph, cluster, split=False, tick_tock="on", verbose=0)):
        order = simulate(graph, cluster, candidate).start_order()
        op_tasks = [task for tasks in order.values() for task in tasks]
        assert op_tasks and all(parse_copy_name(task)[0] in names for task in op_tasks)
