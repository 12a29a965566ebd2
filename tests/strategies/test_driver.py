"""The driver's promises on 4 logical CPUs: each model its own plan, no optional package undoes a
plan, no failure ends fit, every optimizer keeps its state, and verbose=0 is silent."""

import dataclasses
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasflow
from kerasflow import KerasflowError
from kerasflow.planner import Plan
from kerasflow.planner.search import planning
from kerasflow.planner.parallel.baselines import default_placement
from kerasflow.strategies import Collaborators
from kerasflow.strategies.driver_state import Planned
from kerasflow.strategies.options import Options
from kerasflow.strategies.verdict import TIMED_ROUNDS
from kerasflow.testing import ScriptedStopwatch
from tests.profiling import models
from tests.strategies import paths

BATCH = 16


def mlp_data():
    return models.mlp_data(20 * BATCH)


def fit(model, x, y, **kwargs):
    return model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, **kwargs).history["loss"]


def kerasflow_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]


def fit_mlp_under_fastt(**door):
    """(strategy, losses, kerasflow's warnings) of the MLP trained one epoch under FastTStrategy
    (its plan kept even where it measures slower than the default placement), with ``door``'s options."""
    x, y = mlp_data()
    strategy = kerasflow.FastTStrategy(verbose=0, drop_slower_plan=False, **{"collaborators": paths.PLANNING, **door})
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = models.mlp(keras, dropout=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = fit(model, x, y)
    return strategy, losses, kerasflow_warnings(caught)


def plain_mlp_losses():
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    return fit(models.mlp(keras, dropout=False), x, y)


def test_each_model_under_one_strategy_gets_its_own_profile_and_plan():
    x, y = mlp_data()
    strategy = kerasflow.FastTStrategy(verbose=0, drop_slower_plan=False, collaborators=paths.PLANNING)
    with strategy.scope():
        first = models.mlp(keras, units=(32, 16), dropout=False)
        second = models.mlp(keras, units=(8,), dropout=False)
    fit(first, x, y)
    fit(second, x, y)
    one, two = strategy.plan_for(first), strategy.plan_for(second)
    assert one is not None and two is not None and one is not two
    assert one.graph_fingerprint != two.graph_fingerprint
    assert strategy.plan is two  # the model trained last
    assert strategy.placement_report(first).in_force and strategy.placement_report(second).in_force


def test_a_missing_tensorboard_never_undoes_the_plan(monkeypatch, tmp_path, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: it cannot be imported
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(log_dir=str(tmp_path), verbose=1, drop_slower_plan=False,
                                         collaborators=paths.PLANNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=2, shuffle=False,
                           callbacks=[callback]).history["loss"]
    assert kerasflow_warnings(caught) == []
    assert callback.plan_in_force and callback.placement_report().in_force
    out = capsys.readouterr().out
    assert out.count("TensorBoard is not installed") == 1 and "the plan is unaffected" in out
    assert not (tmp_path / "kerasflow").exists()
    assert losses == pytest.approx(plain_mlp_losses(), rel=1e-5)


def heft_only(request):
    """A planner of one HEFT list schedule, as it comes: with its per-device order."""
    return [kerasflow.planner.heft(request.graph, request.cluster)]


def fit_mlp_failing_from(count: int, failures: int | None):
    """(strategy, losses, kerasflow's warnings) of the MLP trained one epoch on a HEFT plan whose
    steps fail from its ``count``-th on, ``failures`` of them (None: every one)."""
    watch = ScriptedStopwatch({"heft": 1e-3}, fail_from=("heft", count), failures=failures)
    return fit_mlp_under_fastt(collaborators=Collaborators(planner=heft_only, stopwatch=watch))


def test_a_planned_step_that_keeps_failing_goes_back_to_the_default_placement():
    strategy, losses, messages = fit_mlp_failing_from(0, None)
    # The plan has a per-device order: the order is dropped first; then the plan goes.
    cause = "RuntimeError: a failure forced at step 1 of heft"
    assert messages == ["kerasflow: the planned order could not run (RuntimeError: a failure forced at step 0 of "
                        "heft); keeping the placement without it.",
                        f"kerasflow: running the planned step failed ({cause}); training continues on the default "
                        "placement. If this persists, report it with the model's code, or plan offline with "
                        "kerasflow.profiling.profile_model and kerasflow.plan and pass plan=."]
    report = strategy.placement_report()
    assert not strategy.plan_in_force and not report.in_force and report.fallback == f"running the planned step " \
                                                                                     f"failed: {cause}"
    assert "Plan not in force" in report.summary()
    assert losses == pytest.approx(plain_mlp_losses(), rel=1e-5)


def test_an_order_tensorflow_refuses_is_dropped_and_the_report_says_so():
    strategy, losses, messages = fit_mlp_failing_from(0, 1)  # the retry without the order runs
    assert strategy.plan.order, "the test needs a plan with a per-device order"
    assert len(messages) == 1 and "planned order could not run" in messages[0]
    report = strategy.placement_report()
    assert report.in_force and strategy.plan_in_force
    assert len(report.not_applied) == 1 and "a failure forced at step 0 of heft" in report.not_applied[0]
    assert "Not applied: the per-device order" in report.summary()
    assert losses == pytest.approx(plain_mlp_losses(), rel=1e-5)


def test_every_optimizer_a_model_owns_keeps_its_state():
    from kerasflow.testing.tutorial_models import gan, gan_dataset

    keras.utils.set_random_seed(7)
    model = gan()
    data = gan_dataset()
    callback = kerasflow.callbacks.FastT(verbose=0, drop_slower_plan=False, collaborators=paths.PLANNING)
    model.fit(data, epochs=2, verbose=0, callbacks=[callback])
    steps = 2 * len(list(data))
    # Profiling ran the step many more times; none of those updates may remain.
    assert int(model.d_optimizer.iterations.numpy()) == steps
    assert int(model.g_optimizer.iterations.numpy()) == steps
    assert callback.plan_in_force


def test_verbose_zero_prints_nothing_not_even_the_profiler(capfd):
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(drop_slower_plan=False, collaborators=paths.PLANNING)
    fit(model, x, y, callbacks=[callback])
    out, err = capfd.readouterr()
    assert callback.plan_in_force
    assert out == ""
    assert "kerasflow" not in err and "rofiler" not in err, err[-2000:]


def test_every_phase_is_shown_with_verbose(capsys):
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=2,
              callbacks=[kerasflow.callbacks.FastT(collaborators=paths.PLANNING)])
    out = capsys.readouterr().out
    for phase in ("warm-up steps", "tracing the training step", "profiling", "planning for 4 devices",
                  "rebuilding the training step", "planned in"):
        assert phase in out, out


@pytest.mark.parametrize("raw, expected", [("no", False), ("OFF", False), ("0", False), ("yes", True),
                                           ("True", True), ("on", True)])
def test_boolean_settings_from_the_environment(monkeypatch, raw, expected):
    monkeypatch.setenv("KERASFLOW_SPLIT", raw)  # a boolean before it had "auto": on or off
    monkeypatch.setenv("KERASFLOW_DROP_SLOWER_PLAN", raw)
    options = Options.from_arguments(devices=["/CPU:0"])
    assert options.split == ("on" if expected else "off") and options.drop_slower_plan is expected


@pytest.mark.parametrize("cluster, asked_to_split", [(None, False), ("cpu-testbed:4", True)],
                         ids=["logical-cpus", "cpu-testbed"])
def test_split_auto_asks_the_planner_to_split_only_devices_that_do_not_share_compute(cluster, asked_to_split):
    # fit plans for the host's logical CPUs by default, which share its cores; the testbed's
    # logical CPUs are taken for devices of their own.
    asked = []

    def keep_the_default_placement(request):
        asked.append(request.split)
        return [default_placement(request.graph, request.cluster)]

    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(cluster=cluster, verbose=0,
                                         collaborators=Collaborators(planner=keep_the_default_placement))
    fit(model, x, y, callbacks=[callback])
    assert callback.options.split == "auto" and asked == [asked_to_split]


@pytest.mark.parametrize("name, value, match", [
    ("tick_tock", "sometimes", "tick_tock must be one of"),
    ("split", "maybe", r"split must be one of \['auto', 'on', 'off'\], or a boolean. Received: split='maybe'"),
    ("warmup_steps", 1, "warmup_steps must be an integer >= 2"),
    ("memory_limit", float("nan"), "memory_limit must be a positive number"),
    ("verbose", "loud", "verbose must be"),
])
def test_bad_settings_are_refused_when_the_door_is_made(name, value, match):
    with pytest.raises(KerasflowError, match=match):
        kerasflow.FastTStrategy(**{name: value})
    with pytest.raises(KerasflowError, match=match):
        kerasflow.callbacks.FastT(**{name: value})


DOORS = {"FastTStrategy": lambda **arguments: kerasflow.FastTStrategy(**arguments),
         "FastT": lambda **arguments: kerasflow.callbacks.FastT(**arguments)}


@pytest.mark.parametrize("arguments, message", [
    (dict(devices=["/CPU:0", "/GPU:3"]),
     "{door} got device(s) ['/GPU:3'] that do not exist; TensorFlow has ['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3']. "
     "Call kerasflow.devices.virtual_cpus(4) before TensorFlow starts for logical CPUs, or pass devices= with "
     "existing ones."),
    (dict(devices=["/CPU:0", "/CPU:1"], cluster="cpu-testbed:1"),
     "The cluster 'cpu-testbed:1' has no device(s) ['/CPU:1']; its devices are ['/CPU:0']."),
    (dict(devices=["/CPU:0", "/CPU:1"], plan=Plan(placement={"a": "/CPU:0", "b": "/CPU:2"}, algorithm="given")),
     "The plan uses device(s) ['/CPU:2'] that {door} does not have (['/CPU:0', '/CPU:1']). Replan for these devices."),
    (dict(options=Options(devices=("/CPU:0", "/CPU:1")), verbose=0),
     "{door} got options= and the keyword argument(s) ['verbose']: pass either options= or the keyword arguments "
     "(dataclasses.replace(options, verbose=...) changes one of its settings). Received: verbose=0"),
    (dict(options=Options(devices=("/CPU:0", "/CPU:9"))),
     "{door} got device(s) ['/CPU:9'] that do not exist; TensorFlow has ['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3']. "
     "Call kerasflow.devices.virtual_cpus(4) before TensorFlow starts for logical CPUs, or pass devices= with "
     "existing ones."),
], ids=["missing-device", "cluster-without-the-devices", "plan-with-other-devices", "options-and-a-keyword",
        "options-with-a-missing-device"])
def test_both_doors_make_the_same_checks_with_the_same_errors(arguments, message):
    # The callback made none of the cluster's and plan's checks before: a plan for other devices
    # failed inside fit, where the strategy refuses it when it is made.
    for door, make in DOORS.items():
        with pytest.raises(KerasflowError) as error:
            make(**arguments)
        assert str(error.value) == message.format(door=door)


def test_options_pass_from_one_door_to_the_other_as_they_are(monkeypatch):
    strategy = kerasflow.FastTStrategy(devices=["/cpu:1", "/CPU:2"], cluster="cpu-testbed:4", warmup_steps="3",
                                       split=True, verbose=0)
    monkeypatch.setenv("KERASFLOW_WARMUP_STEPS", "7")  # options= holds every setting: no variable is read
    callback = kerasflow.callbacks.FastT(options=strategy.options)
    assert callback.options == strategy.options
    assert (callback.options.devices, callback.options.warmup_steps, callback.options.split) == (
        ("/CPU:1", "/CPU:2"), 3, "on")
    tuned = kerasflow.FastTStrategy(options=dataclasses.replace(strategy.options, max_split_evaluations=4))
    assert tuned.options.max_split_evaluations == 4 and tuned.devices == ["/CPU:1", "/CPU:2"]


@pytest.mark.parametrize("setting, match", [
    (dict(connect_timeout=-1), "connect_timeout must be a positive number"),
    (dict(on_lost_task="retry"), r"on_lost_task must be 'exit' or 'wait'. Received: on_lost_task='retry'"),
])
def test_bad_cluster_settings_are_refused_before_connecting(setting, match):
    with pytest.raises(KerasflowError, match=match):
        kerasflow.FastTStrategy(**setting)


def test_a_bad_environment_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("KERASFLOW_TICK_TOCK", "sometimes")
    with pytest.raises(KerasflowError, match="KERASFLOW_TICK_TOCK must be one of"):
        kerasflow.FastTStrategy()


def test_a_model_without_call_trains_under_the_strategy_as_under_none():
    # Keras 3 builds a model under a tf.distribute strategy from a batch at the start of fit, which
    # a VAE without call() cannot take; FastTStrategy builds it at the first trace, as the default
    # strategy does (nothing is planned here: the strategy alone).
    from kerasflow.testing.tutorial_models import vae, vae_data

    def losses(strategy):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = vae()
        return model.fit(vae_data(), batch_size=32, epochs=1, verbose=0).history

    expected = losses(tf.distribute.get_strategy())
    history = losses(kerasflow.FastTStrategy(verbose=0, warmup_steps=1000))
    assert history.keys() == expected.keys()
    for key, values in expected.items():
        np.testing.assert_array_equal(history[key], values, err_msg=key)


def test_random_and_batch_coupled_layers_are_never_split():
    from kerasflow.profiling.splittable import is_splittable

    for layer in (keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.1), keras.layers.RandomFlip(),
                  keras.layers.BatchNormalization(), keras.layers.Lambda(lambda t: t)):
        assert not is_splittable(layer), type(layer).__name__
    assert is_splittable(keras.layers.Dense(2))
    assert is_splittable(keras.layers.LayerNormalization())


def test_the_measured_step_is_said_once_beside_the_prediction_and_the_default_placement(capsys):
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    # One plan timed, whatever it measures.
    callback = kerasflow.callbacks.FastT(drop_slower_plan=False, collaborators=paths.PLANNING)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=2, callbacks=[callback])
    said = [line for line in capsys.readouterr().out.splitlines() if "the plan measured" in line]
    report = callback.report
    assert said == [report["measured_summary"]]
    measured, predicted = report["measured_step_time"], report["predicted_step_time"]
    profiled = callback.profile.metadata["plain_step_seconds"]
    assert 0 < measured < 5 and 0 < profiled < 5
    # The line's prediction leaves out the training loop's own time, which the trial does not time.
    loop = callback.profile.metadata["step_overhead_seconds"]
    assert 0 < loop < predicted
    assert f"the plan measured {measured * 1e3:.2f} ms a step (predicted {(predicted - loop) * 1e3:.2f} ms" in said[0]
    assert said[0].endswith(f"the default placement measured {profiled * 1e3:.2f} ms when profiled: "
                            f"{profiled / measured:.2f}x")
    # The in-fit profile timed its plain step ten times, and the planner tied within its noise.
    spread = callback.profile.metadata["plain_step_spread"]
    assert callback.profile.metadata["plain_step_runs"] == 10
    assert report["tie_margin"] == round(min(0.15, max(0.03, 2 * spread)), 6)


class Stopwatch:
    """Runs every step for real and reports scripted seconds: ``default`` for a step of the default
    placement, ``planned`` (seconds, or a function of the plan's rank: 0 for the first plan put in
    force, 1 for the runner-up) for a planned one. ``default`` may be an exception to raise."""

    def __init__(self, planned, default=1e-3):
        self.planned, self.default, self.plans = planned, default, []

    def __call__(self, step, plan):
        if plan is None:
            if isinstance(self.default, Exception):
                raise self.default
            return step(), self.default
        if plan.algorithm not in self.plans:
            self.plans.append(plan.algorithm)
        rank = self.plans.index(plan.algorithm)
        return step(), self.planned(rank) if callable(self.planned) else self.planned


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_the_measured_step_is_per_train_step(steps_per_execution):
    # Each call of the train function "lasts" 0.1 s, so a train step lasts 0.1 s / steps_per_execution.
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    callback = kerasflow.callbacks.FastT(verbose=0, drop_slower_plan=False,
                                         collaborators=Collaborators(paths.a_plan_whatever_it_gains, Stopwatch(0.1)))
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[callback])
    assert callback.plan_in_force
    assert callback.report["measured_step_time"] == pytest.approx(0.1 / steps_per_execution)


def fit_mlp_timed(planned, default=1e-3, planner=None, **options):
    """(callback, losses, kerasflow's warnings) of the MLP trained two epochs through the callback
    while each planned step reports ``planned`` seconds and each default step ``default``
    (``Stopwatch``), planned by ``planner`` (default: ``paths.a_plan_whatever_it_gains``)."""
    parts = Collaborators(planner=planner or paths.a_plan_whatever_it_gains, stopwatch=Stopwatch(planned, default))
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(verbose=0, collaborators=parts, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False,
                           callbacks=[callback]).history["loss"]
    return callback, losses, kerasflow_warnings(caught)


def plain_mlp_losses_for_two_epochs():
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    return models.mlp(keras, dropout=False).fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                                                shuffle=False).history["loss"]


def runners_up_predicted_at(seconds):
    """A planner as kerasflow's, every candidate after the first predicted at ``seconds`` (the real
    predictions sit near the default step on this machine, so whether one is worth a try would be
    up to the profile's noise)."""
    def ranked(request):
        first, *others = paths.a_plan_whatever_it_gains(request)
        return [first] + [dataclasses.replace(plan, predicted_step_time=seconds) for plan in others]
    return ranked


def slower_by(measured_ms: str, default_ms: str, ratio: str) -> str:
    return (f"the plan measured {measured_ms} ms a step, slower than the default placement's {default_ms} ms in "
            f"alternating steps ({ratio}x its step, the median of {TIMED_ROUNDS} rounds)")


def test_a_plan_measured_slower_than_the_default_placement_beside_it_is_dropped():
    # Planned steps "last" 1 s, default ones 1 ms: the runner-up, predicted at 0.5 ms, is tried,
    # and measures 1 s too.
    callback, losses, said = fit_mlp_timed(1.0, planner=runners_up_predicted_at(0.5e-3))
    assert callback.report["plan_replaced"].split(": ")[0] in callback.report["candidates"]  # the first gave way
    reason = slower_by("1000.00", "1.00", "1000.00")
    assert callback.report["default_step_time"] == pytest.approx(1e-3)
    assert said == [f"kerasflow: {reason}; training continues on the default placement. Pass "
                    "drop_slower_plan=False to keep a slower plan."]
    report = callback.placement_report()
    assert not callback.plan_in_force and not report.in_force and report.fallback == reason
    assert report.summary() == f"Plan not in force: training went back to the default placement ({reason})."
    assert callback.report["plan_dropped"] == reason
    # Training went on, on the default placement, with the model's math unchanged, the steps
    # of the default placement between the planned ones included.
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


def test_a_plan_measured_slower_gives_way_to_the_runner_up_which_stays_when_faster():
    # The first plan's steps "last" 1 s, the runner-up's 1 us; default steps 1 ms; the runner-up
    # is predicted at 0.5 ms.
    callback, losses, said = fit_mlp_timed(lambda rank: 1e-6 if rank else 1.0,
                                           planner=runners_up_predicted_at(0.5e-3))
    first, reason = callback.report["plan_replaced"].split(": ", 1)
    assert first in callback.report["candidates"] and reason == slower_by("1000.00", "1.00", "1000.00")
    assert callback.plan_in_force and said == [] and "plan_dropped" not in callback.report
    assert callback.plan.algorithm not in (None, first)  # the runner-up is in force
    assert callback.report["algorithm"] == callback.plan.algorithm
    assert callback.report["measured_step_time"] == pytest.approx(1e-6)
    assert callback.report["measured_summary"].endswith(
        "the default placement measured 1.00 ms in alternating steps: 1000.00x")
    assert callback.placement_report() == []
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


def test_a_plan_measured_slower_is_dropped_at_once_when_every_runner_up_is_of_its_kind():
    # replicated="off": every candidate places the step whole, like the first plan, which
    # measures 1 s against its prediction of a few ms; each runner-up is expected that many
    # times slower than its own prediction, so none is tried (no second retrace).
    callback, losses, said = fit_mlp_timed(1.0, replicated="off")
    report = callback.report
    assert "plan_replaced" not in report
    ratio = 1.0 / report["predicted_step_time"]
    best, predicted = min(((name, seconds) for name, seconds in report["candidates"].items()
                           if name != report["algorithm"]), key=lambda pair: pair[1])
    reason = (f"{slower_by('1000.00', '1.00', '1000.00')}; no other plan is tried: the best of them, {best}, is "
              f"expected at {predicted * ratio * 1e3:.2f} ms (predicted {predicted * 1e3:.2f} ms, a plan of the same "
              f"kind, scaled by this plan's measured / predicted {ratio:.2f}x), not 5 % faster than the default "
              "placement")
    assert report["plan_dropped"] == reason and callback.placement_report().fallback == reason
    assert said == [f"kerasflow: {reason}; training continues on the default placement. Pass "
                    "drop_slower_plan=False to keep a slower plan."]
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


def test_a_runner_up_not_expected_5_percent_faster_than_the_default_placement_is_not_tried():
    # The others are predicted at 0.99 ms, against default steps of 1 ms: the best is of the
    # other kind (its prediction stands), short of the 5 % a retrace and another timing must buy.
    callback, _, said = fit_mlp_timed(1.0, planner=runners_up_predicted_at(0.99e-3))
    assert "plan_replaced" not in callback.report
    assert said and said[0].endswith(
        "is expected at 0.99 ms, not 5 % faster than the default placement; training continues on the default "
        "placement. Pass drop_slower_plan=False to keep a slower plan.")
    assert "; no other plan is tried: the best of them, " in said[0]


@pytest.mark.parametrize("planned, default", [(1.02e-3, 1e-3), (1.05e-3, 1e-3)])
def test_a_plan_within_3_percent_of_the_default_placement_stays(planned, default):
    callback, _, said = fit_mlp_timed(planned, default, replicated="off")
    kept = planned / default <= 1.03
    assert callback.plan_in_force is kept and ("plan_dropped" in callback.report) is not kept
    assert callback.report["measured_step_time"] == pytest.approx(planned)


def ranked_first(algorithm):
    """A planner as kerasflow's, the plan of ``algorithm`` ranked first."""
    return lambda request: sorted(planning.ranked_plans(request), key=lambda plan: plan.algorithm != algorithm)


@pytest.mark.parametrize("algorithm", ["layerwise_model_parallel", "data_parallel"])
def test_default_steps_timed_between_planned_ones_keep_the_math_and_the_plan(algorithm):
    # The plan's steps "last" 1 us against 1 ms on the default placement: it stays. Its
    # variables moved (layer-wise) or were copied per replica (data-parallel); the default
    # steps ran on the variables before the plan, and every step went on from the last one.
    callback, losses, said = fit_mlp_timed(1e-6, planner=ranked_first(algorithm))
    assert callback.plan.algorithm == algorithm and callback.plan_in_force and said == []
    assert callback.report["default_step_time"] == pytest.approx(1e-3)
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)
    kernels = [layer.kernel for layer in callback.model.layers if hasattr(layer, "kernel")]
    if algorithm == "data_parallel":
        # Every copy was given the default steps' values.
        assert callback.driver.in_force_parts.replicas.differences() == 0.0
    else:
        assert {kernel.value.device.split("/")[-1] for kernel in kernels} != {"device:CPU:0"}


def test_a_default_step_that_fails_ends_the_timing_and_the_plan_stays():
    callback, losses, said = fit_mlp_timed(1.0, default=RuntimeError("no default step today"))
    assert said == ["kerasflow: timing the default placement beside the plan failed (RuntimeError: no default "
                    "step today); the plan stays in force."]  # a plan that slow would otherwise be dropped
    assert callback.plan_in_force and "measured_step_time" not in callback.report
    assert isinstance(callback.driver.state, Planned)  # the trial, its home variables and default function let go
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


def test_replicas_after_a_plan_that_moved_the_variables_take_the_default_steps_values():
    # Layer-wise first (it moves variables off /CPU:0), then data parallelism (back on /CPU:0,
    # as new variables, copied per replica): each default step of the second timing runs on the
    # home variables, and every replica must start the next planned step from its values.
    def two(request):
        by_name = {plan.algorithm: plan for plan in planning.ranked_plans(request)}
        return [by_name["layerwise_model_parallel"],
                dataclasses.replace(by_name["data_parallel"], predicted_step_time=0.5e-3)]

    callback, losses, said = fit_mlp_timed(lambda rank: 1e-6 if rank else 1.0, planner=two)
    assert callback.report["plan_replaced"].startswith("layerwise_model_parallel: ")
    assert callback.plan.algorithm == "data_parallel" and callback.plan_in_force and said == []
    assert callback.driver.in_force_parts.replicas.differences() == 0.0
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


def test_where_no_plan_is_predicted_faster_the_default_placement_is_kept_untried(capsys):
    # On 4 logical CPUs of one host every plan ties with the default placement: kerasflow's own
    # planner keeps it. Nothing is applied or timed (a stopwatch that would keep any plan sees
    # no planned step); one line says so; the losses are plain Keras'.
    watch = Stopwatch(1e-6)
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = models.mlp(keras, dropout=False)
    callback = kerasflow.callbacks.FastT(collaborators=Collaborators(stopwatch=watch))
    losses = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=2, shuffle=False,
                       callbacks=[callback]).history["loss"]
    report = callback.report
    assert report["algorithm"] == "default_placement" and watch.plans == []
    assert report["predicted_default_step_time"] == report["predicted_step_time"] == \
        report["candidates"]["default_placement"]
    said = [line for line in capsys.readouterr().out.splitlines() if "keeping the default placement" in line]
    assert said == [report["summary"]]
    summary = callback.placement_report().summary()
    assert not callback.plan_in_force and "no plan is predicted enough faster" in summary
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


@pytest.mark.parametrize("seconds, options", [(1e-6, {}), (1.0, {"drop_slower_plan": False})])
def test_a_plan_measured_as_fast_or_kept_on_request_stays(seconds, options):
    callback, losses, said = fit_mlp_timed(seconds, **options)
    assert callback.plan_in_force and said == []
    assert callback.report["measured_step_time"] == pytest.approx(seconds)
    assert losses == pytest.approx(plain_mlp_losses_for_two_epochs(), rel=1e-5)


class StatefulNoise(keras.layers.Layer):
    """Adds noise drawn with TensorFlow's stateful random op (``tf.random.uniform``), as the published
    keras.io Switch router does, or with Keras 3's ``keras.random`` (``stateful=False``)."""

    def __init__(self, stateful: bool, **kwargs):
        super().__init__(**kwargs)
        self.stateful = stateful

    def call(self, x, training=False):
        if not training:
            return x
        draw = tf.random.uniform if self.stateful else keras.random.uniform
        return x + draw(tf.shape(x), minval=-0.1, maxval=0.1)


@pytest.mark.parametrize("stateful", [True, False])
def test_a_plan_says_once_that_stateful_random_draws_start_again(capsys, stateful):
    x, y = mlp_data()
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(8, name="dense"),
                              StatefulNoise(stateful, name="noise"), keras.layers.Dense(int(y.max()) + 1, name="head")])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = kerasflow.callbacks.FastT(drop_slower_plan=False, collaborators=paths.PLANNING, verbose=1)
    fit(model, x, y, callbacks=[callback])
    assert callback.plan_in_force
    said = [line for line in capsys.readouterr().out.splitlines() if "stateful random ops" in line]
    if not stateful:  # keras.random keeps its place in a seed generator's variable
        assert said == []
        return
    assert len(said) == 1 and said[0].startswith(f"kerasflow: {callback.plan.algorithm}: noise draw random numbers "
                                                 "with TensorFlow's stateful random ops")


@pytest.mark.parametrize("devices", [2, 4])
def test_the_second_profile_runs_the_rows_of_one_replica(devices):
    # Over N devices a data-parallel replica runs B/N rows: the costs are measured there (and at
    # B), not extrapolated from B/2; over two devices that is the half batch anyway.
    strategy, _, said = fit_mlp_under_fastt(devices=[f"/CPU:{i}" for i in range(devices)])
    assert said == [] and strategy.profile.metadata["batch_sizes"] == [BATCH, BATCH // devices]
    replica = next(op for op in strategy.profile.ops if op.type == "MatMul" and op.phase == "forward")
    assert replica.output_bytes[0].fixed == pytest.approx(0.0, abs=1e-6)  # sizes exact at both batches
