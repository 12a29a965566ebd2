"""What the driver inside ``fit`` asks of the outside world — profile, plan, time a step — passed in, so tests and custom planners replace them without patching.

``Collaborators`` holds three callables. The defaults are kerasflow's own; a test gives a
planner that returns the plans it wants in the order it wants, and a ``ScriptedStopwatch``
that still runs every step (the model's math is untouched) but reports the seconds the test
chose, so each path of the side-by-side trial (kept, replaced, dropped) is reached without
relying on this machine's timing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from kerasflow.devices import wait_for_devices

__all__ = ["Collaborators", "ScriptedStopwatch", "stopwatch"]


def stopwatch(step: Callable[[], Any], plan) -> tuple[Any, float]:
    """Runs ``step()`` and returns ``(outputs, seconds)`` up to its outputs' values and the end of
    every device's work (``devices.wait_for_devices``: a GPU runs the step after it returns).

    Args:
        step: one call of a train function.
        plan: the plan the step runs (None: the default placement); unused here.
    """
    import tensorflow as tf

    started = time.perf_counter()
    outputs = step()
    values = outputs
    if isinstance(outputs, tf.experimental.Optional):  # Keras 3's train function
        values = outputs.get_value() if outputs.has_value() else []
    for value in tf.nest.flatten(values):
        if isinstance(value, tf.Tensor):
            value.numpy()
    wait_for_devices()
    return outputs, time.perf_counter() - started


def _plan_ranked(graph, cluster, **settings):
    from kerasflow.planner import ranked_plans

    return ranked_plans(graph, cluster, **settings)


def _profile(model, batch, **settings):
    from kerasflow.profiling.profiler import profile_training_step

    return profile_training_step(model, batch, **settings)


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


@dataclasses.dataclass(frozen=True)
class Collaborators:
    """The driver's collaborators (see the module docstring).

    Attributes:
        planner: ``planner(graph, cluster, **settings) -> [best plan, *others]`` with the
            keyword arguments of ``kerasflow.planner.ranked_plans`` (the default).
        stopwatch: ``stopwatch(step, plan) -> (outputs, seconds)``: runs one call of a train
            function (``plan`` None for the default placement) and times it. It runs every
            call of a plan in force, so a scripted one can also fail a chosen step.
        profiler: ``profiler(model, batch, **settings) -> OpGraph`` with the keyword arguments
            of ``kerasflow.profiling.profiler.profile_training_step`` (the default).

    Example:
        >>> import kerasflow
        >>> parts = Collaborators(stopwatch=ScriptedStopwatch({None: 1.0, "heft": 3.0}))
        >>> strategy = kerasflow.FastTStrategy(verbose=0, collaborators=parts)  # heft would be dropped
    """

    planner: Callable[..., list] = _plan_ranked
    stopwatch: Callable[[Callable[[], Any], Any], tuple[Any, float]] = stopwatch
    profiler: Callable[..., Any] = _profile
