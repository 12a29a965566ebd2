"""Planners a planning process can import (``kerasflow.planning_job``), scripted for the tests of
planning beside training: each plans the step on one device apart from the first (a
placement-only plan, so a run equals plain Keras bit for bit), after what its name says."""

import dataclasses
import os
import time

from kerasflow.planner import baselines

# The file whose creation lets ``released_later`` answer (the test's callback creates it).
RELEASE = "KERASFLOW_TEST_RELEASE"


def on_the_second_device(request) -> list:
    """The step on the cluster's second device, predicted twice as fast as the default placement."""
    plan = baselines.single_device(request.graph, request.cluster, request.cluster.device_names[1])
    default = plan.predicted_step_time * 2
    return [dataclasses.replace(plan, algorithm="single_device",
                                candidates={"default_placement": default, "single_device": plan.predicted_step_time})]


def released_later(request) -> list:
    """``on_the_second_device`` once the file named by ``KERASFLOW_TEST_RELEASE`` exists (an error
    after 20 s without it: a planner run inside ``fit`` would wait for a step that never comes)."""
    waited = time.monotonic()
    while not os.path.exists(os.environ[RELEASE]):
        if time.monotonic() - waited > 20:
            raise RuntimeError("never released: was the planner run inside fit?")
        time.sleep(0.02)
    return on_the_second_device(request)


def exits(request) -> list:
    """A planning process that dies without a word."""
    os._exit(3)


def hangs(request) -> list:
    """A planner that never answers."""
    time.sleep(3600)
    return []
