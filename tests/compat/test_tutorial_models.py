"""The compatibility suite: Keras models written as the keras.io tutorials write them, through both doors, as users run them.

Each pattern is trained from the same seed on the default strategy (plain Keras) and through
kerasflow twice:

- ``strategy``: under ``FastTStrategy`` in the default configuration: the plan is timed beside
  the default placement in fit's own steps and, as this machine's load decides, kept, replaced
  or dropped, or settled when fit ends during the timing. Whatever happened, no kerasflow
  failure may be warned, and the losses, every validation metric and ``predict()`` must equal
  plain Keras' to 1e-5 relative (a model computing in float16 predicts to two float16 steps; when
  a plan that is not placement-only ran (replicas, waves or a split layer, which sum in another
  order), everything to ten times plain Keras' own spread with each batch's rows permuted: ``kerasflow/testing/rounding.py``); the model must then
  keep its course through a second ``fit``, and evaluate, predict, save and load (weights,
  ``.keras``, legacy ``.h5``) as plain Keras allows.
- ``forced``: through the ``FastT`` callback (the strategy for the two largest, MobileNetV2 and
  the text transformer, which have no callback route to keep the suite within its time), with
  the trial's verdict forced (``Collaborators``): the first plan measures slower than the
  default placement, the runner-up is tried and measures slower too, and the plan is dropped.
  The run is long enough for both timings; the same outputs must equal plain Keras'. Its plans
  are made from the profiled step with datasheet costs, so every run tries the same two (with
  measured costs the machine's load chose them, and a CI run once met a placement no local run
  reproduced). The plans tried there keep one device's order of summation (no replicas, no
  waves): over dozens of steps a reordered sum drifts past 1e-5 on some of these models
  (MobileNetV2 by percents: plain Keras itself drifts as far when one batch's rows are
  reordered, ``benchmarks/heldout_mobilenet.py``), and the switches, not the plans' arithmetic,
  are under test. For MobileNetV2 even one
  device's placement over several (each its own threads) drifts as far as plain Keras does when
  one batch's rows are reordered, so its longer run is compared over its first epoch.
"""

import dataclasses
import functools
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasflow.planner import Cluster, ranked_plans
from kerasflow.planner.search.planning import CANDIDATES
from kerasflow.planner.ir.costmodel import estimate_costs
from kerasflow.strategies import Collaborators
from kerasflow.strategies.verdict import TIMED_ROUNDS
from kerasflow.testing import PlansThatRan, ScriptedStopwatch, tutorial_runs
from kerasflow.testing.rounding import Spread, compute_dtype
from kerasflow.testing.tutorial_models import PATTERNS, Pattern
from kerasflow.testing.tutorial_runs import (assert_like_plain_keras, fit_arguments, flat_outputs, inference_kwargs,
                                             kerasflow_warnings, plain_keras)
from tests.planned_cluster import CLUSTER_OPTION

EPOCHS = 1
# MobileNetV2's runs take half a minute to two minutes on two cores: CI runs them in a step of
# their own (``-m slow``), as it does the other slow tests.
EACH_PATTERN = [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name == "mobilenet_v2" else [])
                for p in PATTERNS]
# Calls of the train function a forced replacement and drop needs: 2 warm-up + 1 profiled + the
# plan's first step, an untimed default step and TIMED_ROUNDS rounds of 2, then the same for the runner-up.
FORCED_CALLS = 4 + (1 + 2 * TIMED_ROUNDS) + (2 + 2 * TIMED_ROUNDS)


def runners_up_worth_a_try(request):
    """kerasflow's planner on the profiled step with datasheet costs (``estimate_costs``), so
    every run plans the same (measured costs ride on the machine's load, and so would the plans),
    for the logical CPUs taken as independent devices (on their shared host every plan ties with
    the default placement, and the route needs plans that use several), every runner-up predicted
    a millionth of the first plan's step (so the first's measured slowness, scaled onto plans of
    its kind, still leaves them worth a try)."""
    cluster = request.cluster
    independent = Cluster(cluster.devices, cluster.default_link, name=cluster.name)
    first, *others = ranked_plans(dataclasses.replace(
        request, graph=estimate_costs(request.graph, cluster.kinds()), cluster=independent,
        candidates=tuple(c for c in CANDIDATES if c != "default_placement")))
    return [first] + [dataclasses.replace(p, predicted_step_time=first.predicted_step_time * 1e-6) for p in others]


def forced_drop_after_a_replacement() -> Collaborators:
    """Every planned step reports 1 s, every default step 1 ms."""
    class EverySlower(ScriptedStopwatch):
        def __call__(self, step, plan):
            return step(), 1e-3 if plan is None else 1.0
    return Collaborators(planner=runners_up_worth_a_try, stopwatch=EverySlower({}))


# The forced route's door: the verdict forced, and only plans that keep one device's summation order.
FORCED = {"collaborators": forced_drop_after_a_replacement(), "replicated": "off", "tick_tock": "off", "split": "off"}


@functools.lru_cache(maxsize=None)
def calls_per_epoch(name: str) -> int:
    """How many times fit calls the train function in one epoch of a pattern."""
    pattern = next(p for p in PATTERNS if p.name == name)
    args, kwargs = fit_arguments(pattern)
    if isinstance(args[0], tf.data.Dataset):
        batches = sum(1 for _ in args[0])
    else:
        samples = len(args[0]) if not isinstance(args[0], dict) else len(next(iter(args[0].values())))
        samples = int(samples * (1 - kwargs.get("validation_split", 0.0)))
        batches = math.ceil(samples / kwargs.get("batch_size", 32))
    return math.ceil(batches / pattern.build().steps_per_execution)


def train(pattern: Pattern, route: str | None, epochs: int = EPOCHS, collaborators: Collaborators | None = None,
          rows_permuted: bool = False):
    """``tutorial_runs.train`` as the suite runs it, for the cluster it plans for
    (``tests/planned_cluster.py``): ``route`` None (plain Keras), "strategy" or "callback" with
    the given collaborators, or "forced" (``FORCED``, through the callback where the pattern has
    that route, else the strategy)."""
    if route == "forced":
        door = "callback" if pattern.callback_route else "strategy"
        return tutorial_runs.train(pattern, door, epochs, **CLUSTER_OPTION, **FORCED)
    return tutorial_runs.train(pattern, route, epochs, rows_permuted, collaborators=collaborators, **CLUSTER_OPTION)


def test_there_are_at_least_fifteen_patterns():
    assert len(PATTERNS) >= 15


@functools.lru_cache(maxsize=None)
def plain_keras_spread(name: str) -> Spread:
    """Plain Keras' own spread (every loss, metric and prediction) when each batch's rows come
    permuted: the same math, summed in another order (``kerasflow/testing/rounding.py``)."""
    pattern = next(p for p in PATTERNS if p.name == name)
    _, history, predictions, _ = train(pattern, None, rows_permuted=True)
    plain_history, plain_predictions = plain_keras(name)
    return Spread.between({**plain_history, "predictions": plain_predictions},
                          {**history, "predictions": predictions})


@pytest.mark.parametrize("pattern", EACH_PATTERN)
def test_pattern_trains_like_plain_keras_in_the_default_configuration(pattern, tmp_path):
    expected = plain_keras(pattern.name)
    watch = PlansThatRan()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history, predictions, door = train(pattern, "strategy", collaborators=Collaborators(stopwatch=watch))
    said = kerasflow_warnings(caught)
    # A plan measured slower is dropped with one line saying so; nothing else may be warned.
    assert all("slower than the default placement" in line or "fit ended before the plan was timed" in line
               for line in said), said
    # On logical CPUs the planner usually keeps the default placement (nothing tried); where it
    # predicts a plan faster, the plan is timed, then kept or dropped.
    report = door.placement_report()
    assert door.plan is not None and report is not None, "nothing was planned"
    assert report.in_force or report.default_kept or "plan_dropped" in door.report, report.fallback
    # Replicas, waves and split layers sum in another order than one device: then every output is
    # held to plain Keras' own spread under permuted rows (MobileNetV2 turns one rounding into
    # percents within a step or two: measured, a data-parallel plan 1.8e-3 from plain Keras' loss).
    assert_like_plain_keras(history, predictions, expected,
                            predictions_follow_rounding=pattern.predictions_follow_rounding,
                            dtype=compute_dtype(model),
                            spread=None if watch.placement_only else plain_keras_spread(pattern.name))
    check_a_second_fit_keeps_its_course(pattern, model, door)
    check_evaluate_predict_save_load(pattern, model, tmp_path)


@pytest.mark.parametrize("pattern", EACH_PATTERN)
def test_pattern_trains_like_plain_keras_through_a_forced_replacement_and_drop(pattern):
    epochs = math.ceil(FORCED_CALLS / calls_per_epoch(pattern.name))
    expected = plain_keras(pattern.name, epochs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history, predictions, door = train(pattern, "forced", epochs)
    said = kerasflow_warnings(caught)
    assert len(said) == 1 and "slower than the default placement" in said[0], said
    assert "plan_replaced" in door.report and "plan_dropped" in door.report
    assert not door.plan_in_force
    assert_like_plain_keras(history, predictions, expected, epochs=1 if pattern.amplifies_rounding else None,
                            predictions_follow_rounding=pattern.predictions_follow_rounding,
                            dtype=compute_dtype(model))


def check_a_second_fit_keeps_its_course(pattern: Pattern, model, door):
    plan, in_force = door.plan, door.plan_in_force
    args, kwargs = fit_arguments(pattern)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(*args, epochs=1, verbose=0, shuffle=False, **kwargs)
    # A model Keras finalizes no optimizer for (a GAN compiled with its own) may still be timing its
    # plan under the strategy: the timing then ends in this fit, possibly dropping it.
    said = kerasflow_warnings(caught)
    assert all("slower than the default placement" in line for line in said), said
    assert door.plan is plan and door.plan_in_force is (in_force and not said)  # not profiled again


def check_evaluate_predict_save_load(pattern: Pattern, model, tmp_path):
    args, _ = fit_arguments(pattern)
    inference = inference_kwargs(pattern)
    if pattern.callable:
        x = args[0] if len(args) == 2 else args[0].take(1)
        predictions = model.predict(x, verbose=0, **inference)
        model.evaluate(*args, verbose=0, **inference)
    weights = tmp_path / "trained.weights.h5"
    model.save_weights(weights)
    keras.utils.set_random_seed(7)
    twin = pattern.build()
    if pattern.callable:
        twin.predict(x, verbose=0, **inference)  # builds a subclassed model's variables
    else:
        twin.built = True
    twin.load_weights(weights)
    for saved, loaded in zip(model.weights, twin.weights):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded), err_msg=saved.path)
    if pattern.keras_file:
        path = tmp_path / "trained.keras"
        model.save(path)
        reloaded = keras.models.load_model(path)
        np.testing.assert_allclose(flat_outputs(reloaded.predict(x, verbose=0, **inference)),
                                   flat_outputs(predictions), rtol=1e-5, atol=1e-6)
    if pattern.keras_file and pattern.h5_file:
        legacy = tmp_path / "trained.h5"  # Keras' legacy format keeps the model, not the optimizer
        model.save(legacy)
        reloaded = keras.models.load_model(legacy, compile=False)
        np.testing.assert_allclose(flat_outputs(reloaded.predict(x, verbose=0, **inference)),
                                   flat_outputs(predictions), rtol=1e-5, atol=1e-6)
