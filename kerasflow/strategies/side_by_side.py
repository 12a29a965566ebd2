"""Which placement each of ``fit``'s next steps runs while a plan is timed against the default placement, and the verdict.

A plan is judged by steps of ``fit`` itself: planned steps alternate with steps of the default
placement, one of each a round, so that the load of a shared machine, which moves on a scale
of seconds, weighs on both alike. Each round gives one ratio (the planned step's time over the
default step's); the verdict is the median ratio of the rounds. One untimed default step comes
first: its first call traces the default train function. Without the default placement
(``against_default=False``) only planned steps are timed, for the report.

This module only keeps the schedule and the times; the driver runs the steps.
"""

from __future__ import annotations

import statistics

__all__ = ["SideBySide"]


class SideBySide:
    """The schedule and the times of one plan's side-by-side timing (see the module docstring).

    Args:
        rounds: how many rounds (with ``against_default``) or planned steps (without) to time.
        against_default: whether default steps alternate with the planned ones.

    Example:
        >>> trial = SideBySide(rounds=2)
        >>> trial.runs_default  # first, the untimed default step
        True
        >>> for seconds in (9.0, 1.2, 1.0, 1.1, 1.0):  # then plan, default, twice
        ...     trial.record(seconds)
        >>> trial.done, trial.planned_seconds, trial.default_seconds, round(trial.ratio, 3)
        (True, 1.15, 1.0, 1.15)
    """

    def __init__(self, rounds: int, against_default: bool = True):
        if rounds < 1:
            raise ValueError(f"A side-by-side timing needs at least one round. Received: rounds={rounds}")
        self.against_default = against_default
        # (runs the default placement, timed) per step, in order.
        self._schedule = ([(True, False)] + [(runs_default, True) for _ in range(rounds) for runs_default in
                                             (False, True)]) if against_default else [(False, True)] * rounds
        self._planned: list[float] = []
        self._default: list[float] = []

    @property
    def done(self) -> bool:
        """True once every scheduled step was recorded."""
        return not self._schedule

    @property
    def runs_default(self) -> bool:
        """Whether the next step runs on the default placement (False once done)."""
        return bool(self._schedule) and self._schedule[0][0]

    def record(self, seconds: float) -> None:
        """Takes the time of the step just run (the one ``runs_default`` said)."""
        if not self._schedule:
            raise ValueError(f"Every scheduled step was recorded already. Received: seconds={seconds}")
        runs_default, timed = self._schedule.pop(0)
        if timed:
            (self._default if runs_default else self._planned).append(seconds)

    @property
    def planned_seconds(self) -> float | None:
        """The median planned step, seconds (None before one was timed)."""
        return statistics.median(self._planned) if self._planned else None

    @property
    def rounds_done(self) -> int:
        """The rounds completed (a planned and a default step each; planned steps without the default placement)."""
        return min(len(self._planned), len(self._default)) if self.against_default else len(self._planned)

    @property
    def default_seconds(self) -> float | None:
        """The median default step, seconds (None without the default placement)."""
        return statistics.median(self._default) if self._default else None

    @property
    def ratio(self) -> float | None:
        """The median over rounds of planned / default step time (None without the default placement)."""
        if not self._default:
            return None
        return statistics.median(p / d for p, d in zip(self._planned, self._default))
