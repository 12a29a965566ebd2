"""What kerasflow tells the user during ``fit``: console lines, files in ``log_dir``, TensorBoard scalars.

Console lines go where Keras prints its own progress (stdout, or absl logging when Keras'
interactive logging is off), so they show in terminals, notebooks and log files alike;
``verbose=0`` prints nothing. Optional outputs whose package is missing (TensorBoard) are
skipped with a one-time note and never touch the plan.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

from kerasflow import _compat
from kerasflow.planner import Cluster, OpGraph, Plan, baselines, simulate

__all__ = ["Reporter"]


class Reporter:
    """Prints kerasflow's progress the way Keras prints its own, and writes the log files.

    Args:
        verbose: ``"auto"`` (follow ``fit``'s verbose), 0 (silent), 1 or 2.
    """

    def __init__(self, verbose="auto"):
        self.verbose = verbose
        self._noted: set[str] = set()

    @property
    def quiet(self) -> bool:
        """True when nothing may be printed (kerasflow's lines and the profiler's logs alike)."""
        return self.verbose in (0, "0", False)

    def say(self, line: str) -> None:
        """One console line, unless quiet."""
        if not self.quiet:
            _compat.print_line(line)

    def note_once(self, key: str, line: str) -> None:
        """A console line printed at most once per key (for skipped optional outputs)."""
        if key not in self._noted:
            self._noted.add(key)
            self.say(line)

    def warn(self, message: str) -> None:
        """A ``RuntimeWarning`` (shown whatever ``verbose`` is: it says training changed course)."""
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def planned(self, plan: Plan, graph: OpGraph, cluster: Cluster, seconds: float, devices: int) -> str:
        """The one line after planning: algorithm, predicted step, ratios to the baselines."""
        single = plan.candidates.get("single_device")
        parallel = baselines.data_parallel(graph, cluster).predicted_step_time
        line = (f"kerasflow: {devices} devices, planned in {seconds:.1f}s ({plan.algorithm}): "
                f"predicted step {plan.predicted_step_time * 1e3:.2f} ms")
        if single:
            line += f", {single / plan.predicted_step_time:.2f}x single device"
        if parallel:
            line += f", {parallel / plan.predicted_step_time:.2f}x data-parallel"
        self.say(line)
        return line

    def measured(self, plan: Plan, measured: float, *, default: float | None = None, speedup: float | None = None,
                 profiled: float | None = None) -> str:
        """The one line once the plan has run a few steps: the measured step against the predicted
        one and against the default placement's step, timed in alternation with the plan
        (``default``, and the plan's ``speedup``: the median over rounds) or when profiled.

        Example:
            >>> from kerasflow.planner import Plan
            >>> Reporter(verbose=0).measured(Plan(predicted_step_time=0.010), 0.012, default=0.011, speedup=0.9)
            'kerasflow: the plan measured 12.00 ms a step (predicted 10.00 ms: 20% slower than predicted); the default placement measured 11.00 ms in alternating steps: 0.90x'
            >>> Reporter(verbose=0).measured(Plan(), 0.012, profiled=0.011)
            'kerasflow: the plan measured 12.00 ms a step; the default placement measured 11.00 ms when profiled: 0.92x'
        """
        line = f"kerasflow: the plan measured {measured * 1e3:.2f} ms a step"
        predicted = plan.predicted_step_time
        if predicted:  # a hand-made plan given with plan= has no prediction
            error = (measured - predicted) / predicted
            line += (f" (predicted {predicted * 1e3:.2f} ms: {abs(error):.0%} "
                     f"{'slower' if error >= 0 else 'faster'} than predicted)")
        if default and speedup:
            line += f"; the default placement measured {default * 1e3:.2f} ms in alternating steps: {speedup:.2f}x"
        elif profiled:
            line += f"; the default placement measured {profiled * 1e3:.2f} ms when profiled: {profiled / measured:.2f}x"
        self.say(line)
        return line

    def write_logs(self, log_dir: str, plan: Plan, graph: OpGraph, cluster: Cluster) -> None:
        """``plan.json``, ``profile.json`` and a Chrome-trace ``timeline.json`` in ``log_dir``."""
        os.makedirs(log_dir, exist_ok=True)
        plan.save(os.path.join(log_dir, "plan.json"))
        graph.save(os.path.join(log_dir, "profile.json"))
        simulate(graph, cluster, plan).save_chrome_trace(os.path.join(log_dir, "timeline.json"))

    def write_scalars(self, log_dir: str, step: int, plan: Plan, graph: OpGraph | None, cluster: Cluster,
                      measured: float) -> bool:
        """TensorBoard scalars in ``log_dir/kerasflow``: predicted and measured step time, samples
        per second, each device's predicted utilisation. Skipped (with a one-time note) when
        TensorBoard is not installed.

        Returns:
            True when the scalars were written.
        """
        if importlib.util.find_spec("tensorboard") is None:
            self.note_once("tensorboard", "kerasflow: TensorBoard is not installed, so no kerasflow scalars are "
                                          "written (pip install tensorboard); the plan is unaffected.")
            return False
        import tensorflow as tf

        batch = plan.batch_size or (graph.batch_size if graph is not None else 0)
        writer = tf.summary.create_file_writer(os.path.join(log_dir, "kerasflow"))
        with writer.as_default():
            tf.summary.scalar("step_time/predicted_seconds", plan.predicted_step_time, step=step)
            tf.summary.scalar("step_time/measured_seconds", measured, step=step)
            if batch:
                tf.summary.scalar("samples_per_second/measured", batch / measured, step=step)
                tf.summary.scalar("samples_per_second/predicted", batch / plan.predicted_step_time, step=step)
            if graph is not None:
                result = simulate(graph, cluster, plan, memory=False)
                for device, share in result.utilization.items():
                    tf.summary.scalar(f"utilization/{device.strip('/').replace(':', '_')}", share, step=step)
        writer.flush()
        return True
