"""Bulk translation on Apache Beam: any model of this package over text or TFRecord files,
on the DirectRunner of one machine or on Dataflow, Flink or Spark (docs/beam.md).

:func:`translate_files` runs the pipeline (read lines keyed by file and line number,
RunInference with :class:`TranslateHandler`, sharded keyed outputs) and merges its shards
into one output in input order: one translation per input line, or what another signature
gives (n-best lists, samples, scores: :mod:`tfxformer.beam.modes`); :func:`load_translate_fn` gives
the same as a function `list[str] -> list[str]` (scripts/evaluate.py, scripts/distill.py).
Apache Beam is an extra: `pip install tfxformer[beam]`.
"""

try:
    import apache_beam  # noqa: F401
except ImportError as error:  # the core package works without Beam
    raise ImportError("tfxformer.beam needs Apache Beam, an optional dependency: "
                      "pip install tfxformer[beam]  (from a checkout: "
                      "pip install -e \".[beam]\")") from error

from tfxformer.beam.handler import TranslateHandler
from tfxformer.beam.modes import NBest, Sample, Score, Translate
from tfxformer.beam.pipeline import match_inputs, merge_shards, translate_files
from tfxformer.beam.translate_fn import BeamTranslateFn, load_translate_fn

__all__ = ["BeamTranslateFn", "NBest", "Sample", "Score", "Translate", "TranslateHandler",
           "load_translate_fn", "match_inputs", "merge_shards", "translate_files"]
