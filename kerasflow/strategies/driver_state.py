"""``DriverState``: where the driver is, as plain data — one frozen state, and the only transitions between states.

The driver holds exactly one of these; everything else about its phase (whether a plan is in
force, which plan was chosen last, why training is on the default placement) is read from it::

    WarmingUp --> Profiling --> Planning --> InTrial --> Planned
        |             |             |           |           |
        +-------------+-------------+-----------+-----------+--> Default  (kept by the planner, dropped
                                                                 as slower, or a failure; for good)

and besides: ``WarmingUp --> InTrial``, a plan given up front; ``Profiling --> InTrial`` (or
``Default``), planning inside ``fit`` (``background_planning=False``), where ``Planning`` is the
planner in a process of its own; ``InTrial --> InTrial``, a runner-up. ``WarmingUp -->
WarmingUp`` is the replan of a given plan that does not fit the model (``on_mismatch="replan"``):
warm-up starts afresh without it. ``Profiling --> WarmingUp`` and ``Planning --> WarmingUp`` are
a ``fit`` that ended while its steps were profiled, or while the planner ran beside it. The
states are named apart from ``strategies.trial.Trial`` (the timing itself), which ``InTrial``
holds.

``AT_FIT_END`` says where each state goes when ``fit`` ends in it, normally or by an exception
(``Driver.fit_ended`` carries it out): nothing kerasflow started outlives the ``fit`` that
started it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the states hold these; the module itself runs on plain data
    from kerasflow.planner import Plan
    from kerasflow.planning_job import PlanningJob
    from kerasflow.strategies.in_force import InForce
    from kerasflow.strategies.planning_in_fit import ProfiledSteps
    from kerasflow.strategies.trial import Trial

__all__ = ["DriverState", "WarmingUp", "Profiling", "Planning", "InTrial", "Planned", "Default", "TRANSITIONS", "AT_FIT_END"]


@dataclasses.dataclass(frozen=True)
class DriverState:
    """One state of the driver (see the module docstring); ``name`` is the phase's name in logs.

    Example:
        >>> WarmingUp().then(Default("planning failed: RuntimeError: no plan today")).name
        'default'
        >>> Default("dropped").then(WarmingUp())
        Traceback (most recent call last):
        ...
        AssertionError: kerasflow: no transition from default to warming_up
    """

    name: ClassVar[str]

    def then(self, following: "DriverState") -> "DriverState":
        """``following``, when the driver may go there from this state (``TRANSITIONS``).

        Raises:
            AssertionError: it may not (a bug in the driver, never the user's doing).
        """
        if type(following) not in TRANSITIONS[type(self)]:
            raise AssertionError(f"kerasflow: no transition from {self.name} to {following.name}")
        return following

    @property
    def in_force(self) -> bool:
        """True while a plan runs (being timed or settled)."""
        return False

    @property
    def plan(self) -> "Plan | None":
        """The plan chosen last: in force, kept by the planner or left for the default placement
        (None before one was chosen)."""
        return None


@dataclasses.dataclass(frozen=True)
class WarmingUp(DriverState):
    """Steps on the default placement, recording a real batch.

    Attributes:
        given: the plan given up front (``plan=``) still to check and apply after step 0
            (None: profile and plan once warm-up is over).
        since: the step warm-up started at (after a replan, the step after the mismatch).

    Example:
        >>> WarmingUp(given=None, since=6).then(WarmingUp(since=7))  # a replan: afresh, without it
        WarmingUp(given=None, since=7)
    """

    name: ClassVar[str] = "warming_up"
    given: Plan | None = None
    since: int = 0


@dataclasses.dataclass(frozen=True)
class Profiling(DriverState):
    """``fit``'s own steps under TensorFlow's profiler.

    Attributes:
        steps: the profiled steps (``ProfiledSteps``).
    """

    name: ClassVar[str] = "profiling"
    steps: ProfiledSteps


@dataclasses.dataclass(frozen=True)
class Planning(DriverState):
    """The planner in a process of its own, steps on the default placement meanwhile.

    Attributes:
        job: the planning process (``PlanningJob``).
        since: the step it started after.
        profile_seconds: what ``fit`` waited for the profile that was planned.
    """

    name: ClassVar[str] = "planning"
    job: PlanningJob
    since: int
    profile_seconds: float


@dataclasses.dataclass(frozen=True)
class _PlanInForce(DriverState):
    """A state in which a plan runs: ``InTrial`` or ``Planned``.

    Attributes:
        parts: the plan put in force (``InForce``, the plan's one home while it runs).
    """

    parts: InForce

    @property
    def in_force(self) -> bool:
        return True

    @property
    def plan(self) -> Plan:
        return self.parts.plan


@dataclasses.dataclass(frozen=True)
class InTrial(_PlanInForce):
    """A plan in force (``parts``), timed beside the default placement.

    Attributes:
        trial: its timing (``Trial``).
    """

    name: ClassVar[str] = "trial"
    trial: Trial


@dataclasses.dataclass(frozen=True)
class Planned(_PlanInForce):
    """A plan in force (``parts``), settled: every later step runs on it."""

    name: ClassVar[str] = "planned"


@dataclasses.dataclass(frozen=True)
class Default(DriverState):
    """On the default placement for good.

    Attributes:
        reason: why (the placement report's ``fallback``).
        kept: the plan the planner chose when it kept the default placement (nothing was
            applied), else None.
        dropped: the plan chosen last before training went back (dropped as slower, or one that
            failed), else None.

    Example:
        >>> from kerasflow.planner import Plan
        >>> Default("the plan measured slower", dropped=Plan(algorithm="heft")).plan.algorithm
        'heft'
    """

    name: ClassVar[str] = "default"
    reason: str
    kept: Plan | None = None
    dropped: Plan | None = None

    @property
    def plan(self) -> Plan | None:
        return self.kept if self.kept is not None else self.dropped


TRANSITIONS: dict[type, frozenset[type]] = {
    WarmingUp: frozenset({WarmingUp, Profiling, InTrial, Default}),
    Profiling: frozenset({WarmingUp, Planning, InTrial, Default}),
    Planning: frozenset({WarmingUp, InTrial, Default}),
    InTrial: frozenset({InTrial, Planned, Default}),
    Planned: frozenset({Default}),
    Default: frozenset(),
}

# Where the driver is after a fit that ended in each state, normally or by an exception, and what
# that state leaves running: nothing. Warm-up's steps count on in the next fit (the XLA step's
# timing with them, wrapped once); a profile cut short stops TensorFlow's profiler and is
# dropped: the next fit warms up and profiles afresh (so does a planner still running beside the
# fit: its process is ended); a trial is judged on the steps it timed
# (no runner-up is tried): the plan is kept, or the default placement taken back.
AT_FIT_END: dict[type, frozenset[type]] = {
    WarmingUp: frozenset({WarmingUp}),
    Profiling: frozenset({WarmingUp}),
    Planning: frozenset({WarmingUp}),
    InTrial: frozenset({Planned, Default}),
    Planned: frozenset({Planned}),
    Default: frozenset({Default}),
}
