"""The `>>>` examples in the layers' and the model's docstrings run and print what they say
(the same as `pytest --doctest-modules tfxformer/layers tfxformer/models`)."""

import doctest
import importlib

import pytest

MODULES = [
    "tfxformer.layers.attention", "tfxformer.layers.block", "tfxformer.layers.decoder",
    "tfxformer.layers.embedding", "tfxformer.layers.encoder", "tfxformer.layers.feed_forward",
    "tfxformer.layers.masks", "tfxformer.layers.norm", "tfxformer.layers.ops",
    "tfxformer.layers.position",
    "tfxformer.models.transformer", "tfxformer.config",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_examples_are_found():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for name in MODULES
                   for t in finder.find(importlib.import_module(name)))
    assert examples >= 20, examples
