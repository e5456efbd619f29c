"""The benchmarks' runtime patches of tfxformer, all in one place (nothing under
`tfxformer/` is edited). Each replaces one *public* function of tfxformer with what it ran
before a change (or a sketch of a proposed one), so `train_speed.py`, `decode_speed.py`,
`profile_ops.py` and `ab_translate.py` (`--patch NAME[,NAME]`) measure it end to end:

  plain_topk  beam search's top-k over the K*V candidates of a sentence by one
              `tf.math.top_k` instead of the chunked top-k (:mod:`tfxformer.decoding.topk`):
              what the search ran before it, for before/after figures. Replaces
              `tfxformer.decoding.topk.top_k`.
  batched_projection  the lean step's output projection as the broadcast batched matmul
              `tf.matmul(x[:, None, :], rows, transpose_b=True)` it ran before the 2-D
              one. Replaces `tfxformer.models.lean_step.output_projection`.
  layer_step  the decoding step through the Keras layers (`model.decode_step`) instead of
              the lean step (:mod:`tfxformer.models.lean_step`): what the search ran before
              the lean step, for before/after figures. Replaces
              `tfxformer.models.lean_step.unsupported`.

  per_signature_decode  every signature traces its own beam search, as exports did before
              translate_with_options and translate_per_example called one traced decode
              (`Search.best_of_beam`). Replaces `tfxformer.serving.search.Search` with a
              subclass whose `best_of_beam` is the plain Python function.
  per_graph_encoder  every graph of an export traces its own encoder and teacher-forced
              decoder, as exports did before the signatures shared one function of each
              per model (:mod:`tfxformer.decoding.model_calls`). Replaces
              `tfxformer.decoding.model_calls.traced_once` with a context that shares nothing.

Sketches that tfxformer has since adopted or that measured slower are gone; their
verdicts are in bench/README.md, "Studies" (`fused_loss`, `fused_topk`: `git show
677cc7a:bench/patches.py`).

This module imports no other bench script (benchlib and the scripts may import it).
"""

from __future__ import annotations

import contextlib
import importlib


def plain_top_k(x, k, chunk=None):
    """`tfxformer.decoding.topk.top_k` as one `tf.math.top_k` (same results)."""
    import tensorflow as tf

    del chunk
    return tuple(tf.math.top_k(x, k))


def batched_projection(rows, dtype):
    """`tfxformer.models.lean_step.output_projection` as the broadcast batched matmul."""
    import tensorflow as tf

    rows = tf.cast(rows, dtype)
    return lambda x: tf.cast(tf.matmul(x[:, None, :], rows, transpose_b=True)[:, 0],
                             tf.float32)


def per_signature_decode():
    """A translator's `Search` subclass that traces beam search in each signature's own
    graph."""
    from tfxformer.serving.search import Search

    class PerSignatureDecode(Search):
        @property
        def best_of_beam(self):
            best = Search.best_of_beam.func(self).python_function
            best.python_function = best
            return best

    return PerSignatureDecode


@contextlib.contextmanager
def shares_nothing(functions):
    """`traced_once` that leaves :func:`tfxformer.decoding.model_calls.encode` and `decode` as
    the model's own methods, traced where they are called."""
    yield


# name -> (module, public function it replaces, replacement); a replacement that is a
# `Factory` is called (once tfxformer is imported) for the object that replaces it.
class Factory:
    def __init__(self, make):
        self.make = make


PATCHES = {
    "per_signature_decode": ("tfxformer.serving.search", "Search",
                             Factory(per_signature_decode)),
    "per_graph_encoder": ("tfxformer.decoding.model_calls", "traced_once", shares_nothing),
    "batched_projection": ("tfxformer.models.lean_step", "output_projection",
                           batched_projection),
    "layer_step": ("tfxformer.models.lean_step", "unsupported", lambda model: "patched off"),
    "plain_topk": ("tfxformer.decoding.topk", "top_k", plain_top_k),
}


def apply(names):
    """Applies the comma-separated patches `names` (see the module docstring)."""
    for name in names.split(","):
        if name not in PATCHES:
            raise SystemExit(f"unknown --patch {name!r}; choose from {sorted(PATCHES)}")
        module_name, attribute, replacement = PATCHES[name]
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute) or attribute.startswith("_"):
            raise SystemExit(f"patch {name}: {module_name}.{attribute} is not a public name "
                             "of tfxformer any more; update bench/patches.py")
        original = getattr(module, attribute)
        if isinstance(replacement, Factory):
            replacement = replacement.make()
        setattr(module, attribute, replacement)
        # The package may re-export it (tfxformer.decoding does): patch that too.
        package = importlib.import_module(module_name.rpartition(".")[0])
        if getattr(package, attribute, None) is original:
            setattr(package, attribute, replacement)
