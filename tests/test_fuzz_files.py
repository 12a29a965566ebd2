"""Fuzzing kerasflow's files: mutated profiles, plans and clusters through every loader and subcommand.

The only outcomes allowed: success, or one ``KerasflowError`` (from a loader) / exit status 2
with one line (from the command) — never another exception, a traceback or a half-written file.
Each file is written plain or gzip-compressed, and may hold numbers past float's range.
"""

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kerasflow.cli import main
from kerasflow.planner import Cluster, KerasflowError, OpGraph, Plan, plan, synthetic

CLUSTER = "2xK80-pcie"
GRAPH = synthetic.chain_mlp(layers=2)
VALID = {
    "profile": GRAPH.to_dict(),
    "plan": plan(GRAPH, CLUSTER, max_split_evaluations=2, tick_tock="on").to_dict(),
    "cluster": Cluster.preset(CLUSTER).to_dict(),
}
LOADERS = {"profile": OpGraph.load, "plan": Plan.load, "cluster": Cluster.load}

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10 ** 30, max_value=10 ** 30) | st.floats(allow_nan=False)
    | st.sampled_from([10 ** 400, -10 ** 400, 1e308, 1e-308, 1e19]) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(value, prefix=()):
    """Every path into a JSON value (lists by index, objects by key)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:4]):
            yield from _paths(item, prefix + (index,))


def _replace(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw, kind):
    """Bytes of a valid file of ``kind`` with one JSON value replaced, or its text cut or flipped."""
    data = VALID[kind]
    how = draw(st.sampled_from(["replace", "delete", "truncate", "flip"]))
    paths = list(_paths(data))
    if how == "replace":
        path = draw(st.sampled_from(paths))
        return json.dumps(_replace(data, path, draw(ANY_JSON))).encode()
    if how == "delete":
        path = draw(st.sampled_from([p for p in paths if p and isinstance(p[-1], str)]))
        parent = _replace(data, (), data)
        for key in path[:-1]:
            parent = parent[key]
        trimmed = json.loads(json.dumps(data))
        target = trimmed
        for key in path[:-1]:
            target = target[key]
        target.pop(path[-1], None)
        return json.dumps(trimmed).encode()
    text = json.dumps(data).encode()
    if how == "truncate":
        return text[:draw(st.integers(0, len(text) - 1))]
    position = draw(st.integers(0, len(text) - 1))
    return text[:position] + bytes([draw(st.integers(0, 255))]) + text[position + 1:]


FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "30")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _write(folder, name, payload, packed):
    """Writes ``payload`` as ``name.json``, or gzip-compressed as ``name.json.gz``; returns the path."""
    path = folder / (f"{name}.json.gz" if packed else f"{name}.json")
    path.write_bytes(gzip.compress(payload) if packed else payload)
    return path


@pytest.mark.parametrize("kind", sorted(VALID))
@FUZZ
@given(data=st.data())
def test_every_loader_succeeds_or_raises_one_kerasflow_error(kind, data, tmp_path):
    path = _write(tmp_path, kind, data.draw(mutated(kind)), data.draw(st.booleans()))
    try:
        LOADERS[kind](path)
    except KerasflowError as error:
        assert str(path) in str(error) and "\n" not in str(error).strip()


COMMANDS = {
    "profile": [["compare", "{file}", "--cluster", CLUSTER], ["show", "plan.json", "--profile", "{file}", "--cluster",
                                                              CLUSTER]],
    "plan": [["show", "{file}"], ["simulate", "profile.json", "--plan", "{file}", "--cluster", CLUSTER]],
    "cluster": [["compare", "profile.json", "--cluster", "{file}"]],
}


@pytest.mark.parametrize("kind", sorted(VALID))
@FUZZ
@given(data=st.data())
def test_every_subcommand_succeeds_or_exits_2_with_one_line(kind, data, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("fuzz")
    GRAPH.save(folder / "profile.json")
    Plan.from_dict(VALID["plan"]).save(folder / "plan.json")
    bad = _write(folder, f"bad_{kind}", data.draw(mutated(kind)), data.draw(st.booleans()))
    argv = data.draw(st.sampled_from(COMMANDS[kind]))
    before = sorted(os.listdir(folder))
    capsys.readouterr()
    code = main([str(folder / part) if part in ("profile.json", "plan.json") else
                 part.replace("{file}", str(bad)) for part in argv])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(folder)) == before  # nothing half-written
