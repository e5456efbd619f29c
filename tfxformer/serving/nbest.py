"""N-best lists from Python: each line's best translations with their scores.

:func:`tfxformer.serving.load_nbest_fn` opens a SavedModel's `translate_nbest` signature, or
a run dir's model through the same graph (:meth:`tfxformer.serving.Translator.nbest`), and returns
`nbest(lines) -> list[list[Hypothesis]]`, best first (docs/steering.md), with the
repetition controls and, per line, a target prefix and terminology constraints (a
:class:`Line`). The CTranslate2
runtime gives the same lists (:meth:`tfxformer.serving.ctranslate2.Ct2TranslateFn.nbest`).

    from tfxformer.serving import load_nbest_fn
    nbest = load_nbest_fn("saved_models/en_de", num_hypotheses=4)
    for hypothesis in nbest(["A dog runs."])[0]:
        print(hypothesis.score, hypothesis.text)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.serving.batching import translate_in_length_order
from tfxformer.serving.signatures import OpenedSignature, language_inputs

__all__ = ["Hypothesis", "Line", "NBestFn", "line_constraints", "moses_lines"]

_DEFAULTS = DecodingOptions()


class Hypothesis(NamedTuple):
    """One translation of an n-best list: its `text` and `score`, log P(Y | X) divided by
    the length normalization (the beam search's own score, higher is better); `tokens`,
    its SentencePiece pieces (the EOS "</s>" last), and `token_log_probs`, each piece's
    log-probability (they add up to score × the length normalizer): tuples, empty where
    the model gives none (an export made before they existed, a CTranslate2 model);
    `alignment`, its word alignment to the source, Pharaoh "i-j" pairs (source word i,
    target word j of `text.split()`; docs/markup.md), "" where the model gives none."""

    text: str
    score: float
    tokens: tuple = ()
    token_log_probs: tuple = ()
    alignment: str = ""


class Line:
    """A source line with its target prefix (str or UTF-8 bytes each; "" = none) and its
    terminology constraints (phrases every translation must hold: a list of str or bytes,
    or one string of phrases separated by TAB; () = none): what an n-best function takes
    in place of a plain line. Its length is the source's, so lines sort by it.

    Raises:
        ValueError: a phrase in a list holds a TAB or a line break.
    """

    __slots__ = ("text", "prefix", "constraints")

    def __init__(self, text, prefix="", constraints=()):
        self.text, self.prefix = text, prefix
        self.constraints = _joined(constraints)

    def __len__(self):
        return len(self.text)

    def __repr__(self):
        return f"Line({self.text!r}, {self.prefix!r}, {self.constraints!r})"


def _joined(phrases):
    """A line's constraints as one string of phrases separated by TAB ("" = none)."""
    if isinstance(phrases, (str, bytes)):
        return phrases
    phrases = list(phrases)
    for phrase in phrases:
        if not isinstance(phrase, (str, bytes)) or any(
                c in phrase for c in (("\t", "\n", "\r") if isinstance(phrase, str)
                                      else (b"\t", b"\n", b"\r"))):
            raise ValueError(f"A constraint phrase must be a str or bytes without TAB or line "
                             f"breaks (TAB separates phrases), got {phrase!r}.")
    if not phrases:
        return ""
    if all(isinstance(p, bytes) for p in phrases):
        return b"\t".join(phrases)
    return "\t".join(p.decode("utf-8", errors="replace") if isinstance(p, bytes) else p
                     for p in phrases)


def line_constraints(lines):
    """Each line's constraints, phrases separated by TAB ("" for a plain line)."""
    return [line.constraints if isinstance(line, Line) else "" for line in lines]


def split_lines(lines):
    """(texts, prefixes) of lines that are plain strings or :class:`Line` s."""
    texts = [line.text if isinstance(line, Line) else line for line in lines]
    return texts, [line.prefix if isinstance(line, Line) else "" for line in lines]


def _input_names(function):
    """The input names of a signature (a SavedModel's or a Translator's tf.function)."""
    if hasattr(function, "structured_input_signature"):  # a concrete function
        args, kwargs = function.structured_input_signature
        return set(kwargs) | {spec.name for spec in tf.nest.flatten(args)}
    return {spec.name for spec in function.input_signature}


def hypotheses(translations, scores, tokens=None, token_log_probs=None, alignments=None
               ) -> list[list[Hypothesis]]:
    """(N, K) byte strings and float scores (and (N, K, T) pieces, "" padding, and their
    log-probabilities; and (N, K) alignments) -> N lists, the padding ("" with score
    -inf) left out."""
    lists = []
    for i, (row_t, row_s) in enumerate(zip(translations, scores, strict=True)):
        row = []
        for j, (t, s) in enumerate(zip(row_t, row_s, strict=True)):
            if s == -np.inf:
                continue
            pieces, values = (), ()
            if tokens is not None:
                used = int(np.count_nonzero(tokens[i, j]))
                pieces = tuple(p.decode("utf-8") for p in tokens[i, j, :used])
                values = tuple(float(v) for v in token_log_probs[i, j, :used])
            alignment = "" if alignments is None else alignments[i, j].decode("utf-8")
            row.append(Hypothesis(t.decode("utf-8"), float(s), pieces, values, alignment))
        lists.append(row)
    return lists


def moses_lines(index: int, nbest: list, token_scores=False, alignments=False
                ) -> list[str]:
    """The Moses n-best lines of sentence `index` (0-based): "i ||| text ||| score"; with
    `token_scores` a fourth field (as Moses appends its alignment field) of each piece
    and its log-probability, "piece=log-prob" separated by spaces (a piece holds no space;
    the last "=" of a pair separates); with `alignments` a last field, the word
    alignment's Pharaoh pairs."""
    lines = []
    for h in nbest:
        line = f"{index} ||| {' '.join(h.text.split())} ||| {h.score:.6f}"
        if token_scores:
            line += " ||| " + " ".join(f"{piece}={value:.6f}" for piece, value in zip(
                h.tokens, h.token_log_probs, strict=True))
        if alignments:
            line += f" ||| {h.alignment}"
        lines.append(line)
    return lines


class NBestFn:
    """`nbest(lines) -> list[list[Hypothesis]]`: each line's (str or UTF-8 bytes, or a
    :class:`Line` with its target prefix and constraints) best translations, best first,
    at most `num_hypotheses` (fewer where the search found fewer; with a prefix, the
    alternatives after it, docs/steering.md). Lines are sorted by length and sent `batch_size` at a
    time. `warnings` holds the signature's per-line warnings of the last call ("" = none).

    Attributes: `path`, `kind`, `options` (a :class:`DecodingOptions`, its
    `no_repeat_ngram_size` and `repetition_penalty` sent with every line),
    `num_hypotheses`.
    """

    def __init__(self, opened: OpenedSignature, options: DecodingOptions, num_hypotheses,
                 batch_size=_DEFAULTS.batch_size, target_language=None):
        self.batch_size = checks.integer(batch_size, "batch_size", 1)
        self.num_hypotheses = checks.integer(num_hypotheses, "num_hypotheses", 1)
        if self.num_hypotheses > options.beam_size:
            raise ValueError(f"`num_hypotheses` {num_hypotheses} must be <= the beam size "
                             f"{options.beam_size}: a beam holds that many hypotheses.")
        language_inputs(opened, target_language, 0)  # a bad language fails here, not later
        self._opened, self._language = opened, target_language
        self.path, self.kind, self.options = opened.path, opened.kind, options
        self.warnings = []
        # an export made before `translate_nbest` took constraints lacks the input
        self.takes_constraints = "constraints" in _input_names(opened.function)
        # and one made before it returned token log-probabilities lacks those outputs
        outputs = getattr(opened.function, "structured_outputs", None)
        self.gives_token_scores = not isinstance(outputs, dict) or "tokens" in outputs
        self.gives_alignments = not isinstance(outputs, dict) or "alignments" in outputs

    def __call__(self, lines) -> list[list[Hypothesis]]:
        results = translate_in_length_order(self._batch, list(lines), self.batch_size)
        self.warnings = [warning for _, warning in results]
        return [nbest for nbest, _ in results]

    def _batch(self, lines):
        texts, prefixes = split_lines(lines)
        size, o = len(texts), self.options
        constraints = line_constraints(lines)
        given = {}
        if self.takes_constraints:
            given["constraints"] = tf.constant(constraints, tf.string)
        elif any(constraints):
            raise ValueError(f"{self.path!r} was exported before `translate_nbest` took "
                             "terminology `constraints`: re-export it with scripts/export.py "
                             f"(python scripts/export.py --model {self.path} --export-dir "
                             "NEW_EXPORT_DIR) to translate with constraints.")
        out = self._opened.function(**given,
            text=tf.constant(texts, tf.string),
            **language_inputs(self._opened, self._language, size),
            beam_size=tf.fill([size], o.beam_size), alpha=tf.fill([size], float(o.alpha)),
            extra_length=tf.fill([size], o.extra_length),
            max_input_tokens=tf.fill([size], o.max_input_tokens),
            num_hypotheses=tf.fill([size], self.num_hypotheses),
            no_repeat_ngram_size=tf.fill([size], o.no_repeat_ngram_size),
            repetition_penalty=tf.fill([size], float(o.repetition_penalty)),
            target_prefix=tf.constant(prefixes, tf.string))
        warnings = [w.decode("utf-8") for w in out["warning"].numpy()]
        per_token = [out[name].numpy() if name in out else None
                     for name in ("tokens", "token_log_probs", "alignments")]
        return list(zip(hypotheses(out["translations"].numpy(), out["scores"].numpy(),
                                   *per_token), warnings, strict=True))

    def describe(self) -> str:
        """One line for a log: the model and its decoding options."""
        o = self.options
        return (f"model: {self.path} ({self.kind.replace('_', ' ')}); {self.num_hypotheses}"
                f"-best lists, beam size {o.beam_size}, alpha {o.alpha}, extra length "
                f"{o.extra_length}, stopping {o.stopping}, length normalization "
                f"{o.length_normalization}")
