"""Train across several "machines" on one: two kerasflow workers on loopback and a chief.

`kerasflow.worker.local_cluster(2)` starts two `python -m kerasflow.worker` processes (2 logical
CPUs each) and gives their `TF_CONFIG` cluster; this script then runs itself again as the chief,
with `TF_CONFIG` set, so `FastTStrategy()` connects, profiles, plans over all 5 devices, moves
the variables and trains. On real hosts you run the workers yourself (tutorial 5). The workers
stop when the `with` block ends.

    python examples/several_machines_on_one.py
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def chief() -> None:
    import keras
    import numpy as np

    import kerasflow
    from kerasflow.multihost import task_of

    # The network between the "hosts" is given, not measured: loopback in one machine's
    # processes says little about a real one.
    # 20 steps end before a plan made beside training would arrive: fit waits for the planner.
    strategy = kerasflow.FastTStrategy(inter_host_link=(25e-6, 12.5e9), background_planning=False)
    print(f"Devices: {strategy.devices}")
    with strategy.scope():
        inputs = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="stem")(inputs)
        branches = [keras.layers.Conv2D(16, k, padding="same", activation="relu", name=f"branch_{k}")(x)
                    for k in (1, 3, 5)]
        x = keras.layers.GlobalAveragePooling2D(name="gap")(keras.layers.Concatenate(name="join")(branches))
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="cnn")
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((640, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, 640)
    model.fit(x, y, batch_size=32, epochs=1, verbose=2)
    tasks = sorted({task_of(d) for d in strategy.plan.devices()})
    print(f"Plan {strategy.plan.algorithm!r} uses {len(tasks)} task(s): {tasks}")
    report = strategy.placement_report()
    print(report.summary() if report is not None else "No plan was applied.")
    model.save_weights("several_machines.weights.h5")  # written by the chief
    print("Checkpoint written by the chief: several_machines.weights.h5")


def main() -> None:
    from kerasflow.worker import local_cluster

    with local_cluster(2, virtual_cpus=2) as cluster:
        print(f"Workers serving: {cluster['worker']}")
        config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        subprocess.run([sys.executable, __file__, "--chief"], env=dict(os.environ, TF_CONFIG=config), check=True)
    print("Workers stopped.")


if __name__ == "__main__":
    chief() if "--chief" in sys.argv else main()
