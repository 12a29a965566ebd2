"""The default placement (with and without XLA), MirroredStrategy and FastTStrategy side by side on this machine's GPUs.

First the devices as kerasflow reads them (``kerasflow.devices.local_gpus``: each logical GPU's
card, kind and memory, and how they were found) and one model's profile: its kernel coverage per
place, its copies, and memory: the allocator's measured peak (GPUs) beside the modelled one, and
the Tick-Tock plan's predicted peak per device against the budget the planner gives it (device
memory less headroom and the measured temporary memory), written with TensorFlow's own profile
of three training steps to ``--profile-dir`` (``profile.json`` and the ``.xplane.pb``, to become
a test fixture). Then one
table: per model, each setup's median steady step time, samples/s, its ratio to the default
placement and to MirroredStrategy, and for FastTStrategy its plan, the planner's predicted step
time and the simulator's error. ``default`` runs without XLA (``jit_compile=False``),
``default_xla`` with it (what Keras 3 compiles by default on a GPU host with no strategy);
``fastt_callback`` is that XLA-compiled ``fit`` with ``kerasflow.callbacks.FastT()`` added, which
times the XLA step in warm-up and keeps it unless a plan beats it (on CPUs the model is compiled
with ``jit_compile=True``, as "auto" would on a GPU host). Each
setup runs in its own process (TensorFlow fixes its devices when it starts), in alternating
rounds so that drift hits all setups alike. Then the calibration table of ``calibration.py`` on
the same models: the simulator's predicted step against the measured one per plan kind, so the
first run on a GPU machine checks the cost model there.

Devices: every GPU; a single GPU is split into two logical GPUs (``--memory-mb`` each), so
there is something to place on. Without a GPU the same comparison runs on two logical CPUs
(so CI can smoke-test the script); the table says which.

Bounded by construction (``budget.Budget``): no process outlives ``--budget-s`` (each setup's also
at most ``--setup-limit-s``), the budget is checked before every setup and the calibration stops
at it, and a setup that hangs is killed, with everything it started, and reported as "hung" in
its row: the tables print what was measured by then. The exit status is 1 when any setup failed
or hung.

Usage:
    python benchmarks/gpu_check.py                      # mlp, cnn, resnet, lstm, transformer
    python benchmarks/gpu_check.py --models mlp --steps 20 --rounds 1 --budget-s 120 --calibration-rounds 1
    python benchmarks/gpu_check.py --budget-s 480                  # a lent GPU machine's few minutes, 1 or 8 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _common import devices, format_table, machine, step_durations
from budget import RESULT, Budget

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("mlp", "cnn", "resnet", "lstm", "transformer")
SETUPS = ("default", "default_xla", "mirrored", "fastt", "fastt_callback")
TICK_TOCK = "tick_tock_data_parallel"


def build(name: str, keras):
    """A model of the comparison and its batch size (synthetic data, no downloads)."""
    if name in ("mlp", "cnn", "lstm", "transformer"):
        from kerasflow.testing.testbed_models import build as zoo_build

        return zoo_build(name, keras)[0], 64 if name == "mlp" else 32
    inputs = keras.Input((32, 32, 3))  # a ResNet-like CNN with BatchNormalization
    x = keras.layers.Conv2D(32, 3, padding="same", name="stem")(inputs)
    for block in range(2):
        h = keras.layers.Conv2D(32, 3, padding="same", name=f"conv_{block}a")(x)
        h = keras.layers.BatchNormalization(name=f"bn_{block}")(h)
        h = keras.layers.Activation("relu", name=f"relu_{block}")(h)
        h = keras.layers.Conv2D(32, 3, padding="same", name=f"conv_{block}b")(h)
        x = keras.layers.Add(name=f"residual_{block}")([x, h])
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="resnet_like")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, 32


def synthetic_data(model, batch: int, steps: int):
    """``steps`` batches of random inputs of the model's shape and labels of 10 classes."""
    import numpy as np

    rng = np.random.default_rng(0)
    spec = model.inputs[0]
    shape = (steps * batch,) + tuple(spec.shape[1:])
    x = rng.integers(0, 1000, shape).astype("int32") if "int" in str(spec.dtype) else rng.random(shape, dtype=np.float32)
    return x, rng.integers(0, 10, steps * batch)


def describe(model_name: str, memory_mb: int, directory: str) -> dict:
    """The devices as kerasflow reads them and one model's profile on the first, written to
    ``directory`` with TensorFlow's own profile of three training steps."""
    import dataclasses
    import glob

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.path.insert(0, os.path.join(HERE, ".."))
    _, names = devices(memory_mb)
    import keras

    from kerasflow.devices import local_gpus, wait_for_devices
    from kerasflow.profiling import profile_model
    from kerasflow.profiling.xplane import StepProfiler

    keras.utils.set_random_seed(0)
    model, batch = build(model_name, keras)
    x, y = synthetic_data(model, batch, 4)
    graph = profile_model(model, (x, y), batch_size=batch, device=names[0], verbose=0)  # without XLA, said
    os.makedirs(directory, exist_ok=True)
    graph.save(os.path.join(directory, "profile.json"))
    profiler = StepProfiler(logdir=os.path.join(directory, "xplane"), quiet=True)
    profiler.start()
    for step in range(3):
        with profiler.step(step):
            model.train_on_batch(x[:batch], y[:batch])
            wait_for_devices()
    profiler.stop()
    meta = graph.metadata
    return {"gpus": [dataclasses.asdict(gpu) for gpu in local_gpus()], "devices": names, "model": model_name,
            "coverage": meta["coverage"], "coverage_by_place": meta.get("coverage_by_place", {}),
            "copies_per_step": meta.get("copies_per_step", []), "memory": meta.get("memory"),
            "tick_tock": tick_tock_memory(graph, names),
            "written": [os.path.join(directory, "profile.json")]
            + sorted(glob.glob(os.path.join(directory, "xplane", "**", "*.xplane.pb"), recursive=True))}


def tick_tock_memory(graph, names: list[str]) -> dict:
    """Memory as the planner sees it for Tick-Tock on these devices: the default step's modelled
    peak beside the allocator's measured one (GPUs only), each device's budget, and the Tick-Tock
    plan's predicted peak per device (or why it was left out)."""
    from kerasflow.planner import ranked_plans, simulate
    from kerasflow.planner.parallel.baselines import default_placement
    from kerasflow.planner.ir.graphtables import temporary_bytes
    from kerasflow.planner.schedule.listschedule import memory_budgets
    from kerasflow.profiling.links import cluster_of

    cluster = cluster_of(names)
    modelled = simulate(graph, cluster, default_placement(graph, cluster)).peak_memory[names[0]]
    plans = ranked_plans(graph, cluster, tick_tock="on", split=False)
    tick = next((p for p in plans if p.algorithm == TICK_TOCK), None)
    budgets = memory_budgets(cluster, reserved=temporary_bytes(graph))
    return {"measured_peak": graph.metadata.get("measured_peak_bytes"), "modelled_peak": modelled,
            "reserved": temporary_bytes(graph), "budgets": dict(zip(cluster.device_names, budgets)),
            "plan": TICK_TOCK, "predicted_peaks": dict(tick.predicted_peak_memory) if tick else {},
            "excluded": None if tick else plans[0].excluded.get(TICK_TOCK, "not among the candidates")}


def worker(setup: str, model_name: str, steps: int, memory_mb: int) -> dict:
    """One setup on one model, in this process: the measured figures as a dict."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.path.insert(0, os.path.join(HERE, ".."))
    kind, names = devices(memory_mb)
    import keras
    import numpy as np
    import tensorflow as tf

    import kerasflow

    if setup.startswith("default") or setup == "fastt_callback":
        strategy = tf.distribute.get_strategy()  # plain Keras: TensorFlow places the step on the first device
    elif setup == "mirrored":
        strategy = tf.distribute.MirroredStrategy(names)
    else:
        # The plan itself is timed, even one slower than the default placement (drop_slower_plan).
        strategy = kerasflow.FastTStrategy(devices=names, verbose=0, drop_slower_plan=False)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, batch = build(model_name, keras)
    if setup.startswith("default"):  # "auto" is XLA on a GPU host without a strategy: both, said
        model.jit_compile = setup == "default_xla"
    callbacks = []
    if setup == "fastt_callback":
        model.jit_compile = True  # what "auto" resolved to on a GPU host; set on CPUs to take the same path
        callbacks = [kerasflow.callbacks.FastT(devices=names, verbose=0)]
    x, y = synthetic_data(model, batch, steps)
    durations = step_durations(model, x, y, batch, callbacks)
    result = {"setup": setup, "model": model_name, "batch": batch, "kind": kind, "devices": len(names)}
    if setup == "fastt_callback":
        report = callbacks[0].report
        result["xla_step"] = report.xla_step_time
        result["predicted"] = report.predicted_step_time if callbacks[0].plan_in_force else None
        result["algorithm"] = callbacks[0].plan.algorithm if callbacks[0].plan_in_force else (
            "default with XLA (kept)" if report.algorithm == "default_placement" else
            "default with XLA (dropped as slower)" if "plan_dropped" in report else "default with XLA (fell back)")
        options, xla = callbacks[0].options, callbacks[0].driver.xla
        settled = report.settled_step or ((xla.steps if xla else 0) + options.warmup_steps + options.profile_steps)
        steady = durations[settled:] if len(durations) - settled >= 3 else durations[-3:]
    elif setup == "fastt":
        first_planned = strategy.options.warmup_steps + strategy.options.profile_steps
        steady = durations[first_planned + 3:]
        kept = strategy.report.get("algorithm") == "default_placement"  # the planner kept it: nothing tried
        result["predicted"] = strategy.plan.predicted_step_time if strategy.plan_in_force or kept else None
        dropped = "plan_dropped" in strategy.report  # measured slower (or fit ended first): no failure
        result["algorithm"] = strategy.plan.algorithm if strategy.plan_in_force else (
            "default (kept by the planner)" if kept else "default (dropped as slower)" if dropped
            else "default (fell back)")
    else:
        steady = durations[5:]
    result["step"] = float(np.median(steady))
    return result



def describe_lines(described: dict) -> str:
    """The devices and the first model's profile, as lines."""
    lines = [f"Devices: {', '.join(described['devices'])}"]
    for gpu in described["gpus"]:
        lines.append(f"  {gpu['name']}: {gpu['kind']}, {gpu['memory'] / 2**30:.1f} GiB, card {gpu['card']} "
                     f"({gpu['found']})")
    places = ", ".join(f"{place} {share:.1%}" for place, share in sorted(described["coverage_by_place"].items()))
    lines.append(f"Profile of {described['model']}: kernel coverage {described['coverage']:.1%} ({places}); "
                 f"memory: {described['memory']}")
    tick = described["tick_tock"]
    measured = f"{tick['measured_peak'] / 2**20:,.1f} MiB" if tick["measured_peak"] is not None else \
        "not measured (a CPU's allocator statistics leave out most tensors)"
    lines.append(f"Memory of the default step: modelled peak {tick['modelled_peak'] / 2**20:,.1f} MiB, measured peak "
                 f"{measured}; kept free on every device for temporaries: {tick['reserved'] / 2**20:,.1f} MiB")
    if tick["excluded"]:
        lines.append(f"Tick-Tock: left out ({tick['excluded']})")
    else:
        for device, budget in tick["budgets"].items():
            peak = tick["predicted_peaks"].get(device)
            within = "" if peak is None else f"predicted peak {peak / 2**20:,.1f} MiB, " + (
                "within" if peak <= budget else "OVER")
            lines.append(f"Tick-Tock ({tick['plan']}) on {device}: {within} budget {budget / 2**20:,.1f} MiB")
    for copy in described["copies_per_step"]:
        lines.append(f"  copies {copy['source']} -> {copy['destination']}: {copy['bytes']:,.0f} B, "
                     f"{copy['seconds'] * 1e6:.1f} us a step")
    lines.append("Written: " + ", ".join(described["written"]))
    return "\n".join(lines) + "\n"


def table(results: dict, outcomes: dict, models: list[str], rounds: int, steps: int, kind: str) -> str:
    """The comparison table, one row per model and setup; ``results``: (model, setup) -> the figures
    of each round that ran; ``outcomes``: (model, setup) -> why a setup has none (``Outcome.status``:
    "hung", "failed"; "not run" where the budget was spent first)."""
    rows = []
    for model in models:
        step = {s: statistics.median(r["step"] for r in results[(model, s)]) for s in SETUPS if (model, s) in results}
        for setup in SETUPS:
            runs = results.get((model, setup))
            if not runs:
                rows.append([model, setup, "", outcomes.get((model, setup), "not run"), *[""] * 6])
                continue
            plan = predicted = error = ""
            if setup in ("fastt", "fastt_callback"):
                plan = runs[-1]["algorithm"]
                if runs[-1].get("xla_step"):
                    plan += f"; XLA step {runs[-1]['xla_step'] * 1e3:.2f} ms"
                figures = [r["predicted"] for r in runs if r["predicted"]]
                if figures:
                    predicted = f"{statistics.median(figures) * 1e3:.2f}"
                    error = f"{(statistics.median(figures) - step[setup]) / step[setup] * 100:+.0f}%"
            batch = runs[0]["batch"]
            ratio = {than: f"{step[than] / step[setup]:.2f}x" if than in step else "" for than in ("default", "mirrored")}
            rows.append([model, setup, str(batch), f"{step[setup] * 1e3:.2f}", f"{batch / step[setup]:,.0f}",
                         ratio["default"], ratio["mirrored"], plan, predicted, error])
    devices = "/".join(str(d) for d in sorted({r["devices"] for runs in results.values() for r in runs}))
    title = (f"{devices} {kind} devices ({'logical CPUs: no GPU here' if kind == 'CPU' else 'GPUs'}); "
             f"medians of up to {rounds} alternating round(s) of {steps} steps" if devices else
             "No setup measured") + f" ({machine()})"
    return title + "\n" + format_table(["model", "setup", "batch", "step ms", "samples/s", "vs default",
                                        "vs mirrored", "plan", "predicted ms", "simulator error"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=4096, help="per logical GPU when one GPU is split")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="the whole run's seconds: every process is killed when they run out, and the "
                             "tables print what was measured by then")
    parser.add_argument("--setup-limit-s", type=float, default=180.0,
                        help="the most seconds one setup's process may take (a hung one is killed then)")
    parser.add_argument("--calibration-rounds", type=int, default=1,
                        help="rounds of the calibration table after the comparison (0: none)")
    parser.add_argument("--profile-dir", default="gpu_check_profile",
                        help="where the first model's profile.json and TensorFlow's .xplane.pb are written")
    parser.add_argument("--worker", nargs=2, metavar=("SETUP", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--describe", metavar="MODEL", help=argparse.SUPPRESS)
    # Tests: the process of this setup ("describe" or one of SETUPS) sleeps for ever, as a hung one would.
    parser.add_argument("--stall", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if (args.worker and args.worker[0] == args.stall) or (args.describe and args.stall == "describe"):
        time.sleep(10**6)
    if args.worker:
        print(RESULT + json.dumps(worker(args.worker[0], args.worker[1], args.steps, args.memory_mb)))
        return 0
    if args.describe:
        print(RESULT + json.dumps(describe(args.describe, args.memory_mb, args.profile_dir)))
        return 0
    budget = Budget(args.budget_s)
    common = ["--memory-mb", str(args.memory_mb), *(["--stall", args.stall] if args.stall else [])]
    described = budget.run([sys.executable, __file__, "--describe", args.models[0], "--profile-dir",
                            os.path.abspath(args.profile_dir), *common], cwd=HERE, limit=args.setup_limit_s)
    print(describe_lines(described.result) if described.ok else
          f"Describing the devices: {described.status} ({described.detail})\n", flush=True)
    kind = "GPU" if described.ok and described.result["gpus"] else "CPU"
    results, outcomes, rounds = {}, {}, 0
    for number in range(args.rounds):
        for model in args.models:
            for setup in SETUPS:
                if budget.spent():
                    break
                outcome = budget.run([sys.executable, __file__, "--worker", setup, model, "--steps", str(args.steps),
                                      *common], cwd=HERE, limit=args.setup_limit_s)
                if outcome.ok:
                    results.setdefault((model, setup), []).append(outcome.result)
                    kind = outcome.result["kind"]
                    print(f"{model} {setup}: {outcome.result}", flush=True)
                else:
                    outcomes[(model, setup)] = outcome.status
                    print(f"{model} {setup}: {outcome.status} ({outcome.detail})", file=sys.stderr, flush=True)
        rounds = number + 1
        if budget.spent():
            print(f"The {args.budget_s:.0f}-second budget is spent (round {rounds} of {args.rounds}): the setups "
                  "not run are left out.", flush=True)
            break
    print()
    print(table(results, outcomes, args.models, rounds, args.steps, kind))
    whole = described.ok and not outcomes
    if args.calibration_rounds and budget.spent():
        print(f"\nThe calibration table is left out: the {args.budget_s:.0f}-second budget is spent. Run "
              f"python benchmarks/calibration.py --models {' '.join(args.models)} for it.")
    elif args.calibration_rounds:
        print("\nThe simulator on this machine (benchmarks/calibration.py):", flush=True)
        import calibration

        whole = calibration.main(["--models", *args.models, "--rounds", str(args.calibration_rounds),
                                  "--budget-s", str(budget.left())]) == 0 and whole
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
