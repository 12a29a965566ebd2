"""The chief of the testbed's smoke test, run in its own process (the testbed joins a cluster,
which changes TensorFlow's context for good): starts a two-task testbed, trains a few steps of a
plan that puts layers on both tasks, reads the placement back, stops it, and writes JSON.

    python -m tests.testbed_chief OUT.json
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402


def layers_on_both_tasks(request):
    """Layer-wise model parallelism over the testbed's two tasks, whatever it gains."""
    from kerasflow.planner.parallel.baselines import layerwise_model_parallel

    return [layerwise_model_parallel(request.graph, request.cluster)]


def main(out: str) -> None:
    testbed = kerasflow.testbed.start(tasks=2)
    import keras
    import numpy as np

    from kerasflow.multihost import task_of
    from kerasflow.strategies import Collaborators

    strategy = kerasflow.FastTStrategy(devices=testbed.devices, cluster=testbed.cluster, warmup_steps=2,
                                       profile_steps=1, drop_slower_plan=False, verbose=0,
                                       collaborators=Collaborators(planner=layers_on_both_tasks))
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="first"),
                                  keras.layers.Dense(32, activation="relu", name="second"),
                                  keras.layers.Dense(4, name="logits")])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    history = model.fit(rng.normal(size=(16 * 8, 16)).astype("float32"), rng.integers(0, 4, 16 * 8),
                        batch_size=16, epochs=1, verbose=0)
    report = strategy.placement_report()
    result = {
        "pid": os.getpid(),
        "devices": testbed.devices,
        "workers": [process.pid for process in testbed.processes],
        "ports": [int(address.rsplit(":", 1)[1]) for address in testbed.addresses],
        "kinds": sorted(set(testbed.cluster.kinds())),
        "link": list(testbed.cluster.link(testbed.devices[0], testbed.devices[1])),
        "plan_tasks": sorted({task_of(d) for d in strategy.plan.placement.values()}),
        "in_force": strategy.plan_in_force,
        "off_plan": len(report),
        "sent_between_tasks": sum(1 for t in report.transfers if task_of(t.src) != task_of(t.dst)),
        "loss": history.history["loss"],
    }
    testbed.stop()
    result["workers_alive_after_stop"] = [process.poll() is None for process in testbed.processes]
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1])
