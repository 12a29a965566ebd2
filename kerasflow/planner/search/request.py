"""``PlanRequest``: what to plan and how, checked once; what ``plan`` and a custom planner are given."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .._jsonio import check_number
from ..errors import InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import refused_batch_sizes, temporary_bytes
from ..ir.plan import Plan
from ..schedule.listschedule import DEFAULT_MEMORY_HEADROOM, memory_budgets
from .candidates import CANDIDATES

__all__ = ["PlanRequest", "TICK_TOCK_MODES"]

TICK_TOCK_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """One training step to plan and every knob of the search, checked when it is made.

    ``plan(request)``, ``ranked_plans(request)`` and ``candidate_plans(request)`` take it; so does
    a custom planner given to ``Collaborators(planner=...)``, which may plan a changed copy
    (``dataclasses.replace(request, candidates=...)``, checked again). ``plan(graph, cluster,
    split=False)`` is short for ``plan(PlanRequest(graph, cluster, split=False))``.

    Args:
        graph: the step (a profile, or a synthetic graph).
        cluster: a ``Cluster``, a preset name or a cluster JSON path (held as the ``Cluster``).
        batch_size: the batch to plan for (default: the graph's).
        split: also try FastT's critical-path op splitting.
        tick_tock: ``"auto"`` adds Tick-Tock wave candidates (kept when they are faster, or
            when nothing fits without them) unless the model has batch-coupled ops such as
            BatchNormalization; ``"on"`` returns the best plan with waves (warning if the
            model has batch-coupled ops); ``"off"`` never uses waves.
        memory_limit: a cap in bytes for every device's memory.
        memory_headroom: the fraction of each device's memory left free (default 10 %).
        max_split_evaluations: the split search's budget, in plans scheduled and simulated.
        candidates: which base strategies to try (names from ``CANDIDATES``, in any order:
            they are tried in the registry's).
        replicated: also try strategies that replicate the step on every device (data
            parallelism, plain or with Tick-Tock waves).
        replica_statistics: also try data parallelism whose replicas normalize
            (BatchNormalization) with their own share's statistics, as ``MirroredStrategy``'s
            do, which changes the losses (candidate ``data_parallel_replica_statistics``). It
            comes before ``data_parallel`` in trial order: it waits for no ring, so it is the
            simpler plan and wins a tie. Off (the default): every data-parallel plan keeps one
            device's math.
        placement_only: only plans that add no sum in another order (``Plan.placement_only``: no
            replicas, no split layer, no waves), which compute as the default placement bit for
            bit; every candidate left out for it is named in ``Plan.excluded`` with that reason
            (what ``deterministic`` asks for inside ``fit``).
        tie_margin: candidates predicted within this fraction of the fastest count as tied,
            and the first of them in trial order (the simplest) wins; 0 keeps the fastest.
            None (the default): ``tie_margin_for(graph)``, from the profile's own noise.
        progress: called with each candidate's name when it is done.
        verbose: show a progress bar on stderr (only on a terminal; 0 or False: never).

    Attributes:
        budgets: the bytes the plan may use on each device, in the cluster's order (its memory,
            or ``memory_limit``, less the headroom and the step's temporary memory).

    Raises:
        InvalidClusterError: ``cluster`` is neither a ``Cluster``, a preset nor a cluster file.
        InvalidPlanError: an unknown candidate or ``tick_tock`` mode, a ``batch_size`` that is
            no whole number, one other than the graph's for a model that refused a smaller
            batch, a ``tie_margin`` outside [0, 1), or ``tick_tock="on"`` with ``placement_only``.
        InsufficientMemoryError: a ``memory_headroom`` outside [0, 1).

    Example:
        >>> from kerasflow.planner import synthetic
        >>> request = PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie", batch_size=16, split=False)
        >>> request.cluster.name, request.batch, len(request.budgets)
        ('2xK80-pcie', 16, 2)
        >>> PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie", tick_tock="always")
        Traceback (most recent call last):
        ...
        kerasflow.planner.errors.InvalidPlanError: tick_tock must be one of ('auto', 'on', 'off'); received 'always'.
    """

    graph: OpGraph
    cluster: Cluster
    batch_size: int | None = None
    split: bool = True
    tick_tock: str = "auto"
    memory_limit: float | None = None
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    max_split_evaluations: int = 48
    candidates: tuple[str, ...] = CANDIDATES
    replicated: bool = True
    replica_statistics: bool = False
    placement_only: bool = False
    tie_margin: float | None = None
    progress: Callable[[str], None] | None = None
    verbose: bool | int = True
    budgets: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "cluster", Cluster.resolve(self.cluster))
        object.__setattr__(self, "candidates", tuple(self.candidates))
        unknown = sorted(set(self.candidates) - set(CANDIDATES))
        if unknown:
            raise InvalidPlanError(f"Unknown candidate(s) {unknown}; choose from {list(CANDIDATES)}.")
        if self.tick_tock not in TICK_TOCK_MODES:
            raise InvalidPlanError(f"tick_tock must be one of {TICK_TOCK_MODES}; received {self.tick_tock!r}.")
        if self.tick_tock == "on" and self.placement_only:
            raise InvalidPlanError("tick_tock='on' asks for waves, which add the two waves' gradients in another "
                                   "order, and placement_only=True allows none (deterministic training asks for it). "
                                   "Pass tick_tock='auto' or 'off'. Received: tick_tock='on', placement_only=True")
        if self.batch_size is not None:
            check_number(self.batch_size, "batch_size", InvalidPlanError, kind="count",
                         fix="pass the batch to plan for")
        margin = self.tie_margin
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                                   or not 0 <= margin < 1):
            raise InvalidPlanError(f"tie_margin must be a fraction in [0, 1), such as 0.03, or None (from the "
                                   f"profile's noise). Received: tie_margin={margin!r}")
        budgets = memory_budgets(self.cluster, self.memory_limit, self.memory_headroom, temporary_bytes(self.graph))
        object.__setattr__(self, "budgets", tuple(budgets))
        refused = refused_batch_sizes(self.graph)
        if refused and self.batch != self.graph.batch_size:
            raise InvalidPlanError(
                f"The model refused a batch of {refused[0]} while it was profiled at {self.graph.batch_size}: it takes "
                f"only the batch it was profiled at. Received: batch_size={self.batch}. Plan for "
                f"batch_size={self.graph.batch_size}, or profile the model at the batch to plan for.")

    @property
    def batch(self) -> int:
        """The batch planned for: ``batch_size``, or the graph's."""
        return self.batch_size or self.graph.batch_size

    def fits(self, plan: Plan) -> bool:
        """Whether ``plan``'s simulated peak memory stays within every device's budget.

        Example:
            >>> from kerasflow.planner import synthetic
            >>> request = PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie")
            >>> request.fits(Plan(predicted_peak_memory={"/GPU:0": 2.0**40}))
            False
        """
        peaks = plan.predicted_peak_memory
        return all(peaks.get(d, 0.0) <= b * (1 + 1e-9) for d, b in zip(self.cluster.device_names, self.budgets))
