"""No import cycle among the project's own modules (shared, producer, gpu_worker, kernels, ops).

The graph is read with ``ast``; nothing is imported. Its edges:

- every ``import a.b`` / ``from a.b import c`` of a project module, at module level *and
  inside functions*: a lazy import defers loading a module, not depending on it. The cycle
  this test first found was one (``model/ops.py`` imported ``cpu_ops.py`` in a function,
  ``cpu_ops.py`` imported ``ops.py`` at the top). Lazy imports of optional third-party
  packages (triton, redis, transformers) add no edge, so they stay the way to defer a cost.
- ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``.
- importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first: edges to those too,
  except to the importer's own packages, which always start before it. (Hence
  ``model/ops/__init__.py`` imports nothing: ``model/attention.py`` imports ``ops.cpu_native``
  and the backends import ``attention.py``.)
- imports under ``if TYPE_CHECKING:`` never run and are left out; scripts in ``ops/`` (no
  ``__init__``) import their siblings by bare name, which resolves to the sibling file.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "producer", "gpu_worker", "kernels", "ops")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    modules = {}
    for path in sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _import_nodes(node: ast.AST):
    """Every Import / ImportFrom below ``node``, skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            child = ast.Module(child.orelse, [])
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        else:
            yield from _import_nodes(child)


def _targets(node, name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules (packages' ``__init__`` included) one import in ``name`` runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        found = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: package.count(".") + 2 - node.level]
            base = ".".join(anchor + ([base] if base else []))
        found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    script = not (path.parent / "__init__.py").exists()
    found = [f"{package}.{t}" if script and f"{package}.{t}" in modules else t for t in found]
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    ancestry = {".".join(t.split(".")[:i]) for t in found for i in range(1, t.count(".") + 2)}
    return {m for m in ancestry if m in modules and m not in own}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (by the rules above)."""
    modules = project_modules(root)
    return {name: set().union(*(_targets(n, name, path, modules) for n in _import_nodes(ast.parse(path.read_text()))))
            for name, path in modules.items()}


def _paths_from(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module reachable from ``start`` in one step or more -> a shortest path to it."""
    paths: dict[str, list[str]] = {}
    frontier = [[start]]
    while frontier:
        frontier = [paths.setdefault(m, path + [m]) for path in frontier
                    for m in sorted(graph[path[-1]]) if m not in paths]
    return paths


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle (``[a, ..., a]``) per group of modules that all reach one another,
    through the group's first module by name."""
    reach = {m: _paths_from(graph, m) for m in graph}
    starts = {min(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return [reach[s][s] for s in sorted(starts)]


def test_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_finds_lazy_and_package_init_cycles(tmp_path):
    files = {
        "gpu_worker/__init__.py": "",
        "gpu_worker/a.py": "from gpu_worker import b\n",
        "gpu_worker/b.py": "def f():\n    from gpu_worker.a import x\n",
        "gpu_worker/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpu_worker import a\n",
        "kernels/__init__.py": "",
        "kernels/p/__init__.py": "from kernels.p import x\n",
        "kernels/p/x.py": "import kernels.y\nfrom kernels.p import z\n",   # its own package: no edge
        "kernels/p/z.py": "",
        "kernels/y.py": "from kernels.p.z import w\n",                     # runs kernels/p/__init__ first
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["gpu_worker.c"] == set()
    assert find_cycles(graph) == [["gpu_worker.a", "gpu_worker.b", "gpu_worker.a"],
                                  ["kernels.p", "kernels.p.x", "kernels.y", "kernels.p"]]
