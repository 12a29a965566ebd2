"""Applies hand-written one-line mutations of kerasflow's pure parts, one at a time, and reports
which ones their tests do not notice (the survivors). None may survive.

The pure parts are the planner (``kerasflow/planner``) and the runtime's plain-Python pieces:
``strategies.side_by_side`` (the schedule and verdict of a plan timed beside the default
placement), ``planner.search.rerank`` (the runners-up after a measured plan), ``strategies.verdict``
(keep the timed plan, try a runner-up, or drop it; with ``strategies.trial``'s one line that
passes it no runner-up once ``fit`` has ended), ``strategies.options`` (the checked settings
and their ``KERASFLOW_*`` variables) and ``strategies.scopes`` (a traced op's name without its
wave and shard scopes), ``strategies.driver_state`` (the driver's only transitions); and two that check the equality tests' measured bounds
(``kerasflow/testing/rounding.py``) are not too loose: a replica's gradients or a shard's statistics left out
of their sum must fail them; and ``profiling.xplane``'s reading of GPU profiles and the
stopwatch's wait for the devices. Each mutation replaces one line in a temporary copy of the
checkout and runs the tests it names (by default the planner's tests and doctests, which never
start TensorFlow; the tests of ``kerasflow.strategies`` modules import the package, which
does, about 10 s a run), stopping at the first failure. The working tree is never touched.

Before anything runs, every mutation is checked against the checkout: one whose line no longer
occurs exactly once in its file (the code moved on) stops the tool with one error that names
every such mutation. Then each set of tests runs once without a mutation: tests that fail
already would count every mutation as killed.

Usage:
    python tools/mutations.py            # every mutation (about six minutes on 2 cores)
    python tools/mutations.py --list     # what each one changes, and the tests that must notice
    python tools/mutations.py barrier    # only those whose name contains "barrier"

Exit status: 0 when every mutation run was killed, 1 when one survived, 2 when one is stale
or when its tests fail (or cannot run) on the checkout as it is, before any mutation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterable, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What of the checkout each temporary copy holds.
COPIED = ("kerasflow", "tests", "setup.cfg", "benchmarks", "conftest.py")  # conftest: the logical CPUs
PLANNER_TESTS = ("tests/planner", "kerasflow/planner")
SIDE_BY_SIDE_TESTS = ("tests/strategies/test_side_by_side.py", "kerasflow/strategies/side_by_side.py")
RERANK_TESTS = ("tests/planner/test_rerank.py", "kerasflow/planner/search/rerank.py")
VERDICT_TESTS = ("tests/strategies/test_verdict.py", "kerasflow/strategies/verdict.py")
OPTIONS_TESTS = ("tests/strategies/test_options.py", "kerasflow/strategies/options.py")
# The driver's states and the only transitions between them, on plain data.
DRIVER_STATE_TESTS = ("tests/strategies/test_driver_state.py", "kerasflow/strategies/driver_state.py")
# The equality tests' measured bounds (kerasflow/testing/rounding.py) must not be so loose that they hide a
# lost share of a sum: the replicas' test and the split normalization's path.
REPLICAS_TEST = ("tests/strategies/test_batchstats.py::test_replicas_train_as_one_device_does",)
SPLIT_NORMALIZATION_TEST = (
    "tests/strategies/test_every_path.py::test_every_output_equals_plain_keras[bn_cnn-normalization_split-strategy]",)
# GPU profiles read from hand-built XSpace protos.
XPLANE_TESTS = ("tests/profiling/test_xplane.py",)
# Copy kernels priced at the rate measured on the device.
COPY_RATE_TEST = ("tests/profiling/test_profile_model.py::test_copy_kernels_are_priced_at_the_device_measured_copy_rate",)
# Each replica's rows cut where the batch is, and only they copied to its device.
ROWS_TEST = ("tests/strategies/test_replicas.py::"
             "test_a_data_parallel_plan_trains_as_one_device_does_with_a_partial_last_batch",)
# A planned step runs the default placement's fused kernels (the CNN's chains are ordered apart otherwise).
FUSIONS_TEST = ("tests/strategies/test_fusions.py::test_a_planned_step_runs_as_many_fused_kernels_as_the_default_placement[cnn]",)
# The callback door's step compiled with XLA: the default placement every plan is judged against.
XLA_TESTS = ("tests/strategies/test_xla.py",)
# A model whose layer draws unseeded random numbers (Keras' global seed generator), trained as plain Keras is.
GLOBAL_SEED_TEST = (
    "tests/compat/test_tutorial_models.py::test_pattern_trains_like_plain_keras_in_the_default_configuration"
    "[switch_transformer]",)
# pytest's exit statuses of tests that ran and failed: a test failed (1), or an error, such as
# one while collecting, stopped the run (2). Any other means the tests could not run at all.
PYTEST_FAILED = (1, 2)


class Mutation(NamedTuple):
    """One hand-made bug.

    Attributes:
        name: what the bug does, in words.
        path: the file it changes, relative to the checkout.
        before: the text it replaces; must occur exactly once in ``path``.
        after: the text put in its place.
        tests: the test files, folders and modules (for their doctests) that must notice it,
            relative to the checkout, or single tests (``file::test[id]``).
    """

    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...] = PLANNER_TESTS


MUTATIONS = [
    Mutation("tick-tock forward barrier removed", "kerasflow/planner/sim/taskgraph.py",
             "            self._barriers(len(replicas))", "            pass"),
    Mutation("gpipe-4 builds 2 micro-batches", "kerasflow/planner/search/maxbatch.py",
             "pipeline(g, c, 4, batch=b)", "pipeline(g, c, 2, batch=b)"),
    Mutation("CPOP ignores its critical-path device", "kerasflow/planner/schedule/cpop.py",
             "preferred = {t: path_device for t in path if fixed[t] < 0}", "preferred = {}"),
    Mutation("list scheduler forgets received inputs in a device's memory need", "kerasflow/planner/schedule/listschedule.py",
             "                        received += nbytes", "                        received += 0.0"),
    Mutation("fusion buffer of 25 KiB instead of 25 MiB", "kerasflow/planner/sim/ring.py",
             "FUSION_BUFFER_BYTES = 25 * 2**20", "FUSION_BUFFER_BYTES = 25 * 2**10"),
    Mutation("ring reduce-scatter sends the wrong chunk", "kerasflow/planner/sim/ring.py",
             "RingSend(step, i, (i + 1) % parts, (i - step) % parts, True)",
             "RingSend(step, i, (i + 1) % parts, (i + step) % parts, True)"),
    Mutation("simulated transfers ignore the link latency", "kerasflow/planner/sim/eventloop.py",
             "arrival = begin + latency[src][dst] + wire",
             "arrival = begin + wire"),
    Mutation("memory headroom ignored", "kerasflow/planner/schedule/listschedule.py",
             "budgets.append(max(memory * (1.0 - headroom) - reserved, 0.0))", "budgets.append(max(memory - reserved, 0.0))"),
    Mutation("an unordered plan is never kept", "kerasflow/planner/search/planning.py",
             "    if unordered is None or not unordered.predicted_step_time < to_beat:",
             "    if True:"),
    Mutation("the split search stops plans before they pass the time to beat", "kerasflow/planner/parallel/splitting.py",
             "plan = schedule(splits, to_beat)", "plan = schedule(splits, to_beat * 0.9)"),
    Mutation("a simulation runs past its deadline", "kerasflow/planner/sim/eventloop.py",
             "            if now > deadline and not self.op_passed_a_copy[0]:", "            if False:"),
    Mutation("a run whose start order would not replay is stopped at the deadline", "kerasflow/planner/sim/eventloop.py",
             "            if now > deadline and not self.op_passed_a_copy[0]:", "            if now > deadline:"),
    Mutation("a deadline leaves out the profile's step overhead", "kerasflow/planner/sim/simulator.py",
             "deadline=deadline - overhead)", "deadline=deadline)"),
    Mutation("wave gradients concatenated instead of summed", "kerasflow/planner/sim/taskgraph.py",
             'role = "concat" if out.scales_with_batch else "sum"', 'role = "concat"'),
    Mutation("ring all-reduce with D-1 steps instead of 2(D-1)", "kerasflow/planner/sim/taskgraph.py",
             "        steps = 2 * (replicas - 1)",
             "        steps = replicas - 1"),
    Mutation("the step-time bound sends weight gradients for free", "kerasflow/planner/search/bounds.py",
             "        transfer = self.lowest_latency + nbytes / self.fastest_bandwidth", "        transfer = 0.0"),
    Mutation("split ops in the bound counted whole", "kerasflow/planner/search/bounds.py",
             "        return self.fixed[i] + self.per_batch[i] / micro_batches / (self.count if self.splits[i] else 1)",
             "        return self.fixed[i] + self.per_batch[i] / micro_batches"),
    Mutation("a remote copy of a loop that reads its weights gets none", "kerasflow/planner/sim/taskgraph.py",
             "                out, sent = Affine(float(ops[p].persistent_bytes), 0.0), float(ops[p].persistent_bytes)",
             "                pass"),
    Mutation("a loop that reads its weights runs once", "kerasflow/planner/ir/graphtables.py",
             "            and (op.colocation not in anchored or op.type in WEIGHT_READING_LOOPS)",
             "            and op.colocation not in anchored"),
    Mutation("a folded chain sends its inner values", "kerasflow/planner/ir/graphtables.py",
             "    folded = folded_ops(graph)", "    folded = [False] * n"),
    Mutation("the tie margin ignores the profile's noise", "kerasflow/planner/search/planning.py",
             "    return round(min(MAX_TIE_MARGIN, max(TIE_MARGIN, NOISE_TIES * spread)), 6)",
             "    return TIE_MARGIN"),
    Mutation("the tie margin is not capped", "kerasflow/planner/search/planning.py",
             "    return round(min(MAX_TIE_MARGIN, max(TIE_MARGIN, NOISE_TIES * spread)), 6)",
             "    return round(max(TIE_MARGIN, NOISE_TIES * spread), 6)"),
    Mutation("the side-by-side verdict is the mean of the rounds' ratios", "kerasflow/strategies/side_by_side.py",
             "        return statistics.median(p / d for p, d in zip(self._planned, self._default))",
             "        return statistics.mean(p / d for p, d in zip(self._planned, self._default))",
             SIDE_BY_SIDE_TESTS),
    Mutation("the side-by-side ratio is default over planned", "kerasflow/strategies/side_by_side.py",
             "        return statistics.median(p / d for p, d in zip(self._planned, self._default))",
             "        return statistics.median(d / p for p, d in zip(self._planned, self._default))",
             SIDE_BY_SIDE_TESTS),
    Mutation("no untimed default step before the side-by-side rounds", "kerasflow/strategies/side_by_side.py",
             "        self._schedule = ([(True, False)] + [",
             "        self._schedule = ([] + [",
             SIDE_BY_SIDE_TESTS),
    Mutation("the side-by-side's first default step (which traces) is timed", "kerasflow/strategies/side_by_side.py",
             "        self._schedule = ([(True, False)] + [",
             "        self._schedule = ([(True, True)] + [",
             SIDE_BY_SIDE_TESTS),
    Mutation("rerank scales no plan by the measured one's ratio", "kerasflow/planner/search/rerank.py",
             "plan.predicted_step_time * (ratio if same_kind(plan, measured_plan) else 1.0)",
             "plan.predicted_step_time * 1.0",
             RERANK_TESTS),
    Mutation("rerank scales plans of the other kind too", "kerasflow/planner/search/rerank.py",
             "plan.predicted_step_time * (ratio if same_kind(plan, measured_plan) else 1.0)",
             "plan.predicted_step_time * ratio",
             RERANK_TESTS),
    Mutation("the verdict drops a plan exactly 3 % slower than the default placement",
             "kerasflow/strategies/verdict.py",
             "    if ratio <= 1 + SLOWER_MARGIN:", "    if ratio < 1 + SLOWER_MARGIN:",
             VERDICT_TESTS),
    Mutation("the verdict ignores RUNNER_UP_GAIN (any runner-up faster than the default is tried)",
             "kerasflow/strategies/verdict.py",
             "    if expected < default * (1 - RUNNER_UP_GAIN):", "    if expected < default:",
             VERDICT_TESTS),
    Mutation("the verdict takes its runner-up from the slow end of the ranking", "kerasflow/strategies/verdict.py",
             "    best, expected = ranked[0]", "    best, expected = ranked[-1]",
             VERDICT_TESTS),
    Mutation("the verdict explains the scaling for a runner-up of the other kind, not the same kind",
             "kerasflow/strategies/verdict.py",
             '    scaled = "" if not same_kind(best, plan) else (', '    scaled = "" if same_kind(best, plan) else (',
             VERDICT_TESTS),
    Mutation("the verdict at fit's end tries a runner-up", "kerasflow/strategies/trial.py",
             "schedule.rounds_done, [] if final else self.runners_up,", "schedule.rounds_done, self.runners_up,",
             VERDICT_TESTS),
    Mutation("options take warmup_steps=1", "kerasflow/strategies/options.py",
             '    "warmup_steps": _parse_int(2),', '    "warmup_steps": _parse_int(1),',
             OPTIONS_TESTS),
    Mutation("options read an environment variable over a given argument", "kerasflow/strategies/options.py",
             "        value = settings.get(name)",
             '        value = os.environ.get(f"KERASFLOW_{name.upper()}") or settings.get(name)',
             OPTIONS_TESTS),
    Mutation("options name the setting, not the environment variable its bad value came from",
             "kerasflow/strategies/options.py",
             "            given[name] = parse(variable, os.environ[variable])",
             "            given[name] = parse(name, os.environ[variable])",
             OPTIONS_TESTS),
    Mutation("options take max_split_evaluations=0", "kerasflow/strategies/options.py",
             '    "max_split_evaluations": _parse_int(1),', '    "max_split_evaluations": _parse_int(0),',
             OPTIONS_TESTS),
    Mutation("options take a cluster without their devices", "kerasflow/strategies/options.py",
             "        absent = [d for d in devices if cluster is not None and d not in cluster.device_names]",
             "        absent = []", OPTIONS_TESTS + ("tests/strategies/test_driver.py::"
                                                    "test_both_doors_make_the_same_checks_with_the_same_errors",)),
    Mutation("options take a plan using other devices", "kerasflow/strategies/options.py",
             "        unknown = sorted(set(plan.devices()) - set(self.devices) - hosts)", "        unknown = []",
             OPTIONS_TESTS + ("tests/strategies/test_driver.py::"
                              "test_both_doors_make_the_same_checks_with_the_same_errors",)),
    Mutation("options take options= and a keyword argument, the keyword lost", "kerasflow/strategies/options.py",
             "    if given:\n        raise KerasflowError(", "    if False:\n        raise KerasflowError(",
             OPTIONS_TESTS),
    Mutation("the options' constructor takes any spelling a parser reads", "kerasflow/strategies/options.py",
             "    if parsed != value or isinstance(parsed, bool) != isinstance(value, bool):",
             "    if False:", OPTIONS_TESTS),
    Mutation("options take devices as spelt, unchecked", "kerasflow/strategies/options.py",
             "        devices = tuple(canonical_device(d) for d in (devices or default_devices()))\n"
             "        _refuse_missing(door, devices)",
             "        devices = tuple(devices or default_devices())", OPTIONS_TESTS),
    Mutation("options take booleans for replicated and tick_tock (True as on)", "kerasflow/strategies/options.py",
             "        text = raw.strip().lower() if isinstance(raw, str) else None",
             '        text = raw.strip().lower() if isinstance(raw, str) else {True: "on", False: "off"}.get(raw)',
             OPTIONS_TESTS),
    Mutation("options take an infinite or NaN memory_limit", "kerasflow/strategies/options.py",
             "    if not math.isfinite(value) or value <= 0:", "    if value <= 0:",
             OPTIONS_TESTS),
    Mutation("tasks on shared compute run at full speed side by side", "kerasflow/planner/sim/sharedpools.py",
             "        speed = rate[p](len(tasks))", "        speed = 1.0"),
    Mutation("a superseded end event on shared compute ends its task", "kerasflow/planner/sim/eventloop.py",
             "                        if seq != latest[t]:", "                        if False:"),
    Mutation("replicas on shared compute are mirrored", "kerasflow/planner/sim/taskgraph.py",
             " and not self.cluster.shares_compute(names) and", " and"),
    Mutation("the default placement is kept only within the tie margin", "kerasflow/planner/search/planning.py",
             "    margin = max(tie_margin, PREDICTION_ERROR * measured)", "    margin = tie_margin"),
    Mutation("a profiled op's time among others is taken for its time alone", "kerasflow/profiling/xplane.py",
             "            share = (at - since) * min(1.0, lanes / len(running))", "            share = at - since",
             ("kerasflow/profiling/xplane.py",)),
    Mutation("a plan predicted far faster than the default placement is timed anyway", "kerasflow/strategies/verdict.py",
             "    return default / plan.predicted_step_time - 1 <= min(gains[kind] for kind in kinds)",
             "    return True", VERDICT_TESTS),
    Mutation("a plan on a kind never calibrated goes untimed on another kind's trusted gain",
             "kerasflow/strategies/verdict.py",
             "    if not default or not plan.predicted_step_time or not kinds or not kinds <= set(gains):",
             "    if not default or not plan.predicted_step_time or not kinds:", VERDICT_TESTS),
    Mutation("a priority run always claims its start order replays", "kerasflow/planner/sim/eventloop.py",
             "                elif copies_waiting[r]:", "                elif False:"),
    Mutation("wave candidates are skipped below the fastest plan by their busiest device, not above",
             "kerasflow/planner/parallel/ticktock.py",
             "    return (busiest_device_seconds(graph, cluster, plan, batch) + overhead > seconds",
             "    return (busiest_device_seconds(graph, cluster, plan, batch) + overhead < seconds"),
    Mutation("wave candidates are skipped below the fastest plan by their longest chain, not above",
             "kerasflow/planner/parallel/ticktock.py",
             "            or longest_chain_seconds(graph, cluster, plan, batch) + overhead > seconds)",
             "            or longest_chain_seconds(graph, cluster, plan, batch) + overhead < seconds)"),
    Mutation("a device's work is its last op task's, not their sum", "kerasflow/planner/sim/taskgraph.py",
             "        work[device] += seconds",
             "        work[device] = seconds"),
    Mutation("a backward op that reads nothing of the batch keeps its forward readers out of the wave barrier",
             "kerasflow/planner/sim/taskgraph.py",
             "            tainted[i] = inherited or (self.is_batch[i] and ops[i].phase != \"forward\" and reads_batch[i])",
             "            tainted[i] = inherited or (self.is_batch[i] and ops[i].phase != \"forward\")"),
    Mutation("a wave's scope held twice in an op name is kept once", "kerasflow/strategies/scopes.py",
             "        if w and wave in (-1, int(w.group(1))):", "        if w and wave < 0:",
             ("kerasflow/strategies/scopes.py",)),
    Mutation("a block of gaps exactly as long as a task is passed over", "kerasflow/planner/schedule/listschedule.py",
             "        cutoff = duration * (1 - 1e-9) - 1e-9", "        cutoff = duration * (1 + 1e-9)"),
    Mutation("the longest chain's ops start before their inputs are done", "kerasflow/planner/sim/taskgraph.py",
             "                if done[c] < finish:", "                if False:"),
    Mutation("the compiled loss' gradient is left out of the loss' pseudo-layer", "kerasflow/planner/ir/graphtables.py",
             "    return name.removeprefix(_GRADIENT_PREFIX).startswith(_LOSS_SCOPE)",
             "    return name.startswith(_LOSS_SCOPE)"),
    Mutation("a split layer's gradient sum runs whole though a reader takes the shards", "kerasflow/planner/sim/planchecks.py",
             "        shards_of_layer.get(reader) == shards_of_layer[groups[i]] for reader in readers.get(groups[i], ())))",
             "        False for reader in readers.get(groups[i], ())))"),
    Mutation("a gradient sum read by two layers joins one of them", "kerasflow/planner/ir/graphtables.py",
             "            if len(readers) == 1:", "            if readers:"),
    Mutation("every shard of a split normalization updates its moving statistics", "kerasflow/planner/sim/taskgraph.py",
             "                    shards = shards[:1]  # the shards' one statistic, one moving average to update",
             "                    shards = shards"),
    Mutation("a weight's gradient counts as an update of the moving statistics", "kerasflow/planner/ir/graphtables.py",
             "        if (i in layer_ops and copied[i] and ops[i].phase == \"forward\" and readers",
             "        if (i in layer_ops and copied[i] and readers"),
    Mutation("each shard of a split normalization keeps its own statistic", "kerasflow/planner/sim/taskgraph.py",
             "            if k >= 0 and p in self.shared_statistics:", "            if False:"),
    Mutation("a normalization the profile synchronizes is not split", "kerasflow/planner/ir/graphtables.py",
             "    return [op.splittable or i in together for i, op in enumerate(graph.ops)]",
             "    return [op.splittable for op in graph.ops]"),
    Mutation("the last replica's gradients are left out of the sum", "kerasflow/strategies/replicas.py",
             "                    flat.append(tf.concat([tf.reshape(gradients[i], [-1]) for i in indices], axis=0))",
             "                    flat.append(tf.concat([tf.reshape(gradients[i] * float(device != devices[-1]), [-1])"
             " for i in indices], axis=0))", REPLICAS_TEST),
    Mutation("the last shard's statistics are left out of a split normalization's",
             "kerasflow/strategies/batchstats.py",
             "            total = tf.add_n(list(values))", "            total = tf.add_n(list(values)[:-1])",
             SPLIT_NORMALIZATION_TEST),
    Mutation("profiling leaves Keras' global seed generator advanced", "kerasflow/profiling/profiler.py",
             "                 + _compat.metric_variables(model) + _compat.global_random_state())",
             "                 + _compat.metric_variables(model))", GLOBAL_SEED_TEST),
    Mutation("data parallelism is tried for a model that refused the half batch", "kerasflow/planner/search/planning.py",
             "    cut = [name for name in names if REGISTRY[name].replicated]",
             "    cut = []"),
    Mutation("data parallelism inside one host is tried on one host", "kerasflow/planner/search/candidates.py",
             "              replicated=True, applies=lambda r: len(r.cluster.hosts()) > 1),",
             "              replicated=True),"),
    Mutation("replicated=False still tries data parallelism", "kerasflow/planner/search/planning.py",
             "                      and (request.replicated or not REGISTRY[name].replicated))",
             "                      )"),
    Mutation("a GPU kernel's op stored as a reference is not read", "kerasflow/profiling/xplane.py",
             "            found[key] = texts.get(stat.ref_value, \"\")", "            pass", XPLANE_TESTS),
    Mutation("the profile viewer's derived lines are read too", "kerasflow/profiling/xplane.py",
             "            if line.name in _DERIVED_LINES:", "            if False:", XPLANE_TESTS),
    Mutation("a GPU kernel run after the host's step mark is dropped", "kerasflow/profiling/xplane.py",
             "        step = host_step(begin) if place == HOST else device_step(begin)",
             "        step = host_step(begin)", XPLANE_TESTS),
    Mutation("the stopwatch stops before the devices are done", "kerasflow/strategies/collaborators.py",
             "    wait_for_devices()\n    return outputs, time.perf_counter() - started",
             "    return outputs, time.perf_counter() - started", ("tests/test_devices.py",)),
    Mutation("logical GPUs of one card are priced as devices of their own", "kerasflow/devices.py",
             "            for names in by_card.values() if len(names) > 1]",
             "            for names in by_card.values() if len(names) > 99]", ("tests/test_devices.py",)),
    Mutation("a card's kind is read from any part of its name", "kerasflow/devices.py",
             '_KIND_IN_NAME = re.compile(r"\\b(H200|H100|A100|V100|K80)\\b")',
             '_KIND_IN_NAME = re.compile(r"(H200|H100|A100|V100|K80)")', ("tests/test_devices.py",)),
    Mutation("a local device's kind keeps the user's case", "kerasflow/devices.py",
             '        return f"/{kind.upper()}:{index}"', '        return f"/{kind}:{index}"',
             ("tests/test_devices.py", "kerasflow/devices.py")),
    Mutation("the step's temporary memory is left on the devices' budgets", "kerasflow/planner/schedule/listschedule.py",
             "        budgets.append(max(memory * (1.0 - headroom) - reserved, 0.0))",
             "        budgets.append(max(memory * (1.0 - headroom), 0.0))"),
    Mutation("fit prices copy kernels at the datasheet's memory bandwidth", "kerasflow/profiling/links.py",
             'Device(d, "CPU", DEVICE_SPECS["CPU"].memory, memory_bandwidth=rate)',
             'Device(d, "CPU", DEVICE_SPECS["CPU"].memory)', COPY_RATE_TEST),
    Mutation("a plan predicted slower than the XLA step is tried anyway", "kerasflow/strategies/xla_step.py",
             "        return self.seconds is None or predicted_step < self.seconds + (loop_seconds or 0.0)",
             "        return True", XLA_TESTS),
    Mutation("the trial times the default placement without XLA", "kerasflow/strategies/xla_step.py",
             "        self.restore()\n        try:", "        try:", XLA_TESTS),
    Mutation("XLA stays off when the plan is dropped", "kerasflow/strategies/driver.py",
             "            self.xla.restore()  # Keras' train function, made anew below or by the trial, compiles with XLA",
             "            pass", XLA_TESTS),
    Mutation("a replica's rows of the batch arrive free in the simulator", "kerasflow/planner/sim/taskgraph.py",
             "                    home = self.batch_holder  # the replica's rows of the batch, sent from there",
             "                    pass"),
    Mutation("a replica's rows are sent wave by wave in the simulator", "kerasflow/planner/sim/taskgraph.py",
             "            if dp and k >= 0 and len(waves) > 1 and out.scales_with_batch and resource[src] != "
             "resource[waves[0][0][0]]:", "            if False:"),
    Mutation("each replica's rows are cut on the last replica's device", "kerasflow/strategies/steps.py",
             "        with tf.device(_held_on(x)), tf.name_scope(WAVES_SCOPE):",
             "        with tf.device(devices[-1]), tf.name_scope(WAVES_SCOPE):", ROWS_TEST),
    Mutation("a fused chain is ordered like any op", "kerasflow/strategies/applier.py",
             "            names = [task for task in names if parse_copy_name(task)[0] not in self.unordered]",
             "            names = list(names)", FUSIONS_TEST),
    Mutation("split='auto' never splits", "kerasflow/strategies/planning_in_fit.py",
             "    return options.split == \"on\" or not cluster.shares_compute(cluster.device_names)",
             "    return options.split == \"on\"", OPTIONS_TESTS),
    Mutation("the default placement is not for good", "kerasflow/strategies/driver_state.py",
             "    Default: frozenset(),", "    Default: frozenset({WarmingUp}),", DRIVER_STATE_TESTS),
    Mutation("a settled plan goes back to its trial", "kerasflow/strategies/driver_state.py",
             "    Planned: frozenset({Default}),", "    Planned: frozenset({Default, InTrial}),", DRIVER_STATE_TESTS),
    Mutation("a split layer's plan counts as placement-only", "kerasflow/planner/ir/plan.py",
             "        return not self.splits and self.waves is None and self.data_parallel is None",
             "        return self.waves is None and self.data_parallel is None",
             ("tests/compat/test_fine_tuning.py::test_fine_tuning_after_a_recompile_equals_plain_keras[split_head-callback]",)),
    Mutation("candidates that cannot be tried end in the memory error", "kerasflow/planner/search/planning.py",
             "    if not lineup.names:\n", "    if False:\n"),
    Mutation("a transfer between hosts holds its link for its whole latency", "kerasflow/planner/sim/eventloop.py",
             "                                row[dst] = begin + gap[src][dst] + wire",
             "                                row[dst] = arrival"),
    Mutation("a step on another host pays no dispatch", "kerasflow/planner/ir/cluster.py",
             "        return self._step_dispatch if any(self._devices[i].host != first for i in used) else 0.0",
             "        return 0.0"),
    Mutation("a transfer's cores copy it for free", "kerasflow/planner/sim/eventloop.py",
             "                                    owed[dst] += copying", "                                    pass"),
    Mutation("placement_only lets plans that sum in another order in", "kerasflow/planner/search/planning.py",
             "    elif request.placement_only:", "    elif False:"),
    Mutation("a replica copies the learning rate instead of reading the user's", "kerasflow/_compat.py",
             "    return [v for v in optimizer.variables if id(v) not in rates]",
             "    return list(optimizer.variables)",
             ("tests/strategies/test_replicas.py::test_every_replica_reads_the_rate_a_callback_or_the_user_sets_from_"
              "the_users_optimizer[strategy-mixed_float16]",)),
    Mutation("a fit that ends while profiling leaves the profiler running", "kerasflow/strategies/driver.py",
             "                    steps.close()\n", "                    pass\n",
             ("tests/strategies/test_fit_end.py::test_a_fit_ending_in_any_state_leaves_nothing_running[callback-exception]",)),
    Mutation("host-only ops run where a plan puts them, not on the host", "kerasflow/planner/sim/taskgraph.py",
             "        self.planned_for = cluster if hosted and host_held_ops(graph) else cluster.unhosted",
             "        self.planned_for = cluster.unhosted"),
    Mutation("the host's cut of the batch is priced as a copy", "kerasflow/planner/sim/taskgraph.py",
             "            seconds = 0.0 if aliased else self._copy_seconds(device, src_bytes, sum(sizes))",
             "            seconds = self._copy_seconds(device, src_bytes, sum(sizes))"),
    Mutation("fit waits for the planner whatever background_planning says", "kerasflow/strategies/driver.py",
             "        if self.options.background_planning and can_run_apart(planner):",
             "        if False:",
             ("tests/strategies/test_background_planning.py::test_steps_go_on_while_the_planner_plans_then_the_plan_"
              "runs_as_plain_keras[callback]",)),
    Mutation("a plan keeps its host-only ops on the devices it gave them", "kerasflow/planner/sim/hostops.py",
             "    placement = {name: host if name in names else device for name, device in plan.placement.items()}",
             "    placement = dict(plan.placement)"),
    Mutation("the host runs its ops at a GPU's estimated cost", "kerasflow/planner/sim/hostops.py",
             '    return op.duration("CPU" if "CPU" in op.cost else devices_kind, batch)',
             "    return op.duration(devices_kind, batch)"),
]


def stale(mutations: Iterable[Mutation]) -> list[str]:
    """What keeps each of ``mutations`` from applying to the checkout as it is now.

    Args:
        mutations: the mutations to check.

    Returns:
        One line per problem, naming its mutation: a ``before`` that does not occur exactly once
        in its file (the code moved on), an ``after`` equal to its ``before``, or a file or
        test path that is gone. Empty when every mutation applies.
    """
    problems = []
    for m in mutations:
        source = os.path.join(ROOT, m.path)
        if os.path.isfile(source):
            with open(source, encoding="utf-8") as handle:
                count = handle.read().count(m.before)
            if count != 1:
                problems.append(f"{m.name!r}: its before text occurs {count} times in {m.path} (must be once): "
                                f"{m.before.strip()!r}")
        else:
            problems.append(f"{m.name!r}: no file {m.path}")
        if m.after == m.before:
            problems.append(f"{m.name!r}: its after text is its before text")
        problems += [f"{m.name!r}: no test path {path}" for path in m.tests
                     if not os.path.exists(os.path.join(ROOT, path.split("::")[0]))]
    return problems


def run_tests(tests: tuple[str, ...], timeout: float, mutation: Mutation | None = None) -> str | None:
    """Runs ``tests`` on a temporary copy of the checkout, with ``mutation`` applied if given.

    Args:
        tests: test files, folders and modules, relative to the checkout.
        timeout: seconds the tests may take; a run that takes longer counts as a failure.
        mutation: a mutation that applies (see ``stale``), or None for the checkout as it is.

    Returns:
        None when the tests pass, else how they failed: pytest's first failure or error line,
        or that they timed out.

    Raises:
        SystemExit: pytest could not run the tests at all (no test collected, a usage error).
    """
    with tempfile.TemporaryDirectory(prefix="kerasflow_mutation_") as copy:
        for part in COPIED:
            source = os.path.join(ROOT, part)
            (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, os.path.join(copy, part))
        if mutation is not None:
            target = os.path.join(copy, mutation.path)
            with open(target, encoding="utf-8") as handle:
                text = handle.read()
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(text.replace(mutation.before, mutation.after))
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
        env = dict(os.environ, PYTHONPATH=copy)
        try:
            result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s"
    if result.returncode == 0:
        return None
    if result.returncode not in PYTEST_FAILED:
        print(f"tools/mutations.py: pytest could not run {' '.join(tests)} (exit status {result.returncode}):\n"
              f"{result.stdout[-3000:]}{result.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(2)
    lines = result.stdout.splitlines()
    return next((line for line in lines if line.startswith(("FAILED ", "ERROR "))), "a test failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run the mutations whose name contains one of these words")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or any(word in m.name for word in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.before.strip()!r} -> {m.after.strip()!r} (tests: {' '.join(m.tests)})")
    problems = stale(MUTATIONS)
    if problems:
        print(f"tools/mutations.py: {len(problems)} mutation problem(s); bring MUTATIONS up to today's code:\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 2
    if not chosen:
        print(f"tools/mutations.py: no mutation's name contains any of {args.only}", file=sys.stderr)
        return 2
    if args.list:
        return 0
    started = time.monotonic()
    for tests in dict.fromkeys(m.tests for m in chosen):
        failure = run_tests(tests, args.timeout)
        if failure:
            print(f"tools/mutations.py: {' '.join(tests)} fail without any mutation, so no mutation can be judged: "
                  f"{failure}", file=sys.stderr)
            return 2
    survivors = []
    for m in chosen:
        began = time.monotonic()
        noticed = run_tests(m.tests, args.timeout, m)
        if noticed is None:
            survivors.append(m.name)
        print(f"{'SURVIVED' if noticed is None else 'killed  '}  {m.name} ({time.monotonic() - began:.0f} s)"
              + (f": {noticed}" if noticed else ""), flush=True)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations killed in {time.monotonic() - started:.0f} s; "
          f"survivors: {survivors or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
