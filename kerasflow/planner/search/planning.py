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
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable

from ..._progress import progress_bar
from .._gc import collector_paused
from .._jsonio import check_number
from ..errors import InsufficientMemoryError, InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import batch_statistics, refused_batch_sizes, temporary_bytes
from ..ir.plan import Plan
from ..sim.predict import with_prediction
from ..schedule.cpop import cpop
from ..schedule.heft import heft
from ..schedule.listschedule import DEFAULT_MEMORY_HEADROOM, memory_budgets
from ..parallel import baselines
from ..parallel.onecopy import one_copy_data_parallel
from ..parallel.splitting import hybrid_splits, split_search
from ..parallel.ticktock import (
    batch_coupled_ops, tick_tock_data_parallel, tick_tock_model_parallel, with_waves,
)

__all__ = ["plan", "ranked_plans", "candidate_plans", "strongest_host", "order_if_faster", "split_start",
           "tie_margin_for", "CANDIDATES", "PLANNED_CANDIDATES", "TICK_TOCK_MODES", "TIE_MARGIN", "NOISE_TIES",
           "MAX_TIE_MARGIN", "PREDICTION_ERROR"]

TICK_TOCK_MODES = ("auto", "on", "off")

# Two profiles of the same MLP on the CPU testbed ranked its layer-wise and HEFT plans 2 %
# apart one way and 1 % apart the other: a tie within measurement noise. Among candidates
# this close to the fastest, the simpler one (fewer devices to coordinate, fewer copies) wins.
TIE_MARGIN = 0.03

# A profile's plain step times spread (interquartile range over median) by a few per cent on a
# loaded machine, and near-tied candidates trade places from one profile to the next by about
# twice that: on this project's 2-core machine (2026-12-02) the testbed MLP's HEFT and
# layer-wise plans swapped places by up to 6.8 % between profiles whose plain steps spread by 3
# to 8 %. With a fixed 3 % margin five profiles gave the MLP three different plans and the
# Transformer three; tied within twice each profile's spread, one kind of plan each, in two runs
# (``benchmarks/plan_stability.py``). The margin stops at MAX_TIE_MARGIN: a plan predicted that
# much faster is taken however noisy the profile.
NOISE_TIES = 2.0
MAX_TIE_MARGIN = 0.15

# The band within which the simulator's step times matched measured ones on this project's
# calibration benchmark (``benchmarks/calibration.py``, docs/benchmarks.md): a plan predicted
# less than this much faster than the default placement is not worth a switch.
PREDICTION_ERROR = 0.10

CANDIDATES = (baselines.DEFAULT_PLACEMENT, "single_device", "data_parallel_replica_statistics", "data_parallel",
              "data_parallel_one_host", "layerwise_model_parallel", "heft", "heft-layers", "cpop", "cpop-layers")
# Every candidate but the default placement: ``candidates=PLANNED_CANDIDATES`` returns a plan to
# apply whatever it gains (a benchmark timing plans, a test forcing one).
PLANNED_CANDIDATES = CANDIDATES[1:]


@collector_paused()  # millions of short-lived task tuples and lists, no cycles
def candidate_plans(graph: OpGraph, cluster: Cluster | str, *, batch_size: int | None = None,
                    split: bool = True, tick_tock: str = "auto", memory_limit: float | None = None,
                    memory_headroom: float = DEFAULT_MEMORY_HEADROOM, max_split_evaluations: int = 48,
                    candidates: tuple[str, ...] = CANDIDATES, replicated: bool = True,
                    replica_statistics: bool = False, progress: Callable[[str], None] | None = None,
                    verbose=True, skip_slower: bool = False) -> tuple[dict[str, Plan], dict[str, str]]:
    """Every candidate plan that fits in memory, simulated (arguments as for ``plan``).

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
        ``(plans by candidate name in trial order, candidate name -> why it is not among them:
        it did not fit, did not apply, or was left out or skipped)``.

    Raises:
        InvalidPlanError: an unknown candidate, or ``batch_size`` other than the graph's for a
            model that refused a smaller batch.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> plans, excluded = candidate_plans(synthetic.chain_mlp(layers=2), "2xK80-pcie", split=False)
        >>> sorted(plans)[:2], excluded
        (['cpop', 'cpop-layers'], {})
    """
    cluster = Cluster.resolve(cluster)
    unknown = sorted(set(candidates) - set(CANDIDATES))
    if unknown:
        raise InvalidPlanError(f"Unknown candidate(s) {unknown}; choose from {list(CANDIDATES)}.")
    waves_wanted = _waves_wanted(graph, tick_tock)
    if batch_size is not None:
        check_number(batch_size, "batch_size", InvalidPlanError, kind="count", fix="pass the batch to plan for")
    batch = batch_size or graph.batch_size
    budgets = memory_budgets(cluster, memory_limit, memory_headroom, temporary_bytes(graph))
    options = {"batch_size": batch, "memory_limit": memory_limit, "memory_headroom": memory_headroom}

    def fits(candidate: Plan) -> bool:
        peaks = candidate.predicted_peak_memory
        return all(peaks.get(d, 0.0) <= b * (1 + 1e-9) for d, b in zip(cluster.device_names, budgets))

    makers = _makers(graph, cluster, batch, options)
    if len(cluster) < 2:
        candidates = ("single_device",)
    if not replicated:
        candidates = tuple(c for c in candidates if not c.startswith("data_parallel"))
    if not (replica_statistics and batch_statistics(graph).layer_ops):
        candidates = tuple(c for c in candidates if c != "data_parallel_replica_statistics")
    if len(cluster.hosts()) < 2:
        candidates = tuple(c for c in candidates if c != "data_parallel_one_host")
    excluded: dict[str, str] = {}
    whole_batch_only = _whole_batch_only(graph, batch)
    if whole_batch_only is not None:
        fewer_rows = [c for c in candidates if c.startswith("data_parallel")]
        fewer_rows += ["op_splitting"] * (split and len(cluster) > 1) + ["waves"] * waves_wanted
        excluded.update(dict.fromkeys(fewer_rows, whole_batch_only))
        candidates = tuple(c for c in candidates if c not in excluded)
        split = waves_wanted = False
    results: dict[str, Plan] = {}
    computed: dict[str, Plan] = {}

    def consider(name: str, make: Callable[[], Plan | None]) -> None:
        try:
            candidate = make()
        except InsufficientMemoryError as error:
            excluded[name] = str(error)
            return
        except InvalidPlanError as error:  # not applicable to this graph (e.g. no layers)
            excluded[name] = f"not applicable: {error}"
            return
        if candidate is None:  # a wave candidate slower than the fastest plan, unsimulated
            excluded[name] = (f"not simulated to the end: its busiest device or its longest chain of ops alone "
                              f"works longer than the fastest plan found ({fastest_so_far() * 1e3:.3f} ms), or its "
                              "simulation passed that time")
        else:
            computed[name] = candidate
            if fits(candidate):
                results[name] = candidate
            else:
                peak = max(candidate.predicted_peak_memory.values())
                excluded[name] = f"simulated peak {peak / 2**20:,.1f} MiB exceeds the budget"
        bar.update(1)
        if progress is not None:
            progress(name)

    def fastest_so_far() -> float | None:
        """The bound wave candidates must beat to be simulated, when ``skip_slower`` applies."""
        if not (skip_slower and results) or tick_tock == "on" or cluster.shared:
            return None
        return min(p.predicted_step_time for p in results.values())

    bar = progress_bar(len(candidates) + (max_split_evaluations + 1 if split else 0) + (4 if waves_wanted else 0),
                       "kerasflow: planning", verbose)

    for name in candidates:
        consider(name, makers[name])
    schedulers = [n for n in results if n in ("heft", "heft-layers", "cpop", "cpop-layers")]
    if schedulers:
        # Only the best list schedule is re-simulated without its order: one simulation
        # more per plan() instead of one per candidate keeps planning within its time budget.
        base_name = min(schedulers, key=lambda n: (results[n].predicted_step_time, candidates.index(n)))
        results[base_name] = computed[base_name] = order_if_faster(results[base_name], graph, cluster, fits)
        if split and len(cluster) > 1:
            _add_split_candidate(graph, cluster, base_name, makers[base_name], results, computed, consider, fits,
                                 max_split_evaluations, lambda: bar.update(1))
            if progress is not None:
                progress(f"{base_name}+split")
    try:
        if waves_wanted:
            _add_wave_candidates(graph, cluster, batch, computed, consider, replicated, fastest_so_far)
    finally:
        bar.close()
    if not results:
        raise InsufficientMemoryError(
            f"No strategy fits the memory of cluster {cluster.name!r} at batch {batch} "
            f"(budgets {min(budgets) / 2**20:,.0f} MiB per device after {memory_headroom:.0%} headroom). "
            "Ways out: more devices, a smaller batch, Tick-Tock waves (tick_tock='on'), or a larger "
            "memory_limit. Details: " + _details(excluded))
    return results, excluded


def _whole_batch_only(graph: OpGraph, batch: int) -> str | None:
    """Why no candidate may hand a device fewer rows than ``batch``: the model refused a smaller
    batch while it was profiled (None: it did not)."""
    refused = refused_batch_sizes(graph)
    if not refused:
        return None
    if batch != graph.batch_size:
        raise InvalidPlanError(
            f"The model refused a batch of {refused[0]} while it was profiled at {graph.batch_size}: it takes only "
            f"the batch it was profiled at. Received: batch_size={batch}. Plan for batch_size={graph.batch_size}, "
            "or profile the model at the batch to plan for.")
    return (f"hands a device fewer rows than the batch of {batch}, and the model refused a batch of {refused[0]} "
            "while it was profiled")


def _details(excluded: dict[str, str]) -> str:
    return " | ".join(f"{name}: {why}" for name, why in excluded.items())


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


def _waves_wanted(graph: OpGraph, tick_tock: str) -> bool:
    """Whether Tick-Tock candidates are tried (``tick_tock`` checked; "on" warns on batch-coupled ops)."""
    if tick_tock not in TICK_TOCK_MODES:
        raise InvalidPlanError(f"tick_tock must be one of {TICK_TOCK_MODES}; received {tick_tock!r}.")
    coupled = batch_coupled_ops(graph)
    if tick_tock == "on" and coupled:
        warnings.warn(
            f"tick_tock='on' runs the batch as two micro-batches, which changes the result of ops that "
            f"couple the samples of a batch ({coupled[:3]}{'...' if len(coupled) > 3 else ''}, e.g. "
            "BatchNormalization statistics come from each wave). Use tick_tock='auto' to avoid waves "
            "for this model.", stacklevel=3)
    return tick_tock == "on" or (tick_tock == "auto" and not coupled)


def _makers(graph: OpGraph, cluster: Cluster, batch: int, options: dict) -> dict[str, Callable[..., Plan | None]]:
    """Per candidate name, the function that builds it (list schedules take ``splits`` and
    ``unless_slower_than``)."""
    return {
        baselines.DEFAULT_PLACEMENT: lambda **_: baselines.default_placement(graph, cluster, batch=batch),
        "single_device": lambda **_: baselines.single_device(graph, cluster, batch=batch),
        "data_parallel": lambda **_: baselines.data_parallel(graph, cluster, batch=batch),
        # MirroredStrategy's math: each replica's BatchNormalization with its own share's statistics.
        "data_parallel_replica_statistics": lambda **_: baselines.data_parallel(
            graph, cluster, batch=batch, synchronized=False),
        # Several hosts: data parallelism inside the strongest host only, where the network
        # would cost more than the other hosts' devices give.
        "data_parallel_one_host": lambda **_: baselines.data_parallel(
            graph, cluster, devices=strongest_host(cluster), batch=batch),
        "layerwise_model_parallel": lambda **_: baselines.layerwise_model_parallel(graph, cluster, batch=batch),
        "heft": lambda **more: heft(graph, cluster, **more, **options),
        "heft-layers": lambda **more: heft(graph, cluster, affinity="layer", **more, **options),
        "cpop": lambda **more: cpop(graph, cluster, **more, **options),
        "cpop-layers": lambda **more: cpop(graph, cluster, affinity="layer", **more, **options),
    }


def _add_split_candidate(graph: OpGraph, cluster: Cluster, base_name: str, make: Callable[..., Plan],
                         results: dict[str, Plan], computed: dict[str, Plan],
                         consider: Callable[[str, Callable[[], Plan]], None], fits: Callable[[Plan], bool],
                         max_evaluations: int, tick: Callable[[], None]) -> None:
    """FastT's critical-path splitting from the best list schedule, or from its data-parallel-like
    hybrid where that starts faster beyond the tie margin (``split_start``), kept as
    ``<base>+split`` when it splits anything."""
    def schedule(splits, unless_slower_than=None):
        candidate = make(splits=splits, unless_slower_than=unless_slower_than)
        if candidate is not None and not fits(candidate):
            raise InsufficientMemoryError("split plan exceeds a device's memory budget")
        return candidate

    start = results[base_name]
    hybrid = hybrid_splits(graph, cluster, start)
    if hybrid:
        consider(f"{base_name}+hybrid", lambda: schedule(hybrid))
        if f"{base_name}+hybrid" in results:
            start = split_start(start, results[f"{base_name}+hybrid"], tie_margin_for(graph))
    best_split, _ = split_search(graph, cluster, start, schedule, max_evaluations=max_evaluations,
                                 progress=lambda _: tick())
    best_split = order_if_faster(best_split, graph, cluster, fits)
    if best_split.splits:
        name = f"{base_name}+split"
        results[name] = computed[name] = dataclasses.replace(best_split, algorithm=name)


def split_start(schedule: Plan, hybrid: Plan, margin: float) -> Plan:
    """Where the split search starts: the list schedule, unless its hybrid is faster by more
    than ``margin`` (a fraction). A start within the margin is a tie, and the simpler plan wins
    it, as among candidates: the greedy search only adds splits, so from the hybrid it cannot
    leave the hybrid's. On GNMT over 8xH100-nvlink the hybrid starts 1 % faster than HEFT
    (39.08 against 39.53 ms) and its search ends at 38.80 ms, HEFT's at 33.40 ms.

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


def strongest_host(cluster: Cluster) -> list[str]:
    """The devices of the host with the most total speed (the first such host on a tie).

    Example:
        >>> strongest_host(Cluster.preset("2x8xV100"))[0]
        '/job:worker/replica:0/task:0/device:GPU:0'
    """
    hosts = cluster.hosts()
    speed = {h: sum(cluster.device(d).speed for d in names) for h, names in hosts.items()}
    return hosts[max(hosts, key=lambda h: (speed[h], -h))]


def _add_wave_candidates(graph: OpGraph, cluster: Cluster, batch: int, computed: dict[str, Plan],
                         consider: Callable[[str, Callable[[], Plan | None]], None], replicated: bool,
                         to_beat: Callable[[], float | None]) -> None:
    """Wave candidates: data parallelism on one copy of the weights, Tick-Tock data-parallel and
    model-parallel waves, and the best placement found so far (FastT's, split or not, whether
    it fit or not) run as two waves; each left unsimulated when its busiest device or longest
    chain of ops alone works longer than ``to_beat()`` seconds (None: always simulated)."""
    if len(cluster) < 2:
        base = computed.get("single_device") or baselines.single_device(graph, cluster, batch=batch)
        consider("single_device+waves", lambda: with_waves(base, graph, cluster, batch=batch))
        return
    # One copy of the weights, one wave per device: data parallelism the one-replica runtime runs.
    consider("one_copy_data_parallel",
             lambda: one_copy_data_parallel(graph, cluster, batch=batch, unless_slower_than=to_beat()))
    if replicated:
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


def plan(graph: OpGraph, cluster: Cluster | str, *, batch_size: int | None = None, split: bool = True,
         tick_tock: str = "auto", memory_limit: float | None = None,
         memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
         max_split_evaluations: int = 48, candidates: tuple[str, ...] = CANDIDATES, replicated: bool = True,
         replica_statistics: bool = False, tie_margin: float | None = None,
         progress: Callable[[str], None] | None = None, verbose=True) -> Plan:
    """Computes the fastest plan for one training step of ``graph`` on ``cluster``.

    Args:
        graph: the step (a profile, or a synthetic graph).
        cluster: a ``Cluster``, a preset name or a cluster JSON path.
        batch_size: the batch to plan for (default: the graph's).
        split: also try FastT's critical-path op splitting.
        tick_tock: ``"auto"`` adds Tick-Tock wave candidates (kept when they are faster, or
            when nothing fits without them) unless the model has batch-coupled ops such as
            BatchNormalization; ``"on"`` returns the best plan with waves (warning if the
            model has batch-coupled ops); ``"off"`` never uses waves.
        memory_limit: a cap in bytes for every device's memory.
        memory_headroom: the fraction of each device's memory left free (default 10 %).
        max_split_evaluations: the split search's budget, in plans scheduled and simulated.
        candidates: which base strategies to try (a subset of ``CANDIDATES``).
        replicated: also try strategies that replicate the step on every device (data
            parallelism, plain or with Tick-Tock waves).
        replica_statistics: also try data parallelism whose replicas normalize
            (BatchNormalization) with their own share's statistics, as ``MirroredStrategy``'s
            do, which changes the losses (candidate ``data_parallel_replica_statistics``). It
            comes before ``data_parallel`` in trial order: it waits for no ring, so it is the
            simpler plan and wins a tie. Off (the default): every data-parallel plan keeps one
            device's math.
        tie_margin: candidates predicted within this fraction of the fastest count as tied,
            and the first of them in trial order (the simplest) wins; 0 keeps the fastest.
            None (the default): ``tie_margin_for(graph)``, from the profile's own noise.
        progress: called with each candidate's name when it is done.
        verbose: show a progress bar on stderr (only on a terminal; 0 or False: never).

    Returns:
        The chosen ``Plan``: ``predicted_step_time`` is the simulator's figure for it and
        ``candidates`` maps every strategy simulated that fits to its predicted step time. The same
        inputs give the same plan, byte for byte.

    Raises:
        InsufficientMemoryError: no strategy fits the devices' memory; the message says
            how much was needed and what to do.
        InvalidPlanError: an unknown candidate name, a ``tie_margin`` outside [0, 1), or a
            profile whose ``plain_step_spread`` is not a non-negative number.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> best = plan(synthetic.inception_like(blocks=2), "4xV100-nvlink", max_split_evaluations=4)
        >>> best.predicted_step_time <= min(best.candidates.values()) * (1 + TIE_MARGIN)
        True
    """
    return ranked_plans(graph, cluster, batch_size=batch_size, split=split, tick_tock=tick_tock,
                        memory_limit=memory_limit, memory_headroom=memory_headroom,
                        max_split_evaluations=max_split_evaluations, candidates=candidates, replicated=replicated,
                        replica_statistics=replica_statistics, tie_margin=tie_margin, progress=progress,
                        verbose=verbose)[0]


def ranked_plans(graph: OpGraph, cluster: Cluster | str, *, batch_size: int | None = None, split: bool = True,
                 tick_tock: str = "auto", memory_limit: float | None = None,
                 memory_headroom: float = DEFAULT_MEMORY_HEADROOM, max_split_evaluations: int = 48,
                 candidates: tuple[str, ...] = CANDIDATES, replicated: bool = True, replica_statistics: bool = False,
                 tie_margin: float | None = None, progress: Callable[[str], None] | None = None,
                 verbose=True) -> list[Plan]:
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
    if tie_margin is None:
        tie_margin = tie_margin_for(graph)
    elif isinstance(tie_margin, bool) or not isinstance(tie_margin, (int, float)) or not 0 <= tie_margin < 1:
        raise InvalidPlanError(f"tie_margin must be a fraction in [0, 1), such as 0.03, or None (from the "
                               f"profile's noise). Received: tie_margin={tie_margin!r}")
    results, excluded = candidate_plans(
        graph, cluster, batch_size=batch_size, split=split, tick_tock=tick_tock, memory_limit=memory_limit,
        memory_headroom=memory_headroom, max_split_evaluations=max_split_evaluations, candidates=candidates,
        replicated=replicated, replica_statistics=replica_statistics, progress=progress, verbose=verbose,
        skip_slower=True)
    if tick_tock == "on":
        results = {n: p for n, p in results.items() if p.waves is not None}
        if not results:
            raise InsufficientMemoryError(
                "No plan with Tick-Tock waves fits the devices' memory. Ways out: more devices, a smaller "
                "batch, or a larger memory_limit. Details: " + _details(excluded))
    fastest = min(p.predicted_step_time for p in results.values())
    default = results.get(baselines.DEFAULT_PLACEMENT)
    # Measured costs come with the error band calibration measured; datasheet ones with none known.
    measured = "plain_step_seconds" in graph.metadata
    margin = max(tie_margin, PREDICTION_ERROR * measured)
    if default is not None and default.predicted_step_time <= fastest * (1 + margin):
        best_name = baselines.DEFAULT_PLACEMENT
    else:
        best_name = next(n for n, p in results.items() if p.predicted_step_time <= fastest * (1 + tie_margin))
    others = sorted((n for n in results if n != best_name), key=lambda n: results[n].predicted_step_time)
    figures = {name: p.predicted_step_time for name, p in results.items()}
    return [dataclasses.replace(results[name], algorithm=name, candidates=figures, excluded=excluded)
            for name in [best_name] + others]
