"""``plan()``: run every candidate strategy, keep the fastest that fits in memory (ties to the simplest).

Candidates: the default placement (what TensorFlow runs without a plan), single device, data
parallelism (on several hosts, also inside the strongest host; where the user allows it, also
with each replica's own BatchNormalization statistics as ``MirroredStrategy`` computes them), layer-wise model parallelism, HEFT and CPOP (each
with op and with layer affinity), FastT's critical-path op splitting on top of the best list
schedule, and waves: data parallelism on one copy of the weights (a wave per device),
Tick-Tock data-parallel and model-parallel waves, and the best placement run as two waves.
Each candidate is judged by the simulator (a wave candidate whose busiest device or longest
chain of ops alone works longer than the fastest plan found before it is not built: it could
not win); the winner is the simplest candidate (earliest in trial order) predicted within
``TIE_MARGIN`` of the fastest, so that profile noise, which moves near-tied candidates by a few
per cent, does not flip the plan from one profile to the next. The default
placement comes first and, for a profile of measured costs, wins unless a plan is predicted
faster by more than ``PREDICTION_ERROR``, the simulator's measured error band: then "keep the
default placement" is the answer, and ``fit`` tries nothing. The winner's predicted step time is
the simulator's figure for it, and it records every candidate's.

What to plan and every knob of the search come as one ``PlanRequest`` (``request.py``), checked
once; the base candidates are ``candidates.REGISTRY``'s builders, and those left out travel as
``Misfit`` records (``Plan.excluded`` holds them as a mapping, as plan files do).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, NamedTuple

from ..._progress import progress_bar
from .._gc import collector_paused
from ..errors import InsufficientMemoryError, InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import refused_batch_sizes
from ..ir.plan import Plan
from ..sim.predict import with_prediction
from ..parallel import baselines
from ..parallel.onecopy import one_copy_data_parallel
from ..parallel.splitting import hybrid_splits, split_search
from ..parallel.ticktock import (
    batch_coupled_ops, tick_tock_data_parallel, tick_tock_model_parallel, with_waves,
)
from .candidates import CANDIDATES, PLANNED_CANDIDATES, REGISTRY, Misfit, strongest_host
from .request import TICK_TOCK_MODES, PlanRequest

__all__ = ["plan", "ranked_plans", "candidate_plans", "strongest_host", "order_if_faster", "split_start",
           "tie_margin_for", "CANDIDATES", "PLANNED_CANDIDATES", "TICK_TOCK_MODES", "TIE_MARGIN", "NOISE_TIES",
           "MAX_TIE_MARGIN", "PREDICTION_ERROR"]

# Two profiles of the same MLP on the CPU testbed ranked its layer-wise and HEFT plans 2 %
# apart one way and 1 % apart the other: a tie within measurement noise. Among candidates
# this close to the fastest, the simpler one (fewer devices to coordinate, fewer copies) wins.
TIE_MARGIN = 0.03

# A profile's plain step times spread (interquartile range over median) by a few per cent on a
# loaded machine, and near-tied candidates trade places from one profile to the next by about
# twice that. With a fixed margin the same model got a different plan from profile to profile;
# tied within twice each profile's spread, one kind of plan each (``benchmarks/plan_stability.py``;
# the figures are in docs/planner.md). The margin stops at MAX_TIE_MARGIN: a plan predicted that
# much faster is taken however noisy the profile.
NOISE_TIES = 2.0
MAX_TIE_MARGIN = 0.15

# The band within which the simulator's step times matched measured ones on this project's
# calibration benchmark (``benchmarks/calibration.py``, docs/benchmarks.md): a plan predicted
# less than this much faster than the default placement is not worth a switch.
PREDICTION_ERROR = 0.10


@collector_paused()  # millions of short-lived task tuples and lists, no cycles
def candidate_plans(request: PlanRequest | OpGraph | None = None, cluster: Cluster | str | None = None, /, *,
                    skip_slower: bool = False, **settings) -> tuple[dict[str, Plan], tuple[Misfit, ...]]:
    """Every candidate plan that fits in memory, simulated (the request as for ``plan``).

    ``replicated=False`` leaves out the strategies that replicate the whole step per device
    (data parallelism, plain or with waves), for runtimes that execute one replica.
    ``data_parallel_replica_statistics`` is tried only with ``replica_statistics=True`` and
    for a graph with synchronized BatchNormalization layers (otherwise it is ``data_parallel``).
    ``skip_slower=True`` (what ``plan`` does) does not simulate a wave candidate whose busiest
    device or longest chain of ops alone works longer than the fastest plan found before it takes
    (``ticktock.slower_than``), and stops its simulation once the clock passes that plan's step:
    it could be neither the fastest nor the choice.
    Not with ``tick_tock="on"`` (the choice is among wave plans then) nor on shared compute.
    For a model that refused a smaller batch while it was profiled (``refused_batch_sizes``),
    every candidate that hands a device fewer rows than the batch (data parallelism, waves, op
    splitting) is left out, and planning for another batch is an error.

    Returns:
        ``(plans by candidate name in trial order, the candidates not among them as ``Misfit``
        records in the order they were left out: they did not fit, did not apply, or were left
        out or skipped)``.

    Raises:
        InsufficientMemoryError: no candidate fits the devices' memory.
        InvalidPlanError: as ``PlanRequest``, a request given with more arguments, or none of
            the candidates asked for can be tried (none applies, or all replicate the step and
            ``replicated`` is False).

    Example:
        >>> from kerasflow.planner import synthetic
        >>> plans, misfits = candidate_plans(synthetic.chain_mlp(layers=2), "2xK80-pcie", split=False)
        >>> sorted(plans)[:2], misfits
        (['cpop', 'cpop-layers'], ())
    """
    request = _as_request(request, cluster, settings)
    lineup = _lineup(request)
    if not lineup.names:
        raise InvalidPlanError(
            f"None of the candidates asked for can be tried for this request: {_details(_untried(request, lineup))}. "
            f"Ask for others (kerasflow.planner.CANDIDATES), or allow what they need. Received: "
            f"candidates={list(request.candidates)}")
    steps = (len(lineup.names) + (request.max_split_evaluations + 1 if lineup.split else 0)
             + (4 if lineup.waves else 0))
    with progress_bar(steps, "kerasflow: planning", request.verbose) as bar:
        trial = _Trial(request, lineup.misfits, skip_slower, bar)
        for name in lineup.names:
            trial.consider(name, lambda name=name: REGISTRY[name].build(request))
        _improve_best_schedule(trial, split=lineup.split and len(request.cluster) > 1)
        if lineup.waves:
            _add_wave_candidates(trial)
    if not trial.results:
        raise InsufficientMemoryError(
            f"No strategy fits the memory of cluster {request.cluster.name!r} at batch {request.batch} "
            f"(budgets {min(request.budgets) / 2**20:,.0f} MiB per device after {request.memory_headroom:.0%} "
            "headroom). Ways out: more devices, a smaller batch, Tick-Tock waves (tick_tock='on'), or a larger "
            "memory_limit. Details: " + _details(trial.misfits))
    return trial.results, tuple(trial.misfits)


class _Lineup(NamedTuple):
    """What a request tries: the base candidates in trial order, whether op splitting and waves
    follow, and the candidates left out before any is built."""

    names: tuple[str, ...]
    split: bool
    waves: bool
    misfits: tuple[Misfit, ...]


def _lineup(request: PlanRequest) -> _Lineup:
    """The request's lineup: the candidates asked for that apply (on one device, only
    ``single_device``), less, for a model that refused a smaller batch, every one that hands a
    device fewer rows than the batch, and with ``placement_only`` every one that adds sums in
    another order (replicas, op splitting, waves), each left out with why."""
    waves = _waves_wanted(request.graph, request.tick_tock)
    if len(request.cluster) < 2:
        names = ("single_device",)
    else:
        names = tuple(name for name in request.candidates if REGISTRY[name].applies(request)
                      and (request.replicated or not REGISTRY[name].replicated))
    refused = refused_batch_sizes(request.graph)
    if refused:
        why = (f"hands a device fewer rows than the batch of {request.batch}, and the model refused a batch of "
               f"{refused[0]} while it was profiled")
    elif request.placement_only:
        why = ("adds sums in another order than the default placement (each replica's, shard's or wave's part of a "
               "sum), and only plans that compute bit for bit as it were asked for (placement_only: deterministic "
               "training)")
    else:
        return _Lineup(names, request.split, waves, ())
    # The candidates that cut the batch: these are the ones that hand a device fewer rows and the
    # ones that sum each part's share in another order.
    cut = [name for name in names if REGISTRY[name].replicated]
    cut += ["op_splitting"] * (request.split and len(request.cluster) > 1) + ["waves"] * waves
    return _Lineup(tuple(n for n in names if n not in cut), False, False, tuple(Misfit(name, why) for name in cut))


def _untried(request: PlanRequest, lineup: _Lineup) -> list[Misfit]:
    """The candidates asked for that the lineup left out, and why."""
    def why(candidate) -> str:
        if not candidate.applies(request):
            return "does not apply to this graph and cluster"
        return "replicates the step, and the request allows no replicas (replicated=False)"
    left_out = [Misfit(name, why(REGISTRY[name])) for name in request.candidates
                if name not in lineup.names and name not in dict(lineup.misfits)]
    return left_out + list(lineup.misfits)


def _waves_wanted(graph: OpGraph, tick_tock: str) -> bool:
    """Whether Tick-Tock candidates are tried ("on" warns on batch-coupled ops)."""
    coupled = batch_coupled_ops(graph)
    if tick_tock == "on" and coupled:
        warnings.warn(
            f"tick_tock='on' runs the batch as two micro-batches, which changes the result of ops that "
            f"couple the samples of a batch ({coupled[:3]}{'...' if len(coupled) > 3 else ''}, e.g. "
            "BatchNormalization statistics come from each wave). Use tick_tock='auto' to avoid waves "
            "for this model.", stacklevel=4)
    return tick_tock == "on" or (tick_tock == "auto" and not coupled)


class _Trial:
    """One run of the candidates: those built, those that fit (both in trial order), and the
    misfits with why."""

    def __init__(self, request: PlanRequest, misfits: tuple[Misfit, ...], skip_slower: bool, bar):
        self.request, self.skip_slower, self.bar = request, skip_slower, bar
        self.results: dict[str, Plan] = {}
        self.computed: dict[str, Plan] = {}
        self.misfits: list[Misfit] = list(misfits)

    def keep(self, name: str, candidate: Plan) -> None:
        """Keeps ``candidate`` under ``name``, built and fitting (in place of a plan of that name)."""
        self.results[name] = self.computed[name] = candidate

    def consider(self, name: str, make: Callable[[], Plan | None]) -> None:
        """Builds a candidate, and keeps it where it fits; a misfit (with why) where it does not,
        does not apply, or was left unsimulated."""
        try:
            candidate = make()
        except InsufficientMemoryError as error:
            self.misfits.append(Misfit(name, str(error)))
            return
        except InvalidPlanError as error:  # not applicable to this graph (e.g. no layers)
            self.misfits.append(Misfit(name, f"not applicable: {error}"))
            return
        if candidate is None:  # a wave candidate slower than the fastest plan, unsimulated
            self.misfits.append(Misfit(name, (
                f"not simulated to the end: its busiest device or its longest chain of ops alone works longer "
                f"than the fastest plan found ({self.fastest_so_far() * 1e3:.3f} ms), or its simulation passed "
                "that time")))
        else:
            self.computed[name] = candidate
            if self.request.fits(candidate):
                self.results[name] = candidate
            else:
                peak = max(candidate.predicted_peak_memory.values())
                self.misfits.append(Misfit(name, f"simulated peak {peak / 2**20:,.1f} MiB exceeds the budget"))
        self.bar.update(1)
        if self.request.progress is not None:
            self.request.progress(name)

    def fastest_so_far(self) -> float | None:
        """The bound wave candidates must beat to be simulated, when ``skip_slower`` applies."""
        if not (self.skip_slower and self.results) or self.request.tick_tock == "on" or self.request.cluster.shared:
            return None
        return min(p.predicted_step_time for p in self.results.values())


def _improve_best_schedule(trial: _Trial, *, split: bool) -> None:
    """The best list schedule (the first in trial order on a tie) run without its order where
    that is faster, then, with ``split``, FastT's op splitting from it."""
    schedules = [name for name in trial.results if REGISTRY[name].list_schedule]
    if not schedules:
        return
    # Only the best list schedule is re-simulated without its order: one simulation
    # more per plan() instead of one per candidate keeps planning within its time budget.
    base_name = min(schedules, key=lambda name: trial.results[name].predicted_step_time)
    request = trial.request
    trial.keep(base_name, order_if_faster(trial.results[base_name], request.graph, request.cluster, request.fits))
    if split:
        _add_split_candidate(trial, base_name)
        if request.progress is not None:
            request.progress(f"{base_name}+split")


def _add_split_candidate(trial: _Trial, base_name: str) -> None:
    """FastT's critical-path splitting from the best list schedule, or from its data-parallel-like
    hybrid where that starts faster beyond the tie margin (``split_start``), kept as
    ``<base>+split`` when it splits anything."""
    request = trial.request

    def schedule(splits, unless_slower_than=None):
        candidate = REGISTRY[base_name].build(request, splits=splits, unless_slower_than=unless_slower_than)
        if candidate is not None and not request.fits(candidate):
            raise InsufficientMemoryError("split plan exceeds a device's memory budget")
        return candidate

    start = trial.results[base_name]
    hybrid = hybrid_splits(request.graph, request.cluster, start)
    if hybrid:
        trial.consider(f"{base_name}+hybrid", lambda: schedule(hybrid))
        if f"{base_name}+hybrid" in trial.results:
            start = split_start(start, trial.results[f"{base_name}+hybrid"], tie_margin_for(request.graph))
    best_split, _ = split_search(request.graph, request.cluster, start, schedule,
                                 max_evaluations=request.max_split_evaluations, progress=lambda _: trial.bar.update(1))
    best_split = order_if_faster(best_split, request.graph, request.cluster, request.fits)
    if best_split.splits:
        trial.keep(f"{base_name}+split", dataclasses.replace(best_split, algorithm=f"{base_name}+split"))


def tie_margin_for(graph: OpGraph) -> float:
    """The tie margin for a profile: ``NOISE_TIES`` times the spread of its plain step times
    (``metadata["plain_step_spread"]``, which kerasflow's profiler records), at least
    ``TIE_MARGIN`` and at most ``MAX_TIE_MARGIN``; ``TIE_MARGIN`` for a graph without it.

    Raises:
        InvalidPlanError: ``plain_step_spread`` is not a non-negative number.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> tie_margin_for(synthetic.chain_mlp(layers=1))  # no measured noise
        0.03
        >>> graph = synthetic.chain_mlp(layers=1)
        >>> tie_margin_for(OpGraph(graph.ops, graph.edges, metadata={"plain_step_spread": 0.04}))
        0.08
    """
    spread = graph.metadata.get("plain_step_spread")
    if spread is None:
        return TIE_MARGIN
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not math.isfinite(spread) or spread < 0:
        raise InvalidPlanError(f"The profile's metadata['plain_step_spread'] must be a non-negative number (the "
                               f"interquartile range of its plain step times over their median). Received: "
                               f"plain_step_spread={spread!r}. Fix or remove it, or pass tie_margin=.")
    return round(min(MAX_TIE_MARGIN, max(TIE_MARGIN, NOISE_TIES * spread)), 6)


def split_start(schedule: Plan, hybrid: Plan, margin: float) -> Plan:
    """Where the split search starts: the list schedule, unless its hybrid is faster by more
    than ``margin`` (a fraction). A start within the margin is a tie, and the simpler plan wins
    it, as among candidates: the greedy search only adds splits, so from the hybrid it cannot
    leave the hybrid's (on GNMT a hybrid 1 % ahead led the search to a far slower plan than
    HEFT's start did: docs/planner.md gives the figures).

    Example:
        >>> schedule, hybrid = Plan(predicted_step_time=1.00), Plan(predicted_step_time=0.98)
        >>> split_start(schedule, hybrid, 0.03) is schedule, split_start(schedule, hybrid, 0.01) is hybrid
        (True, True)
    """
    return hybrid if hybrid.predicted_step_time * (1 + margin) < schedule.predicted_step_time else schedule


def order_if_faster(candidate: Plan, graph: OpGraph, cluster: Cluster,
                    fits: Callable[[Plan], bool] = lambda _: True) -> Plan:
    """``candidate``, or the same plan without its per-device order when that simulates faster
    (and ``fits``, when ``candidate`` does).

    A list schedule's order is fixed from estimated finish times; run without it, each device
    takes whichever ready task ranks highest, which can beat the fixed order once transfers
    land later or earlier than estimated (and can lose to it, so both are simulated).

    Example:
        >>> from kerasflow.planner import heft, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> ordered = heft(graph, cluster)
        >>> order_if_faster(ordered, graph, cluster).predicted_step_time <= ordered.predicted_step_time
        True
    """
    if not candidate.order:
        return candidate
    # Only a faster run counts: one that passes the candidate's step is stopped there.
    to_beat = candidate.predicted_step_time * (1 - 1e-9)
    unordered = with_prediction(dataclasses.replace(candidate, order={}), graph, cluster,
                                          candidate.batch_size, unless_slower_than=to_beat)
    if unordered is None or not unordered.predicted_step_time < to_beat:
        return candidate
    return unordered if fits(unordered) or not fits(candidate) else candidate


def _add_wave_candidates(trial: _Trial) -> None:
    """Wave candidates: data parallelism on one copy of the weights, Tick-Tock data-parallel and
    model-parallel waves, and the best placement found so far (FastT's, split or not, whether
    it fit or not) run as two waves; each left unsimulated when its busiest device or longest
    chain of ops alone works longer than ``trial.fastest_so_far()`` seconds (None: always simulated)."""
    graph, cluster, batch = trial.request.graph, trial.request.cluster, trial.request.batch
    computed, consider, to_beat = trial.computed, trial.consider, trial.fastest_so_far
    if len(cluster) < 2:
        base = computed.get("single_device") or baselines.single_device(graph, cluster, batch=batch)
        consider("single_device+waves", lambda: with_waves(base, graph, cluster, batch=batch))
        return
    # One copy of the weights, one wave per device: data parallelism the one-replica runtime runs.
    consider("one_copy_data_parallel",
             lambda: one_copy_data_parallel(graph, cluster, batch=batch, unless_slower_than=to_beat()))
    if trial.request.replicated:
        consider("tick_tock_data_parallel",
                 lambda: tick_tock_data_parallel(graph, cluster, batch=batch, base=computed.get("data_parallel"),
                                                 unless_slower_than=to_beat()))
    consider("tick_tock_model_parallel", lambda: tick_tock_model_parallel(
        graph, cluster, batch=batch, base=computed.get("layerwise_model_parallel"), unless_slower_than=to_beat()))
    placed = {n: p for n, p in computed.items()
              if p.data_parallel is None and n not in ("single_device", baselines.DEFAULT_PLACEMENT)}
    if placed:
        name = min(placed, key=lambda n: (placed[n].predicted_step_time, list(placed).index(n)))
        consider(f"{name}+waves",
                 lambda: with_waves(placed[name], graph, cluster, batch=batch, unless_slower_than=to_beat()))


def _details(misfits: list[Misfit] | tuple[Misfit, ...]) -> str:
    return " | ".join(f"{name}: {why}" for name, why in misfits)


def _as_request(request: PlanRequest | OpGraph | None, cluster: Cluster | str | None, settings: dict) -> PlanRequest:
    """``request`` itself, or the ``PlanRequest`` of a graph, a cluster and keyword arguments
    (``graph=`` and ``cluster=`` among them, as before there was a request)."""
    if not isinstance(request, PlanRequest):
        given = {"graph": request, "cluster": cluster}
        return PlanRequest(**{name: value for name, value in given.items() if value is not None}, **settings)
    if cluster is not None or settings:
        raise InvalidPlanError(f"Give a PlanRequest alone, or a graph, a cluster and keyword arguments; to change a "
                               f"request, use dataclasses.replace(request, ...). Received: a PlanRequest with "
                               f"cluster={cluster!r} and {sorted(settings)}")
    return request


def plan(request: PlanRequest | OpGraph | None = None, cluster: Cluster | str | None = None, /,
         **settings) -> Plan:
    """Computes the fastest plan for one training step.

    Args:
        request: a ``PlanRequest``: the step, the cluster and every knob of the search. Or, as
            short for ``plan(PlanRequest(graph, cluster, **settings))``, the graph:
            ``plan(graph, "4xV100-nvlink", split=False)``.
        cluster: with a graph, a ``Cluster``, a preset name or a cluster JSON path.
        **settings: with a graph, the other fields of ``PlanRequest`` (``batch_size``, ``split``,
            ``tick_tock``, ``memory_limit``, ``memory_headroom``, ``max_split_evaluations``,
            ``candidates``, ``replicated``, ``replica_statistics``, ``tie_margin``, ``progress``,
            ``verbose``; see there).

    Returns:
        The chosen ``Plan``: ``predicted_step_time`` is the simulator's figure for it and
        ``candidates`` maps every strategy simulated that fits to its predicted step time. The same
        inputs give the same plan, byte for byte.

    Raises:
        InsufficientMemoryError: no strategy fits the devices' memory; the message says
            how much was needed and what to do.
        InvalidPlanError: a request ``PlanRequest`` refuses (an unknown candidate name, a
            ``tie_margin`` outside [0, 1), ...), or a profile whose ``plain_step_spread`` is not a
            non-negative number.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> best = plan(synthetic.inception_like(blocks=2), "4xV100-nvlink", max_split_evaluations=4)
        >>> best.predicted_step_time <= min(best.candidates.values()) * (1 + TIE_MARGIN)
        True
        >>> request = PlanRequest(synthetic.inception_like(blocks=2), "4xV100-nvlink", max_split_evaluations=4)
        >>> plan(request) == best
        True
    """
    return ranked_plans(request, cluster, **settings)[0]


def ranked_plans(request: PlanRequest | OpGraph | None = None, cluster: Cluster | str | None = None, /,
                 **settings) -> list[Plan]:
    """Every candidate plan that fits, best first (arguments, errors and plans as for ``plan``).

    The first is the plan ``plan`` returns; the others follow by predicted step time. Inside
    ``fit``, a first plan that measures slower than the default placement gives way to the
    best of the others by ``rerank`` before kerasflow gives up.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> ranked = ranked_plans(synthetic.chain_mlp(layers=2), "2xK80-pcie", split=False, verbose=0)
        >>> ranked[0].algorithm == plan(synthetic.chain_mlp(layers=2), "2xK80-pcie", split=False, verbose=0).algorithm
        True
        >>> [p.predicted_step_time for p in ranked[1:]] == sorted(p.predicted_step_time for p in ranked[1:])
        True
    """
    request = _as_request(request, cluster, settings)
    tie_margin = tie_margin_for(request.graph) if request.tie_margin is None else request.tie_margin
    results, misfits = candidate_plans(request, skip_slower=True)
    if request.tick_tock == "on":
        results = {n: p for n, p in results.items() if p.waves is not None}
        if not results:
            raise InsufficientMemoryError(
                "No plan with Tick-Tock waves fits the devices' memory. Ways out: more devices, a smaller "
                "batch, or a larger memory_limit. Details: " + _details(misfits))
    fastest = min(p.predicted_step_time for p in results.values())
    default = results.get(baselines.DEFAULT_PLACEMENT)
    # Measured costs come with the error band calibration measured; datasheet ones with none known.
    measured = "plain_step_seconds" in request.graph.metadata
    margin = max(tie_margin, PREDICTION_ERROR * measured)
    if default is not None and default.predicted_step_time <= fastest * (1 + margin):
        best_name = baselines.DEFAULT_PLACEMENT
    else:
        best_name = next(n for n, p in results.items() if p.predicted_step_time <= fastest * (1 + tie_margin))
    others = sorted((n for n in results if n != best_name), key=lambda n: results[n].predicted_step_time)
    figures = {name: p.predicted_step_time for name, p in results.items()}
    excluded = dict(misfits)  # Plan.excluded: the mapping plan files hold
    return [dataclasses.replace(results[name], algorithm=name, candidates=figures, excluded=excluded)
            for name in [best_name] + others]
