"""``XlaStep``: the model's own XLA-compiled step, timed in warm-up: the default placement a plan must beat (both doors).

Keras 3 compiles a step with XLA on a GPU host when no ``tf.distribute`` strategy is in use
(``jit_compile="auto"``), so a user who adds ``kerasflow.callbacks.FastT()`` to a plain ``fit``
trains an XLA-compiled step; under any strategy, ``FastTStrategy`` included, only an explicit
``compile(jit_compile=True)`` does. XLA fuses the step into a few clusters, which erases per-op
placement and per-op profiles, so kerasflow profiles and plans without it; but the default
placement a plan is judged against stays the user's own step, with XLA:

- its first ``COMPILING_STEPS`` calls (XLA compiles) run untimed, the next ``TIMED_STEPS`` are
  timed with the driver's stopwatch (the median is ``seconds``); then XLA is turned off for the
  warm-up, profiling and planning that follow;
- a plan must be predicted faster than that measured step to be tried at all, and its trial
  times it beside the step compiled with XLA again (``compiled``);
- whenever the default placement is kept or taken back, XLA is turned on again (``restore``).
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Callable

from kerasflow import _compat

__all__ = ["XlaStep", "COMPILING_STEPS", "TIMED_STEPS"]

COMPILING_STEPS = 1
# As many as the side-by-side trial's rounds: a median of three survives one outlier.
TIMED_STEPS = 3


class XlaStep:
    """The model's XLA-compiled step (see the module docstring).

    Args:
        model: a model whose step compiles with XLA (``_compat.uses_jit``).
        stopwatch: ``stopwatch(step, plan) -> (outputs, seconds)`` (``Collaborators.stopwatch``);
            its steps are the default placement's (``plan`` None).
        timed: whether its steps are timed in warm-up (False: a plan was given up front, so XLA
            is off from the start and only ``restore`` is of use).

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse", jit_compile=True)
        >>> xla = XlaStep(model, stopwatch=lambda step, plan: (step(), 0.004))
        >>> xla.steps, xla.seconds
        (4, None)
        >>> xla.turn_off(); model.jit_compile
        False
        >>> xla.restore(); model.jit_compile
        True
    """

    def __init__(self, model, *, stopwatch: Callable, timed: bool = True):
        self.model, self.stopwatch, self.timed = model, stopwatch, timed
        self.calls = 0
        self.times: list[float] = []

    @property
    def steps(self) -> int:
        """The warm-up steps run with XLA before kerasflow's own warm-up (0 when not timed)."""
        return COMPILING_STEPS + TIMED_STEPS if self.timed else 0

    @property
    def seconds(self) -> float | None:
        """The median XLA step timed, seconds per train step (None before one was timed)."""
        return statistics.median(self.times) if self.times else None

    def time_calls(self, first_step: int) -> None:
        """Times the calls of the train function Keras made (the model's own step with XLA), past
        the compiling ones; ``first_step``: the number of ``fit``'s step the next call runs (the
        driver's count). Once: a train function already timed is left as it is."""
        function = self.model.train_function
        if getattr(function, "_kerasflow_timing_xla", False):
            return
        steps = _compat.steps_per_call(self.model)
        self.calls = first_step

        def timed(iterator):
            self.calls += 1
            if self.calls <= COMPILING_STEPS:
                return function(iterator)
            outputs, seconds = self.stopwatch(lambda: function(iterator), None)
            self.times.append(seconds / steps)
            return outputs

        timed._kerasflow_timing_xla = True
        _compat.override(self.model, "train_function", timed)

    def turn_off(self) -> None:
        """XLA off for the train functions made from here (kerasflow's warm-up, profile and plan)."""
        _compat.set_jit(self.model, False)

    def restore(self) -> None:
        """XLA on again, as the user had it: the default placement is kept or taken back."""
        _compat.set_jit(self.model, True)

    @contextlib.contextmanager
    def compiled(self):
        """Inside, a train function Keras makes compiles with XLA (the trial's default placement)."""
        self.restore()
        try:
            yield
        finally:
            self.turn_off()

    def beaten_by(self, predicted_step: float, loop_seconds: float | None) -> bool:
        """Whether a plan predicted at ``predicted_step`` (``fit``'s step, the training loop's own
        ``loop_seconds`` included) is faster than the XLA step measured (True before one was).

        Example:
            >>> xla = XlaStep(None, stopwatch=None)
            >>> xla.times = [0.010, 0.012, 0.011]
            >>> xla.beaten_by(0.0105, loop_seconds=0.001), xla.beaten_by(0.0125, loop_seconds=0.001)
            (True, False)
        """
        return self.seconds is None or predicted_step < self.seconds + (loop_seconds or 0.0)
