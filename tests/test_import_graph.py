"""The layering, checked on the source: ``app.py -> mulo.ui -> engine -> methods -> runner ->
models``, families and eval beside the engine, ``train`` on top: it imports everything and
nothing imports it but the CLI and the probes of a training run (``mulo.eval.probes``). Every
import counts, including those inside functions; no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "mulo").rglob("*.py")) + [REPO / "app.py"]

# module prefix -> prefixes it must not import (a lower layer never reaches up)
FORBIDDEN = {
    "mulo.models": ("mulo.runner", "mulo.methods", "mulo.engine", "mulo.families", "mulo.eval", "mulo.ui"),
    "mulo.runner": ("mulo.methods", "mulo.engine", "mulo.families", "mulo.eval", "mulo.ui", "mulo.trace"),
    "mulo.methods": ("mulo.engine", "mulo.families", "mulo.eval", "mulo.ui", "mulo.ui.views", "mulo.ui.viz"),
    "mulo.engine": ("mulo.eval", "mulo.ui", "mulo.ui.views", "mulo.ui.viz"),
    "mulo.families": ("mulo.engine", "mulo.methods", "mulo.eval", "mulo.ui"),
    "mulo.eval": ("mulo.ui",),
    "mulo.config": ("mulo.",),
    # a trace records what it needs (e.g. ``chain``); the caller that knows the methods names them
    "mulo.trace": ("mulo.methods", "mulo.engine", "mulo.ui", "mulo.families", "mulo.eval"),
    "mulo.tracefile": ("mulo.methods", "mulo.engine", "mulo.ui", "mulo.families", "mulo.eval"),
}
# gradio belongs to the app: the engine and everything under it run without it (CLI, benchmark)
NO_GRADIO = ("mulo.models", "mulo.runner", "mulo.methods", "mulo.engine", "mulo.families", "mulo.eval",
             "mulo.config", "mulo.trace", "mulo.ui.viz", "mulo.ui.views", "mulo.train")  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int]]:
    return imports_of(path.read_text())


def imports_of(source: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement; ``from mulo import x`` counts as
    ``mulo`` and ``mulo.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


GRAPH = {module_name(p): imports(p) for p in SOURCES}


def test_the_graph_is_read_from_every_module():
    assert {"mulo.engine", "mulo.runner", "mulo.methods", "mulo.methods.mulo", "mulo.train.pipeline", "app"} <= set(
        GRAPH
    )
    assert any(under(name, "mulo.methods") for name, _ in GRAPH["mulo.engine"])


def test_nothing_outside_train_imports_train():
    offenders = [
        f"{module}:{line} imports {name}"
        for module, found in GRAPH.items()
        for name, line in found
        if under(name, "mulo.train")
        and not under(module, "mulo.train")
        # the command line is the top of the stack: `python -m mulo train` runs the training
        and module != "mulo.__main__"
        # the probes look at a training run (its folder, data and checkpoints); nothing imports them but the CLI
        and not under(module, "mulo.eval.probes")
    ]
    assert offenders == []
    cli_imports = [name for name, _ in GRAPH["mulo.__main__"] if under(name, "mulo.train")]
    assert cli_imports and set(cli_imports) <= {
        "mulo.train",
        "mulo.train.pipeline",
        "mulo.train.recipes",
        "mulo.train.recipes.RECIPES",
    }


def test_nothing_imports_the_top_layers():
    for module, found in GRAPH.items():
        for name, line in found:
            assert not under(name, "app"), f"{module}:{line} imports app"
            assert not under(name, "mulo.__main__"), f"{module}:{line} imports the CLI"
            if not (under(module, "mulo.ui") or module == "app"):
                assert not under(name, "mulo.ui"), f"{module}:{line} imports {name}"


def test_lower_layers_never_import_higher_ones():
    # the check itself catches an upward import, here a made-up one inside a function
    fake = {"mulo.methods.fake": imports_of("def f():\n    from mulo.engine import Engine\n")}
    assert upward(fake) == ["mulo.methods.fake:2 imports mulo.engine"]
    # the cycle trace -> methods -> trace that the trace's ``chain`` field replaced
    fake = {"mulo.trace": imports_of("def registry():\n    from mulo import methods\n")}
    assert upward(fake) == ["mulo.trace:2 imports mulo.methods"]
    fake = {"mulo.eval.fake": imports_of("from mulo.ui import engines\n")}
    assert upward(fake) == ["mulo.eval.fake:1 imports mulo.ui"]
    assert upward(GRAPH) == []


def upward(graph: dict) -> list[str]:
    """One line per offending import statement (its first offending name)."""
    offenders = {}
    for module, found in graph.items():
        banned = [b for layer, bans in FORBIDDEN.items() if under(module, layer) for b in bans]
        for name, line in found:
            if any(under(name, b) for b in banned) and not under(name, module):
                offenders.setdefault((module, line), f"{module}:{line} imports {name}")
    return sorted(offenders.values())


def test_the_engine_and_below_run_without_gradio():
    offenders = [
        f"{module}:{line}"
        for module, found in GRAPH.items()
        if any(under(module, layer) for layer in NO_GRADIO)
        for name, line in found
        if under(name, "gradio") or under(name, "spaces")
    ]
    assert offenders == []


def module_edges(graph: dict) -> dict[str, set[str]]:
    """module -> the modules of ``graph`` it imports (``from mulo import x`` resolved to ``mulo.x``
    when that is a module, else to ``mulo``)."""
    edges = {}
    for module, found in graph.items():
        targets = set()
        for name, _ in found:
            while name and name not in graph:
                name = name.rpartition(".")[0]
            if name and name != module and not under(module, name):  # a package's own __init__ is no edge
                targets.add(name)
        edges[module] = targets
    return edges


def cycles(graph: dict) -> list[list[str]]:
    """Every import cycle's modules (strongly connected components of two or more modules, Tarjan)."""
    edges, index, low, stack, on_stack, found = module_edges(graph), {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    # the check finds a cycle made of function-local imports, as trace <-> tracefile was
    fake = {
        "mulo.trace": imports_of("def load():\n    from mulo.tracefile import parse\n"),
        "mulo.tracefile": imports_of("from mulo.trace import Trace\n"),
        "mulo.grid": imports_of("import numpy\n"),
    }
    assert cycles(fake) == [["mulo.trace", "mulo.tracefile"]]
    assert cycles(GRAPH) == []


def test_one_command_line():
    """Everything a user runs goes through ``python -m mulo VERB``: no other module of the package
    is a ``__main__`` script (the demo is ``app.py``)."""
    scripts = [m for m, p in zip(GRAPH, SOURCES, strict=True) if '__name__ == "__main__"' in p.read_text()]
    assert scripts == ["mulo.__main__", "app"]  # and the demo, `python app.py`
