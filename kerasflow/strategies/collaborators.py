"""What the driver inside ``fit`` asks of the outside world — profile, plan, time a step — passed in, so tests and custom planners replace them without patching.

``Collaborators`` holds three callables. The defaults are kerasflow's own; a test gives a
planner that returns the plans it wants in the order it wants, and a
``kerasflow.testing.ScriptedStopwatch`` that still runs every step (the model's math is
untouched) but reports the seconds the test chose, so each path of the side-by-side trial (kept,
replaced, dropped) is reached without relying on this machine's timing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

from kerasflow.devices import wait_for_devices
from kerasflow.planner import ranked_plans

if TYPE_CHECKING:
    from kerasflow.planner import PlanRequest

__all__ = ["Collaborators", "stopwatch"]


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


def _profile(model, batch, **settings):
    from kerasflow.profiling.profiler import profile_training_step

    return profile_training_step(model, batch, **settings)


@dataclasses.dataclass(frozen=True)
class Collaborators:
    """The driver's collaborators (see the module docstring).

    Attributes:
        planner: ``planner(request) -> [best plan, *others]``, called once with a
            ``kerasflow.planner.PlanRequest``: the profiled step (``request.graph``), the cluster
            and the options' planning settings. The default is ``kerasflow.planner.ranked_plans``;
            a custom planner may plan a changed request (``dataclasses.replace(request, ...)``)
            or build its plans itself.
        stopwatch: ``stopwatch(step, plan) -> (outputs, seconds)``: runs one call of a train
            function (``plan`` None for the default placement) and times it. It runs every
            call of a plan in force, so a scripted one can also fail a chosen step.
        profiler: ``profiler(model, batch, **settings) -> OpGraph`` with the keyword arguments
            of ``kerasflow.profiling.profiler.profile_training_step`` (the default).

    Example:
        >>> import kerasflow
        >>> from kerasflow.testing import ScriptedStopwatch
        >>> parts = Collaborators(stopwatch=ScriptedStopwatch({None: 1.0, "heft": 3.0}))
        >>> strategy = kerasflow.FastTStrategy(verbose=0, collaborators=parts)  # heft would be dropped

        A planner that leaves the default placement out, so that ``fit`` always tries a plan:

        >>> import dataclasses
        >>> from kerasflow.planner import PlanRequest, ranked_plans, synthetic
        >>> from kerasflow.planner.search.planning import PLANNED_CANDIDATES
        >>> def a_plan_whatever_it_gains(request):
        ...     return ranked_plans(dataclasses.replace(request, candidates=PLANNED_CANDIDATES))
        >>> parts = Collaborators(planner=a_plan_whatever_it_gains)
        >>> request = PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie", split=False, verbose=0)
        >>> parts.planner(request)[0].algorithm != "default_placement"
        True
    """

    # kerasflow.planner's own function: a planning process imports it without TensorFlow.
    planner: Callable[[PlanRequest], list] = ranked_plans
    stopwatch: Callable[[Callable[[], Any], Any], tuple[Any, float]] = stopwatch
    profiler: Callable[..., Any] = _profile
