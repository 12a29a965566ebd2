"""The planner's floors: a module imports only from its own floor and the floors below it."""

import ast
import pathlib

import pytest

import kerasflow.planner

PLANNER = pathlib.Path(kerasflow.planner.__file__).parent
# Bottom to top, as the package docstring lists them; the shared modules under all of them.
FLOORS = ("ir", "sim", "schedule", "parallel", "search")
SHARED = {"errors", "_jsonio", "_gc"}
# The one documented way up: a Plan's validate() and summary() simulate it, imported at call time.
LAZY_UPWARD = {("ir/plan.py", "sim.taskgraph"), ("ir/plan.py", "sim.report")}


def planner_imports(path: pathlib.Path):
    """(module imported, relative to kerasflow.planner; at module level?) for each import of the file."""
    package = path.relative_to(PLANNER).parent.parts
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[:len(package) - (node.level - 1)]) if node.level > 1 else list(package)
            if node.level - 1 > len(package):
                continue  # reaches out of the planner (kerasflow._version, kerasflow._progress)
            names = [node.module] if node.module else [alias.name for alias in node.names]
            for name in names:
                yield ".".join(base + name.split(".")), id(node) in top_level
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [module] if module else [alias.name for alias in node.names]
            for name in names:
                if name.startswith("kerasflow."):
                    yield name.removeprefix("kerasflow.planner."), id(node) in top_level


def floor_of(module: str) -> int:
    first = module.split(".")[0]
    return -1 if first in SHARED else FLOORS.index(first)


def test_every_planner_module_stands_on_a_floor():
    loose = sorted(p.name for p in PLANNER.glob("*.py") if p.stem not in SHARED | {"__init__"})
    assert loose == []
    assert sorted(p.name for p in PLANNER.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(FLOORS)


@pytest.mark.parametrize("floor", FLOORS)
def test_a_floor_imports_nothing_above_it(floor):
    upward = []
    for path in sorted((PLANNER / floor).glob("*.py")):
        for module, _ in planner_imports(path):
            assert not module.startswith("kerasflow."), f"{path.name} imports {module} outside the planner"
            if floor_of(module) > FLOORS.index(floor):
                upward.append((f"{floor}/{path.name}", module))
    assert set(upward) <= LAZY_UPWARD, upward


def test_the_shared_modules_import_no_floor():
    for name in SHARED:
        modules = [module for module, _ in planner_imports(PLANNER / f"{name}.py")]
        assert all(module.split(".")[0] in SHARED for module in modules), (name, modules)


def test_the_documented_upward_imports_happen_at_call_time():
    for where, module in LAZY_UPWARD:
        imports = dict(planner_imports(PLANNER / where))
        assert imports[module] is False, f"{where} imports {module} at module level"


def test_the_floor_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # The checker itself must catch the thing it guards against: ir importing the search floor.
    fake = tmp_path / "planner"
    (fake / "ir").mkdir(parents=True)
    (fake / "ir" / "graph.py").write_text("from ..search.planning import plan\nfrom .. import errors\n")
    monkeypatch.setattr(f"{__name__}.PLANNER", fake)
    found = list(planner_imports(fake / "ir" / "graph.py"))
    assert found == [("search.planning", True), ("errors", True)]
    assert floor_of(found[0][0]) > FLOORS.index("ir") and floor_of(found[1][0]) == -1
