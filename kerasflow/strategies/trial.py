"""``Trial``: the plan in force timed side by side with the default placement, in ``fit``'s own steps.

The trial owns everything the timing needs and nothing else: the variables as they were before
the first plan moved them (``HomeVariables``), the default placement's train function (Keras'
own ``train_step``, traced on those variables), the schedule (``SideBySide``), the runners-up
and the stopwatch. A default step runs on the home variables, given the planned values on the
way in; on the way out the model's own variables take the step's values back and a
data-parallel plan's replicas are refreshed from them, so whenever control returns to Keras the
model's variables hold the current values. The verdict is ``verdict.judge``'s.

Timeline of one plan: its first step retraces (untimed); ``start_timing``; then the schedule's
steps; ``done``; ``judge``. A runner-up starts the same way, on the same home variables.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner.ir.plan import Plan
from kerasflow.strategies.side_by_side import SideBySide
from kerasflow.strategies.variables import HomeVariables
from kerasflow.strategies.verdict import TIMED_ROUNDS, Verdict, judge

__all__ = ["Trial"]

# Errors that end an epoch or a run the way Keras expects, not a failure of the timing.
NOT_OURS = (tf.errors.OutOfRangeError, StopIteration, KeyboardInterrupt)


class Trial:
    """The side-by-side timing of the plan in force (see the module docstring).

    Args:
        model: the model, before the first plan moves its variables.
        stopwatch: ``stopwatch(step, plan) -> (outputs, seconds)`` (``Collaborators.stopwatch``).
        against_default: whether default steps alternate with the planned ones (False: planned
            steps are timed for the report only).
        runners_up: the other candidates, best first (tried once, when the plan measures slower).
        unplanned: a context manager factory inside which the model has its own ``train_step``.
        compiling: a context manager factory inside which Keras makes the default placement's
            train function as the user compiled it (``XlaStep.compiled``: with XLA); None: as
            the model is set now.
        default_name: what the default placement runs, as the verdict names it.
    """

    def __init__(self, model, *, stopwatch: Callable, against_default: bool, runners_up: Sequence[Plan] = (),
                 unplanned: Callable, compiling: Callable | None = None,
                 default_name: str = "the default placement"):
        self.model = model
        self.compiling, self.default_name = compiling or contextlib.nullcontext, default_name
        self.stopwatch = stopwatch
        self.against_default = against_default
        self.runners_up = list(runners_up) if against_default else []
        self.unplanned = unplanned
        self.homes = HomeVariables(model) if against_default else None
        self.default_function: Callable | None = None
        self.schedule: SideBySide | None = None  # None while the plan's first step retraces
        self.failure: Exception | None = None  # a default step failed: the timing ends, the plan stays

    def start_timing(self) -> None:
        """The plan in force ran its first (retracing) step: its timed steps start."""
        self.schedule = SideBySide(TIMED_ROUNDS, against_default=self.against_default)

    @property
    def timing(self) -> bool:
        """True while steps are being timed."""
        return self.schedule is not None and not self.schedule.done

    @property
    def done(self) -> bool:
        """True once every scheduled step was timed."""
        return self.schedule is not None and self.schedule.done

    def run(self, planned: Callable, iterator, plan: Plan, replicas) -> Any:
        """One call of the train function: the plan's, or the default placement's when the
        schedule says so, timed when it is scheduled to be."""
        steps = _compat.steps_per_call(self.model)
        if not self.timing:
            return self.stopwatch(lambda: planned(iterator), plan)[0]
        if self.schedule.runs_default:
            try:
                outputs, seconds = self._run_default(iterator, replicas)
            except NOT_OURS:
                raise
            except Exception as error:  # noqa: BLE001 - an optional measurement: it never undoes the plan
                self.failure = error  # the driver ends the timing; the plan runs this call
                self.schedule = None
                return self.stopwatch(lambda: planned(iterator), plan)[0]
        else:
            outputs, seconds = self.stopwatch(lambda: planned(iterator), plan)
        self.schedule.record(seconds / steps)
        return outputs

    def _run_default(self, iterator, replicas):
        try:
            with self.unplanned(), self.homes.at_home():
                if self.default_function is None:
                    kept = self.model.train_function
                    with self.compiling():
                        self.model.make_train_function(force=True)  # Keras takes the train_step it sees now
                    self.default_function = self.model.train_function
                    _compat.override(self.model, "train_function", kept)
                with _compat.custom_gradients_forgotten():  # its first call traces Keras' step
                    return self.stopwatch(lambda: self.default_function(iterator), None)
        finally:  # the model's own variables hold the step's values again: the replicas take them
            if replicas is not None:
                replicas.refresh()

    def judge(self, plan: Plan, *, final: bool = False) -> tuple[Verdict, dict]:
        """The verdict on ``plan`` and what was measured (``measured_step_time``,
        ``default_step_time``, ``ratio``: see ``SideBySide``), from the rounds timed so far; ``final``: ``fit`` ended, so no
        runner-up is tried. The runner-up, when one is chosen, is taken from the list."""
        schedule = self.schedule or SideBySide(TIMED_ROUNDS, self.against_default)
        measured, default, ratio = schedule.planned_seconds, schedule.default_seconds, schedule.ratio
        if not self.against_default:
            verdict = Verdict(keep=True)  # timed for the report only
        else:
            verdict = judge(plan, measured, default, ratio, schedule.rounds_done, [] if final else self.runners_up,
                            default_name=self.default_name)
        if verdict.runner_up is not None:
            self.runners_up = []  # once
        self.schedule = None
        return verdict, {"measured_step_time": measured, "default_step_time": default, "ratio": ratio}
