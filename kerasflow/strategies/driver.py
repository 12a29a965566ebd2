"""The profile -> plan -> rebuild state machine inside ``fit``, one per model, for the strategy and the callback.

States, in order::

    warming_up --(warmup_steps)--> profiling --(profile_steps)--> planned
         \\                              \\                            \\
          `----------------------------- `---- any failure ---------`--> default (fallback)
                                                                      `-- measured slower --> default

``warming_up``: steps on the default placement (tracing and graph optimisation happen
there); the step records a real batch of the user's data. ``profiling``: fit's own steps
run under TensorFlow's profiler. After the last of them the shared profiling sequence
(``profile_training_step``: the step traced at the recorded batch and at half of it,
every variable restored) builds the ``OpGraph``, ``kerasflow.plan`` plans it, variables
move to their planned devices, ``model.train_step`` becomes the plan-applying step and
the train function is rebuilt, so the next step runs on the plan (``planned``). Every
call of the planned train function is guarded: whatever fails in it (tracing, a refused
placement, an order TensorFlow rejects) first drops the per-device order, then goes back
to the default placement for that same call. A failure anywhere warns once, naming the
cause, and training continues on the default placement (``default``). After the rebuild
the plan is timed side by side with the default placement (``SideBySide``): six of fit's
steps on the plan alternate with six on the default placement, run on the variables as they
were before the plan moved them (``HomeVariables``), the same values, so training goes on
either way. A plan whose median ratio to the default step is more than 3 % slower gives way
to the best other candidate by ``planner.rerank`` (once), timed the same way, when that one is
expected more than 5 % faster than the default step; a plan still slower is dropped the same
way. With ``drop_slower_plan=False``, and for a plan given with ``plan=`` (the user's choice),
the plan stays whatever it measures, and six planned steps are timed for the report (against
the default step as profiled, when it was).

A ``plan=`` given up front skips profiling: it is checked against the model after step 0
and applied from step 1.
"""

from __future__ import annotations

import dataclasses

import re
import time
from typing import Any, Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.multihost import run_within, silent_tasks, task_of
from kerasflow.planner import Cluster, OpGraph, Plan, ranked_plans, rerank
from kerasflow.planner.planning import tie_margin_for
from kerasflow.planner.rerank import same_kind
from kerasflow.planner.errors import ClusterConnectionError, InvalidPlanError, KerasflowError
from kerasflow.planner.ticktock import batch_coupled_ops, replica_coupled_ops
from kerasflow.profiling.capture import capture_step
from kerasflow.profiling.profiler import build_graph, profile_training_step, restore_variables, snapshot_variables
from kerasflow.profiling.xplane import StepProfiler
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.options import Options
from kerasflow.strategies.readback import PlacementReport, read_back, start_recording
from kerasflow.strategies.replicas import Replicas
from kerasflow.strategies.reporting import Reporter
from kerasflow.strategies.side_by_side import SideBySide
from kerasflow.strategies.steps import PlannedStep
from kerasflow.strategies.variables import HomeVariables, current_homes, group_devices, move_variables

__all__ = ["Driver"]

# Errors that end an epoch or a run the way Keras expects: never taken for a plan failure.
_NOT_OURS = (tf.errors.OutOfRangeError, StopIteration, KeyboardInterrupt)


class Driver:
    """Runs the profile -> plan -> rebuild loop for one model (see the module docstring).

    Args:
        options: the ``Options`` (this driver's own copy).
        creating: a context manager factory ``f(device)`` that lets a variable be created
            off the strategy's device (the strategy's; None for the callback).
    """

    def __init__(self, options: Options, *, creating: Callable | None = None):
        self.options = options
        self.creating = creating
        self.reporter = Reporter(options.verbose)
        self.model = None
        self.state = "detached"
        self.step = 0
        self.plan: Plan | None = None
        self.graph: OpGraph | None = None
        self.applier: PlanApplier | None = None
        self.replicas: Replicas | None = None  # a data-parallel plan's copies of the weights
        self.mismatches: list | None = None
        self.transfers: list = []  # what the step read back sent between devices
        self.fallback: str | None = None
        self.report: dict = {}
        self.spec = None
        self.batch = None  # a real batch of the user's data (numpy), for profiling
        self._original_step = None
        self._custom_step = False
        self._spec_full = False
        self._profiler: StepProfiler | None = None
        self._trace = None
        self._read_back = False
        self._verify_pending = False
        self._homes_before: dict[str, str] = {}
        self._home_variables: HomeVariables | None = None  # the variables before the plan moved them
        self._default_function: Callable | None = None  # the default placement's train function, for the timing
        self.trial: SideBySide | None = None  # the plan in force timed beside the default placement
        self.running_default = False  # True while a timed step of the default placement runs
        self._runners_up: list[Plan] = []  # the other candidates; the best is tried once if the plan measures slower

    # ------------------------------------------------------------------ attach
    def attach(self, model, verbose: Any = None) -> None:
        """Installs the recording step on ``model`` (the plan-applying step once planned).

        Args:
            model: the Keras model being fit.
            verbose: ``fit``'s verbose, followed when the options say ``"auto"``.
        """
        if self.model is model:
            return
        self.model = model
        if self.options.verbose == "auto" and verbose is not None:
            self.reporter.verbose = 0 if verbose in (0, False) else verbose
        if _compat.uses_jit(model):
            _compat.disable_jit(model)
            model.make_train_function(force=True)  # the next step runs without XLA
            self.reporter.say("kerasflow: jit_compile turned off: XLA fuses the step into a few clusters, which "
                              "erases per-op placement and profiles.")
        self._custom_step = _compat.has_own_train_step(model)
        if self._custom_step:
            self.reporter.say("kerasflow: the model defines its own train_step: placement and order are "
                              "applied, op splitting and waves are not.")
        step = model.train_step
        self._original_step = step.original if isinstance(step, PlannedStep) else step
        self.state = "warming_up"
        if self.options.plan is not None:
            # Step 0 runs as traced by Keras (recording the inputs); the given plan is
            # checked and applied from step 1, through the guarded rebuild.
            self.plan = self.options.plan
            self._verify_pending = True
        else:
            self.reporter.say(f"kerasflow: {self.options.warmup_steps} warm-up steps on the default placement, "
                              f"then {self.options.profile_steps} profiled steps, then the plan.")
        self._install()

    def detach(self) -> None:
        """Gives the model back its own ``train_step`` (between ``fit`` calls)."""
        if self.model is not None and self._original_step is not None:
            object.__setattr__(self.model, "train_step", self._original_step)
            self.model.train_function = None
        self.model, self.state = None, "detached"

    @property
    def step_function(self) -> PlannedStep:
        """The ``train_step`` installed on the model."""
        return self.model.train_step

    def _install(self) -> None:
        recording = self.applier is None and self.state in ("warming_up", "profiling")
        step = PlannedStep(self.model, self._original_step, self.applier, on_trace=self._record_spec,
                           custom_step=self._custom_step, on_batch=self._record_batch if recording else None,
                           replicas=self.replicas)
        object.__setattr__(self.model, "train_step", step)

    def _record_spec(self, data) -> None:
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                     data)
        full = all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec) if isinstance(s, tf.TensorSpec))
        # A fully-shaped trace wins over a relaxed-shape one (a partial batch).
        if full and not self._spec_full:
            self.spec, self._spec_full = spec, True
        elif self.spec is None:
            self.spec = spec

    def _record_batch(self, batch) -> None:
        """Keeps the largest batch the step has run on (a partial last batch is smaller)."""
        size = _batch_size(batch)
        if self.batch is None or size > _batch_size(self.batch):
            self.batch = batch

    # ------------------------------------------------------------------ per step
    def before_step(self) -> None:
        """Called before each call of the train function."""
        if self.state not in ("warming_up", "profiling", "planned"):
            return
        first, last = self._window()
        try:
            if self.plan is None and self.step == first:
                self.state = "profiling"
                self._profiler = StepProfiler(quiet=self.reporter.quiet)
                self._profiler.start()
            if self._profiler is not None and first <= self.step <= last:
                self._trace = self._profiler.step(self.step - first)
                self._trace.__enter__()
            if self._read_back:
                start_recording()
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.fall_back("profiling", error)

    def after_step(self) -> None:
        """Called after each call of the train function; plans and rebuilds after the profiled steps."""
        if self.state not in ("warming_up", "profiling", "planned"):
            self.step += 1
            return
        stage = "planning"
        slower = None
        try:
            if self._trace is not None:
                self._trace.__exit__(None, None, None)
                self._trace = None
            if self._read_back:
                stage = "reading the placement back"
                self._read_back = False
                self.mismatches, self.transfers = read_back(self.applier)
                # A plan given with plan= is the user's choice: timed for the report only.
                self.trial = SideBySide(TIMED_ROUNDS, against_default=self.options.drop_slower_plan and
                                        self.options.plan is None)
            if self._verify_pending and self.spec is not None:
                stage = "applying the given plan"
                self._verify_given_plan()
            elif self.plan is None and self.step == self._window()[1]:
                self._plan_and_rebuild()
            elif self.state == "planned" and self.trial is not None and self.trial.done:
                stage = "timing the planned step"
                slower = self._judge_trial()
                if slower is not None and self._runners_up:
                    stage = "switching to the next plan"
                    following, passed_over = self._runner_up()
                    if following is None:
                        slower = f"{slower}; {passed_over}"
                    else:
                        self._try_next_plan(slower, following)
                        slower = None
        except InvalidPlanError:
            raise
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            if stage == "timing the planned step":
                self._stop_timing()  # an optional output: it never undoes the plan
                self.reporter.warn(f"kerasflow: {stage} failed ({_describe(error)}); the plan stays in force.")
            else:
                self.fall_back(stage, error)
        if slower is not None:
            self.report["plan_dropped"] = slower
            self.to_default(slower, f"kerasflow: {slower}; training continues on the default placement. Pass "
                                    "drop_slower_plan=False to keep a slower plan.")
        self.step += 1

    def _window(self) -> tuple[int, int]:
        first = self.options.warmup_steps
        return first, first + self.options.profile_steps - 1

    # ------------------------------------------------------------------ planning
    def _profiling_batch(self):
        """The recorded real batch as tensors, else zeros shaped like the traced step's inputs."""
        if self.batch is not None:
            return tf.nest.map_structure(tf.convert_to_tensor, self.batch)
        if self.spec is None:
            raise KerasflowError("the training step was never traced, so its inputs are unknown")

        def zeros(spec):
            if not isinstance(spec, tf.TensorSpec):
                return spec
            dims = spec.shape.as_list()
            if any(d is None for d in dims):
                raise KerasflowError(f"no batch of the data was recorded and the step's inputs have unknown "
                                     f"dimensions {spec.shape}; give the data as tf.Tensor inputs")
            return tf.zeros(dims, spec.dtype)

        return tf.nest.map_structure(zeros, self.spec)

    def _plan_and_rebuild(self) -> None:
        started = time.perf_counter()
        times = self._profiler.stop()
        self._profiler = None
        batch = self._profiling_batch()
        say = self.reporter.say
        # With several steps per call, a profiled "step" holds several train steps.
        in_fit = times if _compat.steps_per_call(self.model) == 1 else None
        with self._unplanned():
            self.graph = profile_training_step(
                self.model, batch, device=self.options.devices[0], warmup_steps=1,
                steps=self.options.profile_steps, kernel_times=in_fit, quiet=self.reporter.quiet,
                say=lambda message: say(f"kerasflow: {message}"), source="kerasflow in-fit profile")
        say(f"kerasflow: planning for {len(self.options.devices)} devices")
        custom = self._custom_step
        replicated = self._may_replicate()
        plan, *others = ranked_plans(
            self.graph, self.cluster(), split=self.options.split and not custom,
            tick_tock="off" if custom else self.options.tick_tock, memory_limit=self.options.memory_limit,
            max_split_evaluations=self.options.max_split_evaluations, replicated=replicated,
            # "on": the user lets replicas change the math, BatchNormalization's statistics too.
            replica_statistics=replicated and self.options.replicated == "on",
            verbose=0 if self.reporter.quiet else self.options.verbose)
        self._runners_up = others if self.options.drop_slower_plan else []
        say("kerasflow: rebuilding the training step with the plan")
        self._use(plan)
        seconds = time.perf_counter() - started
        line = self.reporter.planned(plan, self.graph, self.cluster(), seconds, len(self.options.devices))
        self.report = {"plan_seconds": seconds, "algorithm": plan.algorithm, "summary": line,
                       "predicted_step_time": plan.predicted_step_time, "candidates": dict(plan.candidates),
                       "tie_margin": tie_margin_for(self.graph)}
        if self.options.log_dir:
            self.reporter.write_logs(self.options.log_dir, plan, self.graph, self.cluster())

    def _may_replicate(self) -> bool:
        """Whether the planner may replicate the step: ``replicated="on"``, or ``"auto"`` where the
        replicas keep the model's math (no batch-coupled op but BatchNormalization's, whose
        statistics they compute together) on one host (replicas across hosts are untested), on a
        runtime that can run them (a Keras 3 model whose train_step is Keras' own)."""
        choice = self.options.replicated
        if choice == "off" or self._custom_step or not _compat.can_move_variables(self.model):
            return False
        one_host = len({task_of(d) for d in self.options.devices}) == 1
        return choice == "on" or (one_host and not replica_coupled_ops(self.graph))

    def _verify_given_plan(self) -> None:
        """For ``plan=``: after the first step, checks the plan against the model's structure,
        moves the variables to their planned devices and rebuilds with the plan applied."""
        self._verify_pending = False
        batch = self._profiling_batch()
        snapshot = snapshot_variables(self.model)
        try:
            with _compat.strategy_scope(self.model), self._unplanned():
                structure = build_graph_structure(capture_step(self.model, batch))
        finally:
            restore_variables(snapshot)
        if self.plan.graph_fingerprint and structure.fingerprint() != self.plan.graph_fingerprint:
            message = (f"The plan was made for another model (fingerprint {self.plan.graph_fingerprint}, this "
                       f"model's {structure.fingerprint()}). Make a plan for this model, or pass "
                       "on_mismatch='replan' to profile and plan afresh.")
            if self.options.on_mismatch == "error":
                raise InvalidPlanError(message)
            self.reporter.warn(message + " Replanning.")
            self.options.plan = self.plan = self.applier = None
            self.state = "warming_up"
            self._install()
            self.model.make_train_function(force=True)
            self.step = 0  # warm up and profile afresh
            return
        self.graph = structure
        self._use(self.plan)

    def _use(self, plan: Plan) -> None:
        """Moves variables, installs the plan-applying step and rebuilds the train function."""
        if plan.data_parallel is not None and self._custom_step:
            raise KerasflowError("A data-parallel plan runs kerasflow's own step per replica, and this model has its "
                                 f"own train_step. Received: a plan of {plan.algorithm!r}. Plan with "
                                 "replicated=False for this model.")
        if self.state != "planned":  # a plan replacing another: the homes to go back to stay
            self._homes_before = current_homes(self.model)
        self._say_what_replicas_change(plan)
        self.plan = plan
        if self._home_variables is None:
            self._home_variables = HomeVariables(self.model)
        move_variables(self.model, group_devices(plan, self.graph), creating=self.creating)
        self.replicas = None
        if plan.data_parallel is not None:
            with _compat.strategy_scope(self.model):
                self.replicas = Replicas(self.model, list(plan.data_parallel.devices), creating=self.creating)
        self.applier = PlanApplier(plan, self.graph, self.options.devices)
        self.state = "planned"
        self._install()
        self.rebuild()
        self._read_back = True
        self.trial = None  # timed from the step after the first, which retraces

    def _say_what_replicas_change(self, plan: Plan) -> None:
        """One line when replicas run layers whose math depends on the whole batch on their own
        shares (allowed only by ``replicated="on"`` or a given plan): the losses will not be one
        device's."""
        if plan.data_parallel is None or self.graph is None:
            return
        coupled = replica_coupled_ops(self.graph) if plan.synchronizes_statistics else batch_coupled_ops(self.graph)
        layers = sorted({self.graph.op(name).layer or name for name in coupled})
        if layers:
            self.reporter.say(
                f"kerasflow: {plan.algorithm}: each replica runs {', '.join(layers[:3])}"
                f"{f' and {len(layers) - 3} more' if len(layers) > 3 else ''} on its own share of the batch "
                "(batch statistics or random numbers of their own, as MirroredStrategy computes them), so the "
                "losses differ from one device's. Plan with replicated='auto' to keep the model's math.")

    def _judge_trial(self) -> str | None:
        """Says once what the plan measured against its prediction and the default placement,
        and writes the TensorBoard scalars. Returns why the plan must be dropped when it measured
        slower than the default placement side by side, else None."""
        trial, self.trial = self.trial, None
        measured, default, ratio = trial.planned_seconds, trial.default_seconds, trial.ratio
        self.report["measured_step_time"] = measured
        profiled = self.graph.metadata.get("plain_step_seconds") if self.graph is not None else None
        if default is not None:
            self.report["default_step_time"] = default
            line = self.reporter.measured(self.plan, measured, default=default, speedup=1 / ratio)
        else:
            line = self.reporter.measured(self.plan, measured, profiled=profiled)
        self.report["measured_summary"] = line
        self.report["settled_step"] = self.step + 1
        if self.options.log_dir:
            self.reporter.write_scalars(self.options.log_dir, self.step, self.plan, self.graph, self.cluster(),
                                        measured)
        if ratio is not None and ratio > 1 + SLOWER_MARGIN:
            return (f"the plan measured {measured * 1e3:.2f} ms a step, slower than the default placement's "
                    f"{default * 1e3:.2f} ms in alternating steps ({ratio:.2f}x its step, the median of "
                    f"{TIMED_ROUNDS} rounds)")
        self._stop_timing()  # the plan stays
        return None

    def _stop_timing(self) -> None:
        """Ends the timing for good: the variables before the plan and the default placement's
        train function are let go (they hold memory on the default device)."""
        self.trial = None
        self._home_variables = self._default_function = None

    def _runner_up(self) -> tuple[Plan | None, str]:
        """The plan to try once the plan in force measured slower than the default placement,
        or ``(None, why none is)``: the best of the other candidates by ``rerank`` (a plan of
        the same kind expected as far off its prediction as the measured one), when that is
        expected more than 5 % faster than the default placement's step timed beside it."""
        others, self._runners_up = self._runners_up, []
        ranked = rerank(others, self.plan, self.report["measured_step_time"]) if self.plan.predicted_step_time else []
        if not ranked:
            return None, "no other plan is left to try"
        best, expected = ranked[0]
        # A switch costs a retrace and another timing: it is worth them only for a plan
        # expected faster than the default placement by more than the noise.
        if expected < self.report["default_step_time"] * (1 - RUNNER_UP_GAIN):
            return best, ""
        scaled = "" if not same_kind(best, self.plan) else (
            f" (predicted {best.predicted_step_time * 1e3:.2f} ms, a plan of the same kind, scaled by this plan's "
            f"measured / predicted {expected / best.predicted_step_time:.2f}x)")
        return None, f"no other plan is tried: the best of them, {best.algorithm}, is expected at " \
                     f"{expected * 1e3:.2f} ms{scaled}, not 5 % faster than the default placement"

    def _try_next_plan(self, slower: str, following: Plan) -> None:
        """The plan in force measured slower than the default placement: ``following`` replaces
        it (once), and is timed in its turn."""
        self.report["plan_replaced"] = f"{self.plan.algorithm}: {slower}"
        self.reporter.say(f"kerasflow: {slower}; trying the next plan, {following.algorithm} (predicted "
                          f"{following.predicted_step_time * 1e3:.2f} ms)")
        self._use(following)
        self.report.update(algorithm=following.algorithm, predicted_step_time=following.predicted_step_time)

    def rebuild(self) -> None:
        """Retraces the train function with the plan, every call of it guarded."""
        self.model.make_train_function(force=True)
        planned = self.model.train_function
        driver = self

        def guarded(iterator):
            if driver.state != "planned":
                return driver.run_on_default(iterator)
            try:
                if driver.trial is not None and not driver.trial.done:
                    return driver.run_timed(planned, iterator)
                return planned(iterator)
            except _NOT_OURS:
                raise
            except Exception as error:  # noqa: BLE001 - never lose the user's training
                applier = driver.applier
                lost_task = isinstance(error, tf.errors.UnavailableError)  # not the order's doing
                if applier is not None and applier.plan.order and not applier.skip_order and not lost_task:
                    # First retreat: keep the placement, drop the per-device order.
                    applier.refuse_order(_describe(error))
                    driver.reporter.warn(f"kerasflow: the planned order could not run ({_describe(error)}); "
                                         "keeping the placement without it.")
                    driver.rebuild()
                    return driver.model.train_function(iterator)  # guarded again
                driver.fall_back("running the planned step", error)
                return driver.run_on_default(iterator)

        guarded._kerasflow_guarded = True
        object.__setattr__(self.model, "train_function", guarded)

    def run_timed(self, planned: Callable, iterator):
        """One call of the train function while the plan is timed: the plan's, or the default
        placement's when the trial says so, timed to its outputs. A default step that fails ends
        the timing (the plan stays in force) and the plan runs the call."""
        trial = self.trial
        if not trial.runs_default:
            outputs, seconds = _timed(planned, iterator)
        else:
            try:
                outputs, seconds = self._run_default_step(iterator)
            except _NOT_OURS:
                raise
            except Exception as error:  # noqa: BLE001 - an optional measurement: it never undoes the plan
                self._stop_timing()
                self.reporter.warn(f"kerasflow: timing the default placement beside the plan failed "
                                   f"({_describe(error)}); the plan stays in force.")
                return planned(iterator)
        trial.record(seconds / _compat.steps_per_call(self.model))
        return outputs

    def _run_default_step(self, iterator):
        """(outputs, seconds) of one step of the default placement: the model's own train_step,
        traced by Keras on the variables before the plan moved them, which take the planned
        values first and give theirs back after (the replicas' copies too)."""
        try:
            with self._unplanned(), self._home_variables.at_home():
                if self._default_function is None:
                    kept = self.model.train_function
                    self.model.make_train_function(force=True)  # Keras takes the train_step it sees now
                    self._default_function = self.model.train_function
                    object.__setattr__(self.model, "train_function", kept)
                self.running_default = True
                return _timed(self._default_function, iterator)
        finally:  # the model's own variables hold the step's values again: the replicas take them
            self.running_default = False
            if self.replicas is not None:
                self.replicas.refresh()

    def cluster(self) -> Cluster:
        """The cluster planned for: given, the CPU testbed for logical CPUs, else measured."""
        if self.options.cluster is None:
            devices = self.options.devices
            if all("CPU" in d.upper() for d in devices):
                from kerasflow.planner.cluster import SAME_PROCESS, Device
                from kerasflow.planner.hardware import DEVICE_SPECS

                self.options.cluster = Cluster([Device(d, "CPU", DEVICE_SPECS["CPU"].memory) for d in devices],
                                               SAME_PROCESS, name=f"cpu-testbed:{len(devices)}")
            else:
                from kerasflow.profiling.links import cluster_of

                self.options.cluster = cluster_of(devices)
        return self.options.cluster

    # ------------------------------------------------------------------ reports
    def placement_report(self) -> PlacementReport | None:
        """Ops off the plan, read back after the rebuild, and whether the plan is in force (None
        before a plan was applied)."""
        if self.fallback is not None:
            return PlacementReport(self.mismatches or [], in_force=False, fallback=self.fallback)
        if self.mismatches is None:
            return None
        return PlacementReport(self.mismatches, in_force=self.state == "planned", transfers=self.transfers,
                               not_applied=self.applier.not_applied() if self.applier is not None else ())

    @property
    def in_force(self) -> bool:
        """True while the plan runs (False before it is applied and after a fallback)."""
        return self.state == "planned"

    # ------------------------------------------------------------------ failure
    def _unplanned(self):
        """The model's own ``train_step`` for a while (to trace the step as the user wrote it)."""
        return _Swapped(self.model, self._original_step)

    def fall_back(self, stage: str, error: Exception) -> None:
        """Goes back to the default placement for good, with one warning naming the cause."""
        planned = self.state == "planned"
        self.to_default(f"{stage} failed: {_describe(error)}",
                        f"kerasflow: {stage} failed ({_describe(error)}); training continues on the default "
                        f"placement{'' if planned else ', unchanged'}. {_FIX}")

    def to_default(self, reason: str, warning: str) -> None:
        """Goes back to the default placement for good: warns once, keeps ``reason`` for the
        placement report, moves the variables home and rebuilds the default train function."""
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception:  # noqa: BLE001 - already failing; the first cause is the one to report
                pass
            self._profiler = None
        self._trace = None
        self._read_back = False
        self._stop_timing()
        self._runners_up = []
        self.state = "default"
        self.fallback = reason
        self.reporter.warn(warning)
        if self.model is None or self._original_step is None:
            return
        self.applier = self.replicas = None
        object.__setattr__(self.model, "train_step", self._original_step)
        homes, creating = self._homes_before, self.creating
        lost = None
        try:
            if homes and len({task_of(d) for d in self.options.devices}) > 1:
                # Across a cluster's tasks: a silent task must not hang this call for good.
                run_within(lambda: move_variables(self.model, homes, creating=creating), _MOVE_BACK_SECONDS)
            elif homes:
                move_variables(self.model, homes, creating=creating)
        except TimeoutError:
            lost = tf.errors.UnavailableError(
                None, None, f"moving the variables back did not finish within {_MOVE_BACK_SECONDS} s")
        except Exception as failure:  # noqa: BLE001 - named in the error below
            lost = failure
        self.model.make_train_function(force=True)
        if lost is not None:
            # The variables' values live only on their planned devices: without them there is
            # no model to train, on any placement.
            raise _state_lost(lost) from None

    def run_on_default(self, iterator):
        """One call of the default train function (after a fallback); a lost cluster task,
        which takes the variables placed on it with it, is one clear error."""
        try:
            return self.default_train_function()(iterator)
        except tf.errors.UnavailableError as error:
            raise _state_lost(error) from None

    def default_train_function(self) -> Callable:
        """The train function on the default placement, built by Keras (after a fallback)."""
        function = self.model.train_function
        if getattr(function, "_kerasflow_guarded", False):
            self.model.make_train_function(force=True)
            function = self.model.train_function
        return function


# Moving a model's variables back from a cluster's tasks after a fallback: long enough for
# gigabytes over a slow network, short enough that a silent task does not hang fit for good.
_MOVE_BACK_SECONDS = 120

# How much slower than the default placement, side by side, a plan may measure before it is
# dropped: the median ratio of alternating rounds still varies by a few percent on a shared
# machine.
SLOWER_MARGIN = 0.03
# How much faster than the default placement a runner-up must be expected to be tried: a switch
# costs a retrace and another timing.
RUNNER_UP_GAIN = 0.05
# The rounds of a side-by-side timing (one planned and one default step each).
TIMED_ROUNDS = 6

_FIX = ("If this persists, report it with the model's code, or plan offline with kerasflow.profiling."
        "profile_model and kerasflow.plan and pass plan=.")


class _Swapped:
    """Context manager: ``model.train_step`` is ``step`` inside."""

    def __init__(self, model, step):
        self.model, self.step = model, step

    def __enter__(self):
        self.saved = self.model.__dict__.get("train_step")
        object.__setattr__(self.model, "train_step", self.step)

    def __exit__(self, *exc):
        object.__setattr__(self.model, "train_step", self.saved)


def _state_lost(error: BaseException) -> KerasflowError:
    """The error that ends ``fit`` when the model's variables are out of reach."""
    text = str(error)
    if not isinstance(error, tf.errors.UnavailableError):
        return KerasflowError(
            f"kerasflow: the model's variables could not be moved back to their default devices ({_describe(error)}),"
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
        f"kerasflow: {where} stopped answering during fit ({_describe(error)}). The model's variables placed there "
        "are lost with it, so training cannot continue on any placement: restart `python -m kerasflow.worker` on "
        "that host and resume from your last checkpoint (keras.callbacks.BackupAndRestore or ModelCheckpoint).")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_WRAPPER = "Exception encountered when calling"  # Keras' first line around an error inside a layer


def _describe(error: BaseException) -> str:
    """The error's type and first line of its own message (under Keras' line naming the layer)."""
    lines = [line.strip() for line in _ANSI.sub("", str(error)).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith(_KERAS_WRAPPER):
        lines = lines[1:]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


def _timed(function: Callable, iterator) -> tuple[Any, float]:
    """(outputs, seconds) of one call of a train function, up to its outputs' values."""
    started = time.perf_counter()
    outputs = function(iterator)
    values = outputs
    if isinstance(outputs, tf.experimental.Optional):  # Keras 3's train function
        values = outputs.get_value() if outputs.has_value() else []
    for value in tf.nest.flatten(values):
        if isinstance(value, tf.Tensor):
            value.numpy()
    return outputs, time.perf_counter() - started


def _batch_size(batch) -> int:
    first = next((t for t in tf.nest.flatten(batch) if hasattr(t, "shape") and len(t.shape)), None)
    return int(first.shape[0]) if first is not None else 0


def build_graph_structure(step) -> OpGraph:
    """An ``OpGraph`` of a captured step with no costs (for fingerprints and names)."""
    return build_graph(dataclasses.replace(step, function=None, batch_size=1), None, {}, None, "CPU")
