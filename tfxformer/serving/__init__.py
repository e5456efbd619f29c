"""Translation as a TensorFlow graph (string in, string out), its export and loading.

:func:`load_translate_fn` is the one way from a model on disk (SavedModel, export dir,
run dir, preset dir, CTranslate2 dir) to `translate(list[str]) -> list[str]`; the run dir itself is
:mod:`tfxformer.rundir`'s. :func:`load_score_fn` scores given pairs (log P(target |
source)) and :func:`load_sample_fn` samples translations, from the same kinds of path;
:func:`load_nbest_fn` gives each line's n-best list (docs/steering.md).
"""

from tfxformer.data.tokenizer import load_sentencepiece_ops
from tfxformer.serving.export import (
    export_ensemble,
    export_run_dir,
    export_saved_model,
    export_translator,
    next_version,
)
from tfxformer.serving.loading import (
    TranslateFn,
    load_nbest_fn,
    load_translate_fn,
    make_translate_fn,
    resolve_model_dir,
    saved_model_versions,
    target_languages_of,
)
from tfxformer.serving.multilingual_translator import MultilingualTranslator, make_translator
from tfxformer.serving.nbest import Hypothesis, NBestFn
from tfxformer.serving.sampling import SampleFn, load_sample_fn
from tfxformer.serving.scoring import PairScore, ScoreFn, load_score_fn
from tfxformer.serving.shortlist_data import shortlist_from_data
from tfxformer.serving.text import sanitize_utf8
from tfxformer.serving.translator import Translator

__all__ = [
    "Hypothesis", "MultilingualTranslator", "NBestFn", "PairScore", "SampleFn", "ScoreFn",
    "TranslateFn", "Translator", "export_ensemble", "export_run_dir", "export_saved_model",
    "export_translator", "load_nbest_fn", "load_sample_fn", "load_score_fn",
    "load_sentencepiece_ops", "load_translate_fn",
    "make_translate_fn", "make_translator", "next_version", "resolve_model_dir", "sanitize_utf8",
    "saved_model_versions", "shortlist_from_data", "target_languages_of",
]
