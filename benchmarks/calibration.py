"""How well kerasflow predicts this machine: predicted against measured step time, per model and plan kind.

For each model, in one process of its own: plain Keras (the default placement), and one
``FastTStrategy`` model per plan kind with that plan forced (a planner passed in) and kept
(``drop_slower_plan=False``), plus ``FastTStrategy()`` as a user runs it (``plan()``'s pick,
which may be "keep the default placement"). A first round profiles, plans and retraces; then
``--rounds`` alternating rounds of ``--steps`` steps each, each round starting with another
setup; a setup's measured step is the median over rounds of each round's median step (its first
step left out). Each FastT setup's prediction is the simulator's, from that setup's own profile
in ``fit``; the default placement's is the median of the ``default_placement`` candidate's over
those profiles.

Per cell the error (predicted / measured - 1); per model the rank correlation (Spearman)
between predicted and measured order over its setups, and whether ``plan()``'s pick measured
best or within 3 % of the best.

    python benchmarks/calibration.py                          # 5 testbed models + 5 tutorial patterns
    python benchmarks/calibration.py --models mlp cnn --rounds 3
    python benchmarks/calibration.py --write-trusted-gain      # and record this device kind's trusted gain
    python benchmarks/calibration.py --budget-s 200            # stop at 200 s: the models measured by then

Each model's process runs through ``budget.Budget``: with ``--budget-s`` none outlives it, a model
still running then is killed and named, and the tables print the models measured by then. The
exit status is 1 when a model failed or was killed.

``--write-trusted-gain`` records, for the device kind the table ran on, the worst measured /
predicted step of a plan less one in ``kerasflow/strategies/trusted_gains.json`` (or the file
named): inside ``fit`` a plan predicted faster than the default placement by more than that needs
no trial on that kind (``kerasflow.strategies.verdict``); a kind never calibrated has every plan
timed.

On 4 logical CPUs (``kerasflow.devices.virtual_cpus(4)``, TensorFlow's default threading), or
on the GPUs where there are some (``gpu_check.py`` prints this table after its own), or with
``--testbed N`` on ``kerasflow.testbed``'s N tasks (one core and one thread each, joined over
loopback: devices that share no compute), where every plan kind is timed (layer-wise, HEFT,
CPOP, data parallelism on one copy of the weights, op splitting, Tick-Tock waves), the default
placement is plain Keras on task 0, ``FastTStrategy()`` runs as a user's does (its trial
included: "FastTStrategy()" row, what it settled on after it) beside ``plan()``'s pick kept,
and each model is also timed by plain Keras with TensorFlow's default threading on the whole
machine, in a process of its own (not alternated: "plain Keras, every core")::

    python benchmarks/calibration.py --testbed 2 --models mlp cnn resnet lstm transformer towers
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
DEFAULT_GAINS = os.path.join(HERE, "..", "kerasflow", "strategies", "trusted_gains.json")

from budget import RESULT, Budget  # noqa: E402 - beside this script

TESTBED = ("mlp", "cnn", "resnet", "lstm", "transformer", "towers")
PATTERNS = ("mnist_convnet", "text_transformer", "vae", "subclassed_mlp", "conv1d_weighted")
KINDS = {  # setup -> (planner candidate, split)
    "single_device": ("single_device", False),
    "data_parallel": ("data_parallel", False),
    "layerwise_model_parallel": ("layerwise_model_parallel", False),
    "heft": ("heft", False),
    "heft+split": ("heft", True),
}
# On independent devices (--testbed) every plan kind: a task-spanning data parallelism keeps one copy
# of the weights (each task runs the step on its rows, the gradients summed where the weights live).
TESTBED_KINDS = {
    "layerwise_model_parallel": ("layerwise_model_parallel", False),
    "heft": ("heft", False),
    "cpop": ("cpop", False),
    "one_copy_data_parallel": ("one_copy_data_parallel", False),
    "heft+split": ("heft", True),
    "tick_tock_model_parallel": ("tick_tock_model_parallel", False),
}
SETTLED = 1  # steps left out at the start of each round's fit (the iterator's first batch)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties get their average rank); None for fewer than two pairs.

    Example:
        >>> spearman([1, 2, 3], [10, 30, 20])
        0.5
    """
    if len(xs) < 2:
        return None
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    norm = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / norm if norm else 1.0


def model_and_data(name: str, keras):
    """A compiled model and its training arrays ``(x, y, batch)``, with enough rows for any round."""
    import numpy as np

    if name in TESTBED:
        from kerasflow.testing.testbed_models import build

        model, (x, y) = build(name, keras)
        batch = len(y)
    else:
        from kerasflow.testing.tutorial_models import PATTERNS as ALL

        pattern = next(p for p in ALL if p.name == name)
        model = pattern.build()
        if not pattern.callable:
            model.built = True  # Keras builds a model without call() under no strategy; under one, this does
        data = pattern.data()
        x, y = (data, None) if isinstance(data, np.ndarray) else (data[0], data[1])  # sample weights left out
        batch = pattern.fit_kwargs.get("batch_size", 32)
    return model, x, y, batch


def devices(testbed: int = 0) -> tuple[list[str], object]:
    """The devices to plan over and the cluster to plan them for (None: the strategy's own), set up
    before TensorFlow starts: ``testbed`` tasks of ``kerasflow.testbed``; else the GPUs (one split
    into two logical GPUs, as ``gpu_check.py`` does), else 4 logical CPUs with TensorFlow's default
    threading."""
    import kerasflow

    if testbed:
        started = kerasflow.testbed.start(tasks=testbed)
        return started.devices, started.cluster
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        from _common import devices as gpus

        return gpus(4096)[1], None
    return kerasflow.devices.virtual_cpus(4), None


def worker(name: str, rounds: int, steps: int, testbed: int = 0) -> dict:
    import dataclasses

    import kerasflow

    planned_on, cluster = devices(testbed)
    import keras
    import numpy as np
    import tensorflow as tf

    from kerasflow.planner import PlanRequest, baselines
    from kerasflow.planner.search.planning import candidate_plans
    from kerasflow.strategies import Collaborators

    defaults: list[float] = []
    kinds = TESTBED_KINDS if testbed else KINDS
    on = {"devices": planned_on, "cluster": cluster} if testbed else {}

    def forced(kind):
        candidate, split = kinds[kind]
        waves = candidate.startswith(("one_copy", "tick_tock"))

        def planner(request):
            defaults.append(baselines.default_placement(request.graph, request.cluster).predicted_step_time)
            plans, _ = candidate_plans(PlanRequest(request.graph, request.cluster, split=split,
                                                   candidates=("heft",) if waves else (candidate,),
                                                   tick_tock="on" if waves else "off", replicated=request.replicated,
                                                   verbose=0, max_split_evaluations=8))
            if kind not in plans and not (candidate in plans and not split):
                raise LookupError(f"no {kind} plan for this model")
            return [dataclasses.replace(plans[kind if kind in plans else candidate], algorithm=kind)]
        return planner

    setups = {"default": None, **{k: forced(k) for k in kinds}, "plan()": "own"}
    if testbed:
        setups["FastTStrategy()"] = "user"
    models, strategies = {}, {}
    for setup, planner in setups.items():
        keras.utils.set_random_seed(0)
        if planner is None:
            strategy = tf.distribute.get_strategy()
        elif planner == "user":
            strategy = kerasflow.FastTStrategy(verbose=0, **on)
        elif planner == "own":
            strategy = kerasflow.FastTStrategy(verbose=0, drop_slower_plan=False, **on)
        else:
            strategy = kerasflow.FastTStrategy(verbose=0, drop_slower_plan=False,
                                               collaborators=Collaborators(planner=planner), **on)
        with strategy.scope():
            models[setup], x, y, batch = model_and_data(name, keras)
        strategies[setup] = strategy

    def fit(setup: str, count: int) -> list[float]:
        ends = []

        class Clock(keras.callbacks.Callback):
            def on_train_batch_end(self, index, logs=None):
                ends.append(time.perf_counter())

        repeats = -(-count * batch // len(x))
        xs = np.concatenate([x] * repeats)[:count * batch]
        ys = None if y is None else np.concatenate([y] * repeats)[:count * batch]
        started = time.perf_counter()
        models[setup].fit(xs, ys, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[Clock()])
        return list(np.diff([started] + ends))

    result = {"model": name, "batch": batch, "setups": {}, "kind": kerasflow.devices.device_kind(planned_on[0])}
    usable, one_time = [], {}
    for setup in setups:  # round 0: profile, plan, retrace (a user's FastTStrategy: its trial too)
        started = time.perf_counter()
        try:
            first = fit(setup, 24 if setup == "FastTStrategy()" else 10)
        except Exception as error:  # noqa: BLE001 - a kind this model has no plan of
            result["setups"][setup] = {"error": str(error).splitlines()[0][:120]}
            continue
        one_time[setup] = time.perf_counter() - started - len(first) * statistics.median(first)
        strategy = strategies[setup]
        if setup not in ("default", "FastTStrategy()"):
            report = strategy.report
            if "plan_dropped" in report or report.get("algorithm") is None:
                result["setups"][setup] = {"error": report.get("plan_dropped") or "no plan"}
                continue
        usable.append(setup)
    measured = {s: [] for s in usable}
    for number in range(rounds):
        for setup in usable[number % len(usable):] + usable[:number % len(usable)]:  # each round starts elsewhere
            measured[setup].append(statistics.median(fit(setup, steps + SETTLED)[SETTLED:]))
    default_predicted = statistics.median(defaults) if defaults else None
    for setup in usable:
        report = strategies[setup].report if setup != "default" else {}
        predicted = default_predicted if setup == "default" else report.get("predicted_step_time")
        entry = {"measured": statistics.median(measured[setup]), "predicted": predicted}
        if os.environ.get("KERASFLOW_CALIBRATION_SAVE") and setup != "default" and strategies[setup].plan is not None:
            folder = os.path.join(os.environ["KERASFLOW_CALIBRATION_SAVE"], name, setup.replace("/", "_"))
            os.makedirs(folder, exist_ok=True)
            strategies[setup].profile.save(os.path.join(folder, "profile.json"))
            strategies[setup].plan.save(os.path.join(folder, "plan.json"))
            strategies[setup].cluster.save(os.path.join(folder, "cluster.json"))
        if setup == "plan()":
            entry["pick"] = report.get("algorithm")
        if setup == "FastTStrategy()":
            entry["pick"] = report.get("algorithm") if strategies[setup].plan_in_force else "the default placement"
            entry["predicted"] = None  # what it runs after its trial: a plan or the default placement
            entry["one_time"] = one_time[setup]
        result["setups"][setup] = entry
    return result


def whole_machine(name: str, steps: int) -> dict:
    """Plain Keras with TensorFlow's default threading on every core (no testbed): its median step."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model, x, y, batch = model_and_data(name, keras)
    repeats = -(-(steps + 5) * batch // len(x))
    xs, ys = np.concatenate([x] * repeats), np.concatenate([y] * repeats)
    model.fit(xs[:5 * batch], ys[:5 * batch], batch_size=batch, epochs=1, verbose=0, shuffle=False)
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            ends.append(time.perf_counter())

    started = time.perf_counter()
    model.fit(xs[:steps * batch], ys[:steps * batch], batch_size=batch, epochs=1, verbose=0, shuffle=False,
              callbacks=[Clock()])
    return {"measured": statistics.median(np.diff([started] + ends)[SETTLED:])}


def worst_ratio(results: list[dict]) -> float | None:
    """The worst measured / predicted step of a plan (every setup but the default placement's and
    ``plan()``'s, which may be the default placement) over the workers' results.

    Example:
        >>> worst_ratio([{"setups": {"heft": {"measured": 2.0, "predicted": 1.0}, "default": {"measured": 9.0,
        ...               "predicted": 1.0}, "single_device": {"error": "no plan"}}}])
        2.0
    """
    ratios = [entry["measured"] / entry["predicted"] for result in results
              for setup, entry in result["setups"].items()
              if setup not in ("default", "plan()") and entry.get("predicted") and "measured" in entry]
    return max(ratios) if ratios else None


def write_trusted_gain(path: str, kind: str, worst: float, calibrated: str) -> dict:
    """Records ``kind``'s trusted gain (``worst`` less one) in the JSON at ``path``, beside the other
    kinds', and returns the file's contents; written whole or not at all.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "gains.json")
        >>> write_trusted_gain(path, "H100", 1.3, "today")["H100"]["trusted_gain"]
        0.3
    """
    table = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
    table[kind] = {"calibrated": calibrated, "trusted_gain": round(worst - 1, 2),
                   "worst_measured_over_predicted": round(worst, 2)}
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(partial, path)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TESTBED + PATTERNS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--write-trusted-gain", nargs="?", metavar="PATH", const=DEFAULT_GAINS,
                        help="record the device kind's trusted gain (default file: kerasflow/strategies/trusted_gains.json)")
    parser.add_argument("--testbed", type=int, default=0, metavar="N",
                        help="on kerasflow.testbed's N tasks (a core and a thread each) instead")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop at this many seconds: a model's process still running is killed, and the "
                             "tables print the models measured by then (default: no limit)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--whole-machine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.whole_machine:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        sys.path.insert(0, HERE)
        result = (worker(args.worker, args.rounds, args.steps, args.testbed) if args.worker
                  else whole_machine(args.whole_machine, args.steps * args.rounds))
        print(RESULT + json.dumps(result), flush=True)
        sys.stdout.flush()
        os._exit(0)  # a testbed's chief: its workers stop with it
    from _common import format_table, machine

    budget = Budget(args.budget_s)
    rows, summary, within, results, incomplete = [], [], [], [], []
    for name in args.models:
        if budget.spent():
            left_out = args.models[args.models.index(name):]
            incomplete.extend(left_out)
            print(f"The {args.budget_s:.0f}-second budget is spent: {', '.join(left_out)} left out.", flush=True)
            break
        out = budget.run([sys.executable, __file__, "--worker", name, "--rounds", str(args.rounds),
                          "--steps", str(args.steps), "--testbed", str(args.testbed)], cwd=HERE)
        if not out.ok:
            print(f"{name}: {out.status} ({out.detail})", flush=True)
            incomplete.append(name)
            continue
        result = out.result
        results.append(result)
        setups = result["setups"]
        if args.testbed:
            whole = budget.run([sys.executable, __file__, "--whole-machine", name, "--rounds", str(args.rounds),
                                "--steps", str(args.steps)], cwd=HERE)
            if whole.ok:
                setups["plain Keras, every core"] = whole.result
            else:
                print(f"{name}, plain Keras on every core: {whole.status} ({whole.detail})", flush=True)
        priced = {s: e for s, e in setups.items() if "measured" in e and e.get("predicted")}
        default = setups.get("default", {}).get("measured")
        for setup, entry in setups.items():
            if "error" in entry:
                rows.append([name, setup, "", "", "", entry["error"][:60]])
                continue
            error = entry["predicted"] / entry["measured"] - 1 if entry.get("predicted") else None
            if error is not None and setup != "plan()":
                within.append(abs(error) <= 0.10)
            label = f"{setup} -> {entry['pick']}" if "pick" in entry else setup
            if "one_time" in entry:
                label += f" (one-time {entry['one_time']:.1f} s)"
            rows.append([name, label, f"{entry['predicted'] * 1e3:.2f}" if entry.get("predicted") else "",
                         f"{entry['measured'] * 1e3:.2f}", f"{default / entry['measured']:.2f}x" if default else "",
                         f"{error * 100:+.0f}%" if error is not None else ""])
            print(" | ".join(rows[-1]), flush=True)
        kinds = [s for s in priced if s != "plan()"]
        rho = spearman([priced[s]["predicted"] for s in kinds], [priced[s]["measured"] for s in kinds])
        best = min(e["measured"] for s, e in setups.items() if "measured" in e and s in priced)
        pick = setups.get("plan()", {})
        pick_gap = pick["measured"] / best - 1 if "measured" in pick else None
        summary.append([name, f"{rho:.2f}" if rho is not None else "", f"{pick.get('pick', '')}",
                        f"{pick_gap * 100:+.1f}%" if pick_gap is not None else ""])
    print()
    where = (f"kerasflow.testbed's {args.testbed} tasks (a core and a thread each, over loopback)" if args.testbed
             else "4 logical CPUs")
    print(f"Predicted against measured step time (ms), medians of {args.rounds} alternating rounds of "
          f"{args.steps} steps, {where} ({machine()})")
    print(format_table(["model", "setup", "predicted", "measured", "vs default", "error"], rows))
    print()
    print(format_table(["model", "rank correlation", "plan() picks", "its step vs the best measured"], summary))
    print(f"\ncells within +-10 %: {sum(within)} of {len(within)}")
    worst = worst_ratio(results)
    if args.write_trusted_gain and incomplete:  # the worst of the models measured may not be the worst
        print(f"No trusted gain written: {', '.join(incomplete)} not measured.")
    elif args.write_trusted_gain and worst is not None:
        kind = results[0]["kind"]
        run = "benchmarks/calibration.py" + (f" --testbed {args.testbed}" if args.testbed else "")
        when = f"{time.strftime('%Y-%m-%d')}, {run} on {kind} ({machine()})"
        write_trusted_gain(args.write_trusted_gain, kind, worst, when)
        print(f"{kind}: worst measured / predicted step of a plan {worst:.2f}x; trusted gain {worst - 1:.2f} "
              f"written to {args.write_trusted_gain}")
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
