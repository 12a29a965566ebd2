"""Tests of the per-family step-time bound, with hand-computed answers."""

import math
import warnings

import pytest

from kerasflow.planner import Cluster, OpGraph, Plan, Shard, lower_bound, plan, simulate, step_time_bound, synthetic
from tests.planner.helpers import cluster, op


def split_layer_with_a_weight_gradient():
    """Layer L at batch 8: forward 1 s per sample, a weight gradient 0.5 s per sample whose
    400 B output does not grow with the batch, and a 1 s update that runs once."""
    ops = [op("L/fwd", (0.0, 1.0), [(0, 4)], layer="L", batch_axis=0),
           op("L/grad", (0.0, 0.5), [400], layer="L", phase="backward", batch_axis=0),
           op("L/update", 1.0, [], layer="L", phase="update")]
    return OpGraph(ops, [("L/fwd", "L/grad", 0), ("L/grad", "L/update", 0)], batch_size=8)


def test_one_device_counts_the_whole_step_for_every_family_but_micro_batches():
    graph = OpGraph([op("a", 1.0, [4]), op("b", 2.0)], [("a", "b", 0)])
    bound = step_time_bound(graph, cluster(1))
    # One device runs 1 + 2 s whatever the plan; two micro-batches pay each fixed cost twice.
    assert bound == (3.0, 3.0, 3.0, 6.0)


def test_a_split_weight_gradient_crosses_a_link_before_the_update():
    bound = step_time_bound(split_layer_with_a_weight_gradient(), cluster(2, bandwidth=100.0))
    # One pass, two devices: forward split 8/2 = 4 s, gradient split 4/2 = 2 s, then the
    # remote shard's 400 B at 100 B/s (4 s) or the gradient whole (4 s, 2 s more than split):
    # +2 s, and the update 1 s: path 9 s; work (8 + 4 + 1) / 2 = 6.5 s.
    assert bound.one_pass == pytest.approx(9.0)
    # Data parallel: 4 s forward, 2 s gradient per replica, the ring sends half of 400 B each
    # way twice (2 x 200 B at 100 B/s = 4 s), the 1 s update: 11 s.
    assert bound.replicated == pytest.approx(11.0)
    # m micro-batches: forward 8/(2m), gradient 4/(2m), then the gradient of every micro-batch
    # whole on one device (4 s) beats 2/m + 4 s: the path is 5 + 4/m; no fixed costs, so the
    # work stays 6.5 s: m = 3 reaches max(6.5, 6.33) = 6.5 s.
    assert bound.micro_batched == pytest.approx(6.5)
    assert bound.seconds == pytest.approx(6.5)  # waves are allowed: nothing couples the samples


def test_families_counted_follow_replicated_and_waves():
    graph, c = split_layer_with_a_weight_gradient(), cluster(2, bandwidth=100.0)
    assert step_time_bound(graph, c, waves=False).seconds == pytest.approx(9.0)
    assert step_time_bound(graph, c, replicated=False).seconds == pytest.approx(6.5)
    assert step_time_bound(graph, c, replicated=False, waves=False).seconds == pytest.approx(9.0)
    assert step_time_bound(graph, c, replicated=False, waves=False).one_replica == pytest.approx(6.5)


def test_an_op_that_cannot_be_split_counts_whole_on_the_path():
    graph = OpGraph([op("m", (0.0, 1.0), [])], [], batch_size=8)  # no batch axis
    bound = step_time_bound(graph, cluster(4), replicated=False, waves=False)
    assert bound.seconds == 8.0
    assert lower_bound(graph, cluster(4)).seconds == 2.0  # the any-schedule bound shares it four ways


def test_ops_that_couple_the_samples_leave_out_the_micro_batched_family():
    # Two ops of 1 s per sample at batch 8 without a batch axis (as BatchNormalization), in a
    # chain on two devices: run once, each is whole on the path (16 s); in two micro-batches
    # one micro-batch's path is 4 + 4 s and the work 16 / 2 s: 8 s, which plan() never uses.
    graph = OpGraph([op("a", (0.0, 1.0), [(0, 4)]), op("b", (0.0, 1.0), [])], [("a", "b", 0)], batch_size=8)
    bound = step_time_bound(graph, cluster(2), replicated=False)
    assert (bound.one_pass, bound.micro_batched) == (16.0, 8.0)
    assert bound.seconds == 16.0
    assert step_time_bound(graph, cluster(2), replicated=False, waves=True).seconds == 8.0


def test_the_bound_is_at_least_the_any_schedule_bound_for_one_pass():
    for family in ("mlp", "transformer", "inception", "random"):
        graph, c = synthetic.build(family), Cluster.preset("4xV100-pcie")
        assert step_time_bound(graph, c).one_pass >= lower_bound(graph, c).seconds * (1 - 1e-12)


@pytest.mark.parametrize("family, preset", [("mlp", "4xV100-pcie"), ("transformer", "8xH100-nvlink"),
                                            ("inception", "4xV100-pcie"), ("random", "8xH100-nvlink")])
def test_no_plan_beats_its_bound(family, preset):
    graph, c = synthetic.build(family), Cluster.preset(preset)
    best = plan(graph, c, max_split_evaluations=4, verbose=0)
    one_replica = plan(graph, c, max_split_evaluations=4, replicated=False, verbose=0)
    assert best.predicted_step_time >= step_time_bound(graph, c).seconds * (1 - 1e-9)
    assert one_replica.predicted_step_time >= step_time_bound(graph, c, replicated=False).seconds * (1 - 1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # waves on BatchNormalization: asked for here
        waved = plan(graph, c, split=False, tick_tock="on", verbose=0)
    bound = step_time_bound(graph, c)
    family = bound.micro_batched if waved.data_parallel is None else bound.replicated
    assert math.isfinite(family) and waved.predicted_step_time >= family * (1 - 1e-9)


def test_uneven_shards_can_hide_most_of_a_gradient_transfer_and_the_bound_allows_it():
    # One split op, 1 s per sample at batch 8, its 400 B gradient read by a 1 s update; two
    # devices, 100 B/s. Shards of 6 and 2 samples: the remote 2 s shard plus its 4 s transfer
    # end with the local 6 s one, so the update runs 6-7. The bound is that 7 s: the local share
    # x equalises x = 8/2 + 4(2-1)/2 = 6 s (an even split would wait 4 + 4 = 8 s).
    graph = OpGraph([op("L/grad", (0.0, 1.0), [400], layer="L", phase="backward", batch_axis=0),
                     op("L/update", 1.0, [], layer="L", phase="update")], [("L/grad", "L/update", 0)], batch_size=8)
    c = cluster(2, bandwidth=100.0)
    assert step_time_bound(graph, c).one_pass == pytest.approx(7.0)
    uneven = Plan(placement={"L/grad": "/D:0", "L/update": "/D:0"},
                  splits={"L": (Shard("/D:0", 0.75), Shard("/D:1", 0.25))})
    assert simulate(graph, c, uneven).makespan == pytest.approx(7.0)
