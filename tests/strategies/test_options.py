"""Options: every setting's accepted and refused values, the KERASFLOW_* variables, and the frozen object."""

import dataclasses
import os
import pathlib

import pytest

from kerasflow.planner import Cluster, Plan
from kerasflow.planner.errors import KerasflowError
from kerasflow.strategies.options import Options, parse_bool
from kerasflow.strategies.planning_in_fit import may_split

DEVICES = ["/CPU:0", "/CPU:1"]


@pytest.fixture(autouse=True)
def no_kerasflow_variables(monkeypatch):
    # The machine running the tests may set some: each test sees only those it sets itself.
    for name in list(os.environ):
        if name.startswith("KERASFLOW_"):
            monkeypatch.delenv(name)


def refused(message, **settings):
    """Asserts that ``Options.from_arguments`` refuses ``settings`` with exactly ``message``."""
    with pytest.raises(KerasflowError) as error:
        Options.from_arguments(devices=DEVICES, **settings)
    assert str(error.value) == message


def test_the_defaults():
    options = Options.from_arguments(devices=DEVICES)
    assert options == Options(devices=("/CPU:0", "/CPU:1"), cluster=None, plan=None, warmup_steps=2,
                              profile_steps=3, split="auto", tick_tock="auto", replicated="auto", memory_limit=None,
                              log_dir=None, verbose="auto", on_mismatch="error", drop_slower_plan=True,
                              deterministic="auto", max_split_evaluations=16)
    # The devices come in as any sequence and are kept as a tuple (the object is hashable).
    assert options.devices == ("/CPU:0", "/CPU:1")
    assert hash(options) == hash(Options.from_arguments(devices=tuple(DEVICES)))


@pytest.mark.parametrize("raw, value", [(2, 2), (7, 7), ("3", 3), (" 4 ", 4)])
def test_warmup_steps_takes_integers_from_2_or_their_text(raw, value):
    assert Options.from_arguments(devices=DEVICES, warmup_steps=raw).warmup_steps == value


@pytest.mark.parametrize("raw, shown", [
    (1, "1"), (0, "0"), (-3, "-3"), ("1", "'1'"), ("x", "'x'"), (3.0, "3.0"), ("2.5", "'2.5'"),
    # A bool is an int to Python, but True steps is a mistake, not 1.
    (True, "True"), (False, "False"),
])
def test_warmup_steps_refuses_less_than_2_bools_and_non_integers(raw, shown):
    # Steps 0 and 1 trace and optimise the graph: profiling starts at step 2 at the earliest.
    refused(f"warmup_steps must be an integer >= 2. Received: warmup_steps={shown}", warmup_steps=raw)


@pytest.mark.parametrize("raw, value", [(1, 1), ("1", 1), (10, 10)])
def test_profile_steps_takes_integers_from_1(raw, value):
    assert Options.from_arguments(devices=DEVICES, profile_steps=raw).profile_steps == value


@pytest.mark.parametrize("raw, shown", [(0, "0"), (-1, "-1"), (True, "True"), ("one", "'one'")])
def test_profile_steps_refuses_less_than_1_bools_and_non_integers(raw, shown):
    refused(f"profile_steps must be an integer >= 1. Received: profile_steps={shown}", profile_steps=raw)


@pytest.mark.parametrize("raw, value", [
    (True, True), (False, False), (1, True), (0, False), ("1", True), ("0", False), ("TRUE", True), (" no ", False),
    ("yes", True), ("on", True), ("Off", False),
])
def test_a_yes_no_setting_takes_a_bool_or_its_words(raw, value):
    assert Options.from_arguments(devices=DEVICES, drop_slower_plan=raw).drop_slower_plan is value


@pytest.mark.parametrize("raw, shown", [("maybe", "'maybe'"), (2, "2"), ("", "''"), ("auto", "'auto'")])
def test_a_yes_no_setting_refuses_anything_else(raw, shown):
    refused(f"drop_slower_plan must be a boolean (1/0, true/false, yes/no, on/off). Received: drop_slower_plan={shown}",
            drop_slower_plan=raw)


def test_parse_bool_names_what_it_was_given_as():
    with pytest.raises(KerasflowError) as error:
        parse_bool("KERASFLOW_DROP_SLOWER_PLAN", "2")
    assert str(error.value) == ("KERASFLOW_DROP_SLOWER_PLAN must be a boolean (1/0, true/false, yes/no, on/off). "
                                "Received: KERASFLOW_DROP_SLOWER_PLAN='2'")


@pytest.mark.parametrize("raw, value", [
    ("auto", "auto"), ("Auto", "auto"), ("on", "on"), (" OFF ", "off"),
    # split was a boolean before it had "auto": a boolean, or its words, still means on or off.
    (True, "on"), (False, "off"), (1, "on"), (0, "off"), ("yes", "on"), ("no", "off"), ("true", "on"), ("0", "off"),
])
def test_split_takes_auto_on_off_or_a_boolean(raw, value):
    assert Options.from_arguments(devices=DEVICES, split=raw).split == value


@pytest.mark.parametrize("raw, shown", [("maybe", "'maybe'"), (3, "3"), (2, "2"), (1.0, "1.0"), ("", "''"),
                                        ("always", "'always'")])
def test_split_refuses_anything_else(raw, shown):
    refused(f"split must be one of ['auto', 'on', 'off'], or a boolean. Received: split={shown}", split=raw)


# The planning clusters fit uses: logical CPUs of one host share its cores; the testbed's and
# GPUs are devices of their own, and so are the hosts of a two-level cluster.
SHARED = Cluster.preset("logical-cpus:4")
INDEPENDENT = ("cpu-testbed:4", "4xV100-nvlink", "2x8xV100")


def options_for(cluster, **settings):
    """The options of ``settings`` as the doors parse them, for ``cluster``'s devices (GPUs and
    other hosts' included, which this process does not have to have)."""
    return dataclasses.replace(Options.from_arguments(devices=DEVICES, **settings), devices=cluster.device_names)


def test_split_auto_does_not_split_devices_that_share_compute():
    assert may_split(options_for(SHARED), SHARED, own_train_step=False) is False


@pytest.mark.parametrize("preset", INDEPENDENT)
def test_split_auto_splits_devices_that_do_not_share_compute(preset):
    cluster = Cluster.preset(preset)
    assert may_split(options_for(cluster), cluster, own_train_step=False) is True


@pytest.mark.parametrize("preset", ["logical-cpus:4", *INDEPENDENT])
@pytest.mark.parametrize("split, expected", [("on", True), ("off", False), (True, True), (False, False)])
def test_split_on_or_off_holds_whatever_the_cluster(preset, split, expected):
    cluster = Cluster.preset(preset)
    assert may_split(options_for(cluster, split=split), cluster, own_train_step=False) is expected


@pytest.mark.parametrize("split", ["auto", "on"])
def test_a_model_with_its_own_train_step_is_never_split(split):
    # Its step is not rebuilt shard by shard.
    cluster = Cluster.preset("cpu-testbed:4")
    assert may_split(options_for(cluster, split=split), cluster, own_train_step=True) is False


@pytest.mark.parametrize("name", ["tick_tock", "replicated", "deterministic"])
@pytest.mark.parametrize("raw, value", [("auto", "auto"), ("on", "on"), ("off", "off"), (" ON ", "on"),
                                        ("Auto", "auto")])
def test_a_three_way_setting_takes_auto_on_or_off(name, raw, value):
    assert getattr(Options.from_arguments(devices=DEVICES, **{name: raw}), name) == value


@pytest.mark.parametrize("name", ["tick_tock", "replicated", "deterministic"])
@pytest.mark.parametrize("raw, shown", [
    # Strings only: True would hide whether "on" (always) or "auto" was meant.
    (True, "True"), (False, "False"), (1, "1"), (0, "0"),
    ("yes", "'yes'"), ("true", "'true'"), ("", "''"), ("always", "'always'"),
])
def test_a_three_way_setting_refuses_booleans_and_other_words(name, raw, shown):
    refused(f"{name} must be one of ['auto', 'on', 'off']. Received: {name}={shown}", **{name: raw})


@pytest.mark.parametrize("raw, value", [(1e9, 1e9), ("2e9", 2e9), (5, 5.0), ("0.5", 0.5), (None, None)])
def test_memory_limit_takes_a_positive_number_of_bytes_or_none(raw, value):
    assert Options.from_arguments(devices=DEVICES, memory_limit=raw).memory_limit == value


@pytest.mark.parametrize("raw, shown", [
    (float("inf"), "inf"), (float("nan"), "nan"), ("inf", "'inf'"), ("nan", "'nan'"), (0, "0"), (-1, "-1"),
    ("x", "'x'"), ([1], "[1]"),
    # Too large for a float: an overflow, which is a refusal like any other.
    (10**400, "1" + "0" * 400),
])
def test_memory_limit_refuses_infinite_nan_zero_negative_and_non_numbers(raw, shown):
    refused(f"memory_limit must be a positive number of bytes. Received: memory_limit={shown}", memory_limit=raw)


def test_the_planners_time_limit_is_a_positive_number_of_seconds_from_its_variable(monkeypatch):
    assert Options.from_arguments(devices=DEVICES).planning_time_limit == 300.0
    monkeypatch.setenv("KERASFLOW_PLANNING_TIME_LIMIT", "2.5")
    assert Options.from_arguments(devices=DEVICES).planning_time_limit == 2.5
    monkeypatch.setenv("KERASFLOW_PLANNING_TIME_LIMIT", "0")
    with pytest.raises(KerasflowError, match=r"^KERASFLOW_PLANNING_TIME_LIMIT must be a positive number of seconds\. "
                                             r"Received: KERASFLOW_PLANNING_TIME_LIMIT='0'$"):
        Options.from_arguments(devices=DEVICES)


@pytest.mark.parametrize("raw, value", [("auto", "auto"), ("AUTO", "auto"), (None, "auto"), (0, 0), (1, 1), (2, 2),
                                        ("0", 0), ("1", 1), ("2", 2)])
def test_verbose_takes_auto_0_1_or_2(raw, value):
    assert Options.from_arguments(devices=DEVICES, verbose=raw).verbose == value


@pytest.mark.parametrize("raw, shown", [(3, "3"), (-1, "-1"), ("loud", "'loud'"), (2.0, "2.0")])
def test_verbose_refuses_anything_else(raw, shown):
    refused(f"verbose must be 'auto', 0, 1 or 2 (as Keras' verbose). Received: verbose={shown}", verbose=raw)


@pytest.mark.parametrize("raw, value", [("error", "error"), ("replan", "replan"), ("REPLAN", "replan")])
def test_on_mismatch_takes_error_or_replan(raw, value):
    assert Options.from_arguments(devices=DEVICES, on_mismatch=raw).on_mismatch == value


@pytest.mark.parametrize("raw, shown", [("ignore", "'ignore'"), (True, "True")])
def test_on_mismatch_refuses_anything_else(raw, shown):
    refused(f"on_mismatch must be one of ['error', 'replan']. Received: on_mismatch={shown}", on_mismatch=raw)


def test_log_dir_is_kept_as_text():
    assert Options.from_arguments(devices=DEVICES, log_dir=pathlib.Path("/tmp/kf")).log_dir == "/tmp/kf"


@pytest.mark.parametrize("raw, value", [(1, 1), ("8", 8), (48, 48)])
def test_max_split_evaluations_takes_integers_from_1(raw, value):
    assert Options.from_arguments(devices=DEVICES, max_split_evaluations=raw).max_split_evaluations == value


@pytest.mark.parametrize("raw, shown", [(0, "0"), (-2, "-2"), (True, "True"), (2.5, "2.5"), ("many", "'many'")])
def test_max_split_evaluations_refuses_less_than_1_bools_and_non_integers(raw, shown):
    refused(f"max_split_evaluations must be an integer >= 1. Received: max_split_evaluations={shown}",
            max_split_evaluations=raw)


def test_the_constructor_checks_as_from_arguments_does():
    # dataclasses.replace goes through the constructor: it must not let a bad value in.
    with pytest.raises(KerasflowError, match=r"^warmup_steps must be an integer >= 2\. Received: warmup_steps=1$"):
        Options(devices=DEVICES, warmup_steps=1)
    with pytest.raises(KerasflowError, match=r"^max_split_evaluations must be an integer >= 1\. "
                                             r"Received: max_split_evaluations=0$"):
        Options(devices=DEVICES, max_split_evaluations=0)


@pytest.mark.parametrize("name, raw, parsed", [
    ("split", True, "on"), ("tick_tock", " ON ", "on"), ("warmup_steps", "3", 3), ("memory_limit", "1e9", 1e9),
    ("log_dir", pathlib.Path("/tmp/kf"), "/tmp/kf"), ("drop_slower_plan", 1, True), ("verbose", True, 1),
    ("max_split_evaluations", "8", 8), ("background_planning", "no", False), ("planning_time_limit", "60", 60.0),
])
def test_the_constructor_converts_nothing(name, raw, parsed):
    # Settings are parsed once, by from_arguments; the constructor takes them parsed, and says
    # so of another spelling that from_arguments would read.
    with pytest.raises(KerasflowError) as error:
        Options(devices=DEVICES, **{name: raw})
    assert str(error.value) == (f"Options takes {name} parsed, as {parsed!r}; Options.from_arguments (and the "
                                f"strategy and callback) read its other spellings. Received: {name}={raw!r}")
    assert getattr(Options.from_arguments(devices=DEVICES, **{name: raw}), name) == parsed


EVERY_VARIABLE = {
    "KERASFLOW_WARMUP_STEPS": "5", "KERASFLOW_PROFILE_STEPS": "4", "KERASFLOW_SPLIT": "yes",
    "KERASFLOW_TICK_TOCK": "ON", "KERASFLOW_REPLICATED": "off", "KERASFLOW_MEMORY_LIMIT": "1e9",
    "KERASFLOW_LOG_DIR": "/tmp/logs", "KERASFLOW_VERBOSE": "0", "KERASFLOW_ON_MISMATCH": "replan",
    "KERASFLOW_DROP_SLOWER_PLAN": "false", "KERASFLOW_MAX_SPLIT_EVALUATIONS": "7", "KERASFLOW_DETERMINISTIC": "On",
}


def test_environment_variables_fill_the_settings_left_at_none(monkeypatch):
    for variable, text in EVERY_VARIABLE.items():
        monkeypatch.setenv(variable, text)
    from_variables = dict(warmup_steps=5, profile_steps=4, split="on", tick_tock="on", replicated="off",
                          memory_limit=1e9, log_dir="/tmp/logs", verbose=0, on_mismatch="replan",
                          drop_slower_plan=False, deterministic="on", max_split_evaluations=7)
    # Left out, or passed as None: the same.
    assert Options.from_arguments(devices=DEVICES) == Options(devices=DEVICES, **from_variables)
    assert Options.from_arguments(devices=DEVICES, warmup_steps=None, split=None) == Options(devices=DEVICES,
                                                                                              **from_variables)


def test_a_given_argument_wins_over_its_environment_variable(monkeypatch):
    for variable, text in EVERY_VARIABLE.items():
        monkeypatch.setenv(variable, text)
    given = dict(warmup_steps=3, profile_steps=2, split="off", tick_tock="off", replicated="on", memory_limit=2e9,
                 log_dir="/tmp/mine", verbose=2, on_mismatch="error", drop_slower_plan=True, deterministic="off",
                 max_split_evaluations=3)
    assert Options.from_arguments(devices=DEVICES, **given) == Options(devices=DEVICES, **given)


def test_a_variable_is_not_even_read_when_its_argument_is_given(monkeypatch):
    # A bad variable behind a given argument is no error: it is not the value used.
    monkeypatch.setenv("KERASFLOW_WARMUP_STEPS", "x")
    monkeypatch.setenv("KERASFLOW_REPLICATED", "true")
    options = Options.from_arguments(devices=DEVICES, warmup_steps=4, replicated="on")
    assert (options.warmup_steps, options.replicated) == (4, "on")


def test_an_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("KERASFLOW_WARMUP_STEPS", "")
    monkeypatch.setenv("KERASFLOW_MEMORY_LIMIT", "")
    options = Options.from_arguments(devices=DEVICES)
    assert (options.warmup_steps, options.memory_limit) == (2, None)


def test_only_from_arguments_reads_the_variables(monkeypatch):
    monkeypatch.setenv("KERASFLOW_WARMUP_STEPS", "5")
    assert Options(devices=DEVICES).warmup_steps == 2


@pytest.mark.parametrize("variable, text, message", [
    ("KERASFLOW_WARMUP_STEPS", "1", "KERASFLOW_WARMUP_STEPS must be an integer >= 2. "
                                    "Received: KERASFLOW_WARMUP_STEPS='1'"),
    ("KERASFLOW_REPLICATED", "true", "KERASFLOW_REPLICATED must be one of ['auto', 'on', 'off']. "
                                     "Received: KERASFLOW_REPLICATED='true'"),
    ("KERASFLOW_SPLIT", "maybe", "KERASFLOW_SPLIT must be one of ['auto', 'on', 'off'], or a boolean. "
                                 "Received: KERASFLOW_SPLIT='maybe'"),
    ("KERASFLOW_MEMORY_LIMIT", "inf", "KERASFLOW_MEMORY_LIMIT must be a positive number of bytes. "
                                      "Received: KERASFLOW_MEMORY_LIMIT='inf'"),
    ("KERASFLOW_VERBOSE", "3", "KERASFLOW_VERBOSE must be 'auto', 0, 1 or 2 (as Keras' verbose). "
                               "Received: KERASFLOW_VERBOSE='3'"),
    ("KERASFLOW_MAX_SPLIT_EVALUATIONS", "0", "KERASFLOW_MAX_SPLIT_EVALUATIONS must be an integer >= 1. "
                                             "Received: KERASFLOW_MAX_SPLIT_EVALUATIONS='0'"),
])
def test_a_bad_variable_is_an_error_naming_the_variable(monkeypatch, variable, text, message):
    # The user set no argument: the error points at where the value came from.
    monkeypatch.setenv(variable, text)
    refused(message)


def test_an_unknown_setting_is_refused():
    refused("Unknown kerasflow setting(s) ['warmup']. Received: warmup=3", warmup=3)
    # Every unknown one is named, the first (in order) shown with its value.
    refused("Unknown kerasflow setting(s) ['alpha', 'zeta']. Received: alpha=2", zeta=1, alpha=2)


def test_cluster_and_plan_are_passed_through():
    plan = Plan(placement={}, algorithm="given")
    options = Options.from_arguments(devices=DEVICES, plan=plan)
    assert options.plan is plan and options.cluster is None


def test_the_options_are_frozen():
    options = Options.from_arguments(devices=DEVICES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.split = "on"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.warmup_steps = 9
    assert options.split == "auto" and options.warmup_steps == 2


def test_replace_keeps_every_other_value():
    options = Options.from_arguments(devices=DEVICES, warmup_steps=3, split="yes", tick_tock="on", memory_limit="1e9",
                                     verbose=1, on_mismatch="replan", log_dir="/tmp/kf", drop_slower_plan=False)
    changed = dataclasses.replace(options, warmup_steps=5)
    assert changed == Options(devices=DEVICES, warmup_steps=5, split="on", tick_tock="on", memory_limit=1e9, verbose=1,
                              on_mismatch="replan", log_dir="/tmp/kf", drop_slower_plan=False)
    assert options.warmup_steps == 3  # the original is untouched
    # A replaced value is checked like any other.
    with pytest.raises(KerasflowError, match=r"Received: replicated=True$"):
        dataclasses.replace(options, replicated=True)


def test_from_arguments_spells_devices_as_tensorflow_has_them_and_resolves_the_cluster():
    options = Options.from_arguments(devices=["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"],
                                     cluster="cpu-testbed:2")
    assert options.devices == ("/CPU:0", "/CPU:1")
    assert (options.cluster.name, options.cluster.device_names) == ("cpu-testbed:2", ["/CPU:0", "/CPU:1"])


@pytest.mark.parametrize("arguments, message", [
    (dict(devices=["/CPU:0", "/GPU:3"]),
     "Options got device(s) ['/GPU:3'] that do not exist; TensorFlow has ['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3']. "
     "Call kerasflow.devices.virtual_cpus(4) before TensorFlow starts for logical CPUs, or pass devices= with "
     "existing ones."),
    (dict(devices=DEVICES, cluster="cpu-testbed:1"),
     "The cluster 'cpu-testbed:1' has no device(s) ['/CPU:1']; its devices are ['/CPU:0']."),
    (dict(devices=DEVICES, plan=Plan(placement={"a": "/CPU:0", "b": "/CPU:3"}, algorithm="given")),
     "The plan uses device(s) ['/CPU:3'] that Options does not have (['/CPU:0', '/CPU:1']). Replan for these "
     "devices."),
])
def test_from_arguments_refuses_devices_a_cluster_or_a_plan_that_do_not_fit(arguments, message):
    with pytest.raises(KerasflowError) as error:
        Options.from_arguments(**arguments)
    assert str(error.value) == message


def test_a_plan_path_is_loaded_and_checked(tmp_path):
    Plan(placement={"a": "/CPU:1"}, algorithm="given").save(tmp_path / "plan.json")
    assert Options.from_arguments(devices=DEVICES, plan=str(tmp_path / "plan.json")).plan.placement == {"a": "/CPU:1"}
    with pytest.raises(KerasflowError, match=r"^The plan uses device\(s\) \['/CPU:1'\] that FastT does not have"):
        Options.from_arguments(door="FastT", devices=["/CPU:0"], plan=tmp_path / "plan.json")


def test_a_gpu_plan_may_put_the_ops_no_gpu_runs_on_their_hosts_cpu():
    # A plan for GPUs puts string ops and lookups on the CPU beside them (Cluster.host); only that CPU.
    gpus = Options(devices=("/GPU:0", "/GPU:1"))
    given = Plan(placement={"lookup": "/CPU:0", "dense": "/GPU:1"}, algorithm="given")
    assert gpus.with_plan(given).plan is given
    with pytest.raises(KerasflowError, match=r"^The plan uses device\(s\) \['/CPU:1'\] that Options does not have"):
        gpus.with_plan(Plan(placement={"lookup": "/CPU:1", "dense": "/GPU:1"}, algorithm="given"))
    with pytest.raises(KerasflowError, match=r"^The plan uses device\(s\) \['/CPU:0'\] that Options does not have"):
        Options(devices=("/CPU:1", "/CPU:2")).with_plan(given.with_devices({"/GPU:1": "/CPU:1"}))


def test_options_are_taken_whole_and_their_devices_checked(monkeypatch):
    made = Options(devices=("/cpu:1", "/CPU:0"), warmup_steps=4, split="off")
    monkeypatch.setenv("KERASFLOW_WARMUP_STEPS", "9")  # options= is every setting: no variable is read
    assert Options.from_arguments(options=made) == Options(devices=("/CPU:1", "/CPU:0"), warmup_steps=4, split="off")
    with pytest.raises(KerasflowError, match=r"^FastT got device\(s\) \['/GPU:3'\] that do not exist"):
        Options.from_arguments(door="FastT", options=Options(devices=("/GPU:3",)))


@pytest.mark.parametrize("keyword", [dict(warmup_steps=3), dict(devices=DEVICES), dict(plan="plan.json")])
def test_options_and_a_keyword_argument_are_refused(keyword):
    ((name, value),) = keyword.items()
    with pytest.raises(KerasflowError) as error:
        Options.from_arguments(door="FastTStrategy", options=Options(devices=DEVICES), **keyword)
    assert str(error.value) == (
        f"FastTStrategy got options= and the keyword argument(s) ['{name}']: pass either options= or the keyword "
        f"arguments (dataclasses.replace(options, {name}=...) changes one of its settings). Received: "
        f"{name}={value!r}")


def test_join_comes_after_the_settings_are_checked_and_before_the_devices():
    joined = []

    def join(devices, cluster):
        joined.append((devices, cluster))
        return ["/CPU:2", "/CPU:3"], "cpu-testbed:4"

    with pytest.raises(KerasflowError, match="^warmup_steps must be"):
        Options.from_arguments(join=join, warmup_steps=1)
    assert joined == []  # nothing connects for a bad setting
    options = Options.from_arguments(join=join, devices=["/GPU:7"])  # a device of the joined cluster's choosing
    assert joined == [(["/GPU:7"], None)]
    assert options.devices == ("/CPU:2", "/CPU:3") and options.cluster.name == "cpu-testbed:4"
