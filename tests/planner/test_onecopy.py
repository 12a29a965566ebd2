"""Data parallelism on one copy of the weights: one wave per device, the weights and the update once."""

import pytest

from kerasflow.planner import Cluster, InvalidPlanError, baselines, one_copy_data_parallel, simulate, synthetic
from kerasflow.planner.sim.tasknames import parse_copy_name


def test_each_wave_runs_the_whole_model_on_its_own_device_and_the_weights_stay_on_the_first():
    graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-nvlink")
    plan = one_copy_data_parallel(graph, cluster)
    result = simulate(graph, cluster, plan)
    ops = {op.name for op in graph.ops}
    devices_of_wave: dict[int, set[str]] = {}
    for task, device in zip(result.task_names, result.task_device):
        op, _, wave, _ = parse_copy_name(task)
        if op in ops and wave >= 0:  # an op's copy for a wave (not a transfer's split or sum)
            devices_of_wave.setdefault(wave, set()).add(device)
    assert devices_of_wave == {w: {f"/GPU:{w}"} for w in range(4)}
    variables = [op.name for op in graph.ops if op.persistent_bytes > 0]
    assert variables and {plan.placement[v] for v in variables} == {"/GPU:0"}
    # One update per variable: its tasks are not copied per wave.
    updates = [op.name for op in graph.ops if op.phase == "update"]
    assert updates and all(result.task_names.count(u) == 1 for u in updates)


def test_it_beats_one_device_where_compute_dominates_and_loses_where_weights_dominate():
    # An MLP on two CPUs that share memory: its matrix products outweigh reading the weights.
    graph = synthetic.chain_mlp(layers=4)
    testbed = Cluster.resolve("cpu-testbed:2")
    single = baselines.single_device(graph, testbed).predicted_step_time
    assert one_copy_data_parallel(graph, testbed).predicted_step_time < single
    # On fast GPUs over PCIe the same weights cost more to move than the compute they save.
    pcie = Cluster.preset("2xK80-pcie")
    assert one_copy_data_parallel(graph, pcie).predicted_step_time > baselines.single_device(
        graph, pcie).predicted_step_time


def test_it_needs_two_of_the_clusters_devices():
    cluster = Cluster.preset("2xK80-pcie")
    with pytest.raises(InvalidPlanError, match="Received: devices=\\['/GPU:0'\\]"):
        one_copy_data_parallel(synthetic.chain_mlp(layers=1), cluster, devices=["/GPU:0"])
    with pytest.raises(InvalidPlanError, match="/GPU:7"):
        one_copy_data_parallel(synthetic.chain_mlp(layers=1), cluster, devices=["/GPU:0", "/GPU:7"])
