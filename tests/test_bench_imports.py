"""bench/: no import cycle among the scripts, no private tfxformer name."""

import ast
import os

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")
# Script name -> its file; the scripts import each other by name.
FILES = {f[:-3]: os.path.join(BENCH, f) for f in os.listdir(BENCH) if f.endswith(".py")}
SCRIPTS = sorted(FILES)


def _trees():
    for name in SCRIPTS:
        with open(FILES[name]) as f:
            yield name, ast.parse(f.read())


def _imports(tree):
    """(module, names) of every import statement, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [alias.name for alias in node.names]


def test_bench_scripts_import_no_cycle():
    graph = {name: {m for m, _ in _imports(tree) if m in SCRIPTS} for name, tree in _trees()}

    def visit(name, path):
        assert name not in path, f"import cycle in bench/: {' -> '.join(path + [name])}"
        for dep in graph[name]:
            visit(dep, path + [name])

    for name in SCRIPTS:
        visit(name, [])


def test_bench_uses_no_private_tfxformer_name():
    for name, tree in _trees():
        aliases = set()
        for module, names in _imports(tree):
            if module.startswith("tfxformer"):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{FILES[name]} imports {private} from {module}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname or a.name for a in node.names
                            if a.name.startswith("tfxformer")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                raise AssertionError(f"{FILES[name]} uses {node.value.id}.{node.attr}")

