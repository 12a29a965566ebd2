"""Prints what users read beside plain Keras' for four Keras conventions, through both doors.

1. Mixed precision (``mixed_float16``) with a learning-rate callback (``LearningRateScheduler``,
   ``ReduceLROnPlateau``) under a data-parallel plan on two devices: the largest relative gap of
   an epoch's loss to plain Keras' over four epochs, and how far the replicas' weights part from
   the model's own.
2. A ``fit`` shorter than the warm-up (one step): whether TensorFlow's profiler is still running
   after it (a user's ``tf.profiler.experimental.start`` raises), and whether a second model is
   then profiled and planned.
3. ``compile(jit_compile=True)``: ``model.jit_compile`` after ``fit``, and the XLA step timed.
4. TensorFlow's op determinism: the candidates left out (a kerasflow version without the option
   leaves none out).

Each in a process of its own (what one leaves behind cannot change the next); on four logical
CPUs, about two minutes on two cores.

    python benchmarks/keras_conventions.py
    python benchmarks/keras_conventions.py --section 2
"""

import argparse
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import format_table, machine  # noqa: E402
from kerasflow.planner import DataParallel, Plan  # noqa: E402

DEVICES = ["/CPU:0", "/CPU:1"]
BATCH = 32


def classifier_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(256, 12)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def classifier():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def built_through(door: str | None, build, **options):
    """(model, the door's object or None, callbacks for fit) with ``build()`` made through ``door``."""
    if door == "strategy":
        strategy = kerasflow.FastTStrategy(devices=DEVICES, verbose=0, **options)
        with strategy.scope():
            return build(), strategy, []
    if door == "callback":
        callback = kerasflow.callbacks.FastT(devices=DEVICES, verbose=0, **options)
        return build(), callback, [callback]
    return build(), None, []


def rate_callback(name: str):
    if name == "LearningRateScheduler":
        return keras.callbacks.LearningRateScheduler(lambda epoch, rate: 1e-2 if epoch == 0 else 1e-3)
    return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.1, patience=0, min_delta=10)


def mixed_precision_rows() -> list[list]:
    keras.mixed_precision.set_global_policy("mixed_float16")
    rows = []
    try:
        x, y = classifier_data()
        for name in ("LearningRateScheduler", "ReduceLROnPlateau"):
            histories = {}
            for door in (None, "strategy", "callback"):
                keras.utils.set_random_seed(5)
                plan = Plan(data_parallel=DataParallel(tuple(DEVICES)), batch_size=BATCH, algorithm="data_parallel")
                model, handle, callbacks = built_through(door, classifier, **({"plan": plan} if door else {}))
                history = model.fit(x, y, batch_size=BATCH, epochs=4, verbose=0, shuffle=False,
                                    callbacks=[rate_callback(name), *callbacks]).history["loss"]
                histories[door] = (history, handle, model)  # the strategy holds its models weakly
            plain = np.asarray(histories[None][0])
            for door in ("strategy", "callback"):
                history, handle, model = histories[door]
                driver = handle._driver_of(model) if door == "strategy" else handle.driver
                parts = driver.in_force_parts
                apart = parts.replicas.differences() if parts is not None and parts.replicas else float("nan")
                gap = float(np.max(np.abs(np.asarray(history) - plain) / plain))
                rows.append([f"mixed_float16 + {name}", door, f"{gap:.2e}", f"{apart:.2e}"])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return rows


def profiler_running() -> bool:
    try:
        tf.profiler.experimental.start(tempfile.mkdtemp(prefix="users_profile_"))
    except tf.errors.AlreadyExistsError:
        return True
    tf.profiler.experimental.stop()
    return False


def short_fit_rows() -> list[list]:
    x, y = classifier_data()
    rows = []
    for door in ("strategy", "callback"):
        keras.utils.set_random_seed(5)
        model, _, callbacks = built_through(door, classifier, warmup_steps=2, profile_steps=3)
        # Four steps: warm-up's two and one of the three profiled ones.
        model.fit(x[:4 * BATCH], y[:4 * BATCH], batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks)
        running = profiler_running()
        second, handle, callbacks = built_through(door, classifier, warmup_steps=2, profile_steps=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            second.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks)
        said = [str(w.message) for w in caught if "kerasflow" in str(w.message)]
        planned = handle.report.algorithm
        rows.append([door, "yes" if running else "no", planned or f"not planned ({said[0][:80] if said else '?'})"])
    return rows


def xla_rows() -> list[list]:
    x, y = classifier_data()
    rows = []
    for door in ("strategy", "callback"):
        def build():
            model = classifier()
            model.compile(optimizer=keras.optimizers.Adam(1e-2),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
            return model

        keras.utils.set_random_seed(5)
        model, handle, callbacks = built_through(door, build)
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=callbacks)
        xla = handle.report.xla_step_time
        rows.append([door, str(model.jit_compile), f"{xla * 1e3:.2f} ms" if xla else "not timed",
                     handle.report.algorithm or "-"])
    return rows


def determinism_rows() -> list[list]:
    tf.config.experimental.enable_op_determinism()
    x, y = classifier_data()
    rows = []
    for door in ("strategy", "callback"):
        keras.utils.set_random_seed(5)
        model, handle, callbacks = built_through(door, classifier, cluster="cpu-testbed:2")
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=callbacks)
        excluded = sorted(handle.report.excluded or {})
        rows.append([door, ", ".join(excluded) or "none", handle.report.algorithm or "-"])
    return rows


SECTIONS = {
    1: ("Mixed precision and a learning-rate callback, a data-parallel plan on two devices, four epochs",
        ["case", "door", "loss gap to plain Keras", "replicas apart"], mixed_precision_rows),
    2: ("A fit of 4 steps (warm-up 2, profiled 3), then a second model",
        ["door", "profiler left running", "second model planned"], short_fit_rows),
    3: ("compile(jit_compile=True), two epochs", ["door", "jit_compile after fit", "XLA step timed", "plan"], xla_rows),
    4: ("tf.config.experimental.enable_op_determinism(), planned for cpu-testbed:2",
        ["door", "candidates left out", "plan"], determinism_rows),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", type=int, choices=sorted(SECTIONS), help="run this section only, here")
    section = parser.parse_args().section
    if section is not None:
        title, headers, rows = SECTIONS[section]
        print(f"{section}. {title}\n{format_table(headers, rows())}\n", flush=True)
        return
    print(f"Keras conventions beside plain Keras, on 4 logical CPUs ({machine()}, TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}, kerasflow {kerasflow.__version__})\n", flush=True)
    for number in SECTIONS:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--section", str(number)], check=True)


if __name__ == "__main__":
    main()
