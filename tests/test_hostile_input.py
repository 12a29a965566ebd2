"""Broken and hostile input through the kerasflow command: one line and exit status 2, nothing lost.

Every case feeds one bad file or argument to a subcommand and checks the whole promise: exit
status 2, exactly one line on stderr naming the problem (no traceback), no output file left
behind, and every input file unchanged.
"""

import copy
import gzip
import json
import os

import pytest

from kerasflow.cli import main
from kerasflow.planner import _jsonio, plan, synthetic

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
    ("an integer too large for a float", _set_op("persistent_bytes", 10 ** 400), COMPARE, "wrong type or range"),
    ("an empty graph", _profile_with(lambda d: d.update(ops=[], edges=[])), COMPARE, "field 'ops' is empty"),
    ("a huge wave count", _waves(count=10 ** 9), SHOW, "waves.count must be an integer from 1 to 64"),
    ("wave fractions as strings", _waves(fractions=["0.5", "0.5"]), SHOW, "waves.fractions must be numbers"),
    ("a stage map as a string", _waves(stage_maps=["/GPU:0", "/GPU:1"]), SHOW, "waves.stage_maps must be device"),
    ("predicted_step_time as a string", _plan_with(lambda d: d.__setitem__("predicted_step_time", "fast")), SHOW,
     "'predicted_step_time' must be a finite number"),
    ("predicted_peak_memory of strings", _plan_with(lambda d: d.__setitem__("predicted_peak_memory", {"/GPU:0": "x"})),
     SHOW, "'predicted_peak_memory' must map names to finite numbers"),
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
]


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


def test_a_gzip_that_unpacks_past_the_limit_is_refused_unread(files, capsys, monkeypatch):
    monkeypatch.setattr(_jsonio, "MAX_JSON_BYTES", 10_000)
    (files / "bomb.json.gz").write_bytes(gzip.compress(b" " * 50_000 + (files / "profile.json").read_bytes()))
    assert main(["compare", str(files / "bomb.json.gz"), "--cluster", CLUSTER]) == 2
    assert "unpacks to more than 10000 bytes" in capsys.readouterr().err


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
