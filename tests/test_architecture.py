"""The house: every import of ``specverify/`` and ``reference/`` points down the floors of docs/architecture.md.

Read from the source, not from what happens to be imported: every ``import`` and ``from ...
import`` at any depth (function-local ones included), relative ones resolved, and the module
strings of the lazy re-export tables (``_LAZY``).  Each folder may import only the folders its
row of the table in ``docs/architecture.md`` names; the table is the one in this test (so the
document cannot drift), and the allowed graph has no cycle (so the floors cannot knot again).
Inside ``adapters/`` the subpackages import each other without a cycle too.  A module name
used in two folders must be a subject or battery-part name (the folder says the role).
No report or README generator ships in the wheel.
"""

from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: Each folder (floor) and the folders it may import, bottom up.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "protocols": {"core"},
    "stats": {"core"},
    "reference": {"core", "protocols"},
    "shard": {"core"},
    "verifier": {"core", "protocols", "stats", "reference", "shard"},
    "decoder": {"core", "protocols", "stats", "reference", "shard"},
    "measure": {"core", "protocols", "stats", "reference", "shard", "verifier", "decoder"},
    "drafter": {"core", "protocols", "stats", "reference", "shard", "verifier", "decoder", "measure"},
    "mutants": {"core", "protocols", "stats", "reference", "verifier"},
    "adapters": {"core", "protocols", "stats", "reference", "verifier"},
    "report": {"core", "stats", "measure"},
    "endpoint": {"core", "stats", "reference", "decoder", "mutants"},
    "bench": {"core", "measure", "endpoint"},
    "selftest": {
        "core",
        "protocols",
        "stats",
        "reference",
        "shard",
        "verifier",
        "decoder",
        "measure",
        "drafter",
        "mutants",
        "report",
    },  # fmt: skip
    "cli": {
        "core",
        "protocols",
        "stats",
        "reference",
        "shard",
        "verifier",
        "decoder",
        "measure",
        "drafter",
        "mutants",
        "adapters",
        "report",
        "selftest",
        "endpoint",
        "bench",
    },  # fmt: skip
    "specverify": {
        "core",
        "protocols",
        "stats",
        "reference",
        "shard",
        "verifier",
        "decoder",
        "measure",
        "drafter",
        "mutants",
        "adapters",
        "report",
        "selftest",
        "endpoint",
        "bench",
        "cli",
    },  # fmt: skip
}

#: Module names that may repeat across folders: subjects and battery parts (the folder gives the role).
SHARED_NAMES = {
    "__init__", "battery", "harness", "scenarios", "chain", "tree", "decoder", "drafter", "verifier", "uniforms",
    "sweep", "kernel", "twosample", "endpoint", "sampler_chain",
}  # fmt: skip


def _sources():
    for base in ("specverify", "reference"):
        yield from sorted((ROOT / base).rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(module: str) -> str | None:
    """The folder (floor) of a dotted module name of this project; None for anything else."""
    parts = module.split(".")
    if parts[0] in ("reference", "specverify_reference"):  # reference/ installs as specverify_reference
        return "reference"
    if parts[0] != "specverify":
        return None
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "specverify"
    return parts[1]


def _is_module(dotted: str) -> bool:
    """Whether a dotted name of this project is a module or package (a file or folder of the tree)."""
    parts = dotted.split(".")
    path = ROOT.joinpath("reference" if parts[0] == "specverify_reference" else parts[0], *parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (any depth, relative resolved, lazy tables included), with its line."""
    tree = ast.parse(path.read_text())
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from P import m`` of a submodule m uses m; any other name is a use of P itself
            submodules = [alias.name for alias in node.names if _is_module(f"{target}.{alias.name}")]
            out += [(f"{target}.{name}", node.lineno) for name in submodules]
            if len(submodules) < len(node.names):
                out.append((target, node.lineno))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            out += [(c.value, node.lineno) for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("specverify.")]  # fmt: skip
    return out


def folder_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in _sources():
        src = folder_of(_module(path))
        assert src is not None
        for target, line in imports_of(path):
            dst = folder_of(target)
            if dst is not None and dst != src:
                edges[(src, dst)].append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (as a list of nodes), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_folder_is_in_the_table():
    folders = {folder_of(_module(p)) for p in _sources()}
    assert folders == set(ALLOWED), (
        f"folders without a row: {folders - set(ALLOWED)}; rows without a folder: {set(ALLOWED) - folders}"
    )


def test_every_import_points_down_the_floors():
    wrong = [
        f"{src} -> {dst}: " + "; ".join(where[:3])
        for (src, dst), where in sorted(folder_edges().items())
        if dst not in ALLOWED[src]
    ]
    assert not wrong, "imports the architecture does not allow:\n" + "\n".join(wrong)


def test_the_floors_have_no_cycle():
    assert _cycle(ALLOWED) is None, f"the allowed imports knot: {_cycle(ALLOWED)}"
    actual: dict[str, set[str]] = defaultdict(set)
    for src, dst in folder_edges():
        actual[src].add(dst)
    assert _cycle(actual) is None


def test_a_cycle_is_found():
    """The cycle finder finds one (the test above cannot pass vacuously)."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_adapter_subpackages_import_each_other_without_a_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted((ROOT / "specverify" / "adapters").rglob("*.py")):
        src = _module(path).split(".")[2] if _module(path).count(".") >= 2 else "adapters"
        for target, _ in imports_of(path):
            parts = target.split(".")
            if parts[:2] == ["specverify", "adapters"] and len(parts) > 2 and parts[2] != src:
                graph[src].add(parts[2])
    assert _cycle(graph) is None, f"adapter subpackages import each other in a circle: {_cycle(graph)}"


def test_the_document_states_the_same_table():
    """docs/architecture.md's table of allowed imports is this test's table."""
    rows = re.findall(r"^\| `([a-z_]+)/?` \| ([^|]*) \|", ARCHITECTURE.read_text(), flags=re.M)
    documented = {name: set(re.findall(r"`([a-z_]+)`", allowed)) for name, allowed in rows}
    assert documented == ALLOWED


def test_a_module_name_means_one_thing():
    counts = Counter(p.stem for p in _sources())
    repeated = {name for name, n in counts.items() if n > 1}
    assert repeated <= SHARED_NAMES, f"module names used for different things: {sorted(repeated - SHARED_NAMES)}"


def test_package_inits_only_re_export():
    """No logic in ``__init__.py``: imports, ``__all__``, lazy tables and their ``__getattr__``/``__dir__``."""
    for path in _sources():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            allowed = isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Expr))
            if isinstance(node, ast.FunctionDef):
                allowed = node.name == "__dir__" and len(node.body) == 1
            assert allowed, f"{path.relative_to(ROOT)}:{node.lineno}: {type(node).__name__} in a package __init__"


@pytest.mark.parametrize("pattern", [r"_reports?\.py$", r"readme", r"examples?/"])
def test_no_report_generator_ships_in_the_package(pattern):
    """The wheel holds ``specverify`` and ``reference`` (as ``specverify_reference``; pyproject lists the
    packages); the generators live in tools/reports."""
    shipped = [str(p.relative_to(ROOT)) for p in _sources()]
    assert not [p for p in shipped if re.search(pattern, p, flags=re.I)]
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert all(p == "specverify_reference" or p.split(".")[0] == "specverify" for p in packages)
    assert not [p for p in packages if re.search(pattern.rstrip("/$"), p, flags=re.I)]
