"""``kerasflow.callbacks.FastT``: FastT planning for a ``fit`` call made without the strategy."""

from __future__ import annotations

import warnings
from typing import Any

import keras

from kerasflow import _compat
from kerasflow.planner import Cluster, Plan
from kerasflow.strategies.collaborators import Collaborators
from kerasflow.strategies.driver import Driver
from kerasflow.strategies.options import Options
from kerasflow.strategies.plan_report import PlanReport

__all__ = ["FastT"]


class FastT(keras.callbacks.Callback, _compat.TfKerasCallbackHooks):
    """Profiles, plans and rebuilds the training step inside an existing ``fit`` call.

    The same loop as ``FastTStrategy`` (warm-up steps, profiled steps, the plan, the rebuild),
    driven from the batch hooks: at the start of training the callback rebinds the model's
    ``train_step`` with the plan-applying step; after the profiled steps it plans and
    rebuilds with ``model.make_train_function(force=True)``. Variables move to their planned
    devices (Keras 3). Works next to ModelCheckpoint, EarlyStopping, TensorBoard, CSVLogger
    and BackupAndRestore. One callback serves one model; a later ``fit`` of the same model
    with the same callback keeps its plan.

    A step the model compiles with XLA (``jit_compile=True``, what Keras 3's ``"auto"`` gives
    on a GPU host) runs as compiled for its first steps and is timed (``report.xla_step_time``):
    kerasflow profiles and plans without XLA, and keeps the default placement with XLA unless
    a plan is predicted, then measured, faster than that step.

    Args: as for ``FastTStrategy`` (``devices``, ``cluster``, ``plan``, ``warmup_steps``,
        ``profile_steps``, ``split``, ``tick_tock``, ``replicated``, ``memory_limit``, ``log_dir``,
        ``verbose``, ``on_mismatch``, ``drop_slower_plan``, ``deterministic``, ``background_planning``,
        ``collaborators``, ``options``: an ``Options`` in place of the settings' keyword arguments, not with them). ``split="auto"``
        (the default) splits layers where no two devices of the cluster share compute (GPUs,
        several hosts, ``cpu-testbed:N``), not on the logical CPUs of one host. The strategy's
        checks, made by the same ``Options.from_arguments``, with the same errors.

    Raises:
        KerasflowError: a device that does not exist, a cluster without the devices, a plan
            using other devices, a bad option, or ``options=`` with one of its keyword arguments.

    Example:
        >>> import keras, numpy as np, kerasflow
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile(optimizer="adam", loss="mse")
        >>> callback = kerasflow.callbacks.FastT(verbose=0)
        >>> x, y = np.ones((512, 8), "float32"), np.ones((512, 1), "float32")
        >>> _ = model.fit(x, y, batch_size=32, verbose=0, callbacks=[callback])
        >>> callback.plan is not None  # in force, unless it measured slower than the default placement
        True
    """

    def __init__(self, devices: list[str] | None = None, cluster: Cluster | str | None = None,
                 plan: Plan | str | None = None, warmup_steps: int | None = None, profile_steps: int | None = None,
                 split: str | bool | None = None, tick_tock: str | None = None, replicated: str | None = None,
                 memory_limit: float | None = None, log_dir: str | None = None, verbose: Any = None,
                 on_mismatch: str | None = None, drop_slower_plan: bool | None = None, deterministic: str | None = None,
                 background_planning: bool | None = None,
                 collaborators: Collaborators | None = None, options: Options | None = None):
        super().__init__()
        self.options = Options.from_arguments(
            door="FastT", options=options, devices=devices, cluster=cluster, plan=plan, warmup_steps=warmup_steps,
            profile_steps=profile_steps, split=split, tick_tock=tick_tock, replicated=replicated,
            memory_limit=memory_limit, log_dir=log_dir, verbose=verbose, on_mismatch=on_mismatch,
            drop_slower_plan=drop_slower_plan, deterministic=deterministic,
            background_planning=background_planning)
        self.collaborators = collaborators or Collaborators()
        self._said_graph_mode = False
        self.driver = Driver(self.options, collaborators=self.collaborators)
        _compat.watch_fits()  # before the fit this callback is given to: its end, even by an exception

    @property
    def plan(self) -> Plan | None:
        """The plan in use (None until computed)."""
        return self.driver.plan

    @property
    def plan_in_force(self) -> bool:
        """True while the plan runs (False before it is applied and after a fallback)."""
        return self.driver.in_force

    @property
    def report(self) -> PlanReport:
        """What planning did, a ``PlanReport`` (as ``FastTStrategy.report``); empty before planning."""
        return self.driver.report

    @property
    def profile(self):
        """The profiled ``OpGraph``, as ``FastTStrategy.profile`` (None until profiled)."""
        return self.driver.graph

    def placement_report(self):
        """Ops that did not land where planned, read back after the rebuild, as a
        ``PlacementReport`` (``in_force``, ``fallback``); None before a plan was applied."""
        return self.driver.placement_report()

    def on_train_begin(self, logs=None):
        if len(self.options.devices) < 2:
            return
        if _compat.graph_mode():
            if not self._said_graph_mode:
                self._said_graph_mode = True
                warnings.warn(_compat.GRAPH_MODE_LINE.format(what="this fit trains as without the callback"),
                              RuntimeWarning, stacklevel=2)
            return
        try:  # a later fit of the same model keeps its plan; another model's fit is driven afresh
            self.driver.attach(self.model, verbose=(self.params or {}).get("verbose"))
            self.driver.begin_fit()
        except Exception as error:  # noqa: BLE001 - never lose the user's training
            self.driver.fail("attaching", error)

    def on_train_batch_begin(self, batch, logs=None):
        if self.driver.model is not None:
            self.driver.before_step()

    def on_train_batch_end(self, batch, logs=None):
        if self.driver.model is not None:
            self.driver.after_step()

