"""Planning beside training (``background_planning=True``, the default): the planner runs in a
process of its own while ``fit`` trains on the default placement; the plan starts at the step
after it arrives; a planner that dies or runs past its time limit leaves the default placement
with one line saying why; a ``fit`` that ends first leaves no process behind. Through both doors,
what the user reads equals plain Keras.

The planners are scripted (``planners_apart``): each answers when the test lets it (a file the
test's callback creates at a chosen step), so no assertion depends on this machine's speed.
"""

import os
import warnings

import keras
import numpy as np
import pytest

import kerasflow
from kerasflow.strategies import Collaborators
from tests.profiling import models
from tests.strategies import planners_apart

# Each test starts planning processes and waits on them (about 30 s in all): CI's slow step runs them,
# which keeps the README's suite under its 15 minutes.
pytestmark = pytest.mark.slow

BATCH = 16
# Warm-up is steps 0-1, step 2 is profiled; the planner starts after step 2.
OPTIONS = dict(verbose=0, warmup_steps=2, profile_steps=1, background_planning=True, drop_slower_plan=False)


class Watch(keras.callbacks.Callback):
    """Notes the driver's state after each step and, at the first step planned beside training,
    runs ``at_planning(job)``; at step ``release_at`` creates ``release`` (``released_later``)
    and waits for the planning process to end."""

    def __init__(self, driver_of, at_planning=None, release=None, release_at=None):
        super().__init__()
        self.driver_of, self.at_planning = driver_of, at_planning
        self.release, self.release_at = release, release_at
        self.states, self.jobs = [], []

    def on_train_batch_end(self, batch, logs=None):
        state = self.driver_of(self.model).state
        self.states.append(state.name)
        if state.name == "planning" and not self.jobs:
            self.jobs.append(state.job)
            if self.at_planning is not None:
                self.at_planning(state.job)
        if self.release is not None and len(self.states) == self.release_at:
            open(self.release, "w").close()
            self.jobs[0].process.wait(60)  # the plan is ready before the next step ends


def train(door: str, planner, steps: int, **watching):
    """A fresh MLP trained ``steps`` steps through ``door`` with ``planner`` beside training: the
    model, its history, the driver, the watch and kerasflow's warnings."""
    keras.utils.set_random_seed(7)
    collaborators = Collaborators(planner=planner)
    if door == "strategy":
        strategy = kerasflow.FastTStrategy(**OPTIONS, collaborators=collaborators)
        with strategy.scope():
            model = models.mlp(keras, dropout=False)
        door_callbacks, driver_of = [], strategy._driver_of
    else:
        model = models.mlp(keras, dropout=False)
        callback = kerasflow.callbacks.FastT(**OPTIONS, collaborators=collaborators)
        door_callbacks, driver_of = [callback], lambda _: callback.driver
    watch = Watch(driver_of, **watching)
    x, y = models.mlp_data(steps * BATCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                            callbacks=door_callbacks + [watch])
    said = [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]
    return model, history, driver_of(model), watch, said


def plain_keras(steps: int):
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    x, y = models.mlp_data(steps * BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    return model, history


def assert_as_plain_keras(model, history, steps: int):
    plain, plain_history = plain_keras(steps)
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    assert history.history == plain_history.history


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_steps_go_on_while_the_planner_plans_then_the_plan_runs_as_plain_keras(door, tmp_path, monkeypatch):
    release = str(tmp_path / "release")
    monkeypatch.setenv(planners_apart.RELEASE, release)
    model, history, driver, watch, said = train(door, planners_apart.released_later, 24, release=release,
                                                release_at=10)
    # Steps 3-10 ran while the planner waited for its release (so it could not delay them), then
    # the plan arrived and was put in force.
    assert watch.states[3:10] == ["planning"] * 7, watch.states
    assert driver.report["steps_while_planning"] >= 8 and driver.report["wait_seconds"] < driver.report["plan_seconds"]
    assert driver.in_force and driver.plan.algorithm == "single_device" and said == []
    assert_as_plain_keras(model, history, 24)
    assert not watch.jobs[0].running


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_planning_process_that_dies_leaves_the_default_placement_and_says_why(door):
    model, history, driver, watch, said = train(door, planners_apart.exits, 12,
                                                at_planning=lambda job: job.process.wait(60))
    assert driver.fallback.startswith("planning failed") and "exit code 3" in driver.fallback
    assert len(said) == 1 and "exit code 3" in said[0] and "training continues on the default placement" in said[0]
    assert_as_plain_keras(model, history, 12)


def test_a_planner_past_its_time_limit_is_stopped(monkeypatch):
    import time

    monkeypatch.setenv("KERASFLOW_PLANNING_TIME_LIMIT", "0.5")
    _, _, driver, watch, said = train("strategy", planners_apart.hangs, 12, at_planning=lambda job: time.sleep(0.7))
    assert "longer than its time limit of 0.5 s" in driver.fallback and len(said) == 1
    assert not watch.jobs[0].running


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_fit_that_ends_before_the_plan_leaves_no_process(door):
    model, history, driver, watch, said = train(door, planners_apart.hangs, 8)
    job = watch.jobs[0]
    assert watch.states[-1] == "planning" and driver.state.name == "warming_up"  # the next fit profiles afresh
    assert not job.running and not os.path.exists(job.folder)
    assert_as_plain_keras(model, history, 8)


def test_a_planner_no_process_can_import_plans_inside_fit():
    _, _, driver, watch, _ = train("strategy", lambda request: planners_apart.on_the_second_device(request), 12)
    assert "planning" not in watch.states and driver.report["steps_while_planning"] == 0
    assert driver.in_force and driver.plan.algorithm == "single_device"
