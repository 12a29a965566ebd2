"""plan()'s own steps, on graphs small enough to work out by hand."""

import dataclasses
import random

import pytest

from kerasflow.planner import Cluster, InvalidPlanError, Link, OpGraph, Plan, PlanRequest
from kerasflow.planner.sim.predict import with_prediction
from kerasflow.planner.ir.machine import SharedCompute
from kerasflow.planner.search.candidates import Misfit
from kerasflow.planner.search.planning import PREDICTION_ERROR, order_if_faster, plan, tie_margin_for
from kerasflow.planner.parallel.ticktock import with_waves
from tests.planner.helpers import cluster, devices, normalization, op


def two_chains(order):
    # a (1 s) on /D:0 feeds b (1 s) on /D:1 (0 B, free link); c (1.5 s) on /D:0 is independent.
    graph = OpGraph([op("a", 1.0, [0]), op("b", 1.0), op("c", 1.5)], [("a", "b", 0)])
    c = cluster(2)
    return graph, c, with_prediction(Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:0"}, order=order), graph, c)


def test_an_order_that_stalls_a_device_is_dropped():
    # In the order c, a: c 0-1.5, a 1.5-2.5, b 2.5-3.5. Without it /D:0 takes the ready task
    # of highest upward rank first: a (1 + 1 = 2 s to the end) before c (1.5 s): a 0-1,
    # b 1-2 on /D:1, c 1-2.5.
    graph, c, ordered = two_chains({"/D:0": ["c", "a"]})
    assert ordered.predicted_step_time == 3.5
    chosen = order_if_faster(ordered, graph, c)
    assert chosen.predicted_step_time == 2.5 and not chosen.order


def test_an_order_as_fast_as_none_is_kept():
    graph, c, ordered = two_chains({"/D:0": ["a", "c"]})  # a 0-1, c 1-2.5, b 1-2: 2.5 either way
    assert order_if_faster(ordered, graph, c) is ordered


def test_an_unordered_plan_that_would_not_fit_is_not_taken():
    graph, c, ordered = two_chains({"/D:0": ["c", "a"]})
    assert order_if_faster(ordered, graph, c, fits=lambda p: bool(p.order)) is ordered


def near_tie():
    # a (1 s) and b (0.02 s) are independent. On one device they take 1.02 s; HEFT puts them
    # on the two devices side by side: 1.00 s, 2 % faster.
    return OpGraph([op("a", 1.0), op("b", 0.02)], []), cluster(2)


def test_a_candidate_within_the_tie_margin_of_the_fastest_gives_way_to_a_simpler_one():
    # The simplest: the default placement (both on /D:0, as single_device's plan there).
    graph, c = near_tie()
    chosen = plan(graph, c, split=False, tick_tock="off", verbose=0)
    assert chosen.algorithm == "default_placement" and chosen.candidates["single_device"] == 1.02
    assert chosen.predicted_step_time == 1.02 and min(chosen.candidates.values()) == 1.0


def test_without_a_tie_margin_the_fastest_wins():
    graph, c = near_tie()
    chosen = plan(graph, c, split=False, tick_tock="off", tie_margin=0, verbose=0)
    assert chosen.predicted_step_time == 1.0 and chosen.algorithm != "single_device"


def test_a_lead_beyond_the_tie_margin_wins():
    # b costs 0.05 s: one device takes 1.05 s, 5 % slower than side by side.
    chosen = plan(OpGraph([op("a", 1.0), op("b", 0.05)], []), cluster(2), split=False, tick_tock="off", verbose=0)
    assert chosen.predicted_step_time == 1.0 and chosen.algorithm != "single_device"


def test_profile_noise_within_the_margin_does_not_flip_the_plan():
    # The same near tie measured with each op's cost off by up to 1 %, as two profiles of one
    # model are: the default placement stays every time.
    rng = random.Random(0)
    for _ in range(20):
        noisy = OpGraph([op("a", 1.0 * rng.uniform(0.99, 1.01)), op("b", 0.02 * rng.uniform(0.99, 1.01))], [])
        assert plan(noisy, cluster(2), split=False, tick_tock="off", verbose=0).algorithm == "default_placement"


def measured(graph, spread):
    """``graph`` as a profile whose plain step times spread by ``spread``."""
    return OpGraph(graph.ops, graph.edges, metadata={"plain_step_spread": spread})


def test_a_noisy_profile_ties_within_twice_its_spread():
    # The 5 % lead of side by side (1.00 s against 1.05 s on one device) wins on a quiet
    # profile (margin 3 %), and is a tie on one whose plain steps spread by 4 % (margin 8 %).
    graph = OpGraph([op("a", 1.0), op("b", 0.05)], [])
    assert tie_margin_for(measured(graph, 0.04)) == 0.08
    quiet = plan(measured(graph, 0.01), cluster(2), split=False, tick_tock="off", verbose=0)
    noisy = plan(measured(graph, 0.04), cluster(2), split=False, tick_tock="off", verbose=0)
    assert quiet.predicted_step_time == 1.0 and quiet.algorithm != "single_device"
    assert noisy.algorithm == "default_placement" and noisy.predicted_step_time == 1.05


def test_however_noisy_the_profile_a_lead_beyond_the_cap_wins():
    # Spread 50 %: the margin stops at 15 %. b costs 0.2 s, so one device takes 1.2 s: the
    # 20 % lead of side by side wins; with b at 0.1 s (a 10 % lead) one device is a tie.
    assert tie_margin_for(measured(OpGraph([op("a", 1.0)], []), 0.5)) == 0.15
    far = plan(measured(OpGraph([op("a", 1.0), op("b", 0.2)], []), 0.5), cluster(2), split=False,
               tick_tock="off", verbose=0)
    near = plan(measured(OpGraph([op("a", 1.0), op("b", 0.1)], []), 0.5), cluster(2), split=False,
                tick_tock="off", verbose=0)
    assert far.predicted_step_time == 1.0 and far.algorithm not in ("single_device", "default_placement")
    assert near.algorithm == "default_placement"


def test_on_a_measured_profile_a_plan_must_lead_the_default_placement_by_the_prediction_error():
    # Side by side takes 1.0 s; the default placement (both on /D:0) 1.0 s + b. A measured
    # profile (it has a plain step) keeps the default placement up to a 10 % lead
    # (PREDICTION_ERROR); a datasheet graph only up to its 3 % tie margin.
    def profile(b, measured_costs=True):
        metadata = {"plain_step_seconds": 1.0 + b} if measured_costs else {}
        return OpGraph([op("a", 1.0), op("b", b)], [], metadata=metadata)

    def chosen(graph):
        return plan(graph, cluster(2), split=False, tick_tock="off", verbose=0).algorithm

    assert PREDICTION_ERROR == 0.10
    assert chosen(profile(0.1)) == "default_placement"
    assert chosen(profile(0.15)) not in ("default_placement", "single_device")
    assert chosen(profile(0.05, measured_costs=False)) not in ("default_placement", "single_device")


def test_on_shared_compute_nothing_beats_the_default_placement_of_independent_ops():
    # a and b (1 s each) on two logical CPUs of one host (one lane, two threads): side by side
    # they share it and both end at 2.0 s, as on the default placement's one device; on two
    # independent devices side by side takes 1.0 s.
    graph = OpGraph([op("a", 1.0), op("b", 1.0)], [])
    pooled = Cluster(devices(2), default_link=Link(0.0, 100.0),
                     shared=[SharedCompute(("/D:0", "/D:1"), threads=2)])
    best = plan(graph, pooled, split=False, tick_tock="off", verbose=0)
    assert best.algorithm == "default_placement" and best.predicted_step_time == 2.0
    assert min(best.candidates.values()) == 2.0
    assert plan(graph, cluster(2), split=False, tick_tock="off", verbose=0).predicted_step_time == 1.0


def test_a_given_tie_margin_overrides_the_profiles_noise():
    graph = measured(OpGraph([op("a", 1.0), op("b", 0.05)], []), 0.04)
    assert plan(graph, cluster(2), split=False, tick_tock="off", tie_margin=0.03, verbose=0).predicted_step_time == 1.0


def test_a_profile_with_a_malformed_spread_is_refused_by_name():
    graph = OpGraph([op("a", 1.0)], [])
    for bad in (-0.1, "4%", float("nan"), True):
        with pytest.raises(InvalidPlanError, match=r"plain_step_spread.*Received: plain_step_spread="):
            plan(measured(graph, bad), cluster(2), verbose=0)


def test_a_tie_margin_outside_zero_to_one_is_refused():
    graph, c = near_tie()
    for bad in (-0.1, 1.0, "3%", True):
        with pytest.raises(InvalidPlanError, match=r"tie_margin must be a fraction in \[0, 1\).*Received: tie_margin="):
            plan(graph, c, tie_margin=bad, verbose=0)


def test_mirrored_strategys_statistics_are_tried_only_when_allowed_and_win_a_tie():
    # helpers.normalization on 2 devices (test_simulator's timelines): data_parallel 5.8 s (its
    # two rings of 0.4 s each), each replica's own statistics 5.0 s, one device 8 s (the batch
    # of 2: m 2, mean 1, norm 2, g 1, dx 2).
    graph, two = normalization(), cluster(2)
    kept = plan(graph, two, split=False, tick_tock="off", tie_margin=0, verbose=0)
    assert kept.algorithm == "data_parallel" and kept.data_parallel.synchronized
    assert "data_parallel_replica_statistics" not in kept.candidates
    allowed = plan(graph, two, split=False, tick_tock="off", replica_statistics=True, tie_margin=0, verbose=0)
    assert allowed.algorithm == "data_parallel_replica_statistics" and not allowed.data_parallel.synchronized
    assert allowed.predicted_step_time == pytest.approx(5.0)
    assert allowed.candidates["data_parallel"] == pytest.approx(5.8)
    assert allowed.candidates["single_device"] == pytest.approx(8.0)
    # It comes before data_parallel in trial order: faster or tied, it is the one kept.
    assert list(allowed.candidates).index("data_parallel_replica_statistics") < list(allowed.candidates).index(
        "data_parallel")
    # Without synchronized layers the two would be one plan: not tried twice.
    plain = plan(normalization(()), two, split=False, tick_tock="off", replica_statistics=True, verbose=0)
    assert "data_parallel_replica_statistics" not in plain.candidates


def test_skipping_wave_candidates_slower_than_the_fastest_changes_no_choice():
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans, ranked_plans

    skipped_any = False
    for graph, preset in ((synthetic.random_layered(400, width=8, seed=3, kinds=["V100"]), "4xV100-nvlink"),
                          (synthetic.chain_mlp(layers=4), "2xK80-pcie"),
                          (synthetic.inception_like(blocks=2), "8xH100-nvlink")):
        every, _ = candidate_plans(graph, preset, split=False, verbose=0)
        kept, misfits = candidate_plans(graph, preset, split=False, verbose=0, skip_slower=True)
        fastest = min(p.predicted_step_time for p in kept.values())
        assert fastest == min(p.predicted_step_time for p in every.values())
        skipped = [misfit.name for misfit in misfits if "not simulated" in misfit.reason]
        skipped_any = skipped_any or bool(skipped)
        for name in skipped:  # what was skipped simulates slower than the fastest, as its bound said
            if name not in every:  # the best placed plan's waves, where that plan differs without skipping
                base = name.removesuffix("+waves")
                assert base in kept
                every[name] = with_waves(kept[base], graph, Cluster.preset(preset))
            assert every[name].predicted_step_time > fastest
        for name, candidate in kept.items():
            if name in every:
                assert candidate.predicted_step_time == every[name].predicted_step_time
        assert ranked_plans(graph, preset, split=False, verbose=0)[0].algorithm in every
    assert skipped_any



def test_the_split_search_starts_from_the_hybrid_only_where_it_leads_beyond_the_tie_margin():
    from kerasflow.planner.search.planning import split_start

    schedule = Plan(predicted_step_time=1.0)
    for hybrid_seconds, margin, start in [(0.98, 0.03, "schedule"), (0.96, 0.03, "hybrid"), (0.98, 0.0, "hybrid"),
                                          (1.0, 0.0, "schedule"), (1.2, 0.03, "schedule")]:
        hybrid = Plan(predicted_step_time=hybrid_seconds)
        assert split_start(schedule, hybrid, margin) is {"schedule": schedule, "hybrid": hybrid}[start]


def test_a_search_from_the_hybrid_keeps_its_splits():
    # One Inception block over 4xV100-pcie: the hybrid starts three times faster than the list
    # schedule (1.83 against 5.91 ms), beyond any tie, so the search starts there and only adds.
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans

    plans, _ = candidate_plans(synthetic.inception_like(blocks=1), "4xV100-pcie", split=True, tick_tock="off",
                               max_split_evaluations=8, verbose=0)
    hybrid = next(p for name, p in plans.items() if name.endswith("+hybrid"))
    split = next(p for name, p in plans.items() if name.endswith("+split"))
    assert hybrid.predicted_step_time * 3 < plans["heft-layers"].predicted_step_time
    assert set(hybrid.splits) <= set(split.splits) and split.predicted_step_time <= hybrid.predicted_step_time


def test_a_model_that_refused_a_smaller_batch_gets_no_plan_that_hands_a_device_fewer_rows():
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans

    graph = synthetic.inception_like(blocks=1)
    refusing = OpGraph(graph.ops, graph.edges, batch_size=graph.batch_size,
                       metadata={"refused_batch_sizes": [graph.batch_size // 2]})
    settings = {"verbose": 0, "max_split_evaluations": 4}
    every, _ = candidate_plans(graph, "4xV100-nvlink", **settings)
    # Without the refusal, the same step gets plans of every kind that cuts the batch.
    assert {"data_parallel", "one_copy_data_parallel", "heft+split"} <= set(every)
    kept, misfits = candidate_plans(refusing, "4xV100-nvlink", **settings)
    assert kept and not any(p.data_parallel or p.waves or p.splits for p in kept.values())
    assert set(kept) <= set(every)
    why = (f"hands a device fewer rows than the batch of {graph.batch_size}, and the model refused a batch of "
           f"{graph.batch_size // 2} while it was profiled")
    assert misfits == (Misfit("data_parallel", why), Misfit("op_splitting", why), Misfit("waves", why))
    excluded = {"data_parallel": why, "op_splitting": why, "waves": why}
    best = plan(refusing, "4xV100-nvlink", **settings)
    assert best.excluded == excluded and Plan.from_dict(best.to_dict()).excluded == excluded
    assert best.to_dict()["excluded"] == excluded  # plan files keep the mapping
    with pytest.raises(InvalidPlanError, match=f"batch_size={2 * graph.batch_size}. Plan for batch_size="):
        plan(refusing, "4xV100-nvlink", batch_size=2 * graph.batch_size, **settings)


def test_placement_only_leaves_out_every_plan_that_sums_in_another_order_with_why():
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans

    graph = synthetic.inception_like(blocks=1)
    settings = {"verbose": 0, "max_split_evaluations": 4}
    every, _ = candidate_plans(graph, "4xV100-nvlink", **settings)
    assert any(not p.placement_only for p in every.values())  # replicas, splits and waves, without it
    kept, misfits = candidate_plans(graph, "4xV100-nvlink", placement_only=True, **settings)
    assert kept and all(p.placement_only for p in kept.values()) and set(kept) <= set(every)
    assert [m.name for m in misfits] == ["data_parallel", "op_splitting", "waves"]
    assert all("sums in another order" in m.reason and "deterministic" in m.reason for m in misfits)
    assert plan(graph, "4xV100-nvlink", placement_only=True, **settings).excluded == dict(misfits)
    with pytest.raises(InvalidPlanError, match=r"tick_tock='on' asks for waves.*Received: tick_tock='on', "
                                               r"placement_only=True"):
        plan(graph, "4xV100-nvlink", placement_only=True, tick_tock="on", **settings)


def test_candidates_that_cannot_be_tried_are_named_with_why_not_reported_as_memory():
    # Asked for data parallelism alone where replicas are not allowed (the in-fit planner does
    # so for a model whose samples are coupled), the planner once raised "No strategy fits the
    # memory ... Details: " with no detail.
    from kerasflow.planner import synthetic

    graph = synthetic.chain_mlp(layers=2)
    with pytest.raises(InvalidPlanError, match=r"data_parallel: replicates the step, and the request allows no "
                                               r"replicas \(replicated=False\).*Received: candidates=\['data_parallel'\]"):
        plan(graph, "2xK80-pcie", candidates=("data_parallel",), replicated=False, verbose=0)
    with pytest.raises(InvalidPlanError, match=r"data_parallel_one_host: does not apply to this graph and cluster"):
        plan(graph, "2xK80-pcie", candidates=("data_parallel_one_host",), verbose=0)
    # One that can be tried is enough: the others are left out as before.
    assert plan(graph, "2xK80-pcie", candidates=("data_parallel", "heft"), replicated=False, split=False,
                tick_tock="off", verbose=0).algorithm == "heft"


def test_the_steps_temporary_memory_is_kept_free_on_every_device():
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans

    graph = synthetic.chain_mlp(layers=2)
    limit = 2 * 2**30  # budgets of 0.9 x 2 GiB
    settings = {"memory_limit": limit, "split": False, "tick_tock": "off", "verbose": 0}
    plans, misfits = candidate_plans(graph, "2xK80-pcie", **settings)
    alone = max(plans["single_device"].predicted_peak_memory.values())
    assert "single_device" not in dict(misfits)
    # A GPU profile measured this much more than the model's tensors: one device can no longer hold the step.
    temporary = 0.9 * limit - alone + 1
    with_workspace = OpGraph(graph.ops, graph.edges, batch_size=graph.batch_size, metadata={"temporary_bytes": temporary})
    plans, misfits = candidate_plans(with_workspace, "2xK80-pcie", **settings)
    assert "single_device" not in plans and dict(misfits)["single_device"].endswith("exceeds the budget")
    assert all(peak + temporary <= 0.9 * limit for p in plans.values() for peak in p.predicted_peak_memory.values())


def test_a_request_is_checked_when_it_is_made():
    graph = OpGraph([op("a", 1.0)], [])
    for settings, message in [({"candidates": ("heft", "fastest")}, r"Unknown candidate\(s\) \['fastest'\]"),
                              ({"tick_tock": "always"}, "tick_tock must be one of"),
                              ({"batch_size": 0}, "Received: batch_size=0"),
                              ({"tie_margin": 1.0}, r"tie_margin must be a fraction in \[0, 1\)")]:
        with pytest.raises(InvalidPlanError, match=message):
            PlanRequest(graph, cluster(2), **settings)
    request = PlanRequest(graph, cluster(2), memory_limit=100.0, memory_headroom=0.5)
    assert request.budgets == (50.0, 50.0) and request.batch == graph.batch_size
    with pytest.raises(InvalidPlanError, match="tick_tock must be one of"):  # a changed copy is checked again
        dataclasses.replace(request, tick_tock="always")


def test_plan_of_a_request_is_plan_of_its_keywords():
    graph, c = near_tie()
    settings = {"split": False, "tick_tock": "off", "tie_margin": 0, "verbose": 0}
    by_keywords = plan(graph, c, **settings)
    assert by_keywords.algorithm != "default_placement"  # the strict fastest: side by side
    assert plan(PlanRequest(graph, c, **settings)) == by_keywords == plan(graph=graph, cluster=c, **settings)
    with pytest.raises(InvalidPlanError, match=r"Give a PlanRequest alone.*Received: a PlanRequest with "
                                               r"cluster=None and \['split'\]"):
        plan(PlanRequest(graph, c), split=False)


def test_the_registry_holds_the_base_candidates_in_trial_order_with_their_labels():
    from kerasflow.planner.search.candidates import CANDIDATES, REGISTRY, label

    assert CANDIDATES == ("default_placement", "single_device", "data_parallel_replica_statistics", "data_parallel",
                          "data_parallel_one_host", "layerwise_model_parallel", "heft", "heft-layers", "cpop",
                          "cpop-layers")
    assert [name for name in CANDIDATES if REGISTRY[name].replicated] == [
        "data_parallel_replica_statistics", "data_parallel", "data_parallel_one_host"]
    assert [name for name in CANDIDATES if REGISTRY[name].list_schedule] == [
        "heft", "heft-layers", "cpop", "cpop-layers"]
    assert label("heft-layers+split") == "HEFT (layer affinity) + op splitting"
    assert label("layerwise_model_parallel+waves") == "layer-wise model-parallel + Tick-Tock waves"


def test_one_host_and_one_replica_leave_their_candidates_out():
    from kerasflow.planner import synthetic
    from kerasflow.planner.search.planning import candidate_plans

    graph, settings = synthetic.chain_mlp(layers=2), {"split": False, "tick_tock": "off", "verbose": 0}
    one_host, _ = candidate_plans(graph, "4xV100-nvlink", **settings)
    assert "data_parallel" in one_host and "data_parallel_one_host" not in one_host
    assert "data_parallel_one_host" in candidate_plans(graph, "2x8xV100", **settings)[0]
    one_replica, misfits = candidate_plans(graph, "4xV100-nvlink", replicated=False, **settings)
    assert list(one_replica) == [name for name in one_host if not name.startswith("data_parallel")]
    assert misfits == ()
