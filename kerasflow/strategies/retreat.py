"""``Retreat``: takes a model back to the default placement for good, its state intact, and names failures.

Made when the first plan is applied, it remembers where every variable lived before (the
default placement's devices). Going back gives the model its own ``train_step``, moves every
variable (the model's, the optimizers', the metrics') home with its value, rebuilds Keras'
train function and forgets the test and predict functions traced on the planned variables.
During a trial the way back is shorter: the trial's home variables become the model's again and
the default train function it traced on them runs on (the driver hands both over).
Across a cluster's tasks a silent task cannot hang the move for good: past ``MOVE_BACK_SECONDS``
the model's state is out of reach, which is the one error that ends ``fit``.
"""

from __future__ import annotations

import re
from typing import Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.multihost import run_within, silent_tasks, task_of
from kerasflow.planner.errors import ClusterConnectionError, KerasflowError
from kerasflow.strategies.variables import HomeVariables, current_homes, move_variables

__all__ = ["Retreat", "describe", "state_lost"]

# Long enough for gigabytes over a slow network, short enough that a silent task does not hang fit.
MOVE_BACK_SECONDS = 120


class Retreat:
    """The way back to the default placement (see the module docstring).

    Args:
        model: the model, before the first plan moves its variables.
        own_step: the model's own ``train_step``.
        devices: the devices planned over (to tell whether they span a cluster's tasks).
        creating: the strategy's factory ``f(device)`` letting a variable be made off its device.
    """

    def __init__(self, model, own_step, devices, creating=None):
        self.model, self.own_step, self.creating = model, own_step, creating
        self.homes = current_homes(model)
        self.across_tasks = len({task_of(d) for d in devices}) > 1

    def go(self, homes: HomeVariables | None = None, default_function: Callable | None = None) -> None:
        """Moves everything home and puts Keras' own train function back.

        Args:
            homes: the home variables of the trial still timing the plan, if it has them: they
                take the current values and are the model's again (no new variables).
            default_function: the default train function that trial traced on them, if it did:
                reused (no retrace).

        Raises:
            KerasflowError: the variables could not be moved back (``ClusterConnectionError``
                when a task stopped answering): training cannot continue on any placement.
        """
        model = self.model
        _compat.override(model, "train_step", self.own_step)
        if homes is not None:
            move = homes.come_home
        else:
            def move():
                move_variables(model, self.homes, creating=self.creating)
        lost = None
        try:
            if self.across_tasks:  # a silent task must not hang this call for good
                run_within(move, MOVE_BACK_SECONDS)
            else:
                move()
        except TimeoutError:
            lost = tf.errors.UnavailableError(
                None, None, f"moving the variables back did not finish within {MOVE_BACK_SECONDS} s")
        except Exception as failure:  # noqa: BLE001 - named in the error below
            lost = failure
        if homes is not None and default_function is not None:
            _compat.override(model, "train_function", default_function)
        else:
            model.make_train_function(force=True)
        _compat.forget_traced_functions(model)
        if lost is not None:
            raise state_lost(lost) from None


def state_lost(error: BaseException) -> KerasflowError:
    """The error that ends ``fit`` when the model's variables are out of reach."""
    text = str(error)
    if not isinstance(error, tf.errors.UnavailableError):
        return KerasflowError(
            f"kerasflow: the model's variables could not be moved back to their default devices ({describe(error)}),"
            " so training cannot continue. Resume from your last checkpoint (keras.callbacks.BackupAndRestore or "
            "ModelCheckpoint), and report this with the model's code.")
    task = re.search(r"remote target (/job:[\w-]+/replica:\d+/task:\d+)", text)
    address = re.search(r"ipv[46]:(\[[^\]]+\]:\d+|[\d.]+:\d+)", text)
    if task:
        where = task.group(1) + (f" at {address.group(1)}" if address else "")
    else:  # TensorFlow's message does not say which: ask the tasks
        where = ", ".join(f"/job:{job}/replica:0/task:{index} at {at}" for job, index, at in silent_tasks()) or (
            "a task of the cluster")
    return ClusterConnectionError(
        f"kerasflow: {where} stopped answering during fit ({describe(error)}). The model's variables placed there "
        "are lost with it, so training cannot continue on any placement: restart `python -m kerasflow.worker` on "
        "that host and resume from your last checkpoint (keras.callbacks.BackupAndRestore or ModelCheckpoint).")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_WRAPPER = "Exception encountered when calling"  # Keras' first line around an error inside a layer


def describe(error: BaseException) -> str:
    """The error's type and first line of its own message (under Keras' line naming the layer).

    Example:
        >>> describe(ValueError("Exception encountered when calling Dense.call().\\nshapes differ"))
        'ValueError: shapes differ'
    """
    lines = [line.strip() for line in _ANSI.sub("", str(error)).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith(_KERAS_WRAPPER):
        lines = lines[1:]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]
