"""bench/ and bench/studies/: no import cycle among the scripts, no private tfxformer name,
live patches."""

import ast
import importlib
import os
import sys

import numpy as np
import tensorflow as tf

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")
STUDIES = os.path.join(BENCH, "studies")
# Script name -> its file; bench/studies/ scripts import bench/'s modules by name.
FILES = {f[:-3]: os.path.join(folder, f) for folder in (BENCH, STUDIES)
         for f in os.listdir(folder) if f.endswith(".py")}
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


def _patches():
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module("patches")
    finally:
        sys.path.remove(BENCH)


def test_every_patch_replaces_a_live_public_function():
    for name, (module, attribute, _) in _patches().PATCHES.items():
        assert not attribute.startswith("_"), name
        assert callable(getattr(importlib.import_module(module), attribute, None)), (
            f"patch {name}: {module}.{attribute} is gone")


def test_fused_top_extensions_equal_top_extensions():
    from tfxformer.decoding import top_extensions

    logits = tf.random.stateless_normal([6, 50], seed=[1, 2]) * 3.0  # 2 sentences x 3 beams
    alive = tf.constant([[0.0, -1.0, -2.5], [-0.5, -1e9, -1e9]])
    expected = top_extensions(logits, alive, 6)
    fused = _patches().fused_top_extensions(logits, alive, 6)
    np.testing.assert_allclose(fused[0], expected[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(fused[1:], expected[1:], strict=True):
        np.testing.assert_array_equal(got, want)
