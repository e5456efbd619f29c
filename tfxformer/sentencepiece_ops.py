"""The one tensorflow-text op library an exported translator runs, loaded alone.

Below everything that reads or exports a translator (:mod:`tfxformer.pretrained`,
:mod:`tfxformer.serving`), and re-exported by :mod:`tfxformer.data.tokenizer`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import tensorflow as tf

__all__ = ["load_sentencepiece_ops"]


@functools.cache
def load_sentencepiece_ops() -> None:
    """Registers the one tensorflow-text op library an exported translator runs
    (`_sentencepiece_tokenizer.so`: SentencepieceOp, SentencepieceTokenizeOp,
    SentencepieceDetokenizeOp), as TF Serving links it, instead of `import
    tensorflow_text`, which loads all of its 20-odd op libraries (~110 MiB more resident
    memory in a serving process). Falls back to the import when the library is not where
    tensorflow-text installs it."""
    spec = importlib.util.find_spec("tensorflow_text")
    library = None if spec is None or not spec.submodule_search_locations else os.path.join(
        spec.submodule_search_locations[0], "python", "ops", "_sentencepiece_tokenizer.so")
    if "tensorflow_text" in sys.modules or library is None or not os.path.exists(library):
        import tensorflow_text  # noqa: F401  (registers its ops)
    else:
        tf.load_op_library(library)
