"""A ``fit`` that ends in any state of the driver, normally or by an exception, leaves nothing of
kerasflow's running (``driver_state.AT_FIT_END``): the next model is profiled as usual, and the
user's own profiler session starts."""

import warnings

import keras
import pytest
import tensorflow as tf

import kerasflow
from kerasflow.strategies import Collaborators
from kerasflow.strategies.driver_state import AT_FIT_END, Default, InTrial, Planned, Profiling, WarmingUp
from kerasflow.testing import ScriptedStopwatch
from tests.profiling import models
from tests.strategies import paths

BATCH = 16
# Warm-up is steps 0-1, steps 2-3 are profiled, the plan is made after step 3; its trial takes 8
# steps (the first planned step retracing, one untimed default step, 3 timed rounds of two steps).
OPTIONS = {**paths.OPTIONS, "profile_steps": 2}
# The state the driver is in after each step count, and the planner that gets it there.
ENDS = [
    ("warm-up", 1, "heft", WarmingUp),
    ("profiling", 3, "heft", Profiling),
    ("trial", 9, "heft", InTrial),  # a round of the trial timed: the plan measured faster is kept
    ("planned", 16, "heft", Planned),
    ("default", 5, "default_placement", Default),
]


class EndsFit(keras.callbacks.Callback):
    """Notes the driver's state after every step (after kerasflow's own hooks) and, with
    ``raising``, ends ``fit`` with an exception after the last step, as a user's callback may."""

    def __init__(self, driver_of, steps: int, raising: bool):
        super().__init__()
        self.driver_of, self.steps, self.raising = driver_of, steps, raising
        self.states = []

    def on_train_batch_end(self, batch, logs=None):
        self.states.append(type(self.driver_of(self.model).state))
        if self.raising and len(self.states) == self.steps:
            raise RuntimeError("the user's callback stops here")


def fit_until(door: str, steps: int, planner: str, raising: bool):
    """A fresh MLP trained ``steps`` steps through ``door``: the driver, the state its last step
    left, kerasflow's warnings, and ``again(steps)``: the same model's next fit through the door
    (its kerasflow warnings)."""
    collaborators = Collaborators(planner=paths.planner(planner),
                                  stopwatch=ScriptedStopwatch({None: 1.0, "heft": 0.5}))
    keras.utils.set_random_seed(7)
    if door == "strategy":
        strategy = kerasflow.FastTStrategy(**OPTIONS, collaborators=collaborators)
        with strategy.scope():
            model = models.mlp(keras, dropout=False)
        door_callbacks, driver_of = [], strategy._driver_of
    else:
        model = models.mlp(keras, dropout=False)
        callback = kerasflow.callbacks.FastT(**OPTIONS, collaborators=collaborators)
        door_callbacks, driver_of = [callback], lambda _: callback.driver

    def again(steps: int, ends=None, said=None) -> list[str]:
        x, y = models.mlp_data(steps * BATCH)
        said = [] if said is None else said
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                          callbacks=door_callbacks + ([ends] if ends else []))
            finally:  # kept when fit raises too
                said += [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]
        return said

    ends, said = EndsFit(driver_of, steps, raising), []
    if raising:
        with pytest.raises(RuntimeError, match="the user's callback stops here"):
            again(steps, ends, said)
    else:
        again(steps, ends, said)
    return driver_of(model), ends.states[-1], said, again


def users_profiler_starts(tmp_path) -> None:
    tf.profiler.experimental.start(str(tmp_path / "users_profile"))  # raises while another session runs
    tf.profiler.experimental.stop()


@pytest.mark.parametrize("raising", [False, True], ids=["normal-end", "exception"])
@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_fit_ending_in_any_state_leaves_nothing_running(door, raising, tmp_path):
    for name, steps, planner, state in ENDS:
        driver, last, said, _ = fit_until(door, steps, planner, raising)
        # Each fit was planned as usual (no profiler left by the fit before it), up to where it ended.
        assert last is state and not said, (name, last, said)
        assert isinstance(driver.state, tuple(AT_FIT_END[state])), (name, driver.state)
        users_profiler_starts(tmp_path)
    # A fit cut short while profiling: the model's next fit warms up and profiles afresh.
    driver, _, _, again = fit_until(door, 3, "heft", raising)
    assert isinstance(driver.state, WarmingUp) and driver.state.since == 3
    said = again(8)
    assert driver.graph is not None and driver.report.algorithm == "heft" and not said, (driver.state, said)
    users_profiler_starts(tmp_path)
