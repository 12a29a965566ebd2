"""``ScriptedStopwatch``: a stopwatch for ``Collaborators`` that runs every step but reports the seconds a test chose.

The driver inside ``fit`` times each step of a plan in force with its ``Collaborators``'
stopwatch and keeps, replaces or drops the plan on what it reports. A ``ScriptedStopwatch``
still runs each step (the model's math is untouched) but reports seconds from a script, by
plan, so that each path of the side-by-side trial (kept, replaced, dropped) and a failure at a
chosen step are reached without relying on the machine's timing.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["ScriptedStopwatch"]


class ScriptedStopwatch:
    """A stopwatch that runs each step and reports the seconds a script gives it, by plan.

    Args:
        seconds: the seconds a step of each plan reports, by ``Plan.algorithm``; the key None is
            the default placement. A value may also be a function of the count of steps of that
            plan run so far (from 0). A plan not in the script raises ``KeyError``.
        fail_from: optional ``(algorithm or None, count)``: from that step of that plan on, steps
            raise ``RuntimeError`` instead of running (a failure forced at a chosen step).
        failures: how many steps fail from there (None: every one, so that retrying without the
            plan's per-device order does not cure it; 1: the retry runs).

    Example:
        >>> watch = ScriptedStopwatch({"heft": 2.0, None: 1.0})
        >>> class Heft:
        ...     algorithm = "heft"
        >>> watch(lambda: "planned outputs", Heft())
        ('planned outputs', 2.0)
        >>> watch(lambda: "default outputs", None)
        ('default outputs', 1.0)
        >>> import kerasflow
        >>> parts = kerasflow.strategies.Collaborators(stopwatch=ScriptedStopwatch({None: 1.0, "heft": 3.0}))
        >>> strategy = kerasflow.FastTStrategy(verbose=0, collaborators=parts)  # heft would be dropped
    """

    def __init__(self, seconds: dict, fail_from: tuple | None = None, failures: int | None = None):
        self.seconds = dict(seconds)
        self.fail_from, self.failures = fail_from, failures
        self.counts: dict = {}

    def __call__(self, step: Callable[[], Any], plan) -> tuple[Any, float]:
        key = None if plan is None else plan.algorithm
        count = self.counts.get(key, 0)
        self.counts[key] = count + 1
        failing = self.fail_from is not None and self.fail_from[0] == key and count >= self.fail_from[1]
        if failing and (self.failures is None or count < self.fail_from[1] + self.failures):
            raise RuntimeError(f"a failure forced at step {count} of {key or 'the default placement'}")
        seconds = self.seconds[key]
        return step(), seconds(count) if callable(seconds) else seconds
