"""Broken and hostile input through the kerasflow command: one line and exit status 2, nothing lost.

Every case feeds one bad file or argument to a subcommand and checks the whole promise: exit
status 2, exactly one line on stderr naming the problem (no traceback), no output file left
behind, and every input file unchanged. The loaders refuse the same numbers with one
``FileFormatError``; every kind of file reads the same gzip-compressed; a gzip bomb and a file
that fills the memory available are one line too.
"""

import copy
import gzip
import json
import os
import subprocess
import sys
import tracemalloc
import zlib

import pytest

from kerasflow.cli import main
from kerasflow.planner import (Cluster, FileFormatError, InvalidPlanError, OpGraph, Plan, SimulationError, _jsonio, plan,
                               simulate, synthetic)

CLUSTER = "2xK80-pcie"


@pytest.fixture()
def files(tmp_path):
    graph = synthetic.chain_mlp(layers=2)
    graph.save(tmp_path / "profile.json")
    plan(graph, CLUSTER, max_split_evaluations=2).save(tmp_path / "plan.json")
    return tmp_path


def _valid_file_with(source, mutate):
    """Writes ``source`` (a valid fixture) with one change, as ``bad_<source>``."""
    def write(folder):
        data = json.loads((folder / source).read_text())
        mutate(data)
        (folder / f"bad_{source}").write_text(json.dumps(data))
        return f"bad_{source}"
    return write


def _profile_with(mutate):
    return _valid_file_with("profile.json", mutate)


def _plan_with(mutate):
    return _valid_file_with("plan.json", mutate)


def _set_op(field, value):
    return _profile_with(lambda data: data["ops"][0].__setitem__(field, value))


def _every_op(field, value):
    return _profile_with(lambda data: [op.__setitem__(field, value(op)) for op in data["ops"]])


def _cluster_with(mutate):
    """Writes the cluster preset's file with one change, as ``bad_cluster.json``."""
    def write(folder):
        data = Cluster.preset(CLUSTER).to_dict()
        mutate(data)
        (folder / "bad_cluster.json").write_text(json.dumps(data))
        return "bad_cluster.json"
    return write


def _raw(name, payload):
    def write(folder):
        (folder / name).write_bytes(payload)
        return name
    return write


def _fifo(folder):
    os.mkfifo(folder / "pipe.json")
    return "pipe.json"


def _waves(**fields):
    return _plan_with(lambda data: data.__setitem__("waves", {"count": 2, "offset": "forward", **fields}))


COMPARE = ["compare", "{bad}", "--cluster", CLUSTER]
SHOW = ["show", "{bad}"]
# Per kind of file: its loader, and every subcommand that reads one (a trace asked for, so none may be written).
KINDS = {
    "profile": (OpGraph.load, [("compare", COMPARE + ["--trace", "trace.json"]),
                               ("plan", ["plan", "{bad}", "--cluster", CLUSTER, "-o", "out.json"]),
                               ("simulate", ["simulate", "{bad}", "--plan", "plan.json", "--cluster", CLUSTER,
                                             "--trace", "t.json"]),
                               ("show", ["show", "plan.json", "--profile", "{bad}", "--cluster", CLUSTER])]),
    "plan": (Plan.load, [("show", SHOW), ("simulate", ["simulate", "profile.json", "--plan", "{bad}", "--cluster",
                                                       CLUSTER, "--trace", "t.json"])]),
    "cluster": (Cluster.load, [("compare", ["compare", "profile.json", "--cluster", "{bad}"]),
                               ("simulate", ["simulate", "profile.json", "--plan", "plan.json", "--cluster", "{bad}"])]),
}
HUGE = 10 ** 400  # an integer no float holds
# (id, writes the bad file, its kind, the message's telling part): every figure too large to
# compute with is refused by name, through the loader and every subcommand that reads it.
NUMBERS = [
    ("a profile batch of 10**400", _profile_with(lambda d: d.__setitem__("batch_size", HUGE)), "profile",
     "field 'batch_size' must be a whole number from 1 to 1e+18; give the batch the costs were measured at. "
     "Received: batch_size=an integer of 401 digits"),
    ("costs of 1e308", _every_op("cost", lambda op: {"K80": [1e308, 0.0]}), "profile",
     "field 'cost['K80']' must be finite and non-negative, at most 1e+18"),
    ("a cost of 10**400", _set_op("cost", {"K80": [0.0, HUGE]}), "profile",
     "Received: cost['K80']=[0.0, an integer of 401 digits]"),
    ("output bytes of 1e308", _every_op("output_bytes", lambda op: [[1e308, 1e308]] * len(op["output_bytes"])),
     "profile", "field 'output_bytes[0]' must be finite and non-negative, at most 1e+18"),
    ("flops of 1e19", _set_op("flops", [1e19, 0.0]), "profile", "field 'flops' must be finite and non-negative"),
    ("an integer of 5000 digits", _raw("bad.json", b'{"batch_size": 1' + b"0" * 5000 + b"}"), "profile",
     "holds an integer of thousands of digits; kerasflow's numbers are at most 1e+18"),
    ("a plan batch of 10**400", _plan_with(lambda d: d.__setitem__("batch_size", HUGE)), "plan",
     "Plan field 'batch_size' must be a whole number from 1 to 1e+18"),
    ("a predicted peak of 10**400", _plan_with(lambda d: d["predicted_peak_memory"].__setitem__("/GPU:0", HUGE)),
     "plan", "Plan field 'predicted_peak_memory['/GPU:0']' must be finite and non-negative"),
    ("a shard fraction of 10**400", _plan_with(lambda d: d.__setitem__(
        "splits", {"dense_0": [{"device": "/GPU:0", "fraction": HUGE}, {"device": "/GPU:1", "fraction": -HUGE}]})),
     "plan", "every shard needs a fraction > 0 and <= 1; received an integer of 401 digits"),
    ("a device memory of 10**400", _cluster_with(lambda d: d["devices"][0].__setitem__("memory", HUGE)), "cluster",
     "device '/GPU:0': field 'memory' must be finite and positive, at most 1e+18"),
    ("a device speed of 1e-308", _cluster_with(lambda d: d["devices"][1].__setitem__("speed", 1e-308)), "cluster",
     "device '/GPU:1': field 'speed' must be finite and from 1e-18 to 1e+18"),
    ("a link latency of 1e308", _cluster_with(lambda d: d["default_link"].__setitem__("latency", 1e308)), "cluster",
     "default_link: field 'latency' must be finite and non-negative, at most 1e+18"),
    ("a link bandwidth of 10**400", _cluster_with(lambda d: d["default_link"].__setitem__("bandwidth", HUGE)),
     "cluster", "default_link: field 'bandwidth' must be finite and at least 1e-18; fix the cluster's figures. "
     "Received: bandwidth=an integer of 401 digits"),
    ("a memory bandwidth of 1e-308", _cluster_with(lambda d: d["devices"][0].__setitem__("memory_bandwidth", 1e-308)),
     "cluster", "device '/GPU:0': field 'memory_bandwidth' must be finite and at least 1e-18"),
]
# (id, writes the bad file and returns its name (or None), argv, the message's telling part)
CASES = [
    ("corrupted gzip", _raw("bad.json.gz", b"\x1f\x8b\x08\x00garbage, not deflate"), COMPARE, "is not a valid gzip file"),
    ("truncated gzip", lambda f: _raw("bad.json.gz", gzip.compress((f / "profile.json").read_bytes())[:-12])(f),
     COMPARE, "truncated gzip file"),
    ("deeply nested JSON", _raw("bad.json", b"[" * 100_000 + b"]" * 100_000), COMPARE, "nests more than 64 levels"),
    ("not UTF-8", _raw("bad.json", b"\xff\xfe\x00{"), COMPARE, "is not UTF-8 text"),
    ("a pipe given as a profile", _fifo, COMPARE, "is not a regular file"),
    ("colocation as a list", _set_op("colocation", ["a", "b"]), COMPARE, "field 'colocation' must be a string or null"),
    ("colocation as an object", _set_op("colocation", {"a": 1}), COMPARE, "field 'colocation' must be a string"),
    ("layer as an integer", _set_op("layer", 7), COMPARE, "field 'layer' must be a string or null"),
    ("metadata as a string", _profile_with(lambda d: d.__setitem__("metadata", "fast")), COMPARE,
     "field 'metadata' must be a JSON object"),
    ("an integer too large for a float", _set_op("persistent_bytes", 10 ** 400), COMPARE,
     "field 'persistent_bytes' must be finite and non-negative, at most 1e+18"),
    ("an empty graph", _profile_with(lambda d: d.update(ops=[], edges=[])), COMPARE, "field 'ops' is empty"),
    ("a huge wave count", _waves(count=10 ** 9), SHOW, "waves.count must be an integer from 1 to 64"),
    ("wave fractions as strings", _waves(fractions=["0.5", "0.5"]), SHOW, "waves.fractions must be numbers"),
    ("a stage map as a string", _waves(stage_maps=["/GPU:0", "/GPU:1"]), SHOW, "waves.stage_maps must be device"),
    ("predicted_step_time as a string", _plan_with(lambda d: d.__setitem__("predicted_step_time", "fast")), SHOW,
     "field 'predicted_step_time' must be finite and non-negative"),
    ("predicted_peak_memory of strings", _plan_with(lambda d: d.__setitem__("predicted_peak_memory", {"/GPU:0": "x"})),
     SHOW, "field 'predicted_peak_memory['/GPU:0']' must be finite and non-negative"),
    ("candidates as a list", _plan_with(lambda d: d.__setitem__("candidates", [1, 2])), SHOW,
     "'candidates' must be a mapping"),
    ("batch size 0", None, ["compare", "--synthetic", "mlp", "--cluster", CLUSTER, "--batch-size", "0"],
     "--batch-size: must be a whole number >= 1"),
    ("batch size -5", None, ["plan", "--synthetic", "mlp", "--cluster", CLUSTER, "--batch-size", "-5", "-o", "out.json"],
     "--batch-size: must be a whole number >= 1"),
    ("memory limit nan", None, ["plan", "--synthetic", "mlp", "--cluster", CLUSTER, "--memory-limit", "nan", "-o",
                                "out.json"], "--memory-limit: must be a positive, finite number"),
    ("a testbed of 100000 CPUs", None, ["compare", "--synthetic", "mlp", "--cluster", "cpu-testbed:100000"],
     "cpu-testbed:N needs 1 <= N <= 1024"),
    ("an output folder that does not exist", None,
     ["plan", "profile.json", "--cluster", CLUSTER, "-o", "missing/dir/out.json"], "does not exist. Create it first"),
    ("an output path that is a folder", None, ["plan", "profile.json", "--cluster", CLUSTER, "-o", "."],
     "it is a folder"),
    ("a plan written over its own profile", None, ["plan", "profile.json", "--cluster", CLUSTER, "-o", "profile.json"],
     "Refusing to write the output over the input file"),
    ("a trace written over the plan", None,
     ["simulate", "profile.json", "--plan", "plan.json", "--cluster", CLUSTER, "--trace", "plan.json"],
     "Refusing to write the trace over the input file"),
    ("batch size 10**400", None, ["compare", "--synthetic", "mlp", "--cluster", CLUSTER, "--batch-size", str(HUGE)],
     "--batch-size: must be a whole number >= 1, at most 1e+18"),
    ("memory limit 1e308", None, ["plan", "--synthetic", "mlp", "--cluster", CLUSTER, "--memory-limit", "1e308", "-o",
                                  "out.json"], "--memory-limit: must be a positive, finite number of bytes, at most"),
] + [(f"{case} ({command})", write, argv, message)
     for case, write, kind, message in NUMBERS for command, argv in KINDS[kind][1]]


@pytest.mark.parametrize("case, write, argv, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2_and_nothing_is_lost(case, write, argv, message, files, capsys,
                                                               monkeypatch):
    monkeypatch.chdir(files)
    bad = write(files) if write is not None else None
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    code = main([part.replace("{bad}", bad or "") for part in argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert message in captured.err, captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    after = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing changed, no temporary left


@pytest.mark.parametrize("case, write, kind, message", NUMBERS, ids=[c[0] for c in NUMBERS])
def test_the_loaders_refuse_the_same_numbers_with_one_file_format_error(case, write, kind, message, files):
    name = write(files)
    with pytest.raises(FileFormatError) as raised:
        KINDS[kind][0](files / name)
    assert name in str(raised.value) and message in str(raised.value) and "\n" not in str(raised.value)


def test_the_api_refuses_a_batch_past_any_float_by_name():
    graph = synthetic.chain_mlp(layers=2)
    with pytest.raises(InvalidPlanError, match=r"^field 'batch_size' must be a whole number .* Received: "
                                               r"batch_size=an integer of 401 digits$"):
        plan(graph, CLUSTER, batch_size=10**400, verbose=0)
    planned = plan(graph, CLUSTER, split=False, verbose=0)
    with pytest.raises(SimulationError, match=r"^field 'batch' must be finite .* Received: batch=an integer of 401 digits$"):
        simulate(graph, Cluster.resolve(CLUSTER), planned, batch=10**400)


def test_every_kind_of_file_is_read_gzip_compressed_or_not(files, capsys):
    Cluster.preset(CLUSTER).save(files / "cluster.json")
    for kind in ("profile", "plan", "cluster"):
        packed = gzip.compress((files / f"{kind}.json").read_bytes())
        (files / f"{kind}.json.gz").write_bytes(packed)
        (files / f"gzip_{kind}.json").write_bytes(packed)  # gzip told by its bytes, whatever its name
    for profile, plan_file, cluster in [("profile.json", "plan.json", "cluster.json"),
                                        ("profile.json.gz", "plan.json.gz", "cluster.json.gz"),
                                        ("gzip_profile.json", "gzip_plan.json", "gzip_cluster.json")]:
        profile, plan_file, cluster = (str(files / name) for name in (profile, plan_file, cluster))
        assert main(["compare", profile, "--cluster", cluster]) == 0, capsys.readouterr().err
        assert main(["simulate", profile, "--plan", plan_file, "--cluster", cluster]) == 0
        assert main(["show", plan_file, "--profile", profile, "--cluster", cluster]) == 0
        assert Cluster.resolve(cluster).to_dict() == Cluster.preset(CLUSTER).to_dict()


@pytest.fixture(scope="module")
def bomb():
    """A gzip stream of ``MAX_JSON_BYTES`` + 1 zero bytes, compressed a chunk at a time: a 130 KiB file."""
    compressor, chunk, parts = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS), bytes(2**20), []
    size = _jsonio.MAX_JSON_BYTES + 1
    for start in range(0, size, len(chunk)):
        parts.append(compressor.compress(chunk[:size - start]))
    return b"".join(parts) + compressor.flush()


@pytest.mark.parametrize("kind, argv", [("profile", ["compare", "{bomb}", "--cluster", CLUSTER]),
                                        ("plan", ["show", "{bomb}"]),
                                        ("cluster", ["compare", "profile.json", "--cluster", "{bomb}"])])
def test_a_gzip_that_unpacks_past_the_documented_limit_is_refused_unread(kind, argv, bomb, files, capsys,
                                                                         monkeypatch):
    # The real limit, not a patched one: the stream is measured a chunk at a time and refused
    # before any of it is kept, so reading it holds a few MiB however far it would unpack.
    assert _jsonio.MAX_JSON_BYTES == 128 * 2**20
    monkeypatch.chdir(files)
    (files / f"{kind}.json.gz").write_bytes(bomb)
    tracemalloc.start()
    try:
        code = main([part.replace("{bomb}", f"{kind}.json.gz") for part in argv])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"unpacks to more than {_jsonio.MAX_JSON_BYTES} bytes (128 MiB), more than kerasflow reads" in err
    assert peak < 16 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the address space from /proc")
def test_a_file_that_fills_the_memory_available_is_one_line(files):
    # Within the size limit, JSON of tiny values takes 25 times its size as Python objects: a
    # 16 MiB file of empty objects, read with 256 MiB of address space to spare, runs out.
    (files / "dicts.json").write_text('{"format_version": 1, "kind": "kerasflow.OpGraph", "ops": ['
                                      + "{}," * (16 * 2**20 // 3) + "{}], \"edges\": []}")
    script = ("import resource, sys\n"
              "from kerasflow.cli import main\n"
              "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
              "resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, resource.RLIM_INFINITY))\n"
              "sys.exit(main(['compare', sys.argv[1], '--cluster', 'cpu-testbed:2']))\n")
    done = subprocess.run([sys.executable, "-c", script, str(files / "dicts.json")], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "holds more than the memory available can read; pass the right file, or run with more memory" in done.stderr


def test_a_failed_write_leaves_the_old_file_and_no_temporary(files, monkeypatch):
    target = files / "plan.json"
    old = target.read_bytes()

    def broken_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_jsonio.os, "replace", broken_replace)
    graph = synthetic.chain_mlp(layers=2)
    with pytest.raises(Exception, match="No space left on device"):
        plan(graph, CLUSTER, max_split_evaluations=2).save(target)
    assert target.read_bytes() == old
    assert sorted(p.name for p in files.iterdir()) == ["plan.json", "profile.json"]


def test_the_valid_files_still_work(files, capsys):
    # The fixtures themselves: the cases above fail because of their one change only.
    assert main(COMPARE[0:1] + [str(files / "profile.json")] + COMPARE[2:]) == 0
    assert main(["show", str(files / "plan.json")]) == 0
    data = copy.deepcopy(json.loads((files / "plan.json").read_text()))
    assert data["kind"] == "kerasflow.Plan"
