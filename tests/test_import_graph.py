"""The layering, checked on the source: ``app.py -> mulo.ui -> engine -> methods -> runner ->
models``, families and eval beside the engine, ``train`` on top: it imports everything and
nothing imports it. Every import counts, including those inside functions."""

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
    assert {"mulo.engine", "mulo.runner", "mulo.methods", "mulo.methods.mulo", "mulo.train.twemoji", "app"} <= set(
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
    ]
    assert offenders == []
    cli_imports = [name for name, _ in GRAPH["mulo.__main__"] if under(name, "mulo.train")]
    assert cli_imports and set(cli_imports) <= {"mulo.train", "mulo.train.twemoji"}


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
