"""One run of the reproducibility test's script, in a process of its own: the user's script with
TensorFlow's op determinism on, trained under ``FastTStrategy`` planned for independent devices
(where replicas, op splitting and waves are all candidates), with timings scripted per run.

    python -m tests.strategies.same_script OUT.npz RUN [--nondeterministic]

RUN (0 or 1) picks the timings: each run scales the part of every op's profiled cost that grows
with the batch by a hundred (so that cutting the batch across devices wins by far: replicas or
split layers, where they are allowed) and perturbs the cost by its own seeded noise (up to 40 %
either way) before the real planner ranks the plans (the default placement left out, so a plan
is always tried); its trial steps report the plan faster (run 0: kept) or slower (run 1:
dropped, the runner-up tried, then the default placement) than the default placement.
``--nondeterministic``: the same without TensorFlow's op determinism (the control).
OUT.npz holds the weights after ``fit``, the algorithms of the plans that ran a step, whether
all of them were placement-only, whether a plan was in force at the end, and the candidates the
report excluded with why.
"""

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)


def noisy_planner(run: int):
    """The real planner on the profile with each op's cost scaled and moved by this run's noise."""
    import numpy as np

    from kerasflow.planner import OpGraph, ranked_plans
    from kerasflow.planner.ir.graph import Affine
    from kerasflow.planner.search.candidates import PLANNED_CANDIDATES

    def planner(request):
        graph = request.graph
        noise = np.random.default_rng(run).uniform(0.6, 1.4, size=len(graph.ops))
        ops = [dataclasses.replace(op, cost={kind: Affine(cost.fixed * factor, 100 * cost.per_sample * factor)
                                             for kind, cost in op.cost.items()})
               for op, factor in zip(graph.ops, noise)]
        noisy = OpGraph(ops, graph.edges, batch_size=graph.batch_size, name=graph.name, metadata=graph.metadata)
        return ranked_plans(dataclasses.replace(request, graph=noisy, candidates=PLANNED_CANDIDATES))

    return planner


def main(out: str, run: int, deterministic: bool) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    from kerasflow.strategies import Collaborators
    from kerasflow.testing import PlansThatRan
    from tests.profiling import models

    if deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(7)
    planned_seconds = 0.5 if run == 0 else 2.0
    ran = PlansThatRan(lambda step, plan: (step(), 1.0 if plan is None else planned_seconds))
    strategy = kerasflow.FastTStrategy(cluster="cpu-testbed:4", warmup_steps=2, profile_steps=1, verbose=0,
                                       collaborators=Collaborators(planner=noisy_planner(run), stopwatch=ran))
    with strategy.scope():
        model = models.mlp(keras, dropout=False)
    x, y = models.mlp_data(24 * 16)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    excluded = strategy.report.excluded or {}
    np.savez(out, *model.get_weights(), ran=np.array([plan.algorithm for plan in ran.plans], dtype=str),
             placement_only=ran.placement_only, in_force=strategy.plan_in_force,
             excluded=np.array([f"{name}: {why}" for name, why in sorted(excluded.items())], dtype=str))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), deterministic="--nondeterministic" not in sys.argv[3:])
