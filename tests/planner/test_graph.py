"""Tests of the OpGraph IR: validation, queries, fingerprints and JSON."""

import json
import os
import subprocess
import sys

import pytest

from kerasflow.planner import Affine, Edge, FileFormatError, InvalidGraphError, Op, OpGraph, synthetic
from tests.planner.helpers import op


def diamond():
    return OpGraph([op("a", 1.0, [(8, 4)]), op("b", 2.0, [4]), op("c", 3.5, [4]), op("d", 1.0)],
                   [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)], batch_size=10)


def test_affine_values_scale_with_the_batch():
    assert Affine(2.0, 0.5).at(4) == 4.0
    assert Affine.of([1, 2]) == Affine(1.0, 2.0)
    assert Affine.of({"fixed": 3}) == Affine(3.0, 0.0)
    assert not Affine(3.0).scales_with_batch and Affine(0, 1).scales_with_batch


def test_queries_on_a_diamond():
    graph = diamond()
    assert graph.topological_order() == ["a", "b", "c", "d"]
    assert graph.predecessors("d") == ["b", "c"]
    assert graph.successors("a") == ["b", "c"]
    assert graph.total_work("X") == 7.5
    assert graph.critical_path("X") == (5.5, ["a", "c", "d"])
    assert graph.edge_bytes(graph.edges[0]) == 48.0  # 8 + 4 * 10
    assert graph.edge_bytes(graph.edges[0], batch=2) == 16.0


def test_costs_are_affine_in_the_batch():
    graph = OpGraph([op("m", (1.0, 0.5))], [], batch_size=4)
    assert graph.total_work("X") == 3.0
    assert graph.total_work("X", batch=8) == 5.0


def test_fingerprint_depends_on_structure_not_costs():
    graph = diamond()
    cheaper = graph.with_ops([op("a", 0.1, [(8, 4)])])
    assert cheaper.fingerprint() == graph.fingerprint()
    rewired = OpGraph(graph.ops, list(graph.edges[:3]))
    assert rewired.fingerprint() != graph.fingerprint()


def test_json_round_trip(tmp_path):
    graph = synthetic.inception_like(blocks=1, branches=3)
    path = tmp_path / "profile.json"
    graph.save(path)
    loaded = OpGraph.load(path)
    assert loaded.to_dict() == graph.to_dict()
    assert loaded.fingerprint() == graph.fingerprint()
    assert [o for o in loaded.ops] == list(graph.ops)
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("build, message", [
    (lambda: OpGraph([op("a", [1, 1]), op("b")], [("a", "b", None), ("b", "a", None)]), "cycle"),
    (lambda: OpGraph([op("a", -1.0)], []), r"op 'a': field 'cost\['X'\]' must be finite and non-negative"),
    (lambda: OpGraph([op("a", float("nan"))], []), "non-negative"),
    (lambda: OpGraph([op("a"), op("a")], []), "appears twice"),
    (lambda: OpGraph([op("a")], [("a", "zz", None)]), "unknown op 'zz'"),
    (lambda: OpGraph([op("a"), op("b")], [("a", "b", 0)]), "reads output 0 but op 'a' has 0 output"),
    (lambda: Op("a", phase="sideways"), "phase"),
    (lambda: Op("a", output_bytes=[-4]), "output_bytes"),
    (lambda: Op("a", persistent_bytes=-1), "persistent_bytes"),
    (lambda: OpGraph([op("a")], [], batch_size=0), "batch_size"),
    (lambda: OpGraph([op("a")], [("a",)]), "An edge must be"),
])
def test_bad_graphs_raise_one_clear_error(build, message):
    with pytest.raises(InvalidGraphError, match=message):
        build()


def test_missing_cost_for_a_kind_names_the_op_and_the_fix():
    with pytest.raises(InvalidGraphError, match="op 'a' has no cost for device kind 'V100'.*estimate_costs"):
        OpGraph([op("a")], []).total_work("V100")


def test_unknown_op_lookup_is_not_a_key_error():
    with pytest.raises(InvalidGraphError, match="no op named 'zz'"):
        diamond().op("zz")


def write(tmp_path, data, name="profile.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_bad_files_name_the_file_op_and_field(tmp_path):
    good = diamond().to_dict()
    with pytest.raises(FileFormatError, match="profile.json' is not valid JSON"):
        OpGraph.load(write(tmp_path, '{"ops": [', "profile.json"))
    with pytest.raises(FileFormatError, match="does not exist"):
        OpGraph.load(tmp_path / "missing.json")
    with pytest.raises(FileFormatError, match="format_version 99 is not supported"):
        OpGraph.load(write(tmp_path, {**good, "format_version": 99}))
    with pytest.raises(FileFormatError, match="Expected a kerasflow.OpGraph but the data holds a 'kerasflow.Plan'"):
        OpGraph.load(write(tmp_path, {**good, "kind": "kerasflow.Plan"}))
    bad_op = json.loads(json.dumps(good))
    bad_op["ops"][2]["cost"]["X"] = [-3, 0]
    with pytest.raises(FileFormatError, match=r"profile.json' is invalid: op 'c': field 'cost\['X'\]'"):
        OpGraph.load(write(tmp_path, bad_op))
    unknown_field = json.loads(json.dumps(good))
    unknown_field["ops"][0]["colour"] = "red"
    with pytest.raises(FileFormatError, match=r"op 'a': unknown field\(s\) \['colour'\]"):
        OpGraph.load(write(tmp_path, unknown_field))
    no_ops = {k: v for k, v in good.items() if k != "ops"}
    with pytest.raises(FileFormatError, match="field 'ops' must be a list"):
        OpGraph.load(write(tmp_path, no_ops))
    with pytest.raises(FileFormatError, match="Expected a JSON object"):
        OpGraph.load(write(tmp_path, [1, 2]))


def test_graph_errors_are_value_errors_exported_from_kerasflow():
    import kerasflow

    assert issubclass(kerasflow.InvalidGraphError, ValueError)
    assert issubclass(kerasflow.FileFormatError, kerasflow.KerasflowError)


def test_importing_the_planner_does_not_import_tensorflow_or_keras():
    code = ("import sys, kerasflow, kerasflow.planner, kerasflow.planner.ir.synthetic; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planner_tests_and_doctests_run_without_tensorflow(tmp_path):
    (tmp_path / "no_tensorflow_check.py").write_text(
        "import sys\n"
        "def pytest_sessionfinish(session, exitstatus):\n"
        "    bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras')]\n"
        "    if bad:\n"
        "        session.exitstatus = 3\n"
        "        print('TensorFlow was imported:', bad[:3])\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no_tensorflow_check",
                             "tests/planner/test_tasknames.py", "kerasflow/planner/ir/toposort.py"],
                            cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_edges_accept_lists_and_mappings():
    graph = OpGraph([op("a", 1.0, [4]), op("b")], [{"src": "a", "dst": "b", "output": 0}])
    assert graph.edges == (Edge("a", "b", 0),)


def test_gzip_round_trip_is_byte_identical_and_bad_gzip_is_named(tmp_path):
    graph = synthetic.inception_like(blocks=1, branches=3)
    path = tmp_path / "profile.json.gz"
    graph.save(path)
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic
    assert OpGraph.load(path).to_dict() == graph.to_dict()
    OpGraph.load(path).save(tmp_path / "again.json.gz")
    assert (tmp_path / "again.json.gz").read_bytes() == path.read_bytes()
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(FileFormatError, match="broken.json.gz.* is not a valid gzip file"):
        OpGraph.load(tmp_path / "broken.json.gz")
