"""Tests of the baseline plans and the lower bound, with hand-computed answers."""

import dataclasses

import pytest

from kerasflow.planner import (
    Cluster, Device, InvalidPlanError, Link, OpGraph, baselines, lower_bound, simulate, synthetic,
)
from kerasflow.planner.parallel.baselines import _linear_partition
from tests.planner.helpers import cluster, op


def test_single_device_takes_the_fastest_device_and_the_total_work():
    graph = synthetic.chain_mlp(layers=3, kinds=["V100"])
    c = Cluster([Device("/GPU:0", "V100", 2**34), Device("/GPU:1", "V100", 2**34, speed=2.0)], Link(0, 1e9))
    plan = baselines.single_device(graph, c)
    assert plan.devices() == ["/GPU:1"]
    assert plan.predicted_step_time == pytest.approx(graph.total_work("V100") / 2)
    assert plan.graph_fingerprint == graph.fingerprint() and plan.algorithm == "single_device"


def test_linear_partition_minimises_the_largest_stage():
    assert _linear_partition([1, 2, 3, 4], 2) == [(0, 3), (3, 4)]  # 6 | 4 beats 3 | 7
    assert _linear_partition([5, 1, 1, 1, 5], 3) == [(0, 1), (1, 4), (4, 5)]
    assert _linear_partition([1, 1], 2) == [(0, 1), (1, 2)]


def test_layerwise_model_parallel_cuts_contiguous_balanced_stages():
    # Four layers costing 1, 2, 3, 4 s: stages {L0, L1, L2} and {L3}.
    ops = [op(f"L{i}/op", float(i + 1), [4], layer=f"L{i}") for i in range(4)]
    graph = OpGraph(ops, [(f"L{i}/op", f"L{i + 1}/op", 0) for i in range(3)])
    plan = baselines.layerwise_model_parallel(graph, cluster(2))
    assert [plan.placement[f"L{i}/op"] for i in range(4)] == ["/D:0", "/D:0", "/D:0", "/D:1"]
    # 6 s on D0, one 4 B hop at 100 B/s, 4 s on D1.
    assert plan.predicted_step_time == pytest.approx(10.04)


def test_layerwise_model_parallel_keeps_colocation_and_places_the_input():
    graph = synthetic.chain_mlp(layers=4)
    plan = baselines.layerwise_model_parallel(graph, Cluster.preset("4xV100-pcie"))
    plan.validate(graph, Cluster.preset("4xV100-pcie"))
    assert plan.placement["input/IteratorGetNext"] == plan.placement["dense_0/MatMul"]
    assert plan.devices() == ["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"]


def test_layerwise_model_parallel_needs_layers():
    with pytest.raises(InvalidPlanError, match="no ops with a layer"):
        baselines.layerwise_model_parallel(OpGraph([op("a")], []), cluster(2))


def test_data_parallel_replicates_weights_and_all_reduces():
    graph = synthetic.chain_mlp(layers=2, kinds=["V100"])
    c = Cluster.preset("4xV100-pcie")
    plan = baselines.data_parallel(graph, c)
    weights = sum(o.persistent_bytes for o in graph.ops)
    assert all(peak >= weights for peak in plan.predicted_peak_memory.values())
    result = simulate(graph, c, plan)
    gradients = [o for o in graph.ops if o.name.endswith("_grad_weight")]
    link = c.slowest_link()
    # The gradients (well under 25 MiB together) fuse into one buffer: 2(D-1) ring steps, each
    # paying the slowest link's latency once and a quarter of the buffer over it; on GPUs of
    # their own NCCL runs the ring as one kernel: one launch.
    total = sum(o.output_bytes[0].fixed for o in gradients)
    assert total < 25 * 2**20
    expected = 2 * 3 * (link.latency + total / (4 * link.bandwidth)) + c.devices[0].launch_overhead
    rings = [(s, e) for name, (s, e) in result.times().items() if name.endswith("@allreduce")]
    assert len(rings) == 1
    assert rings[0][1] - rings[0][0] == pytest.approx(expected)


def test_tensorflows_ring_reducer_pays_a_launch_per_kernel_where_nccl_pays_one():
    # The same four V100s and links, named as GPUs (NCCL: one kernel) and as devices TensorFlow's
    # ring reducer sums over (each of the 2(D-1) = 6 steps a receive and a sum: 12 kernels).
    graph = synthetic.chain_mlp(layers=2, kinds=["V100"])
    gpus = Cluster.preset("4xV100-pcie")
    ring = Cluster([dataclasses.replace(d, name=f"/XLA_CPU:{i}") for i, d in enumerate(gpus.devices)], gpus.default_link)

    def allreduce_seconds(cluster):
        result = simulate(graph, cluster, baselines.data_parallel(graph, cluster))
        (start, end), = [t for name, t in result.times().items() if name.endswith("@allreduce")]
        return end - start

    assert gpus.sums_with_nccl(gpus.device_names) and not ring.sums_with_nccl(ring.device_names)
    launch = gpus.devices[0].launch_overhead
    assert allreduce_seconds(ring) - allreduce_seconds(gpus) == pytest.approx(11 * launch)


def test_lower_bound_is_exact_for_a_chain_on_one_device():
    graph = OpGraph([op("a", 1.0, [4]), op("b", 2.0)], [("a", "b", 0)])
    assert lower_bound(graph, cluster(1)) == (3.0, 3.0, 3.0)


def test_lower_bound_takes_the_larger_of_critical_path_and_average_work():
    # Fork-join costs 1, 2, 3, 1: critical path 5 (a-c-d), work 7 over 2 devices 3.5.
    graph = OpGraph([op("a", 1.0, [4]), op("b", 2.0, [4]), op("c", 3.0, [4]), op("d", 1.0)],
                    [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])
    assert lower_bound(graph, cluster(2)) == (5.0, 5.0, 3.5)
    # Four devices: a splittable batch op's per-sample part may be shared by all of them.
    split = OpGraph([op("m", (1.0, 1.0), [], batch_axis=0)], [], batch_size=8)
    assert lower_bound(split, cluster(4)) == (3.0, 3.0, 2.25)


@pytest.mark.parametrize("family", ["mlp", "inception", "transformer", "random"])
def test_every_baseline_respects_the_lower_bound(family):
    graph = synthetic.build(family)
    c = Cluster.preset("4xV100-nvlink")
    bound = lower_bound(graph, c).seconds
    for make in (baselines.single_device, baselines.data_parallel, baselines.layerwise_model_parallel):
        plan = make(graph, c)
        assert plan.predicted_step_time >= bound
