"""The chief of the multi-host test, run in its own process (connecting changes TensorFlow's
context for good): connects through TF_CONFIG, trains with FastTStrategy, checkpoints, and
writes its results as JSON.

    TF_CONFIG='{"cluster": {"chief": [...], "worker": [...]}, "task": {"type": "chief", "index": 0}}' \
        python -m tests.strategies.multihost_chief OUT.json CKPT_DIR
        python -m tests.strategies.multihost_chief OUT.json --stop PID SIGNAL WHEN

The second form stops the worker process PID with SIGNAL a few steps after the plan is in
force (WHEN: ``mid-epoch`` or ``between-epochs``), records when in OUT.json, then how ``fit``
ended and how long after the signal.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402
from kerasflow.multihost import multihost_cluster, task_of  # noqa: E402


def main(out: str, checkpoint_dir: str) -> None:
    import keras
    import numpy as np

    from tests.strategies.test_fastt_strategy import BUILDERS, build_under, data_for, fit

    # A fast network, given: the test checks that a plan spanning tasks runs and trains
    # right, whatever loopback's measured figure would make the planner prefer.
    strategy = kerasflow.FastTStrategy(inter_host_link=(20e-6, 5e9), split=False, tick_tock="off", verbose=0,
                                       drop_slower_plan=False, connect_timeout=60)
    x, y = data_for("cnn")
    model = build_under(strategy, "cnn")
    loss = fit(model, x, y)
    path = os.path.join(checkpoint_dir, "chief.weights.h5")
    model.save_weights(path)
    keras.utils.set_random_seed(7)
    restored = BUILDERS["cnn"][0](keras)
    restored.load_weights(path)
    checkpoint_ok = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), restored.get_weights()))
    measured = multihost_cluster(strategy.devices)  # the network measured over loopback
    first, other = strategy.devices[0], next(d for d in strategy.devices if task_of(d) != task_of(strategy.devices[0]))
    link = measured.link(first, other)
    result = {
        "devices": strategy.devices,
        "loss": loss,
        "plan_tasks": sorted({task_of(d) for d in strategy.plan.placement.values()}) if strategy.plan else [],
        "variable_tasks": sorted({task_of(kerasflow.devices.normalize_device(v.value.device))
                                  for v in model.trainable_variables}),
        "mismatches": len(strategy.placement_report() or []),
        "checkpoint_ok": checkpoint_ok,
        "hosts": {str(k): v for k, v in strategy._options.cluster.hosts().items()},
        "measured_link": [link.latency, link.bandwidth],
    }
    with open(out, "w") as handle:
        json.dump(result, handle)


def stop_a_worker_mid_fit(out: str, pid: int, signal_name: str, when: str) -> None:
    import signal
    import time
    import traceback

    import keras
    import numpy as np

    from kerasflow.planner import baselines
    from kerasflow.planner.sim.predict import with_prediction
    from kerasflow.strategies import Collaborators

    def a_layer_on_every_device(request):
        # The planner's own choice rides on loopback's noise, and may leave the stopped worker
        # idle (its loss then shows only in Keras' sync at the end of the epoch, as TensorFlow's
        # own error): a layer on every device gives the stopped worker variables the next step needs.
        graph, cluster = request.graph, request.cluster
        return [with_prediction(baselines.layerwise_model_parallel(graph, cluster), graph, cluster)]

    strategy = kerasflow.FastTStrategy(inter_host_link=(20e-6, 5e9), split=False, tick_tock="off", verbose=0,
                                       drop_slower_plan=False, connect_timeout=5,
                                       collaborators=Collaborators(planner=a_layer_on_every_device))
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    stopped = {}

    def stop():
        stopped["variable_tasks"] = sorted({task_of(kerasflow.devices.normalize_device(v.value.device))
                                            for v in model.trainable_variables})
        os.kill(pid, getattr(signal, signal_name))
        stopped["at"] = time.monotonic()
        with open(out, "w") as handle:  # in case this process does not get to write more
            json.dump({"stopped_at": time.time()}, handle)

    class StopTheWorker(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stopped["planned_steps"] = stopped.get("planned_steps", 0) + strategy.plan_in_force
            # Mid-epoch: a step follows in the same epoch (after an epoch's last step comes
            # Keras' sync with every task, which fails as TensorFlow's own error).
            last_batch = self.params["steps"] - 1
            if when == "mid-epoch" and stopped["planned_steps"] >= 3 and batch < last_batch and "at" not in stopped:
                stop()

        def on_epoch_end(self, epoch, logs=None):
            if when == "between-epochs" and stopped.get("planned_steps", 0) >= 3 and "at" not in stopped:
                stop()

    x, y = np.random.rand(512, 64).astype("float32"), np.random.randint(0, 10, 512)
    result = {"raised": None}
    try:
        model.fit(x, y, batch_size=32, epochs=20, verbose=0, callbacks=[StopTheWorker()])
    except Exception as error:  # noqa: BLE001 - what fit raised is the result
        result = {"raised": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
    result["seconds"] = time.monotonic() - stopped["at"] if "at" in stopped else None
    result["variable_tasks"] = stopped.get("variable_tasks")
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    if sys.argv[2] == "--stop":
        stop_a_worker_mid_fit(sys.argv[1], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main(sys.argv[1], sys.argv[2])
