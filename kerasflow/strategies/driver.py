"""The profile -> plan -> trial -> settle state machine inside ``fit``, one per model, for both doors.

The driver is always in exactly one ``DriverState`` (``driver_state``: ``WarmingUp``,
``Profiling``, ``InTrial``, ``Planned``, ``Default``), which holds what that state owns; the
only transitions are that module's ``TRANSITIONS`` (drawn there), checked in ``DriverState.then``.

``WarmingUp``: steps on the default placement (tracing and graph optimisation happen there),
recording a real batch (``RecordedInputs``); a plan given up front is checked and applied after
step 0 (one that fits another model, with ``on_mismatch="replan"``: ``WarmingUp`` again, without
it, from the next step). Through either door a step the model compiles with XLA runs as
compiled for its first ``XlaStep.steps`` and is timed (``XlaStep``): every plan is judged
against it, and XLA is on again whenever the default placement is kept or taken back.
``Profiling``: fit's own steps under TensorFlow's profiler, then the collaborators' profiler
profiles the step and the planner plans it: by default in a process of its own
(``kerasflow.planning_job``), in ``Planning``, while the steps go on on the default placement
and each step's end asks whether the plans have arrived; with ``background_planning=False``
(or a planner that process cannot import) inside ``fit``, which waits. ``InTrial``: the plan is
in force (``InForce``, the plan's one home) and timed beside the default placement (``Trial``); its verdict keeps it (``Planned``), tries the
runner-up once, or drops it. ``Default``: the planner kept the default placement (nothing was
applied: no trial, no retrace), or ``Retreat`` took the model back to it. A failure anywhere
warns once, naming the cause, and retreats; a plan given up front that fits another model raises.
Whenever a ``fit`` ends, normally or by an exception, ``fit_ended`` takes the state where
``driver_state.AT_FIT_END`` says: nothing kerasflow started outlives that ``fit``.

The driver alone writes its state, its step counter and the fields of the ``PlanReport``
(planning makes it); the doors and ``GuardedTrainFunction`` only call its methods. One owner of
state: whenever Keras has control (after every step, before validation, evaluate, predict and
every callback, at the end of ``fit``, after every switch) the model's own variables hold the
current values; the trial's home variables and a plan's replicas are refreshed from them, and
every switch forgets the test and predict functions Keras traced before it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.devices import local_gpus
from kerasflow.planner import OpGraph, Plan
from kerasflow.planner.errors import InvalidPlanError
from kerasflow.planner.parallel.baselines import DEFAULT_PLACEMENT, best_other_than_the_default, default_placement
from kerasflow.planner.sim.simulator import step_overhead
from kerasflow.planning_job import PlanningJob, can_run_apart
from kerasflow.profiling.links import planning_cluster
from kerasflow.strategies.collaborators import Collaborators
from kerasflow.strategies.driver_state import (AT_FIT_END, Default, DriverState, InTrial, Planned, Planning, Profiling,
                                               WarmingUp)
from kerasflow.strategies.guarded import GuardedTrainFunction
from kerasflow.strategies.in_force import InForce
from kerasflow.strategies.inputs import RecordedInputs
from kerasflow.strategies.options import Options
from kerasflow.strategies.plan_report import PlanReport
from kerasflow.strategies.planning_in_fit import (LoopTime, ProfiledSteps, given_plan_mismatch, placement_only,
                                                  planned_report, planning_request, profile_in_fit)
from kerasflow.strategies.readback import PlacementCheck, PlacementReport
from kerasflow.strategies.reporting import Reporter
from kerasflow.strategies.retreat import Retreat, describe, state_lost
from kerasflow.strategies.steps import PlannedStep
from kerasflow.strategies.trial import NOT_OURS, Trial
from kerasflow.strategies.verdict import needs_confirmation
from kerasflow.strategies.xla_step import XlaStep

__all__ = ["Driver"]

_FIX = "If this persists, report it with the model's code, or plan offline with kerasflow.profiling.profile_model " \
       "and kerasflow.plan and pass plan=."


class Driver:
    """Runs the state machine of the module docstring for one model.

    Args:
        options: the door's ``Options`` (``options.plan``: the plan the user gave, if any).
        collaborators: the profiler, planner and stopwatch (``Collaborators``).
        creating: the strategy's factory ``f(device)`` letting a variable be made off its
            device (None for the callback).
        under_strategy: the door is ``FastTStrategy``, under which Keras resolves
            ``jit_compile="auto"`` to no XLA (said once on a GPU host, where plain Keras compiles
            with it); an explicit ``jit_compile=True`` is timed and kept as through the callback.

    Attributes:
        state: the ``DriverState`` it is in.
        step: the calls of the train function so far (counted by the driver alone).
    """

    def __init__(self, options: Options, *, collaborators: Collaborators = Collaborators(),
                 creating: Callable | None = None, under_strategy: bool = False):
        self.options, self.collaborators, self.creating = options, collaborators, creating
        self.under_strategy = under_strategy
        self.model = None
        self._afresh()

    def _afresh(self) -> None:
        """Everything a model's training leaves on the driver, as before any model."""
        self.xla: XlaStep | None = None  # the model's own step compiled with XLA
        self.reporter = Reporter(self.options.verbose)
        self.report = PlanReport()
        self.state: DriverState = WarmingUp(given=self.options.plan)
        self.own_step = None
        self.step = 0
        self.inputs = RecordedInputs()
        self.graph: OpGraph | None = None
        self.retreat: Retreat | None = None
        self.placement = PlacementCheck()
        self.loop = LoopTime()  # the training loop's own time per step, for the predictions

    def _go(self, state: DriverState) -> None:
        self.state = self.state.then(state)

    # ------------------------------------------------------------------ read from the state
    @property
    def in_force(self) -> bool:
        """True while the plan runs (being timed or settled)."""
        return self.state.in_force

    @property
    def in_force_parts(self) -> InForce | None:
        """The plan in force and what runs it (None while none is)."""
        return self.state.parts if self.state.in_force else None

    @property
    def plan(self) -> Plan | None:
        """The plan chosen last: in force, kept by the planner, or dropped (None before one was)."""
        return self.state.plan

    @property
    def fallback(self) -> str | None:
        """Why training is on the default placement for good (None while it is not)."""
        return self.state.reason if isinstance(self.state, Default) else None

    # ------------------------------------------------------------------ the doors' hooks
    def attach(self, model, verbose=None, *, running: bool = False) -> None:
        """Installs the recording step on ``model`` (a later ``fit``: the plan-applying one). Another
        model than the one driven so far (the callback given to another model's ``fit``) gives the
        last one back its own step and is driven afresh. ``running``: attached while Keras traces
        the model's first step (the strategy), which runs as traced."""
        if self.model is model:
            return
        if self.model is not None:
            self.detach()
            self._afresh()
        self.model = model
        _compat.on_fit_end(model, self.fit_ended)
        if self.options.verbose == "auto" and verbose is not None:
            self.reporter.verbose = 0 if verbose in (0, False) else verbose
        self._take_xla(model)
        self.reporter.attached(model, self.options)
        step = model.train_step
        self.own_step = step.original if isinstance(step, PlannedStep) else step
        if self._timing_xla:  # an XLA-compiled step cannot record its batches (a py_function)
            if running:
                self.xla.time_calls(first_step=self.step + 1)  # the step being traced is not timed
        else:
            self._install()

    def _take_xla(self, model) -> None:
        """A step compiled with XLA is timed first, or turned off for a plan given up front; on a
        GPU host the strategy's step runs without XLA, and that is said once."""
        if not _compat.uses_jit(model):
            if self.under_strategy and _compat.xla_by_default(model, local_gpus()):
                self.reporter.xla_off_under_strategy()
            return
        self.xla = XlaStep(model, stopwatch=self.collaborators.stopwatch, timed=self.options.plan is None)
        if self._timing_xla:
            self.reporter.xla_timed(self.xla.steps, self.xla.steps - 1)
            return
        self.xla.turn_off()
        model.make_train_function(force=True)
        self.reporter.xla_turned_off()

    @property
    def _timing_xla(self) -> bool:
        return self.xla is not None and self.xla.timed and self.step < self.xla.steps

    def begin_fit(self) -> None:
        """A ``fit`` starts (the callback door, after Keras made its train function): the train
        function runs what the state needs."""
        if self.in_force and not isinstance(self.model.train_function, GuardedTrainFunction):
            self.rebuild()  # a later fit whose train function Keras made anew: the plan applies again
        elif self._timing_xla:
            self.xla.time_calls(first_step=self.step)
        elif isinstance(self.state, (WarmingUp, Profiling)):
            self.model.make_train_function(force=True)

    def detach(self) -> None:
        """Gives the model back its own ``train_step``."""
        if self.model is not None and self.own_step is not None:
            _compat.override(self.model, "train_step", self.own_step)
            _compat.override(self.model, "train_function", None)
        self.model = None

    def before_step(self) -> None:
        """Before each call of the train function: starts profiling, or recording the placement."""
        try:
            state = self.state
            if isinstance(state, WarmingUp) and state.given is None and \
                    self.step - state.since == self.options.warmup_steps + (self.xla.steps if self.xla else 0):
                self._go(Profiling(ProfiledSteps(quiet=self.reporter.quiet)))
            match self.state:
                case Profiling(steps):
                    steps.enter()
                    self.loop.entered()
                case WarmingUp():
                    self.loop.entered()
            self.placement.before_step()
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.fail("profiling", error)

    def after_step(self) -> None:
        """After each call of the train function: plans, applies, reads back, judges."""
        stage = "profiling"
        try:
            if isinstance(self.state, Profiling):
                self.state.steps.leave()
            if isinstance(self.state, WarmingUp) and self._timing_xla and self.step == self.xla.steps - 1:
                stage = "turning XLA off"  # the XLA step was timed: warm-up, profile and plan go without it
                self.xla.turn_off()
                self._install()
                self.model.make_train_function(force=True)
            stage = "reading the placement back"
            state = self.state
            if isinstance(state, InTrial) and self.placement.after_step(state.parts.applier, state.parts.plan):
                state.trial.start_timing()
            match state:
                case WarmingUp(given=given) if given is not None and self.inputs.traced:
                    stage = "applying the given plan"
                    self._apply_given(given)
                case Profiling(steps) if steps.steps == self.options.profile_steps:
                    stage = "planning"
                    self._plan(steps)
                case Planning(job=job):
                    stage = "planning"
                    plans = job.poll()
                    if plans is not None:
                        self._planned(plans, job.seconds)
                case InTrial(trial=trial) if trial.done or trial.failure is not None:
                    stage = "switching to the next plan"
                    self._settle()
        except InvalidPlanError:
            raise
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.fail(stage, error)
        self.step += 1
        self.loop.left()

    def fit_ended(self, model) -> None:
        """A ``fit`` of ``model`` ended, normally or by an exception: the state goes where
        ``AT_FIT_END`` says. A profile cut short stops TensorFlow's profiler and is dropped (the
        next ``fit`` warms up and profiles afresh); a plan still being timed is judged on what was
        measured (no runner-up). A failure here warns and retreats, as anywhere."""
        if model is not self.model:  # the callback went on to another model
            return
        state = self.state
        try:
            match state:
                case Profiling(steps):
                    steps.close()
                    self._go(WarmingUp(since=self.step))
                case Planning(job=job):
                    job.cancel()
                    self.reporter.say("kerasflow: fit ended before the plan arrived; the planner was stopped "
                                      "(the next fit profiles and plans afresh)")
                    self._go(WarmingUp(since=self.step))
                case InTrial():
                    self._settle(final=True)
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.fail("ending fit", error)
        # A failure goes back to the default placement from any state, at the end of fit too.
        assert isinstance(self.state, (*AT_FIT_END[type(state)], Default)), f"kerasflow: fit ended in {self.state.name}"

    # ------------------------------------------------------------------ planning
    def _plan(self, profiled: ProfiledSteps) -> None:
        """Stops profiling, profiles the step and plans it: beside training (``Planning``, where
        the planner can run in a process of its own) or here, ``fit`` waiting."""
        started = time.perf_counter()
        times = profiled.stop()
        self.graph = profile_in_fit(
            self.model, self.inputs.tensors(), own_step=self.own_step,
            kernel_times=times if _compat.steps_per_call(self.model) == 1 else None,  # a "step" may hold several
            options=self.options, collaborators=self.collaborators, reporter=self.reporter,
            loop_seconds=self.loop.seconds(_compat.steps_per_call(self.model)))
        self.inputs.stop()  # the steps run on meanwhile record no batch
        cluster = planning_cluster(self.options)
        self.reporter.say(f"kerasflow: planning for {len(self.options.devices)} devices")
        planner = self.collaborators.planner
        if self.options.background_planning and can_run_apart(planner):
            self.reporter.say("kerasflow: the planner runs beside training; steps go on on the default placement")
            request = planning_request(self.model, self.graph, cluster, self.options, verbose=0)
            job = PlanningJob(planner, request, time_limit=self.options.planning_time_limit)
            self._go(Planning(job, since=self.step, profile_seconds=time.perf_counter() - started))
            return
        verbose = 0 if self.reporter.quiet else self.options.verbose
        plans = planner(planning_request(self.model, self.graph, cluster, self.options, verbose=verbose))
        self._planned(plans, time.perf_counter() - started)

    def _planned(self, plans: list[Plan], seconds: float) -> None:
        """The planner's ranked ``plans`` (``seconds`` after it started): the default placement
        kept, or the best plan put in force and timed."""
        plan, trial = self._trial_of(plans, seconds)
        if plan.algorithm == DEFAULT_PLACEMENT:
            self._keep_default(plan)
        elif self.xla is not None and not self.xla.beaten_by(plan.predicted_step_time, step_overhead(self.graph)):
            self._keep_for_xla(plan)
        else:
            self._switch(plan, trial, "rebuilding the step with the plan")

    def _trial_of(self, plans: list[Plan], seconds: float) -> tuple[Plan, Trial]:
        """The best of ``plans`` and the trial that will time it; the report made."""
        (plan, *others), cluster = plans, planning_cluster(self.options)
        state = self.state
        beside = isinstance(state, Planning)
        self.report = planned_report(
            self.graph, plan, cluster, self.options, self.reporter,
            plan_seconds=seconds + (state.profile_seconds if beside else 0.0),
            wait_seconds=state.profile_seconds if beside else seconds,
            steps_while_planning=self.step - state.since if beside else 0)
        # Trusted as far as the kinds it runs on were calibrated (a multi-host plan names remote devices).
        kinds = {cluster.device(d).kind for d in plan.devices() if d in cluster.device_names} or set(cluster.kinds())
        xla = self.xla.seconds if self.xla is not None else None
        self.report.xla_step_time = xla
        # The simulator never priced an XLA-compiled step: a plan is always timed beside it.
        confirm = self.options.drop_slower_plan and (xla is not None or needs_confirmation(plan, kinds))
        if plan.algorithm != DEFAULT_PLACEMENT:
            if self.options.drop_slower_plan and not confirm:
                gain = plan.candidates[DEFAULT_PLACEMENT] / plan.predicted_step_time
                self.reporter.say(f"kerasflow: the plan is predicted {gain:.2f}x faster than the default placement, "
                                  "beyond the simulator's measured error: it is not timed beside it")
            self.reporter.say("kerasflow: rebuilding the training step with the plan")
        return plan, Trial(self.model, stopwatch=self.collaborators.stopwatch, runners_up=others,
                           against_default=confirm, unplanned=self._unplanned,
                           compiling=self.xla.compiled if xla is not None else None,
                           default_name="the default placement" + (" with XLA" if xla is not None else ""))

    def _keep_default(self, plan: Plan, reason: str | None = None) -> None:
        """The planner predicts no plan enough faster (``plan`` is its default placement; ``reason``
        says why, by default that): nothing is applied or timed; the step traced for profiling runs
        on (its recording of batches stops), later traces are Keras' own; a step the model compiles
        with XLA gets XLA back."""
        self.inputs.stop()
        _compat.override(self.model, "train_step", self.own_step)
        if reason is None:
            best = best_other_than_the_default(plan)
            reason = "no plan is predicted enough faster" + (
                f": the best, {best[0]}, at {best[1] * 1e3:.2f} ms a step against its "
                f"{plan.predicted_step_time * 1e3:.2f} ms" if best else "")
        self._go(Default(reason, kept=plan))
        self._restore_xla()

    def _keep_for_xla(self, plan: Plan) -> None:
        """``plan`` is not predicted faster than the model's own XLA-compiled step: the default
        placement is kept, with XLA."""
        loop = step_overhead(self.graph)
        line = self.reporter.kept_for_xla(plan, self.xla.seconds, loop)
        default = default_placement(self.graph, planning_cluster(self.options))
        self._keep_default(dataclasses.replace(default, candidates=dict(plan.candidates), excluded=dict(plan.excluded)),
                           f"no plan is predicted faster than the model's own step with XLA: the best, {plan.algorithm}, "
                           f"at {(plan.predicted_step_time - loop) * 1e3:.2f} ms a step without XLA against its "
                           f"{self.xla.seconds * 1e3:.2f} ms measured")
        self.report.algorithm, self.report.summary = DEFAULT_PLACEMENT, line
        self.report.predicted_step_time = default.predicted_step_time

    def _restore_xla(self) -> None:
        """The default placement runs the model's own step with XLA again, as the user compiled it."""
        if self.xla is None or self.model is None:
            return
        self.xla.restore()
        self.model.make_train_function(force=True)
        self.reporter.xla_restored(self.xla.seconds)

    def _apply_given(self, given: Plan) -> None:
        """``plan=``: checked against the model after step 0, then applied (timed for the report only).
        Under ``deterministic``, a plan that adds sums in another order is refused."""
        if placement_only(self.options) and not given.placement_only:
            raise InvalidPlanError(
                f"The plan given ({given.algorithm}) adds sums in another order than the default placement (replicas, a "
                "split layer or waves), and deterministic training asks for plans that compute bit for bit as it: "
                "two runs would not give the same weights. Pass a placement-only plan, or deterministic='off'. "
                f"Received: deterministic={self.options.deterministic!r}" + (
                    " with TensorFlow's op determinism on" if self.options.deterministic == "auto" else ""))
        structure, mismatch = given_plan_mismatch(self.model, self.inputs.tensors(), self.own_step, given)
        if mismatch is not None:
            if self.options.on_mismatch == "error":
                raise InvalidPlanError(mismatch)
            self.reporter.warn(mismatch + " Replanning.")
            self._go(WarmingUp(since=self.step + 1))  # warm up and profile afresh from the next step
            return
        self.graph = structure
        self._switch(given, Trial(self.model, stopwatch=self.collaborators.stopwatch, against_default=False,
                                  unplanned=self._unplanned), "applying the given plan")

    def _switch(self, plan: Plan, trial: Trial, stage: str) -> None:
        """Puts ``plan`` in force: variables moved, the plan-applying step installed, the train
        function rebuilt, Keras' test and predict functions forgotten; ``trial`` times it. A plan
        that cannot be put in force (``stage`` names the step) is the plan dropped for good."""
        self.retreat = self.retreat or Retreat(self.model, self.own_step, self.options.devices, self.creating)
        self.reporter.replicas_change_the_math(plan, self.graph)
        self.reporter.draws_start_afresh(plan, self.graph)
        try:
            parts = InForce.put(self.model, plan, self.graph, self.options.devices, self.creating, self._unplanned)
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.fail(stage, error, plan, trial)
            return
        self._go(InTrial(parts, trial))
        self.rebuild()
        _compat.forget_traced_functions(self.model)
        self.placement.arm()

    def _settle(self, final: bool = False) -> None:
        """Judges the timed plan (``final``: fit ended, its last step counted): kept, replaced or dropped."""
        parts, trial = self.state.parts, self.state.trial
        self.placement.armed = False  # fit may end before a plan's first step was read back
        if trial.failure is not None:
            self.reporter.warn(f"kerasflow: timing the default placement beside the plan failed "
                               f"({describe(trial.failure)}); the plan stays in force.")
            self._go(Planned(parts))
            return
        verdict, measured = trial.judge(parts.plan, final=final)
        if measured["measured_step_time"] is not None:
            self._record_measured(parts.plan, trial.default_name, self.step - final, **measured)
        if verdict.keep:
            self._go(Planned(parts))  # the home variables and the default function are let go
        elif verdict.runner_up is not None:
            self.reporter.replaced(verdict.runner_up, verdict.why)
            self.report.plan_replaced = f"{parts.plan.algorithm}: {verdict.why}"
            self.report.algorithm = verdict.runner_up.algorithm
            self.report.predicted_step_time = verdict.runner_up.predicted_step_time
            self._switch(verdict.runner_up, trial, "switching to the next plan")
        else:
            self.report.plan_dropped = verdict.why
            self.back_to_default(verdict.why, f"kerasflow: {verdict.why}; training continues on the default "
                                              "placement. Pass drop_slower_plan=False to keep a slower plan.")

    def _record_measured(self, plan: Plan, default_name: str, step: int, *, measured_step_time: float,
                         default_step_time: float | None, ratio: float | None) -> None:
        """Says what the plan measured by ``step`` and keeps it in the ``PlanReport`` (and TensorBoard's)."""
        report = self.report
        report.measured_step_time, report.default_step_time = measured_step_time, default_step_time
        report.measured_summary = self.reporter.trial_measured(plan, self.graph, measured_step_time,
                                                               default_step_time, ratio, default_name)
        report.settled_step = step + 1
        if self.options.log_dir:
            self.reporter.write_scalars(self.options.log_dir, self.step, plan, self.graph,
                                        planning_cluster(self.options), measured_step_time)

    # ------------------------------------------------------------------ running steps
    def _install(self) -> None:
        step = PlannedStep(self.model, self.own_step, self.in_force_parts, on_trace=self.inputs.on_trace,
                           custom_step=_compat.has_own_train_step(self.model),
                           on_batch=self.inputs.on_batch if isinstance(self.state, (WarmingUp, Profiling)) else None)
        _compat.override(self.model, "train_step", step)

    def _unplanned(self):
        return _compat.overridden(self.model, "train_step", self.own_step)

    def rebuild(self) -> None:
        """Installs the plan-applying step and retraces the train function (``GuardedTrainFunction``)."""
        self._install()
        self.model.make_train_function(force=True)
        _compat.override(self.model, "train_function", GuardedTrainFunction(self.model.train_function, self))

    def run_step(self, planned: Callable, iterator):
        """One call of the train function as Keras makes it (``GuardedTrainFunction``): ``planned``
        (the train function traced with the plan-applying step) while a plan is in force, chosen
        and timed by the trial while it runs, else Keras' own.

        A planned call that fails never ends ``fit``: the plan's per-device order is dropped
        (TensorFlow may refuse an order; the placement stays) and the call tried again once, else
        training goes back to the default placement, which runs that same call. A lost cluster task
        (``tf.errors.UnavailableError``) and a replicas' sum that timed out
        (``Collectives.timed_out``) are never the order's doing; the end of the data and an
        interrupt (``NOT_OURS``) pass through, as they do in plain Keras.
        """
        state = self.state
        if not state.in_force:
            return self.run_on_default(iterator)
        parts = state.parts
        try:
            if isinstance(state, InTrial):
                return state.trial.run(functools.partial(parts.run, planned), iterator, parts.plan, parts.replicas)
            return self.collaborators.stopwatch(lambda: parts.run(planned, iterator), parts.plan)[0]
        except NOT_OURS:
            raise
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            lost_task = isinstance(error, tf.errors.UnavailableError)
            if isinstance(error, tf.errors.DeadlineExceededError) and parts.replicas is not None:
                error = parts.replicas.collectives.timed_out(error)  # no order is to blame: no retry
                lost_task = True
            if parts.plan.order and not parts.applier.skip_order and not lost_task:
                parts.applier.refuse_order(describe(error))
                self.reporter.warn(f"kerasflow: the planned order could not run ({describe(error)}); "
                                   "keeping the placement without it.")
                self.rebuild()
                return self.model.train_function(iterator)  # guarded again: a second failure goes back
            self.fail("running the planned step", error)
            return self.run_on_default(iterator)

    def run_on_default(self, iterator):
        """One call of Keras' own train function; a lost cluster task is one clear error."""
        if isinstance(self.model.train_function, GuardedTrainFunction):
            self.model.make_train_function(force=True)
        try:
            return self.model.train_function(iterator)
        except tf.errors.UnavailableError as error:
            raise state_lost(error) from None

    # ------------------------------------------------------------------ going back
    def fail(self, stage: str, error: Exception, plan: Plan | None = None, trial: Trial | None = None) -> None:
        """Goes back to the default placement for good, with one warning naming the cause; ``plan``
        and its ``trial``: the plan chosen that could not be put in force."""
        self.back_to_default(f"{stage} failed: {describe(error)}",
                             f"kerasflow: {stage} failed ({describe(error)}); training continues on the default "
                             f"placement{'' if self.in_force else ', unchanged'}. {_FIX}", plan, trial)

    def back_to_default(self, reason: str, warning: str, plan: Plan | None = None, trial: Trial | None = None) -> None:
        """Warns once, keeps ``reason`` for the placement report and retreats (see ``Retreat``);
        ``plan`` and ``trial``: the plan chosen last and its trial, when not the state's."""
        state = self.state
        if isinstance(state, Default):
            return
        if isinstance(state, Profiling):
            state.steps.close()  # does nothing once planning stopped the profiler
        if isinstance(state, Planning):
            state.job.cancel()  # does nothing once the job is done
        if trial is None and isinstance(state, InTrial):
            trial = state.trial
        self.placement.armed = False
        self._go(Default(reason, dropped=plan if plan is not None else state.plan))
        self.reporter.warn(warning)
        if self.xla is not None:
            self.xla.restore()  # Keras' train function, made anew below or by the trial, compiles with XLA
        if self.model is not None and self.own_step is not None:
            self.retreat = self.retreat or Retreat(self.model, self.own_step, self.options.devices, self.creating)
            # A trial's way back is shorter: its home variables and the default function traced on them.
            homes, function = (trial.homes, trial.default_function) if trial is not None else (None, None)
            self.retreat.go(homes, function)
        if self.xla is not None:
            self.reporter.xla_restored(self.xla.seconds)

    def placement_report(self) -> PlacementReport | None:
        """Ops off the plan, read back after the rebuild (None before a plan was applied)."""
        state, check, parts = self.state, self.placement, self.in_force_parts
        if isinstance(state, Default):
            mismatches = check.executed.mismatches if check.executed is not None else []
            return PlacementReport(mismatches, in_force=False, fallback=state.reason, default_kept=state.kept is not None)
        if check.executed is None:
            return None
        return PlacementReport.of_step(check.executed, in_force=state.in_force,
                                       not_applied=parts.applier.not_applied() if parts else ())
