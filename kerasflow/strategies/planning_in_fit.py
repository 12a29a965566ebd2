"""Profiling and planning inside ``fit``: the recorded step as an ``OpGraph``, the planner's request, the report."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from kerasflow import _compat
from kerasflow.devices import wait_for_devices
from kerasflow.multihost import task_of
from kerasflow.planner import Cluster, OpGraph, Plan, PlanRequest
from kerasflow.planner.parallel import baselines
from kerasflow.planner.parallel.baselines import DEFAULT_PLACEMENT
from kerasflow.planner.search.planning import tie_margin_for
from kerasflow.planner.sim.simulator import STEP_OVERHEAD_FIELD
from kerasflow.planner.parallel.ticktock import replica_coupled_ops
from kerasflow.profiling.host import host_lanes
from kerasflow.profiling.xplane import KernelTimes, StepProfiler
from kerasflow.strategies.collaborators import Collaborators
from kerasflow.strategies.options import Options
from kerasflow.strategies.plan_report import PlanReport
from kerasflow.strategies.reporting import Reporter

__all__ = ["profile_in_fit", "planning_request", "planned_report", "data_parallel_step", "may_split", "may_replicate",
           "placement_only", "ProfiledSteps", "LoopTime", "given_plan_mismatch"]


def profile_in_fit(model, batch, *, own_step: Callable, kernel_times, options: Options,
                   collaborators: Collaborators, reporter: Reporter, loop_seconds: float | None = None) -> OpGraph:
    """Profiles the model's own step at ``batch`` with the collaborators' profiler.

    Args:
        model: the model, on the default placement.
        batch: a real batch of its data (tensors).
        own_step: the model's own ``train_step`` (traced for the profile).
        kernel_times: the kernel times of ``fit``'s profiled steps, or None.
        options: the door's options.
        collaborators: the profiler and planner.
        reporter: where the phases are said.
        loop_seconds: the training loop's own seconds per train step (``LoopTime``), recorded in
            the profile (``STEP_OVERHEAD_FIELD``) so that every prediction is of ``fit``'s step.

    Returns:
        The profiled step.
    """
    say = reporter.say
    with _compat.overridden(model, "train_step", own_step):
        # The second profile at one replica's rows: data parallelism over every device is priced
        # at the batch its replicas run, not extrapolated from half of it.
        graph = collaborators.profiler(
            model, batch, device=options.devices[0], warmup_steps=1, steps=options.profile_steps,
            second_divisor=max(2, len(options.devices)),
            kernel_times=kernel_times, quiet=reporter.quiet, say=lambda message: say(f"kerasflow: {message}"),
            source="kerasflow in-fit profile")
    if loop_seconds is not None:
        graph = OpGraph(graph.ops, graph.edges, batch_size=graph.batch_size, name=graph.name,
                        metadata={**graph.metadata, STEP_OVERHEAD_FIELD: loop_seconds})
    return graph


def planning_request(model, graph: OpGraph, cluster: Cluster, options: Options, *, verbose: int) -> PlanRequest:
    """What the planner is asked for ``graph``: the options' planning settings, as far as the model
    allows them (no split or Tick-Tock for a model with its own ``train_step``, replicas only
    where ``may_replicate``).

    Example:
        >>> import keras
        >>> from kerasflow.planner.ir.synthetic import chain_mlp
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> options = Options(devices=("/CPU:0", "/CPU:1"), split="off")
        >>> request = planning_request(model, chain_mlp(layers=2), Cluster.preset("cpu-testbed:2"), options, verbose=0)
        >>> request.split, request.memory_limit
        (False, None)
    """
    custom = _compat.has_own_train_step(model)
    replicated = may_replicate(options, model, graph)
    return PlanRequest(
        graph, cluster, split=may_split(options, cluster, own_train_step=custom),
        tick_tock="off" if custom else options.tick_tock,
        memory_limit=options.memory_limit, max_split_evaluations=options.max_split_evaluations,
        replicated=replicated, replica_statistics=replicated and options.replicated == "on",  # the user allows it
        placement_only=placement_only(options), verbose=verbose)


def planned_report(graph: OpGraph, best: Plan, cluster: Cluster, options: Options, reporter: Reporter, *,
                   plan_seconds: float, wait_seconds: float, steps_while_planning: int) -> PlanReport:
    """Says the plan's line, writes the log files (``options.log_dir``) and returns the report of
    planning ``graph`` into ``best`` (the timings as ``PlanReport`` documents them)."""
    line = reporter.planned(best, plan_seconds, len(options.devices), parallel=data_parallel_step(best, graph, cluster))
    report = PlanReport(plan_seconds=plan_seconds, wait_seconds=wait_seconds, steps_while_planning=steps_while_planning,
                        algorithm=best.algorithm, summary=line,
                        predicted_step_time=best.predicted_step_time, candidates=dict(best.candidates),
                        excluded=dict(best.excluded) or None,
                        predicted_default_step_time=best.candidates.get(DEFAULT_PLACEMENT),
                        tie_margin=tie_margin_for(graph))
    if options.log_dir:
        reporter.write_logs(options.log_dir, best, graph, cluster)
    return report


def data_parallel_step(plan: Plan, graph: OpGraph, cluster: Cluster) -> float | None:
    """Data parallelism's predicted step on ``cluster``, the baseline the line after planning
    compares ``plan`` with (None when the planner kept the default placement: no line compares).

    Example:
        >>> from kerasflow.planner.ir.synthetic import chain_mlp
        >>> graph, cluster = chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> data_parallel_step(Plan(algorithm="heft"), graph, cluster) > 0
        True
        >>> data_parallel_step(Plan(algorithm=DEFAULT_PLACEMENT), graph, cluster) is None
        True
    """
    if plan.algorithm == DEFAULT_PLACEMENT:
        return None
    return baselines.data_parallel(graph, cluster).predicted_step_time


def may_split(options: Options, cluster: Cluster, *, own_train_step: bool) -> bool:
    """Whether the planner may split layers across the cluster's devices: ``split="on"``, or
    ``"auto"`` (the default) where no two of them share compute (GPUs, several hosts,
    ``cpu-testbed:N``). On one pool of compute (logical CPUs of one host) a layer's shards take
    cores from one another, so no split can shorten the critical path; on independent devices
    splitting the critical path is where FastT's gains come from. Never for a model with its own
    ``train_step``: its step is not rebuilt shard by shard.

    Example:
        >>> options = Options(devices=("/CPU:0", "/CPU:1"))
        >>> [may_split(options, Cluster.preset(name), own_train_step=False)
        ...  for name in ("logical-cpus:2", "cpu-testbed:2")]
        [False, True]
    """
    if own_train_step or options.split == "off":
        return False
    # The cluster's devices, not the options': the planner places over every one of them.
    return options.split == "on" or not cluster.shares_compute(cluster.device_names)


def placement_only(options: Options) -> bool:
    """Whether only plans that compute bit for bit as the default placement may run
    (``deterministic="on"``, or ``"auto"`` with TensorFlow's op determinism on): two runs of a
    script then give the same weights whichever plan the timings choose, since every candidate
    left adds each sum as the default placement does (``Plan.placement_only``).

    Example:
        >>> [placement_only(Options(devices=("/CPU:0", "/CPU:1"), deterministic=mode)) for mode in ("on", "off")]
        [True, False]
    """
    if options.deterministic == "auto":
        return _compat.op_determinism()
    return options.deterministic == "on"


def may_replicate(options: Options, model, graph: OpGraph) -> bool:
    """Whether the planner may replicate the step: ``replicated="on"``, or ``"auto"`` where the
    replicas keep the model's math (no batch-coupled op but BatchNormalization's, whose
    statistics they compute together) on one host (replicas across hosts are untested), on a
    runtime that can run them (a Keras 3 model whose train_step is Keras' own)."""
    if options.replicated == "off" or _compat.has_own_train_step(model) or not _compat.can_move_variables(model):
        return False
    one_host = len({task_of(d) for d in options.devices}) == 1
    return options.replicated == "on" or (one_host and not replica_coupled_ops(graph))


def given_plan_mismatch(model, batch, own_step: Callable, plan: Plan) -> tuple[OpGraph, str | None]:
    """The model's step structure (no costs) and, when ``plan`` was made for another model, why
    (its fingerprint differs), else None."""
    from kerasflow.profiling.profiler import graph_structure

    structure = graph_structure(model, batch, own_step)
    if not plan.graph_fingerprint or structure.fingerprint() == plan.graph_fingerprint:
        return structure, None
    return structure, (f"The plan was made for another model (fingerprint {plan.graph_fingerprint}, this model's "
                       f"{structure.fingerprint()}). Make a plan for this model, or pass on_mismatch='replan' to "
                       "profile and plan afresh.")


class LoopTime:
    """The training loop's own time: from the end of one call of the train function to the start of
    the next (Keras' callbacks and logs), recorded while the steps run on the default placement.

    Example:
        >>> loop = LoopTime()
        >>> for left, entered in ((0.0, 0.002), (0.010, 0.011), (0.020, 0.023)):
        ...     loop.left(left); loop.entered(entered)
        >>> loop.seconds(steps_per_call=1)
        0.002
    """

    def __init__(self):
        self._left_at: float | None = None
        self.gaps: list[float] = []

    def left(self, now: float | None = None) -> None:
        """A call of the train function ended (``now``: ``time.perf_counter()``)."""
        self._left_at = time.perf_counter() if now is None else now

    def entered(self, now: float | None = None) -> None:
        """A call of the train function starts."""
        now = time.perf_counter() if now is None else now
        if self._left_at is not None:
            self.gaps.append(now - self._left_at)

    def seconds(self, steps_per_call: int) -> float | None:
        """The median gap per train step (None before two calls)."""
        return statistics.median(self.gaps) / steps_per_call if self.gaps else None


class ProfiledSteps:
    """``fit``'s own steps under TensorFlow's profiler: it starts when made, each step is marked
    between ``enter`` and ``leave``, and ``stop`` returns the kernel times (``close`` stops it
    without them, after a failure or when ``fit`` ends first)."""

    def __init__(self, quiet: bool):
        self._profiler = StepProfiler(quiet=quiet, lanes=host_lanes())
        self._profiler.start()
        self._marked = None
        self.steps = 0

    def enter(self) -> None:
        """Marks the step about to run."""
        self._marked = self._profiler.step(self.steps)
        self._marked.__enter__()

    def leave(self) -> None:
        """Ends the step's mark once every device has finished the step (a GPU runs it after the
        train function returns)."""
        if self._marked is not None:
            wait_for_devices()
            self._marked.__exit__(None, None, None)
            self._marked, self.steps = None, self.steps + 1

    def stop(self) -> KernelTimes:
        """Stops the profiler: the kernel times of the marked steps."""
        return self._profiler.stop()

    def close(self) -> None:
        """Stops the profiler without reading it (after a failure, whose cause is the one to report,
        or a ``fit`` that ended first), a step's mark left open included."""
        try:
            if self._marked is not None:
                self._marked, marked = None, self._marked
                marked.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - already failing, or dropping the profile: the profiler stops anyway
            pass
        try:
            self._profiler.discard()
        except Exception:  # noqa: BLE001 - as above; no session is left running either way
            pass
