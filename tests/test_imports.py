"""tfxformer/ has no import cycle: the modules import one another in one order, imports
inside functions counted; the decoding package knows no model class.

Package `__init__` files are facades that re-export names and are left out. A module
never imports one that uses it, not even inside a function: `Transformer.from_preset`
hands its own class down to :mod:`tfxformer.pretrained`, which imports no model.
"""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "tfxformer")


def _modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                path = os.path.join(folder, name)
                module = os.path.relpath(path[:-3], os.path.join(PACKAGE, "..")).replace(
                    os.sep, ".")
                found[module] = path
    return found


def _imports(path, modules):
    """(module-level imports, imports inside functions) of tfxformer modules."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef,
                                                               ast.AsyncFunctionDef))
              for n in ast.walk(f) if n is not f}
    top, inner = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        targets = {n for n in names if n in modules}
        (inner if id(node) in nested else top).update(targets)
    return top, inner


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {m: _imports(p, modules) for m, p in modules.items()}


def _cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = "done"
        return None
    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_module_level_imports_have_no_cycle(graph):
    cycle = _cycle({m: top for m, (top, _) in graph.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_inside_functions_close_no_cycle(graph):
    cycle = _cycle({m: top | inner for m, (top, inner) in graph.items()})
    assert cycle is None, "import cycle through a function-level import: " + " -> ".join(
        cycle)


def test_decoding_imports_no_model(graph):
    for module, (top, inner) in graph.items():
        if module.startswith("tfxformer.decoding."):
            models = sorted(d for d in top | inner if d.startswith("tfxformer.models"))
            assert not models, f"{module} imports {models}"


def test_finding_a_model_on_disk_is_below_what_builds(graph):
    """tfxformer.locate (the loaders of every form) is handed the classes and runtimes
    it loads into: it reaches no model class, tokenizer, pretrained or serving module."""
    seen, todo = set(), ["tfxformer.locate"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module][0] | graph[module][1])
    builders = {"tfxformer.models.transformer", "tfxformer.data.tokenizer",
                "tfxformer.pretrained"} | {m for m in graph if m.startswith("tfxformer.serving.")}
    assert not seen & builders, sorted(seen & builders)


def test_no_module_imports_private_names():
    """A module imports another's public names only (`_name` is free to change)."""
    found = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("tfxformer"):
                found += [f"{module}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert not found, found
