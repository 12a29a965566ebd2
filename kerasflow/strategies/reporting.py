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
from kerasflow.planner.sim.simulator import step_overhead
from kerasflow.planner.parallel.ticktock import batch_coupled_ops, replica_coupled_ops

__all__ = ["Reporter"]

# TensorFlow's stateful random ops (``tf.random.uniform`` and kin, tf-keras' unseeded layers): each
# kernel keeps its own position in its sequence, so a step traced anew starts the sequence again.
# Keras 3's ``keras.random`` draws statelessly from a seed generator's variable and keeps its place.
_STATEFUL_RANDOM_TYPES = frozenset({"RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
                                    "ParameterizedTruncatedNormal", "Multinomial", "RandomGamma", "RandomPoisson",
                                    "RandomPoissonV2", "RandomShuffle"})


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

    def planned(self, plan: Plan, seconds: float, devices: int, parallel: float | None = None) -> str:
        """The one line after planning: algorithm, predicted step, ratios to the baselines (one
        device, and ``parallel``: data parallelism's predicted step); or, when the default placement
        is kept, the best plan's predicted step beside the default's.

        Example:
            >>> from kerasflow.planner import Plan
            >>> heft = Plan(algorithm="heft", predicted_step_time=0.010, candidates={"single_device": 0.02})
            >>> print(Reporter(verbose=0).planned(heft, 2.5, 4, parallel=0.015))
            kerasflow: 4 devices, planned in 2.5s (heft): predicted step 10.00 ms, 2.00x single device, 1.50x data-parallel
        """
        if plan.algorithm == baselines.DEFAULT_PLACEMENT:
            return self.kept_default(plan, seconds, devices)
        single = plan.candidates.get("single_device")
        line = (f"kerasflow: {devices} devices, planned in {seconds:.1f}s ({plan.algorithm}): "
                f"predicted step {plan.predicted_step_time * 1e3:.2f} ms")
        if single:
            line += f", {single / plan.predicted_step_time:.2f}x single device"
        if parallel:
            line += f", {parallel / plan.predicted_step_time:.2f}x data-parallel"
        self.say(line)
        return line

    def kept_default(self, plan: Plan, seconds: float, devices: int) -> str:
        """The one line when planning keeps the default placement.

        Example:
            >>> from kerasflow.planner import Plan
            >>> default = Plan(algorithm="default_placement", predicted_step_time=0.010,
            ...                candidates={"default_placement": 0.010, "heft": 0.0095, "data_parallel": 0.02})
            >>> print(Reporter(verbose=0).kept_default(default, 2.5, 4))
            kerasflow: 4 devices, planned in 2.5s: keeping the default placement (predicted 10.00 ms a step); the best plan, heft, is predicted at 9.50 ms, not enough faster to be worth a switch
        """
        best = baselines.best_other_than_the_default(plan)
        line = (f"kerasflow: {devices} devices, planned in {seconds:.1f}s: keeping the default placement (predicted "
                f"{plan.predicted_step_time * 1e3:.2f} ms a step)")
        if best:
            line += (f"; the best plan, {best[0]}, is predicted at {best[1] * 1e3:.2f} ms, not enough faster to be "
                     "worth a switch")
        self.say(line)
        return line

    def attached(self, model, options) -> None:
        """The lines when kerasflow takes a model's ``fit``: what will happen."""
        if _compat.has_own_train_step(model):
            self.say("kerasflow: the model defines its own train_step: placement and order are applied, op "
                     "splitting and waves are not.")
        if options.plan is None:
            self.say(f"kerasflow: {options.warmup_steps} warm-up steps on the default placement, then "
                     f"{options.profile_steps} profiled steps, then the plan.")

    def xla_timed(self, steps: int, timed: int) -> None:
        """The line when the model's own XLA-compiled step is timed first (``XlaStep``)."""
        self.say(f"kerasflow: the model compiles its step with XLA (jit_compile): its first {steps} steps run as "
                 f"compiled and {timed} of them are timed, the default placement a plan must beat. kerasflow "
                 "profiles and plans without XLA (it fuses the step into a few clusters, which erases per-op "
                 "placement and profiles) and turns it on again if it keeps the default placement.")

    def xla_turned_off(self) -> None:
        """The line when XLA is turned off for the whole ``fit`` (the strategy, or a given plan)."""
        self.say("kerasflow: jit_compile turned off: XLA fuses the step into a few clusters, which erases per-op "
                 "placement and profiles; the plan is judged against the default placement without XLA.")

    def xla_off_under_strategy(self) -> None:
        """The line on a GPU host when the strategy's step runs without XLA, as under any strategy."""
        self.say("kerasflow: the step runs without XLA, as Keras runs every step under a tf.distribute strategy "
                 "(jit_compile='auto' compiles with XLA on this GPU host only without one): plans are judged "
                 "against the default placement without XLA. To judge them against the step compiled with XLA, "
                 "train without the strategy and add kerasflow.callbacks.FastT() to fit.")

    def xla_restored(self, seconds: float | None) -> None:
        """The line when the default placement gets the model's XLA-compiled step back."""
        measured = f" (measured {seconds * 1e3:.2f} ms a step in warm-up)" if seconds is not None else ""
        self.say(f"kerasflow: XLA is on again: the default placement runs the model's own step compiled with "
                 f"XLA{measured}.")

    def kept_for_xla(self, plan: Plan, xla_seconds: float, loop: float) -> str:
        """The line when no plan is predicted faster than the model's own XLA-compiled step.

        Example:
            >>> from kerasflow.planner import Plan
            >>> heft = Plan(algorithm="heft", predicted_step_time=0.012)
            >>> print(Reporter(verbose=0).kept_for_xla(heft, 0.009, loop=0.001))
            kerasflow: keeping the default placement with XLA (the model's own step, measured 9.00 ms a step in warm-up): the best plan, heft, is predicted at 11.00 ms without XLA
        """
        line = (f"kerasflow: keeping the default placement with XLA (the model's own step, measured "
                f"{xla_seconds * 1e3:.2f} ms a step in warm-up): the best plan, {plan.algorithm}, is predicted at "
                f"{(plan.predicted_step_time - loop) * 1e3:.2f} ms without XLA")
        self.say(line)
        return line

    def trial_measured(self, plan: Plan, graph: OpGraph | None, measured: float, default: float | None,
                       ratio: float | None, default_name: str = "the default placement") -> str:
        """The line when the trial of ``plan`` (profiled as ``graph``) ended: what it measured,
        beside ``default`` (the default placement's step timed in alternation, with ``ratio``, the
        plan's over it) or else the default placement's profiled step (``measured``)."""
        profiled = graph.metadata.get("plain_step_seconds") if graph is not None else None
        loop = step_overhead(graph) if graph is not None else 0.0
        return self.measured(plan, measured, default=default, speedup=1 / ratio if ratio else None, profiled=profiled,
                             loop=loop, default_name=default_name)

    def replaced(self, following: Plan, why: str) -> None:
        """Says that ``following`` replaces the plan timed (measured slower: ``why``)."""
        self.say(f"kerasflow: {why}; trying the next plan, {following.algorithm} (predicted "
                 f"{following.predicted_step_time * 1e3:.2f} ms)")

    def replicas_change_the_math(self, plan: Plan, graph: OpGraph | None) -> None:
        """One line when a data-parallel plan's replicas run layers whose math depends on the whole
        batch on their own shares (allowed only by ``replicated="on"`` or a given plan)."""
        if plan.data_parallel is None or graph is None:
            return
        coupled = replica_coupled_ops(graph) if plan.synchronizes_statistics else batch_coupled_ops(graph)
        layers = sorted({graph.op(name).layer or name for name in coupled})
        if layers:
            self.say(f"kerasflow: {plan.algorithm}: each replica runs {', '.join(layers[:3])}"
                     f"{f' and {len(layers) - 3} more' if len(layers) > 3 else ''} on its own share of the batch "
                     "(batch statistics or random numbers of their own, as MirroredStrategy computes them), so the "
                     "losses differ from one device's. Plan with replicated='auto' to keep the model's math.")

    def draws_start_afresh(self, plan: Plan, graph: OpGraph | None) -> None:
        """One line when the step draws with TensorFlow's stateful random ops, whose sequences the
        plan's new trace starts again: its draws then differ from plain Keras'."""
        if graph is None:
            return
        layers = sorted({op.layer or op.name for op in graph.ops if op.type in _STATEFUL_RANDOM_TYPES})
        if layers:
            self.say(f"kerasflow: {plan.algorithm}: {', '.join(layers[:3])}"
                     f"{f' and {len(layers) - 3} more' if len(layers) > 3 else ''} draw random numbers with "
                     "TensorFlow's stateful random ops (tf.random.uniform and kin), whose sequences start again in "
                     "the planned step, traced anew (as plain Keras' do when it retraces), so the draws differ "
                     "from plain Keras' from here. keras.random with a keras.random.SeedGenerator keeps one "
                     "sequence across traces.")

    def measured(self, plan: Plan, measured: float, *, default: float | None = None, speedup: float | None = None,
                 profiled: float | None = None, loop: float = 0.0, default_name: str = "the default placement") -> str:
        """The one line once the plan has run a few steps: the measured step against the predicted
        one and against the default placement's step, timed in alternation with the plan
        (``default``, and the plan's ``speedup``: the median over rounds) or when profiled. The
        steps are timed inside the train function, so the prediction is shown without the
        training loop's own time (``loop``, which it includes). ``default_name``: what the default
        placement ran ("the default placement with XLA": the model's own compiled step).

        Example:
            >>> from kerasflow.planner import Plan
            >>> Reporter(verbose=0).measured(Plan(predicted_step_time=0.010), 0.012, default=0.011, speedup=0.9)
            'kerasflow: the plan measured 12.00 ms a step (predicted 10.00 ms: 20% slower than predicted); the default placement measured 11.00 ms in alternating steps: 0.90x'
            >>> Reporter(verbose=0).measured(Plan(), 0.012, profiled=0.011)
            'kerasflow: the plan measured 12.00 ms a step; the default placement measured 11.00 ms when profiled: 0.92x'
        """
        line = f"kerasflow: the plan measured {measured * 1e3:.2f} ms a step"
        predicted = plan.predicted_step_time - loop if plan.predicted_step_time else None
        if predicted:  # a hand-made plan given with plan= has no prediction
            error = (measured - predicted) / predicted
            line += (f" (predicted {predicted * 1e3:.2f} ms: {abs(error):.0%} "
                     f"{'slower' if error >= 0 else 'faster'} than predicted)")
        if default and speedup:
            line += f"; {default_name} measured {default * 1e3:.2f} ms in alternating steps: {speedup:.2f}x"
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
