"""Tests of Plan: validation against a graph and cluster, and JSON."""

import json

import pytest

from kerasflow.planner import (
    Cluster, DataParallel, FileFormatError, InvalidPlanError, OpGraph, Plan, Shard, Waves, synthetic,
)
from tests.planner.helpers import cluster, op


def small():
    return OpGraph([op("v", 0.0, [4], phase="other", persistent_bytes=12, colocation="v"),
                    op("r", 0.0, [4], colocation="v"),
                    op("m", (0.0, 1.0), [(0, 4)], layer="L", batch_axis=0),
                    op("n", (0.0, 1.0), [], layer="N", batch_axis=0)],
                   [("v", "r", 0), ("r", "m", 0), ("m", "n", 0)], batch_size=4)


def everything_on(device):
    return {name: device for name in "vrmn"}


def test_a_complete_plan_round_trips_byte_identically(tmp_path):
    plan = Plan(placement=everything_on("/D:0"), order={"/D:0": ["v", "r", "m@w0", "m@w1", "n@w0", "n@w1"]},
                splits={"N": [Shard("/D:0", 0.25), Shard("/D:1", 0.75)]},
                waves=Waves(2, "forward", ({}, {"/D:0": "/D:1", "/D:1": "/D:0"})),
                batch_size=4, predicted_step_time=1.5, predicted_peak_memory={"/D:0": 10.0},
                candidates={"single_device": 2.0}, excluded={"data_parallel": "hands a device fewer rows"},
                graph_fingerprint="abc", cluster="test2", algorithm="hand")
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded == plan
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "plan.json").read_bytes()
    dp = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    dp.save(tmp_path / "dp.json")
    assert Plan.load(tmp_path / "dp.json") == dp and dp.data_parallel.synchronized


def test_a_data_parallel_plan_file_from_before_synchronized_statistics_keeps_each_replicas_own(tmp_path):
    data = Plan(data_parallel=DataParallel(("/D:0", "/D:1"))).to_dict()
    del data["data_parallel"]["synchronized"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert not Plan.load(tmp_path / "old.json").synchronizes_statistics
    data["data_parallel"]["synchronized"] = "yes"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=r"data_parallel.synchronized must be true or false; received 'yes'"):
        Plan.load(tmp_path / "bad.json")


def test_a_valid_plan_validates():
    Plan(placement=everything_on("/D:1")).validate(small(), cluster(2))
    Plan(placement=everything_on("/D:0"), splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]}).validate(
        small(), cluster(2))


@pytest.mark.parametrize("plan, message", [
    (lambda: Plan(placement=everything_on("/D:7")), r"device '/D:7', which is not in cluster 'test2' \(devices: \['/D:0', '/D:1'\]\)"),
    (lambda: Plan(placement={**everything_on("/D:0"), "ghost": "/D:0"}), r"places 1 op\(s\) the graph does not have, e.g. \['ghost'\]"),
    (lambda: Plan(placement={k: v for k, v in everything_on("/D:0").items() if k != "n"}), "op 'n' has no device"),
    (lambda: Plan(placement={**everything_on("/D:0"), "r": "/D:1"}), "colocation group 'v' is split"),
    (lambda: Plan(placement=everything_on("/D:0"), splits={"Q": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]}), "layer 'Q'"),
    (lambda: Plan(placement=everything_on("/D:0"), splits={"N": [Shard("/D:0", 0.5), Shard("/D:5", 0.5)]}), "'/D:5'"),
    (lambda: Plan(placement=everything_on("/D:0"), order={"/D:0": ["v", "r", "m"]}), "misses \\['n'\\]"),
    (lambda: Plan(placement=everything_on("/D:0"), order={"/D:0": ["v", "r", "m", "n", "n"]}), "lists a task twice"),
    (lambda: Plan(placement=everything_on("/D:0"), order={"/D:0": ["v", "r", "m", "zz"]}), "task 'zz'"),
    (lambda: Plan(placement=everything_on("/D:0"), order={"/D:1": ["n"]}), "runs on '/D:0'"),
    (lambda: Plan(placement=everything_on("/D:0"), order={"/D:0": ["v", "r", "n", "m"]}), "'n' too early"),
])
def test_plans_that_do_not_fit_raise_one_clear_error(plan, message):
    with pytest.raises(InvalidPlanError, match=message):
        plan().validate(small(), cluster(2))


def test_a_layer_that_couples_the_batch_cannot_be_split():
    graph = OpGraph([op("bn", 1.0, [], layer="batch_norm")], [])  # no batch_axis
    plan = Plan(placement={"bn": "/D:0"}, splits={"batch_norm": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]})
    with pytest.raises(InvalidPlanError, match="layer 'batch_norm' cannot be split: its op 'bn'"):
        plan.validate(graph, cluster(2))


@pytest.mark.parametrize("build, message", [
    (lambda: Plan(splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.4)]}), "sum to 1"),
    (lambda: Plan(splits={"L": [Shard("/D:0", 1.0)]}), "at least 2 shards"),
    (lambda: Plan(splits={"L": [Shard("/D:0", 0.0), Shard("/D:1", 1.0)]}), "fraction > 0"),
    (lambda: Waves(0), "count"),
    (lambda: Waves(2, offset="half"), "offset"),
    (lambda: Waves(2, stage_maps=({}, {"/D:0": "/D:1"})), "permute"),
    (lambda: Waves(2, stage_maps=({},)), "one per wave"),
    (lambda: Waves(2, fractions=(0.7, 0.7)), "sum to 1"),
    (lambda: DataParallel(("/D:0", "/D:0")), "distinct"),
    (lambda: Plan(placement={"a": "/D:0"}, data_parallel=DataParallel(("/D:0",))), "leave placement"),
    (lambda: Plan(batch_size=0), "batch_size"),
    (lambda: Plan(order={"/D:0": "abc"}), "list of task names"),
    (lambda: Plan(excluded={"heft": 3.0}), "'excluded' must map candidate names to reasons"),
    (lambda: Plan(excluded=["heft"]), "'excluded' must be a mapping"),
])
def test_malformed_plans_raise_at_construction(build, message):
    with pytest.raises(InvalidPlanError, match=message):
        build()


def test_bad_plan_files(tmp_path):
    path = tmp_path / "plan.json"
    data = Plan(placement={"a": "/D:0"}).to_dict()
    path.write_text(json.dumps({**data, "format_version": 0}))
    with pytest.raises(FileFormatError, match="plan file .*plan.json.*format_version 0"):
        Plan.load(path)
    path.write_text(json.dumps({**data, "waves": {"count": -1}}))
    with pytest.raises(FileFormatError, match="waves.count"):
        Plan.load(path)
    path.write_text(json.dumps({**data, "extra": 1}))
    with pytest.raises(FileFormatError, match="unknown plan field"):
        Plan.load(path)
    path.write_text(json.dumps({**data, "placement": [1, 2]}))
    with pytest.raises(FileFormatError, match="'placement' must be a mapping"):
        Plan.load(path)


def test_plan_for_another_graph_says_replan():
    graph = synthetic.chain_mlp(layers=2)
    other = synthetic.chain_mlp(layers=3)
    c = Cluster.preset("2xK80-pcie")
    plan = Plan(placement={o.name: "/GPU:0" for o in other.ops}, graph_fingerprint=other.fingerprint())
    with pytest.raises(InvalidPlanError, match="made for another graph.*Replan"):
        plan.validate(graph, c)


def test_plans_are_immutable():
    plan = Plan(placement={"a": "/D:0"})
    with pytest.raises(TypeError):
        plan.placement["a"] = "/D:1"


def test_with_devices_renames_everywhere_and_refuses_merges():
    from kerasflow.planner import Shard, Waves

    plan = Plan(placement={"a": "/GPU:0", "b": "/GPU:1"}, order={"/GPU:0": ["a"], "/GPU:1": ["b"]},
                splits={"L": (Shard("/GPU:0", 0.5), Shard("/GPU:1", 0.5))},
                waves=Waves(2, stage_maps=({}, {"/GPU:0": "/GPU:1", "/GPU:1": "/GPU:0"})),
                predicted_peak_memory={"/GPU:0": 1.0, "/GPU:1": 2.0})
    remote = "/job:worker/replica:0/task:1/device:GPU:0"
    moved = plan.with_devices({"/GPU:1": remote})
    assert moved.placement == {"a": "/GPU:0", "b": remote}
    assert moved.order == {"/GPU:0": ("a",), remote: ("b",)}
    assert [s.device for s in moved.splits["L"]] == ["/GPU:0", remote]
    assert moved.waves.stage_maps[1] == {"/GPU:0": remote, remote: "/GPU:0"}
    assert moved.predicted_peak_memory == {"/GPU:0": 1.0, remote: 2.0}
    assert moved.with_devices({remote: "/GPU:1"}).to_dict() == plan.to_dict()
    with pytest.raises(InvalidPlanError, match="would merge devices"):
        plan.with_devices({"/GPU:1": "/GPU:0"})
