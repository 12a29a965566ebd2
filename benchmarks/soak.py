"""Many fits in one process through both doors, then one long planned fit: what kerasflow leaves behind.

Two processes, each with a fresh TensorFlow on 4 logical CPUs, run the same loop: ``--fits``
consecutive ``fit`` calls (each after ``keras.backend.clear_session()``; an MLP, a
BatchNormalization CNN and a GRU in turn; 1024 samples, batch 32, ``validation_split=0.1``, then
``evaluate``), then ``--epochs`` epochs of one MLP. One process is plain Keras; in the other the
fits alternate the two doors (``FastTStrategy`` and the ``FastT`` callback) in the default
configuration, except that every sixth fit (from the second) has its plan forced slower than the
default placement (dropped) and every sixth (from the third) a planner that fails (a fallback), and the
long fit's plan is forced faster (kept in force for all its epochs). The verdicts are forced
through ``kerasflow.strategies.Collaborators``; every step still runs.

The table gives resident memory after warm-up (``--warmup`` fits: each model through each door),
after the last fit, after the long fit's fifth epoch and after its last, and the growth of each
phase; then what is left: threads started during the loop and still running, models not freed,
whether a profiler session can still start, and what is left in the loop's own temporary
directory. It exits 1 when kerasflow's growth over either phase exceeds plain Keras' by more
than ``--margin`` percentage points or anything is left behind.

    python benchmarks/soak.py                          # 30 fits and 50 epochs (about 4 minutes on 2 cores)
    python benchmarks/soak.py --fits 12 --epochs 10
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAMPLES, BATCH = 1024, 32
LONG_FIT_FIRST_EPOCHS = 5  # the long fit's own warm-up: its growth is measured from here


@dataclasses.dataclass
class Leftovers:
    """What one soak loop measured and left behind.

    Attributes:
        rss_mb: resident memory after each fit, then after each epoch of the long fit.
        fits: how many of ``rss_mb`` are fits (the rest are the long fit's epochs).
        threads_left: names of threads started during the loop and still running after it.
        models_alive: the fits (kind, door, forced verdict) whose model is still reachable after the
            loop (each was let go).
        profiler: "free" when a profiler session starts and stops after the loop, else the error.
        temp_left: entries left in the loop's own temporary directory (``tempfile`` points there
            during the loop).
        warned: kerasflow's warnings, one line each.
    """

    rss_mb: list
    fits: int
    threads_left: list
    models_alive: list
    profiler: str
    temp_left: list
    warned: list


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _layers(kind: str) -> list:
    from keras import layers

    return {
        "mlp": [layers.Input((20,)), layers.Dense(64, activation="relu"), layers.Dense(64, activation="relu")],
        "bn_cnn": [layers.Input((16, 16, 3)), layers.Conv2D(8, 3), layers.BatchNormalization(), layers.ReLU(),
                   layers.GlobalAveragePooling2D()],
        "gru": [layers.Input((12, 8)), layers.GRU(16)],
    }[kind]


def build(kind: str):
    """A compiled model of ``kind`` ("mlp", "bn_cnn" or "gru") and its data (x, y)."""
    import keras
    import numpy as np

    model = keras.Sequential(_layers(kind) + [keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    shape = model.input_shape[1:]
    x = np.random.default_rng(0).standard_normal((SAMPLES, *shape)).astype("float32")
    return model, (x, np.random.default_rng(1).integers(0, 10, SAMPLES))


def collaborators(forced: str | None):
    """The driver's collaborators for a fit whose verdict is forced: "slower" (the plan is dropped),
    "faster" (kept), "failing" (the planner raises: a fallback), None (kerasflow's own)."""
    from kerasflow.planner import ranked_plans
    from kerasflow.planner.search.planning import PLANNED_CANDIDATES
    from kerasflow.strategies.collaborators import Collaborators, stopwatch

    def timed(seconds_of_plan):
        def watch(step, plan):
            outputs, seconds = stopwatch(step, plan)
            return outputs, seconds if plan is None else seconds_of_plan
        return watch

    def failing_planner(graph, cluster, **settings):
        raise RuntimeError("a planner failure forced by the soak")

    def best_plan(graph, cluster, **settings):  # the logical CPUs as devices of their own: a plan, not the default
        return ranked_plans(graph, cluster.independent(), **{**settings, "candidates": PLANNED_CANDIDATES})[:1]

    if forced == "slower":  # the best plan alone, a second a step: dropped within one epoch
        return Collaborators(planner=best_plan, stopwatch=timed(1.0))
    if forced == "faster":
        return Collaborators(planner=best_plan, stopwatch=timed(1e-6))
    if forced == "failing":
        return Collaborators(planner=failing_planner)
    return Collaborators()


def fit_once(kind: str, door: str | None, forced: str | None = None, epochs: int = 1, callbacks=()):
    """One fit (and evaluate) of a new ``kind`` model through ``door`` ("strategy", "callback" or
    None: plain Keras); returns a weak reference to the model."""
    import keras

    import kerasflow

    keras.backend.clear_session()
    options = dict(verbose=0, collaborators=collaborators(forced))
    callbacks = list(callbacks)
    if door == "strategy":
        with kerasflow.FastTStrategy(**options).scope():
            model, (x, y) = build(kind)
    else:
        model, (x, y) = build(kind)
        if door == "callback":
            callbacks.append(kerasflow.callbacks.FastT(**options))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, validation_split=0.1, verbose=0, callbacks=callbacks)
    model.evaluate(x, y, batch_size=BATCH, verbose=0)
    return weakref.ref(model)


def schedule(fits: int, with_kerasflow: bool) -> list:
    """(model kind, door, forced verdict) of each fit of the loop."""
    kinds = ("mlp", "bn_cnn", "gru")
    plan = []
    for index in range(fits):
        door = ("strategy", "callback")[index % 2] if with_kerasflow else None
        forced = {1: "slower", 2: "failing"}.get(index % 6) if with_kerasflow else None
        plan.append((kinds[index % 3], door, forced))
    return plan


@contextlib.contextmanager
def own_temporary_directory():
    """Points ``tempfile`` at a new directory for the block, and yields it: whatever kerasflow
    makes there is the loop's own, while other processes (parallel test workers) use the system's."""
    shared, tempfile.tempdir = tempfile.tempdir, tempfile.mkdtemp(prefix="kerasflow_soak_")
    try:
        yield tempfile.tempdir
    finally:
        own, tempfile.tempdir = tempfile.tempdir, shared
        shutil.rmtree(own, ignore_errors=True)


def soak(fits: int, epochs: int, with_kerasflow: bool) -> Leftovers:
    """Runs the loop in this process (TensorFlow configured with several devices) and returns what it left."""
    import keras
    import tensorflow as tf

    threads_before = set(threading.enumerate())
    memory, models = [], []

    class EpochMemory(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            memory.append(rss_mb())

    with warnings.catch_warnings(record=True) as caught, own_temporary_directory() as temp:
        warnings.simplefilter("always")
        for fit in schedule(fits, with_kerasflow):
            models.append((fit, fit_once(*fit)))
            gc.collect()
            memory.append(rss_mb())
        long_door = "strategy" if with_kerasflow else None
        long_fit = ("mlp", long_door, "faster" if with_kerasflow else None)
        models.append((long_fit, fit_once(*long_fit, epochs, [EpochMemory()])))
        temp_left = sorted(os.listdir(temp))
    warned = [str(w.message).splitlines()[0] for w in caught if str(w.message).startswith("kerasflow:")]
    keras.backend.clear_session()
    gc.collect()
    profiler = "free"
    try:
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            tf.profiler.experimental.stop()
    except Exception as error:  # noqa: BLE001 - reported, not raised: it is what is measured
        profiler = f"{type(error).__name__}: {error}"
    return Leftovers(
        rss_mb=memory, fits=fits,
        threads_left=sorted(t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()),
        models_alive=["/".join(map(str, fit)) for fit, ref in models if ref() is not None], profiler=profiler,
        temp_left=temp_left, warned=warned)


def growth(before: float, after: float) -> float:
    """Percent growth from ``before`` to ``after``."""
    return 100.0 * (after - before) / before


def phases(result: Leftovers, warmup: int) -> dict:
    """Resident memory at the four points of the table, and the growth of each phase."""
    fits, epochs = result.rss_mb[:result.fits], result.rss_mb[result.fits:]
    points = {"after warm-up": fits[warmup - 1], "after the last fit": fits[-1],
              f"after epoch {LONG_FIT_FIRST_EPOCHS}": epochs[LONG_FIT_FIRST_EPOCHS - 1], "after the last epoch": epochs[-1]}
    values = list(points.values())
    return {"points": points, "fits growth": growth(values[0], values[1]), "epochs growth": growth(values[2], values[3])}


def _child(arguments) -> None:
    import kerasflow

    kerasflow.devices.virtual_cpus(4)
    result = soak(arguments.fits, arguments.epochs, arguments.child == "kerasflow")
    print(json.dumps(dataclasses.asdict(result)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=6, help="fits before memory is measured")
    parser.add_argument("--margin", type=float, default=5.0, help="percentage points over plain Keras' growth")
    parser.add_argument("--child", choices=("plain", "kerasflow"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.epochs < LONG_FIT_FIRST_EPOCHS + 1 or not 0 < arguments.warmup < arguments.fits:
        parser.error(f"need --epochs > {LONG_FIT_FIRST_EPOCHS} and 0 < --warmup < --fits. Received: "
                     f"epochs={arguments.epochs}, warmup={arguments.warmup}, fits={arguments.fits}")
    if arguments.child:
        _child(arguments)
        return 0
    results = {}
    for loop in ("plain", "kerasflow"):
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", loop, "--fits", str(arguments.fits),
                              "--epochs", str(arguments.epochs)], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr[-4000:], file=sys.stderr)
            print(f"soak: the {loop} loop failed (exit {run.returncode}).", file=sys.stderr)
            return 1
        results[loop] = Leftovers(**json.loads(run.stdout.strip().splitlines()[-1]))
    measured = {loop: phases(result, arguments.warmup) for loop, result in results.items()}
    print(f"Soak: {arguments.fits} fits, then {arguments.epochs} epochs of one model, one process each "
          f"(resident MiB; growth after warm-up: {arguments.warmup} fits, {LONG_FIT_FIRST_EPOCHS} epochs)")
    points = list(measured["plain"]["points"])
    print(f"{'loop':<10}" + "".join(f"{p:>22}" for p in points) + f"{'fits growth':>14}{'epochs growth':>15}")
    for loop, m in measured.items():
        print(f"{loop:<10}" + "".join(f"{v:>22.0f}" for v in m["points"].values())
              + f"{m['fits growth']:>13.1f}%{m['epochs growth']:>14.1f}%")
    kf = results["kerasflow"]
    print(f"left behind by kerasflow: threads {kf.threads_left or 'none'}, models alive {kf.models_alive or 'none'} "
          f"(plain Keras: {results['plain'].models_alive or 'none'}), profiler {kf.profiler}, temporary files "
          f"{kf.temp_left or 'none'}")
    print(f"kerasflow warned {len(kf.warned)} times: " + "; ".join(sorted(set(kf.warned)))[:600])
    problems = [f"{phase} exceeds plain Keras' by {measured['kerasflow'][phase] - measured['plain'][phase]:.1f} "
                f"percentage points (more than {arguments.margin})"
                for phase in ("fits growth", "epochs growth")
                if measured["kerasflow"][phase] - measured["plain"][phase] > arguments.margin]
    problems += [f"threads left running: {kf.threads_left}"] * bool(kf.threads_left)
    problems += [f"models not freed: {kf.models_alive}"] * (len(kf.models_alive) > len(results["plain"].models_alive))
    problems += [f"profiler: {kf.profiler}"] * (kf.profiler != "free")
    problems += [f"temporary files left: {kf.temp_left}"] * bool(kf.temp_left)
    for problem in problems:
        print(f"soak: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
