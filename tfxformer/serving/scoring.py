"""Scoring given translations from Python: log P(target | source) for each pair.

As fairseq's `--score-reference` and OpenNMT's `score` (corpus filtering, reranking, a
quality-estimation baseline): :func:`load_score_fn` opens a SavedModel's `score`
signature, or a run dir's model through the same graph
(:meth:`tfxformer.serving.Translator.score_pairs`), and returns a function
`score(sources, targets) -> list[PairScore]`.

    from tfxformer.serving import load_score_fn
    score = load_score_fn("saved_models/en_de")
    score(["A dog runs."], ["Ein Hund rennt."])[0].mean_log_prob
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.serving.signatures import OpenedSignature, language_inputs, open_signature

__all__ = ["PairScore", "ScoreFn", "format_score", "load_score_fn"]

_DEFAULTS = DecodingOptions()


class PairScore(NamedTuple):
    """The score of one (source, target) pair.

    log_prob: log P(target | source), the sum of `token_log_probs`.
    mean_log_prob: the length-normalised score, log_prob / len(token_log_probs): the mean
        log-probability per target token, the EOS counted.
    token_log_probs: one log-probability per target token (SentencePiece pieces, then EOS).
    truncated: the source or the target was cut to the model's limits (`max_input_tokens`
        / `max_output_tokens`); the score is then that of the kept tokens.
    """

    log_prob: float
    mean_log_prob: float
    token_log_probs: list
    truncated: bool


class ScoreFn:
    """`score(sources, targets) -> list[PairScore]`, one per pair, in order (str or UTF-8
    bytes). Pairs are sorted by length and scored `batch_size` at a time.

    Attributes: `path` (what was loaded), `kind` ("saved_model" or "run_dir").
    """

    def __init__(self, opened: OpenedSignature, batch_size=_DEFAULTS.batch_size,
                 target_language=None):
        self.batch_size = checks.integer(batch_size, "batch_size", 1)
        language_inputs(opened, target_language, 0)  # a bad language fails here, not later
        self._opened, self._language = opened, target_language
        self.path, self.kind = opened.path, opened.kind

    def __call__(self, sources, targets) -> list[PairScore]:
        sources, targets = list(sources), list(targets)
        if len(sources) != len(targets):
            raise ValueError(f"One target per source: got {len(sources)} sources and "
                             f"{len(targets)} targets.")
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]) + len(targets[i]))
        scores = [None] * len(sources)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            for i, score in zip(rows, self._score([sources[i] for i in rows],
                                                  [targets[i] for i in rows]), strict=True):
                scores[i] = score
        return scores

    def _score(self, sources, targets):
        out = self._opened.function(
            text=tf.constant(sources, tf.string), target=tf.constant(targets, tf.string),
            **language_inputs(self._opened, self._language, len(sources)))
        out = {k: v.numpy() for k, v in out.items()}
        return [PairScore(float(out["log_prob"][i]), float(out["mean_log_prob"][i]),
                          out["token_log_probs"][i, :out["length"][i]].tolist(),
                          bool(out["truncated"][i])) for i in range(len(sources))]

    def describe(self) -> str:
        """One line for a log: the model scored with."""
        return f"model: {self.path} ({self.kind.replace('_', ' ')}); scoring (teacher-forced)"


def load_score_fn(path, batch_size=_DEFAULTS.batch_size, precision="fp32", checkpoint=None,
                  target_language=None) -> ScoreFn:
    """The score function of a SavedModel version dir, its export dir, or a run dir.

    Args:
        path: a SavedModel (version or export dir) with the `score` signature, or a trained
            run dir (its averaged checkpoint first).
        batch_size: pairs per call.
        precision, checkpoint: a run dir's compute type and checkpoint prefix.
        target_language: a multilingual model's target language (required there; the tag
            goes before each source, as the model was trained).

    Returns:
        A :class:`ScoreFn`.

    Raises:
        FileNotFoundError: `path` is no model dir.
        ValueError: a SavedModel without the `score` signature (exported before it
            existed: re-export it with scripts/export.py), a bad option or language.
    """
    opened = open_signature(path, "score", batch_size, precision, checkpoint)
    return ScoreFn(opened, batch_size, target_language)


def format_score(score, tokens=False):
    """One output line (without its newline) of a :class:`PairScore`."""
    columns = [f"{score.log_prob:.4f}", f"{score.mean_log_prob:.4f}"]
    if tokens:
        columns.append(" ".join(f"{x:.4f}" for x in score.token_log_probs))
    return "\t".join(columns)
