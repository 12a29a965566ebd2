"""``FastTStrategy``: a ``tf.distribute`` strategy that plans and applies FastT inside ``model.fit``."""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import one_device_strategy
from tensorflow.python.framework import ops

from kerasflow import _compat
from kerasflow.devices import canonical_device
from kerasflow.planner import Cluster, Plan
from kerasflow.planner.errors import KerasflowError
from kerasflow.profiling.links import planning_cluster
from kerasflow.strategies.collaborators import Collaborators
from kerasflow.strategies.driver import Driver
from kerasflow.strategies.options import Options
from kerasflow.strategies.plan_report import PlanReport

__all__ = ["FastTStrategy"]

_DRIVER = "_kerasflow_driver"  # where a model trained under the strategy keeps its driver


class _FastTExtended(one_device_strategy.OneDeviceExtended):
    """One replica on the first device; the plan spreads its ops over all devices."""

    def __init__(self, container, device: str):
        super().__init__(container, device)
        self._variable_device: str | None = None

    @contextlib.contextmanager
    def creating_on(self, device: str):
        """Lets variables created inside land on ``device`` instead of the replica's."""
        previous, self._variable_device = self._variable_device, device
        try:
            yield
        finally:
            self._variable_device = previous

    def _create_variable(self, next_creator, **kwargs):
        if self._variable_device is not None:
            kwargs.pop("colocate_with", None)
            with ops.device(self._variable_device):
                return next_creator(**kwargs)
        return super()._create_variable(next_creator, **kwargs)

    def _call_for_each_replica(self, fn, args, kwargs):
        fn = self._container_strategy()._intercept(fn, args)
        return super()._call_for_each_replica(fn, args, kwargs)

    # Datasets are iterated as under TensorFlow's default strategy (plain dataset iterators on
    # the host), never through OneDeviceStrategy's OwnedMultiDeviceIterator: Keras 3 drops the
    # iterator an epoch iterator made at the end of the last epoch (EpochIterator.reset), and
    # dropping one of those while it prefetches crashes the process at random (a segmentation
    # fault with TensorFlow and Keras alone: docs/troubleshooting.md). One replica gains
    # nothing from that iterator's prefetch to its device: the plan places the step's ops.
    def _experimental_distribute_dataset(self, dataset, options):
        return dataset

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return dataset_fn(tf.distribute.InputContext())


class FastTStrategy(tf.distribute.OneDeviceStrategy):
    """Trains a Keras model with a FastT plan over several devices, planned inside ``fit``.

    Build and compile the model under ``scope()``, then call ``fit`` as always. Inside that
    ``fit``: ``warmup_steps`` steps on the default placement, ``profile_steps`` profiled
    steps, the plan (``kerasflow.plan``: placement, order, op splitting, Tick-Tock waves),
    the rebuild, and every later step on the plan. The strategy brings its own driver into
    ``fit``: it wraps the model's train function the first time ``fit`` traces it, so no
    callback is needed (``kerasflow.callbacks.FastT`` does the same for models built
    without the strategy).

    Args:
        devices: the devices to use (default: all GPUs, else all logical CPUs).
        cluster: the ``Cluster`` (or preset name) to plan for (default: the CPU testbed for
            logical CPUs, measured links for GPUs).
        plan: a ``Plan`` or a plan JSON path: no profiling; checked against the model after
            step 0 and applied from step 1 (``on_mismatch="replan"`` profiles afresh instead
            of raising on a mismatch).
        warmup_steps: steps before profiling (>= 2).
        profile_steps: profiled steps.
        split: let the planner split layers across devices (FastT's op splitting on the
            critical path): ``"auto"`` (the default) splits where no two devices of the cluster
            share compute (GPUs, several hosts, ``cpu-testbed:N``) and not on logical CPUs of one
            host, which share its cores, so no split can win there; ``"on"`` or ``"off"`` always
            or never (True and False, as earlier versions took, are ``"on"`` and ``"off"``). A
            model with its own ``train_step`` is never split.
        tick_tock: ``"auto"``, ``"on"`` or ``"off"`` (see ``kerasflow.plan``).
        replicated: whether the planner may replicate the whole step on every device (data
            parallelism: a copy of the weights per device, the gradients summed by TensorFlow's
            collective all-reduce). ``"auto"`` (the default) allows it where the replicas keep the model's
            math: a Keras 3 model with its own ``train_step`` left to Keras, on one host, and no
            random or unknown batch-coupled layer (BatchNormalization is fine: the replicas
            normalize with the whole batch's statistics, summed by collectives); ``"on"``
            allows it with random layers too (each replica draws its own numbers) and also
            tries ``MirroredStrategy``'s math for BatchNormalization (each replica's own
            statistics, which wins a tie with the plan that sums them); ``"off"`` never.
        memory_limit: a cap in bytes for every device.
        log_dir: where to write ``plan.json``, ``profile.json`` and ``timeline.json`` (and
            TensorBoard scalars, when TensorBoard is installed).
        verbose: ``"auto"`` follows ``fit(verbose=...)``; 1 or 2 print a line per phase (warm-up,
            profiling, planning, rebuilding) and the plan's report line; 0 prints nothing, not
            even the TensorFlow profiler's log lines.
        on_mismatch: ``"error"`` or ``"replan"`` for a ``plan=`` that does not fit the model.
        drop_slower_plan: after the rebuild the plan is timed in alternation with the default
            placement, in fit's own steps, and one measured slower gives way to the runner-up or
            is dropped with one warning: training continues on the default placement (the rule
            and its numbers: ``kerasflow.strategies.verdict``). Default True; False keeps the
            first plan and times only it; a ``plan=`` given up front is the user's choice: timed
            only, and kept. A ``fit`` that ends during the timing settles it on what was measured.
        deterministic: ``"auto"`` (the default), ``"on"`` or ``"off"``: whether only plans that
            compute bit for bit as the default placement may run, so that two runs of a script
            give the same weights whatever the timings (no replicas, no split layer, no waves:
            each is named in ``report.excluded`` with the reason; a ``plan=`` that adds sums in
            another order is refused). ``"auto"`` follows TensorFlow's switch,
            ``tf.config.experimental.enable_op_determinism()``; ``"on"`` asks for it without.
        background_planning: True (the default): once the steps are profiled, the planner runs
            in a Python process of its own while ``fit`` trains on, on the default placement; the
            plan is applied at the first step after it arrives. If it fails or takes longer than
            ``planning_time_limit`` (300 s; ``KERASFLOW_PLANNING_TIME_LIMIT``), the default
            placement stays, with one line saying why; a ``fit`` that ends first stops it (the
            next ``fit`` profiles afresh). False: ``fit`` waits for the planner (fits too short
            to train while it plans; a planner collaborator the process cannot import, such as
            a lambda, always runs inside ``fit``).
        cluster_resolver: several machines: a ``tf.distribute.cluster_resolver.ClusterResolver``
            (default: ``TFConfigClusterResolver`` when ``TF_CONFIG`` is set). The strategy
            connects to the cluster (every other task runs ``python -m kerasflow.worker``),
            plans over the devices of every task (this process's first: it profiles) and
            builds the two-level cluster. See docs/tutorials/05-train-across-several-machines.md.
        inter_host_link: the network between hosts for the planner: a ``Link`` or
            ``(latency s, bytes/s)``, or ``"measure"`` (timed copies, the default).
        connect_timeout: seconds to wait for every task to answer before
            ``ClusterConnectionError`` (which task, which address, what to check).
        on_lost_task: ``"exit"`` (the default) or ``"wait"``: what this process does when a
            task stops answering for ``connect_timeout`` seconds while TensorFlow waits for it
            (it has no deadline of its own). ``"exit"`` prints which task and what to do, and
            exits with code 75 (``multihost.TaskWatch``); ``"wait"`` leaves TensorFlow waiting.
        collaborators: the profiler, planner and stopwatch used inside ``fit``
            (``kerasflow.strategies.Collaborators``; default kerasflow's own): a custom planner,
            or a ``kerasflow.testing.ScriptedStopwatch`` that forces the trial's verdict in tests.
        options: the settings from ``devices`` to ``deterministic`` as one
            ``kerasflow.strategies.options.Options`` (``Options.from_arguments``, or the
            ``options`` of another strategy or callback; ``dataclasses.replace`` changes one),
            in place of those keyword arguments: pass either, not both. Its settings are taken
            as they are (no ``KERASFLOW_*`` variable is read); its devices, cluster and plan are
            checked as the arguments are.

    Raises:
        KerasflowError: a device that does not exist, a cluster without the devices, a plan
            using other devices, bad options, or ``options=`` with one of its keyword arguments.
        ClusterConnectionError: a task of the cluster is unreachable.

    Example:
        >>> import keras, numpy as np, kerasflow
        >>> strategy = kerasflow.FastTStrategy(verbose=0)
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
        ...                               keras.layers.Dense(1)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> x, y = np.ones((512, 8), "float32"), np.ones((512, 1), "float32")
        >>> _ = model.fit(x, y, batch_size=32, verbose=0)  # profiles, plans, rebuilds, keeps training
        >>> strategy.plan is not None  # in force, unless it measured slower than the default placement
        True
    """

    def __init__(self, devices: list[str] | None = None, cluster: Cluster | str | None = None,
                 plan: Plan | str | None = None, warmup_steps: int | None = None, profile_steps: int | None = None,
                 split: str | bool | None = None, tick_tock: str | None = None, replicated: str | None = None,
                 memory_limit: float | None = None, log_dir: str | None = None, verbose: Any = None,
                 on_mismatch: str | None = None,
                 drop_slower_plan: bool | None = None, deterministic: str | None = None,
                 background_planning: bool | None = None,
                 cluster_resolver: Any = None, inter_host_link: Any = "measure",
                 connect_timeout: float = 30.0, on_lost_task: str = "exit",
                 collaborators: Collaborators | None = None, options: Options | None = None):
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) or not (
                0 < connect_timeout < float("inf")):
            raise KerasflowError(f"connect_timeout must be a positive number of seconds. Received: "
                                 f"connect_timeout={connect_timeout!r}")
        if on_lost_task not in ("exit", "wait"):
            raise KerasflowError(f"on_lost_task must be 'exit' or 'wait'. Received: on_lost_task={on_lost_task!r}")
        # Every setting is checked before join connects to anything.
        join = functools.partial(_joined, resolver=cluster_resolver, inter_host_link=inter_host_link,
                                 connect_timeout=connect_timeout, on_lost_task=on_lost_task)
        self._options = Options.from_arguments(
            door="FastTStrategy", options=options, join=join, devices=devices, cluster=cluster, plan=plan,
            warmup_steps=warmup_steps, profile_steps=profile_steps, split=split, tick_tock=tick_tock,
            replicated=replicated, memory_limit=memory_limit, log_dir=log_dir, verbose=verbose,
            on_mismatch=on_mismatch, drop_slower_plan=drop_slower_plan, deterministic=deterministic,
            background_planning=background_planning)
        devices = self._options.devices
        self._collaborators = collaborators or Collaborators()
        if len(devices) == 1:
            warnings.warn("FastTStrategy has one device: it behaves like OneDeviceStrategy. Call "
                          "kerasflow.devices.virtual_cpus(4) or use a machine with several GPUs.", stacklevel=2)
        extended = _FastTExtended(self, devices[0])
        tf.distribute.Strategy.__init__(self, extended)
        # As the default strategy: Keras pulls no extra batch (and no random draw of the input
        # pipeline) to build a model at the start of each fit.
        _compat.build_when_traced_under(FastTStrategy)
        _compat.watch_fits()  # the driver learns when each fit ends, even by an exception
        # The models trained under this strategy, newest last, each keeping its own driver. Held
        # weakly: TensorFlow's gradient registry keeps every replica context a traced step used,
        # and with it this strategy, for the life of the process, so a model held here (or a
        # driver, which holds its model) would never be freed.
        self._trained: list[weakref.ref] = []
        self._said_graph_mode = False

    @contextlib.contextmanager
    def scope(self):
        """The strategy's scope (create and compile the model inside it).

        Keras 3 builds a model that was never called before ``fit`` under every
        ``tf.distribute`` strategy, from a batch; this strategy has it built at the first
        trace instead, as the default strategy does (``_compat.build_when_traced_under``).
        Where a Keras builds otherwise, a subclassed model without ``call()`` (a VAE whose
        ``train_step`` uses its sub-models) cannot be built that way, and this says so in
        one line. Under TF1-style graphs (tf-keras' v1 training loop) the strategy trains as the
        ``OneDeviceStrategy`` it extends, and says so once.
        """
        if _compat.graph_mode() and not self._said_graph_mode:
            self._said_graph_mode = True
            warnings.warn(_compat.GRAPH_MODE_LINE.format(
                what=f"FastTStrategy trains as tf.distribute.OneDeviceStrategy on {self._options.devices[0]}"),
                RuntimeWarning, stacklevel=3)
        with super().scope():
            try:
                yield self
            except RuntimeError as error:
                if "Unable to automatically build the model" not in str(error):
                    raise
                raise KerasflowError(
                    "Keras cannot build this model under a tf.distribute strategy (it has no call(), so it cannot "
                    "be called on a batch). Either build it before fit (call it on a batch, or set "
                    "model.built = True when all its sub-models are built), or build it without the strategy and "
                    "pass callbacks=[kerasflow.callbacks.FastT()] to fit. Received: "
                    f"{str(error).splitlines()[0]}") from None

    @property
    def devices(self) -> list[str]:
        """The devices this strategy plans over."""
        return list(self._options.devices)

    @property
    def cluster(self) -> Cluster | None:
        """The ``Cluster`` the model trained last was planned for (None before its first ``fit``).

        Example: ``kerasflow.simulate(strategy.profile, strategy.cluster, strategy.plan)``.
        """
        driver = self._driver_of()
        return planning_cluster(driver.options) if driver is not None else None

    @property
    def options(self) -> Options:
        """The settings this strategy plans with (arguments, then ``KERASFLOW_*`` variables)."""
        return self._options

    @property
    def report(self) -> PlanReport:
        """What planning did for the model trained last, a ``PlanReport`` (its fields documented
        there; readable as a mapping of those set); empty before planning."""
        driver = self._driver_of()
        return driver.report if driver is not None else PlanReport()

    def _models(self) -> list:
        """The models trained under this strategy that are still alive and driven, newest last."""
        models = [ref() for ref in self._trained]
        return [model for model in models if model is not None and model.__dict__.get(_DRIVER)]

    def _driver_of(self, model=None) -> Driver | None:
        drivers = [model.__dict__[_DRIVER] for model in self._models()]
        if model is None:
            return drivers[-1] if drivers else None
        return next((d for d in drivers if d.model is model), None)

    def plan_for(self, model=None) -> Plan | None:
        """The plan of ``model`` (default: the model trained last), None until it is computed."""
        driver = self._driver_of(model)
        return driver.plan if driver is not None else None

    @property
    def plan(self) -> Plan | None:
        """The plan of the model trained last under this strategy (None until it is computed)."""
        return self.plan_for()

    @property
    def plan_in_force(self) -> bool:
        """True while the plan of the model trained last runs (False before and after a fallback)."""
        driver = self._driver_of()
        return driver is not None and driver.in_force

    @property
    def profile(self):
        """The profiled ``OpGraph`` of the model trained last (None until profiled)."""
        driver = self._driver_of()
        return driver.graph if driver is not None else None

    def use_plan(self, plan: Plan | str) -> None:
        """Uses ``plan`` (a ``Plan`` or a path) from the next ``fit`` instead of profiling.

        For a plan computed after the model was built (for instance from
        ``kerasflow.profiling.profile_model(model, ...)`` and ``kerasflow.plan``). It is
        checked against the model as a ``plan=`` argument is.

        Raises:
            KerasflowError: the plan uses devices this strategy does not have.
        """
        self._options = self._options.with_plan(plan, door="FastTStrategy")
        for model in self._models():
            model.__dict__[_DRIVER].detach()
            _compat.override(model, _DRIVER, None)
        self._trained.clear()

    def placement_report(self, model=None):
        """Ops of ``model`` (default: the model trained last) that did not land where the plan put
        them, read from the partition graphs after the rebuild.

        Returns:
            A ``PlacementReport``: a list (``[]`` when every op did) with ``in_force`` (False
            once training went back to the default placement) and ``fallback`` (why); None
            before a plan was applied.
        """
        driver = self._driver_of(model)
        return driver.placement_report() if driver is not None else None

    def _intercept(self, fn, args=()):
        if getattr(fn, "_kerasflow_internal", False):
            return fn
        inner = fn
        while getattr(inner, "__wrapped__", None) is not None and getattr(inner, "__self__", None) is None:
            inner = inner.__wrapped__  # Strategy.run wraps fn with autograph
            if getattr(inner, "_kerasflow_internal", False):
                return fn
        model = _compat.model_of_step_function(inner)
        if len(self._options.devices) < 2 or model is None:
            return fn
        driver = self._driver_of(model)
        if driver is None:
            driver = Driver(self._options, collaborators=self._collaborators, creating=self.extended.creating_on,
                            under_strategy=True)
            _compat.override(model, _DRIVER, driver)
            self._trained = [ref for ref in self._trained if ref() is not None] + [weakref.ref(model)]
            try:
                driver.attach(model, verbose=_compat.fit_verbosity(), running=True)
                _wrap_train_function(model, driver)
            except Exception as error:  # noqa: BLE001 - never lose the user's training
                driver.fail("attaching", error)
                return fn
        # Keras 3 passes the bound train_step it looked up before the driver installed its
        # own (on every trace of that train function: TensorFlow traces twice when the first
        # trace creates variables); tf-keras passes a closure that looks model.train_step up.
        return model.train_step if getattr(inner, "__self__", None) is model else fn


def _wrap_train_function(model, driver: Driver) -> None:
    """Drives the loop from each call of the model's train function (re-wrapped after rebuilds).

    The driver is made while step 0 traces, inside Keras' own train function, so step 0 ends
    before any wrapper can see it: the first wrapped call ends it first (as the callback's
    ``on_train_batch_end`` does), then runs on what that put in force (a plan given up front is
    applied from step 1 through both doors).
    """
    step_zero_ended = False

    def drive_the_new_one() -> None:
        if not getattr(model.train_function, "_kerasflow_driven", False):  # rebuilt
            _compat.override(model, "train_function", wrap(model.train_function))

    def wrap(function):
        if getattr(function, "_kerasflow_driven", False):
            return function

        def driven(iterator):
            nonlocal step_zero_ended
            if not step_zero_ended:
                step_zero_ended = True
                driver.after_step()
                if model.train_function is not driven:
                    drive_the_new_one()
                    return model.train_function(iterator)
            driver.before_step()
            try:
                return function(iterator)
            finally:
                driver.after_step()
                drive_the_new_one()

        driven._kerasflow_driven = True
        return driven

    _compat.override(model, "train_function", wrap(model.train_function))


def _joined(devices, cluster, *, resolver, inter_host_link, connect_timeout: float, on_lost_task: str):
    """The devices and cluster to plan over: on several machines (``resolver``, default ``TF_CONFIG``'s)
    connects to every task and watches it, and plans over every task's devices (unless ``devices``
    names some) on the two-level cluster (unless ``cluster`` is given); else as asked."""
    from kerasflow import multihost

    resolver = resolver if resolver is not None else multihost.resolver_from_environment()
    if resolver is None:
        return devices, cluster
    cluster_devices = multihost.connect(resolver, timeout=connect_timeout)
    if on_lost_task == "exit":
        multihost.TaskWatch(multihost.other_tasks(resolver), patience=connect_timeout).start()
    devices = devices or cluster_devices
    if cluster is None:
        cluster = multihost.multihost_cluster([canonical_device(d) for d in devices], inter_host_link=inter_host_link)
    return devices, cluster
