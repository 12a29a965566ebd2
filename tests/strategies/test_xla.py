"""XLA as the user had it, through both doors: the model's own XLA-compiled step is timed in
warm-up, every plan is judged against it, and XLA is back whenever the default placement is kept
(``model.jit_compile`` True after ``fit``); profiling says it profiles without it.

On CPUs XLA compiles with ``jit_compile=True`` (what ``"auto"`` resolves to on a GPU host). The
verdicts are forced with scripted seconds (every step still runs); the outputs are held to plain
Keras' XLA-compiled ``fit``: kerasflow runs some steps without XLA (its warm-up, profile and
trial), so the bound is ten times plain Keras' own spread between its steps with XLA and without,
measured in the same test.
"""

import inspect
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasflow
from kerasflow import _compat
from kerasflow.devices import LocalGPU
from kerasflow.planner import Plan
from kerasflow.strategies import Collaborators
from kerasflow.strategies.xla_step import COMPILING_STEPS, TIMED_STEPS
from kerasflow.testing import ScriptedStopwatch
from tests.profiling import models
from tests.strategies import paths

BATCH = 16
STEPS = 24  # 4 with XLA, 2 warm-up, 1 profiled, the trial's 8, and a few settled


def compiled_with_xla(function) -> bool:
    """Whether a train function Keras made runs its step through a ``tf.function`` compiled with
    XLA (Keras 3 keeps it in the closures of the function it returns; tf-keras returns it)."""
    seen, found = set(), [function]
    while found:
        candidate = found.pop()
        if id(candidate) in seen:
            continue
        seen.add(id(candidate))
        if isinstance(candidate, tf.types.experimental.PolymorphicFunction):
            if candidate._jit_compile:  # noqa: SLF001 - what tf.function(jit_compile=...) was given
                return True
            candidate = candidate.python_function
        if not inspect.isfunction(candidate):
            continue
        for cell in candidate.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            found.append(value)
    return False


def build(jit_compile=True):
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def fit(model, **kwargs):
    x, y = models.mlp_data(STEPS * BATCH)
    return model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, **kwargs)


def weights_apart(model, other) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), other.get_weights()))


@pytest.fixture(scope="module")
def plain():
    """Plain Keras' fit with XLA, and its spread to the same fit without XLA."""
    with_xla, without = build(True), build(False)
    fit(with_xla)
    fit(without)
    assert compiled_with_xla(with_xla.train_function) and not compiled_with_xla(without.train_function)
    return with_xla, weights_apart(with_xla, without)


def fit_through(door: str, seconds: dict, planner=None):
    """The MLP compiled with XLA trained through ``door`` ("strategy" or "callback"), its verdicts
    forced by ``seconds``: the model, what the door reports, and kerasflow's warnings."""
    collaborators = Collaborators(planner=planner or paths.planner("heft"), stopwatch=ScriptedStopwatch(seconds))
    if door == "strategy":
        handle = kerasflow.FastTStrategy(**paths.OPTIONS, collaborators=collaborators)
        with handle.scope():
            model = build(True)
        callbacks = []
    else:
        model = build(True)
        handle = kerasflow.callbacks.FastT(**paths.OPTIONS, collaborators=collaborators)
        callbacks = [handle]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, callbacks=callbacks)
    return model, handle, [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]


def driver_of(handle):
    return handle._driver_of() if isinstance(handle, kerasflow.FastTStrategy) else handle.driver


DOORS = ["strategy", "callback"]


@pytest.mark.parametrize("door", DOORS)
def test_no_plan_predicted_faster_than_the_xla_step_keeps_it(plain, door):
    reference, spread = plain
    model, handle, said = fit_through(door, {None: 1e-9})  # faster than any prediction
    report = handle.report
    assert report.xla_step_time == pytest.approx(1e-9)
    assert report.algorithm == "default_placement" and "with XLA" in report.summary
    assert report.measured_step_time is None  # nothing was tried
    assert handle.placement_report().fallback.startswith("no plan is predicted faster than the model's own step "
                                                        "with XLA: the best, heft")
    assert model.jit_compile is True and compiled_with_xla(driver_of(handle).model.train_function)
    assert driver_of(handle).collaborators.stopwatch.counts == {None: TIMED_STEPS}  # the steps after XLA compiled
    assert not said
    assert weights_apart(model, reference) <= 10 * spread


@pytest.mark.parametrize("door", DOORS)
def test_a_plan_slower_than_the_xla_step_beside_it_gives_xla_back(plain, door):
    reference, spread = plain
    model, handle, said = fit_through(door, {None: 1.0, "heft": 2.0})
    report = handle.report
    assert report.xla_step_time == 1.0 and report.default_step_time == 1.0 and report.measured_step_time == 2.0
    assert "slower than the default placement with XLA's 1000.00 ms" in report.plan_dropped
    assert said == [f"kerasflow: {report.plan_dropped}; training continues on the default placement. Pass "
                    "drop_slower_plan=False to keep a slower plan."]
    assert model.jit_compile is True and compiled_with_xla(model.train_function)  # the trial's, timed beside it
    assert not handle.plan_in_force
    assert weights_apart(model, reference) <= 10 * spread


@pytest.mark.parametrize("door", DOORS)
def test_a_plan_faster_than_the_xla_step_stays_without_xla(plain, door):
    reference, spread = plain
    model, handle, said = fit_through(door, {None: 1.0, "heft": 0.5})
    report = handle.report
    assert report.algorithm == "heft" and report.xla_step_time == 1.0
    assert report.default_step_time == 1.0 and report.measured_step_time == 0.5
    assert "the default placement with XLA measured 1000.00 ms in alternating steps: 2.00x" in report.measured_summary
    assert handle.plan_in_force and model.jit_compile is False and not said
    assert weights_apart(model, reference) <= 10 * spread


def test_xla_steps_come_before_kerasflow_own_warm_up():
    model, callback, _ = fit_through("callback", {None: 1e-9})
    assert callback.driver.xla.steps == COMPILING_STEPS + TIMED_STEPS == 4
    assert callback.report.settled_step is None and callback.profile is not None


@pytest.mark.parametrize("door", DOORS)
def test_a_plan_given_up_front_runs_without_xla_and_says_why(door, capsys):
    given = Plan(placement={}, batch_size=BATCH, algorithm="given")  # every op where TensorFlow puts it
    options = {**paths.OPTIONS, "verbose": 1, "plan": given}
    if door == "strategy":
        handle = kerasflow.FastTStrategy(**options)
        with handle.scope():
            model = build(True)
    else:
        model, handle = build(True), kerasflow.callbacks.FastT(**options)
    fit(model, callbacks=[handle] if door == "callback" else [])
    out = capsys.readouterr().out
    assert "jit_compile turned off" in out and "judged against the default placement without XLA" in out
    assert handle.plan_in_force and model.jit_compile is False and handle.report.xla_step_time is None


def test_keras_compiles_with_xla_by_itself_only_on_a_gpu_host():
    gpu = [LocalGPU(name="/GPU:0", card="/physical_device:GPU:0", kind="H100", memory=80 * 2**30, found="a test")]
    model = build(False)
    assert _compat.xla_by_default(model, gpu) and not _compat.xla_by_default(model, [])
