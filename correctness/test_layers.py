"""The package's layers (DESIGN.md): imports go one way. Every import in src/impl, at module level or
inside a function, is an edge; no module reaches itself through them, the implementation modules
(model, attention, distributed, ...) import none of the layers above them (bench, workloads, nsys: the
Nsight Systems runner and readers, which run workloads, and report),
the measurement core (impl.bench) imports neither the workload recipes nor the report, nothing imports the pytest plugin
(pytest loads it through conftest's `pytest_plugins`), and nothing imports the test kits."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The impl modules `path` imports (a `from pkg import name` of a submodule counts as that submodule)."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
    return {m for m in out if m in modules and m != me}


def _graph() -> dict[str, set[str]]:
    files = sorted(SRC.rglob("*.py"))
    modules = {_module(f) for f in files}
    return {_module(f): _imports(f, modules) for f in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_implementation_imports_no_upper_layer():
    upper = ("impl.bench", "impl.workloads", "impl.nsys", "impl.report")
    for module, deps in _graph().items():
        if not module.startswith(upper):
            bad = sorted(d for d in deps if d.startswith(upper))
            assert not bad, f"{module} imports {bad}"


def test_measurement_core_imports_no_recipe_or_report():
    for module, deps in _graph().items():
        if module.startswith("impl.bench"):
            bad = sorted(d for d in deps if d.startswith(("impl.workloads", "impl.report")))
            assert not bad, f"{module} imports {bad}"


def test_nothing_imports_the_plugin_or_the_test_kits():
    for module, deps in _graph().items():
        assert "impl.bench.plugin" not in deps, module
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        assert "import kits" not in text and "from kits" not in text, path
