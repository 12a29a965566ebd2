"""``PlanReport``: what planning inside ``fit`` did and measured, as a typed object (also readable as a mapping)."""

from __future__ import annotations

import collections.abc
import dataclasses

__all__ = ["PlanReport"]


@dataclasses.dataclass
class PlanReport(collections.abc.Mapping):
    """What planning inside ``fit`` did for one model; a field is None until it happens.

    Also a read-only mapping of the fields that are set (``report["algorithm"]``,
    ``"plan_dropped" in report``, ``dict(report)``, ``report.items()``, ``report.get(...)``), as
    earlier versions returned a dict.

    Attributes:
        plan_seconds: profiling and planning, seconds (the retrace of the step on the plan
            happens in the next step).
        wait_seconds: what ``fit`` waited for them, seconds: the profile alone when the planner
            ran beside training (``background_planning``), else all of ``plan_seconds``.
        steps_while_planning: the steps trained on the default placement while the planner ran
            beside them (0 when ``fit`` waited for it).
        algorithm: the plan in force last (or dropped last).
        summary: the line printed when the plan was made.
        predicted_step_time: that plan's simulated step, seconds (``fit``'s step: the training
            loop's own time per step included).
        predicted_default_step_time: the default placement's simulated step from the same
            profile, seconds (the plan is "default_placement" when no plan was predicted enough
            faster: then kerasflow's work in ``fit`` ends there, with nothing tried).
        candidates: every candidate's predicted step, seconds, by name.
        excluded: every candidate left out, with why, by name (``Plan.excluded``: over memory,
            not applicable, handing a device a batch the model refused, unable to win).
        tie_margin: candidates predicted this close to the fastest were tied (from the
            profile's noise).
        measured_step_time: the median planned step timed inside ``fit``, seconds per train step
            (the train function's time: the training loop's own is not in it).
        default_step_time: the median step of the default placement timed beside it (not for
            ``drop_slower_plan=False`` or a given plan); with ``xla_step_time``, of the model's
            own step compiled with XLA.
        xla_step_time: the model's own step compiled with XLA (``jit_compile``), timed in
            warm-up by the callback door, seconds per train step: the default placement every plan
            was judged against, kept when no plan is predicted faster (None: the step runs
            without XLA, the default placement it is judged against too).
        measured_summary: the line printed when the timing ended.
        settled_step: the first step of ``fit`` after the timing.
        plan_replaced: which plan gave way to the runner-up, and why.
        plan_dropped: why the plan was dropped (training went on on the default placement).

    Example:
        >>> report = PlanReport(algorithm="heft", predicted_step_time=0.01)
        >>> report["algorithm"], "plan_dropped" in report, sorted(report)
        ('heft', False, ['algorithm', 'predicted_step_time'])
        >>> sorted(report.items())
        [('algorithm', 'heft'), ('predicted_step_time', 0.01)]
    """

    plan_seconds: float | None = None
    wait_seconds: float | None = None
    steps_while_planning: int | None = None
    algorithm: str | None = None
    summary: str | None = None
    predicted_step_time: float | None = None
    predicted_default_step_time: float | None = None
    candidates: dict | None = None
    excluded: dict | None = None
    tie_margin: float | None = None
    measured_step_time: float | None = None
    default_step_time: float | None = None
    xla_step_time: float | None = None
    measured_summary: str | None = None
    settled_step: int | None = None
    plan_replaced: str | None = None
    plan_dropped: str | None = None

    def _set(self) -> dict:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}

    def __getitem__(self, name: str):
        value = self._set().get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self):
        return iter(self._set())

    def __len__(self) -> int:
        return len(self._set())
