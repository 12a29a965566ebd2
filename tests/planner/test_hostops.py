"""The ops only a host can run, on a cluster of accelerators: on its host, their transfers priced.

A lookup (host-only: 2 ms on the host's CPU, 1 ms if a GPU could run it) feeds a dense op (3 ms
on a V100) 1 MB over the host's link (100 us + 1 MB / 1 GB/s = 1.1 ms):

    host  |== lookup 2 ms ==|
    link                    |== 1.1 ms ==|
    GPU:0                                |=== dense 3 ms ===|     6.1 ms

Without a host (a CPU cluster, whose devices are hosts' CPUs) the lookup runs where it is placed.

The batch is the host's too: the input pipeline hands it to the step on the host's CPU, and each
device that reads it receives its rows over the host's link at the start of the step (tests
``test_the_batch_*``, worked out below them).
"""

import pytest

from kerasflow.planner import (Cluster, Device, InvalidClusterError, InvalidPlanError, Link, Op, OpGraph, Plan, Shard,
                               plan, simulate)
from kerasflow.planner.ir.graph import HOST_GROUP
from kerasflow.planner.parallel.baselines import data_parallel
from kerasflow.planner.sim.predict import with_prediction

HOST_LINK = Link(1e-4, 1e9)


def cluster(host: bool = True) -> Cluster:
    gpus = [Device(f"/GPU:{i}", "V100", 16 * 2**30) for i in range(2)]
    return Cluster(gpus, Link(0.0, 1e12), host=Device("/CPU:0", "CPU", 64 * 2**30) if host else None,
                   host_link=HOST_LINK)


def graph(lookup_cost=None) -> OpGraph:
    lookup = Op("lookup", "LookupTableFindV2", layer="lookup", cost=lookup_cost or {"CPU": 2e-3, "V100": 1e-3},
                output_bytes=[(1e6, 0)], colocation=HOST_GROUP + "/lookup")
    dense = Op("dense", "MatMul", layer="dense", cost={"V100": 3e-3, "CPU": 9e-3})
    return OpGraph([lookup, dense], [("lookup", "dense", 0)], batch_size=32)


def on_gpu0(g: OpGraph) -> Plan:
    return Plan(placement={op.name: "/GPU:0" for op in g.ops})


def test_a_host_only_op_runs_on_the_host_and_its_output_crosses_the_host_link():
    g = graph()
    result = simulate(g, cluster(), on_gpu0(g))
    assert result.makespan == pytest.approx(2e-3 + 1.1e-3 + 3e-3)
    assert result.busy["/CPU:0"] == pytest.approx(2e-3) and result.busy["/GPU:0"] == pytest.approx(3e-3)
    assert result.link_bytes == {("/CPU:0", "/GPU:0"): pytest.approx(1e6)}


def test_without_a_host_it_runs_where_it_is_placed():
    g = graph()
    assert simulate(g, cluster(host=False), on_gpu0(g)).makespan == pytest.approx(1e-3 + 3e-3)


def test_a_gpu_profile_times_it_on_the_host_under_the_gpus_kind():
    g = graph(lookup_cost={"V100": 1.5e-3})  # measured where it ran: on the host, keyed by the profile's kind
    assert simulate(g, cluster(), on_gpu0(g)).makespan == pytest.approx(1.5e-3 + 1.1e-3 + 3e-3)


def test_the_plan_says_where_it_runs_and_the_planner_keeps_it_there():
    g = graph()
    predicted = with_prediction(on_gpu0(g), g, cluster())
    assert predicted.placement == {"lookup": "/CPU:0", "dense": "/GPU:0"}
    assert predicted.predicted_step_time == pytest.approx(6.1e-3)
    best = plan(g, cluster())
    assert best.placement["lookup"] == "/CPU:0" and best.placement["dense"].startswith("/GPU:")


def test_only_host_only_ops_may_be_placed_on_the_host():
    g = graph()
    with pytest.raises(InvalidPlanError, match="'dense' is placed on the host '/CPU:0', which holds only the batch"):
        simulate(g, cluster(), Plan(placement={"lookup": "/CPU:0", "dense": "/CPU:0"}))


def test_each_replica_runs_its_share_of_them_on_the_host():
    # Two replicas, each with half the batch: the lookup's fixed 2 ms twice on the one host.
    g = graph()
    result = simulate(g, cluster(), data_parallel(g, cluster()))
    assert result.busy["/CPU:0"] == pytest.approx(2 * 2e-3)
    assert result.link_bytes[("/CPU:0", "/GPU:0")] == result.link_bytes[("/CPU:0", "/GPU:1")] == pytest.approx(1e6)


def test_a_cluster_keeps_its_host_in_its_file_and_presets_of_gpus_have_one(tmp_path):
    path = tmp_path / "cluster.json"
    cluster().save(path)
    loaded = Cluster.load(path)
    assert (loaded.host.name, loaded.host_link) == ("/CPU:0", HOST_LINK)
    assert Cluster.preset("8xV100-nvlink").host.name == "/CPU:0"
    assert Cluster.preset("2x8xV100").host.name == "/job:worker/replica:0/task:0/device:CPU:0"
    assert Cluster.preset("cpu-testbed:2").host is None


def test_a_host_is_a_device_apart_from_the_clusters_devices():
    gpus = [Device("/GPU:0", "V100", 2**34)]
    with pytest.raises(InvalidClusterError, match=r"host is a Device apart from its devices.*Received: host=Device\(name='/GPU:0'"):
        Cluster(gpus, host=gpus[0])
    with pytest.raises(InvalidClusterError, match="Each device needs 'name', 'kind' and 'memory'"):
        Cluster.from_dict({**cluster().to_dict(), "host": {"name": "/CPU:0"}})


def batch_graph() -> OpGraph:
    # 32 rows of 31,250 bytes (1 MB) into a dense op of 0.1 ms a row (3.2 ms for the batch).
    x = Op("x", "Placeholder", cost={"V100": 0.0}, output_bytes=[(0, 31250)], batch_axis=0)
    dense = Op("dense", "MatMul", layer="dense", cost={"V100": (0.0, 1e-4)}, batch_axis=0)
    return OpGraph([x, dense], [("x", "dense", 0)], batch_size=32)


def test_the_batch_crosses_the_host_link_before_the_first_op_that_reads_it():
    # host |x|; link 0-1.1 ms (100 us + 1 MB at 1 GB/s); GPU:0 dense 1.1-4.3 ms.
    g = batch_graph()
    result = simulate(g, cluster(), on_gpu0(g))
    assert result.times()["dense"] == pytest.approx((1.1e-3, 4.3e-3))
    assert [(t.task, t.src, t.dst, t.bytes) for t in result.transfers] == [("x", "/CPU:0", "/GPU:0", 1e6)]
    assert with_prediction(on_gpu0(g), g, cluster()).placement == {"x": "/CPU:0", "dense": "/GPU:0"}
    # Without a host the batch is taken to be where its reader runs: nothing crosses.
    assert simulate(g, cluster(host=False), on_gpu0(g)).makespan == pytest.approx(3.2e-3)


def test_the_batch_sends_each_replica_its_rows_from_the_host():
    # Two replicas of 16 rows: each receives its 0.5 MB over its own host link (100 us + 0.5 ms,
    # 0-0.6 ms, the two at once), then runs dense on them (1.6 ms): 2.2 ms.
    g = batch_graph()
    result = simulate(g, cluster(), data_parallel(g, cluster()))
    assert result.makespan == pytest.approx(0.6e-3 + 1.6e-3)
    assert result.link_bytes[("/CPU:0", "/GPU:0")] == pytest.approx(0.5e6)
    assert [(t.src, t.dst) for t in result.transfers] == [("/CPU:0", "/GPU:0")]  # replica 1 mirrors replica 0


def test_the_host_cuts_the_batch_into_a_split_layers_rows_without_copying_it():
    # dense split in halves over the two GPUs: the host's cut shares the batch's buffer (no time),
    # each half (0.5 MB) crosses its own host link (0-0.6 ms), and each shard runs 1.6 ms: 2.2 ms.
    g = batch_graph()
    halves = (Shard("/GPU:0", 0.5), Shard("/GPU:1", 0.5))
    result = simulate(g, cluster(), Plan(placement=on_gpu0(g).placement, splits={"dense": halves}))
    assert result.makespan == pytest.approx(0.6e-3 + 1.6e-3)
    assert sorted((t.dst, t.bytes) for t in result.transfers) == [("/GPU:0", 0.5e6), ("/GPU:1", 0.5e6)]
