"""The profile -> plan -> rebuild loop inside one ``fit`` call, shared by the strategy and the callback.

Steps ``0 .. warmup_steps-1`` run on the default placement (tracing and graph optimisation
happen there); the next ``profile_steps`` steps are profiled; after the last of them the
step is traced once more to read its structure, a half batch is profiled for the batch
scaling (weights restored), ``kerasflow.plan`` runs, variables move to their planned
devices, ``model.train_step`` becomes the plan-applying step and the train function is
rebuilt (``make_train_function(force=True)``), so the next step runs on the plan. The step
after that reads the real placement back from the partition graphs. Any failure warns
once and training continues on the default placement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import warnings
from typing import Any, Callable

import tensorflow as tf

from kerasflow import _compat
from kerasflow.planner import Cluster, OpGraph, Plan, baselines, plan as make_plan, simulate
from kerasflow.planner.errors import InvalidPlanError, KerasflowError
from kerasflow.profiling.capture import capture_step
from kerasflow.profiling.profiler import (
    build_graph, half_batch, profile_step, restore_variables, snapshot_variables, time_step, with_dispatch_overhead,
)
from kerasflow.profiling.xplane import StepProfiler, attribute
from kerasflow.strategies.applier import PlanApplier, normalize_device, split_name
from kerasflow.strategies.steps import PlannedStep
from kerasflow.strategies.variables import group_devices, move_variables

__all__ = ["Options", "Driver", "PlacementMismatch"]


@dataclasses.dataclass
class Options:
    """How kerasflow plans inside ``fit``; arguments first, then ``KERASFLOW_*`` variables.

    Environment: ``KERASFLOW_WARMUP_STEPS``, ``KERASFLOW_PROFILE_STEPS``, ``KERASFLOW_SPLIT``
    (0/1), ``KERASFLOW_TICK_TOCK``, ``KERASFLOW_MEMORY_LIMIT``, ``KERASFLOW_LOG_DIR``,
    ``KERASFLOW_VERBOSE`` — used for any argument left at None.
    """

    devices: list[str]
    cluster: Cluster | None = None
    plan: Plan | None = None
    warmup_steps: int = 2
    profile_steps: int = 3
    split: bool = True
    tick_tock: str = "auto"
    memory_limit: float | None = None
    log_dir: str | None = None
    verbose: Any = "auto"
    on_mismatch: str = "error"
    max_split_evaluations: int = 16

    @classmethod
    def build(cls, devices, **kwargs) -> "Options":
        env = os.environ

        def pick(name, cast, default):
            value = kwargs.get(name)
            if value is not None:
                return value
            raw = env.get(f"KERASFLOW_{name.upper()}")
            return cast(raw) if raw not in (None, "") else default

        options = cls(
            devices=list(devices), cluster=kwargs.get("cluster"), plan=kwargs.get("plan"),
            warmup_steps=pick("warmup_steps", int, 2), profile_steps=pick("profile_steps", int, 3),
            split=pick("split", lambda v: v not in ("0", "false", "False"), True),
            tick_tock=pick("tick_tock", str, "auto"), memory_limit=pick("memory_limit", float, None),
            log_dir=pick("log_dir", str, None), verbose=pick("verbose", str, "auto"),
            on_mismatch=kwargs.get("on_mismatch") or "error")
        if options.warmup_steps < 2:
            raise KerasflowError(f"warmup_steps must be >= 2 (steps 0-1 trace and optimise the graph); "
                                 f"received {options.warmup_steps}.")
        if options.profile_steps < 1:
            raise KerasflowError(f"profile_steps must be >= 1; received {options.profile_steps}.")
        if options.on_mismatch not in ("error", "replan"):
            raise KerasflowError(f"on_mismatch must be 'error' or 'replan'; received {options.on_mismatch!r}.")
        return options


@dataclasses.dataclass
class PlacementMismatch:
    """An op that did not land where the plan put it."""

    op: str
    planned: str
    actual: str


class Driver:
    """Runs the profile -> plan -> rebuild loop for one model (see the module docstring)."""

    def __init__(self, options: Options, *, creating: Callable | None = None,
                 emit: Callable[[str], None] | None = None):
        self.options = options
        self.creating = creating
        self.emit = emit
        self.model = None
        self.step = 0
        self.spec = None
        self.plan: Plan | None = None
        self.graph: OpGraph | None = None
        self.applier: PlanApplier | None = None
        self.failed = False
        self.mismatches: list[PlacementMismatch] | None = None
        self.report: dict = {}
        self._profiler: StepProfiler | None = None
        self._trace = None
        self._read_back = False
        self._original_step = None
        self._custom_step = False
        self._spec_full = False
        self._verify_pending = False
        self.batch_hint: int | None = None
        self._step_started = 0.0
        self._measured: list[float] | None = None  # planned step times, for the TensorBoard scalars

    # ------------------------------------------------------------------ attach
    def attach(self, model) -> None:
        """Installs the recording step on ``model`` (the plan-applying step once planned)."""
        if self.model is model:
            return
        self.model = model
        if _compat.uses_jit(model):
            _compat.disable_jit(model)
            self._say("kerasflow: jit_compile turned off: XLA fuses the step into a few clusters, which erases "
                      "per-op placement and profiles.")
        self._custom_step = _compat.has_own_train_step(model)
        if self._custom_step:
            self._say("kerasflow: the model defines its own train_step: placement and order are applied, "
                      "op splitting and waves are not.")
        self._original_step = model.train_step
        if self.options.plan is not None:
            # Step 0 runs as traced by Keras (recording the inputs); the given plan is
            # checked and applied from step 1, through the guarded rebuild.
            self.plan = self.options.plan
            self._verify_pending = True
        self._install()

    @contextlib.contextmanager
    def _unplanned(self):
        """The model's own ``train_step`` for a while (to read the step as the user wrote it)."""
        current = self.model.__dict__.get("train_step")
        object.__setattr__(self.model, "train_step", self._original_step)
        try:
            yield
        finally:
            object.__setattr__(self.model, "train_step", current)

    def _install(self) -> None:
        step = PlannedStep(self.model, self._original_step, self.applier, on_trace=self._record,
                           custom_step=self._custom_step)
        object.__setattr__(self.model, "train_step", step)

    def _record(self, data) -> None:
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                     data)
        full = all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec) if isinstance(s, tf.TensorSpec))
        # A fully-shaped trace wins over a relaxed-shape one (a partial batch), which is kept
        # only until a full one comes.
        if full and not self._spec_full:
            self.spec, self._spec_full = spec, True
        elif self.spec is None:
            self.spec = spec

    def _verify_given_plan(self) -> None:
        """For ``plan=``: after the first step, checks the plan against the model's structure,
        moves the variables to their planned devices and rebuilds with the plan applied."""
        self._verify_pending = False
        batch = self._zeros_batch()
        snapshot = snapshot_variables(self.model)
        try:
            with _compat.strategy_scope(self.model), self._unplanned():
                structure = build_graph_structure(capture_step(self.model, batch).ops)
        finally:
            restore_variables(snapshot)
        if self.plan.graph_fingerprint and structure.fingerprint() != self.plan.graph_fingerprint:
            message = (f"The plan was made for another model (fingerprint {self.plan.graph_fingerprint}, this "
                       f"model's {structure.fingerprint()}). Make a plan for this model, or pass "
                       "on_mismatch='replan' to profile and plan afresh.")
            if self.options.on_mismatch == "error":
                raise InvalidPlanError(message)
            self._warn(message + " Replanning.")
            self.options.plan = self.plan = self.applier = None
            self._install()
            self.model.make_train_function(force=True)
            self.step = 0  # warm up and profile afresh
            return
        self.graph = structure
        move_variables(self.model, group_devices(self.plan, structure), creating=self.creating)
        self.applier = PlanApplier(self.plan, structure, self.options.devices)
        self._install()
        self._rebuild()
        self._read_back = True

    # ------------------------------------------------------------------ per step
    def before_step(self) -> None:
        """Called before each training step (each call of the train function)."""
        self._step_started = time.perf_counter()
        if self.failed or self.model is None:
            return
        first, last = self._window()
        try:
            if self.plan is None and self.step == first:
                self._profiler = StepProfiler()
                self._profiler.start()
            if self._profiler is not None and first <= self.step <= last:
                self._trace = self._profiler.step(self.step - first)
                self._trace.__enter__()
            if self._read_back:
                from tensorflow.python.eager import context

                context.context().enable_run_metadata()
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self._fail("profiling", error)

    def after_step(self) -> None:
        """Called after each training step; plans and rebuilds after the profiled steps."""
        if self.failed or self.model is None:
            self.step += 1
            return
        first, last = self._window()
        try:
            if self._trace is not None:
                self._trace.__exit__(None, None, None)
                self._trace = None
            if self._read_back:
                self._read_back = False
                self._read_placement()
            if self._verify_pending and self.spec is not None:
                self._verify_given_plan()
            elif self.plan is None and self.step == last:
                self._plan_and_rebuild()
            elif self.plan is not None and self._measured is not None:
                self._measure_planned_step()
        except InvalidPlanError:
            raise
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self._fail("planning" if self.plan is None else "rebuilding", error)
        self.step += 1

    def _window(self) -> tuple[int, int]:
        first = self.options.warmup_steps
        return first, first + self.options.profile_steps - 1

    # ------------------------------------------------------------------ planning
    def _plan_and_rebuild(self) -> None:
        started = time.perf_counter()
        times = self._profiler.stop()
        self._profiler = None
        if self.spec is None:
            raise KerasflowError("the training step was never traced, so its inputs are unknown")
        model = self.model
        batch = self._zeros_batch()
        snapshot = snapshot_variables(model)
        try:
            device = self.options.devices[0]
            with _compat.strategy_scope(model), tf.device(device), self._unplanned():
                big = capture_step(model, batch)
                result = attribute(times, big.by_name(), {op.name: op.flops for op in big.ops})
                if result.coverage < 0.5:  # fit's step differs by name: profile the traced step itself
                    result, plain, _ = profile_step(big, batch, 2, self.options.profile_steps, device)
                else:
                    plain = time_step(big, batch, self.options.profile_steps, device)
                seconds, overhead = with_dispatch_overhead(result.seconds, big, plain)
                small = capture_step(model, half_batch(batch)) if big.batch_size > 1 else None
                small_seconds = None
                if small is not None:
                    small_result, small_plain, _ = profile_step(small, half_batch(batch), 2,
                                                                self.options.profile_steps, device)
                    small_seconds, _ = with_dispatch_overhead(small_result.seconds, small, small_plain)
        finally:
            restore_variables(snapshot)
        kind = self.cluster().devices[0].kind
        self.graph = build_graph(big, small, seconds, small_seconds, kind, name=model.name,
                                 metadata={"coverage": round(result.coverage, 6), "source": "kerasflow in-fit profile",
                                           "dispatch_overhead_per_op_seconds": overhead})
        custom = self._custom_step
        plan = make_plan(self.graph, self.cluster(), split=self.options.split and not custom,
                         tick_tock="off" if custom else self.options.tick_tock, memory_limit=self.options.memory_limit,
                         max_split_evaluations=self.options.max_split_evaluations, replicated=False,
                         verbose=self.options.verbose)
        plan_seconds = time.perf_counter() - started
        self._use(plan)
        self._summarise(plan, plan_seconds)

    def _use(self, plan: Plan) -> None:
        """Moves variables, installs the plan-applying step and rebuilds the train function."""
        if plan.data_parallel is not None:
            raise KerasflowError("a data-parallel plan replicates the step; FastTStrategy runs one replica whose "
                                 "ops it spreads (use tf.distribute.MirroredStrategy for replicas)")
        self.plan = plan
        move_variables(self.model, group_devices(plan, self.graph), creating=self.creating)
        self.applier = PlanApplier(plan, self.graph, self.options.devices)
        self._install()
        self._rebuild()
        self._read_back = True
        self._measured = [] if self.options.log_dir else None

    _MEASURED_STEPS = 5

    def _measure_planned_step(self) -> None:
        """Times planned steps (the first one, which retraces, is left out) and, after a few,
        writes TensorBoard scalars to ``log_dir/kerasflow``: predicted and measured step time,
        samples per second, and each device's predicted utilisation."""
        if self._read_back or self.step <= self._window()[1] + 1:
            return
        self._measured.append(time.perf_counter() - self._step_started)
        if len(self._measured) < self._MEASURED_STEPS:
            return
        measured = sorted(self._measured)[len(self._measured) // 2]
        self._measured = None
        self.report["measured_step_time"] = measured
        batch = self.plan.batch_size or (self.graph.batch_size if self.graph is not None else 0)
        writer = tf.summary.create_file_writer(os.path.join(self.options.log_dir, "kerasflow"))
        with writer.as_default():
            tf.summary.scalar("step_time/predicted_seconds", self.plan.predicted_step_time, step=self.step)
            tf.summary.scalar("step_time/measured_seconds", measured, step=self.step)
            if batch:
                tf.summary.scalar("samples_per_second/measured", batch / measured, step=self.step)
                tf.summary.scalar("samples_per_second/predicted", batch / self.plan.predicted_step_time,
                                  step=self.step)
            if self.graph is not None:
                result = simulate(self.graph, self.cluster(), self.plan, memory=False)
                for device, share in result.utilization.items():
                    tf.summary.scalar(f"utilization/{device.strip('/').replace(':', '_')}", share, step=self.step)
        writer.flush()

    def _zeros_batch(self):
        """A batch of zeros shaped like the traced one (an unknown batch size taken from the data)."""
        def zeros(spec):
            if not isinstance(spec, tf.TensorSpec):
                return spec
            dims = spec.shape.as_list()
            if dims and dims[0] is None:
                if self.batch_hint is None:
                    raise KerasflowError("the batch size is unknown (the data has a partial last batch); use "
                                         "FastTStrategy, whose dataset reveals it, or batches of one size")
                dims[0] = self.batch_hint
            if any(d is None for d in dims):
                raise KerasflowError(f"the step's inputs have unknown dimensions {spec.shape}")
            return tf.zeros(dims, spec.dtype)
        return tf.nest.map_structure(zeros, self.spec)

    def _rebuild(self) -> None:
        """Retraces the train function with the plan; if its first run fails (TensorFlow refuses
        the placement), training goes back to the default placement for that same step."""
        self.model.make_train_function(force=True)
        function = self.model.train_function
        driver = self
        state = {"first": True}

        def guarded(iterator):
            if not state["first"]:
                return function(iterator)
            state["first"] = False
            try:
                return function(iterator)
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, tf.errors.InternalError) as error:
                applier = driver.applier
                if applier is not None and applier.plan.order and not applier.skip_order:
                    # First retreat: keep the placement, drop the per-device order.
                    applier.skip_order = True
                    driver._warn(f"kerasflow: the planned order could not run ({str(error).splitlines()[0]}); "
                                 "keeping the placement without it.")
                    driver._rebuild()
                    return driver.model.train_function(iterator)
                driver._fail("running the planned step", error)
                return driver.model.train_function(iterator)

        object.__setattr__(self.model, "train_function", guarded)

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

    def _summarise(self, plan: Plan, seconds: float) -> None:
        c = plan.candidates
        single = c.get("single_device")
        parallel = baselines.data_parallel(self.graph, self.cluster()).predicted_step_time
        line = (f"kerasflow: {len(self.options.devices)} devices, planned in {seconds:.1f}s ({plan.algorithm}): "
                f"predicted step {plan.predicted_step_time * 1e3:.2f} ms")
        if single:
            line += f", {single / plan.predicted_step_time:.2f}x single device"
        if parallel:
            line += f", {parallel / plan.predicted_step_time:.2f}x data-parallel"
        self.report = {"plan_seconds": seconds, "algorithm": plan.algorithm,
                       "predicted_step_time": plan.predicted_step_time, "candidates": dict(c)}
        self._say(line)
        if self.options.log_dir:
            os.makedirs(self.options.log_dir, exist_ok=True)
            plan.save(os.path.join(self.options.log_dir, "plan.json"))
            self.graph.save(os.path.join(self.options.log_dir, "profile.json"))
            simulate(self.graph, self.cluster(), plan).save_chrome_trace(
                os.path.join(self.options.log_dir, "timeline.json"))

    # ------------------------------------------------------------------ read-back
    def _read_placement(self) -> None:
        from tensorflow.python.eager import context

        metadata = context.context().export_run_metadata()
        context.context().disable_run_metadata()
        if metadata is None or self.applier is None:
            return
        # A name can appear in several partition graphs (functions instantiated more than
        # once): an op is where the plan put it if any of its instances is.
        actual: dict[str, set[str]] = {}
        planned_of: dict[str, str] = {}
        for partition in metadata.partition_graphs:
            for node in partition.node:
                name = _strip_call(node.name)
                if name is None or node.op in ("_Send", "_Recv", "_Arg", "_Retval", "NoOp", "Const"):
                    continue
                base, _, shard = split_name(name)
                if node.op.startswith(_RESOURCE_OPS):
                    # Runs where its variable lives: compare with the variable's planned home.
                    planned = self.plan.placement.get(base) if shard < 0 else None
                else:
                    planned, _ = self.applier.device_for(name)
                    if base not in self.plan.placement and shard < 0:
                        planned = None
                if planned is None:
                    continue
                planned_of[name] = planned
                actual.setdefault(name, set()).add(normalize_device(node.device))
        mismatches = [PlacementMismatch(name, planned_of[name], ", ".join(sorted(devices)))
                      for name, devices in sorted(actual.items()) if planned_of[name] not in devices]
        self.mismatches = mismatches

    # ------------------------------------------------------------------ messages
    def _say(self, line: str) -> None:
        if self.options.verbose in (0, "0", False):
            return
        (self.emit or (lambda text: print(text, file=sys.stdout, flush=True)))(line)

    def _warn(self, message: str) -> None:
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _fail(self, stage: str, error: Exception) -> None:
        if self._profiler is not None:
            try:
                self._profiler.stop()
            except Exception:  # noqa: BLE001
                pass
            self._profiler = None
        self.failed = True
        self._warn(f"kerasflow: {stage} failed ({type(error).__name__}: {error}); training continues on the "
                   "default placement.")
        if self.model is not None and self._original_step is not None and self.applier is not None:
            try:
                object.__setattr__(self.model, "train_step", self._original_step)
                self.model.make_train_function(force=True)
            except Exception:  # noqa: BLE001
                pass


_RESOURCE_OPS = ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                 "ResourceApply", "ResourceGather", "ResourceScatter", "VarHandleOp", "VarIsInitializedOp")


def _strip_call(name: str) -> str | None:
    """The step's op name inside fit's graph (inlined under a call prefix), else None."""
    parts = name.split("/")
    stripped = 0
    while parts and (parts[0].startswith(("StatefulPartitionedCall", "PartitionedCall", "__inference"))):
        parts = parts[1:]
        stripped += 1
    return "/".join(parts) if stripped and parts else None


def build_graph_structure(ops) -> OpGraph:
    """An ``OpGraph`` of captured ops with no costs (for fingerprints and names)."""
    from kerasflow.profiling.capture import CapturedStep

    step = CapturedStep(ops, None, 1, {})
    return build_graph(step, None, {}, None, "CPU")
