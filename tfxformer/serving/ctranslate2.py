"""Translation with CTranslate2, OpenNMT's fast CPU runtime, on a model of this package.

A CTranslate2 directory of this package (:mod:`tfxformer.serving.ctranslate2_export`,
`scripts/export.py --format ctranslate2`) holds CTranslate2's model.bin and config.json,
spm.model and our record tfxformer.json. :func:`load_ct2_translate_fn` gives
`translate(list[str]) -> list[str]` for it (:class:`Ct2TranslateFn`, the interface of
:class:`tfxformer.serving.TranslateFn`); :func:`tfxformer.serving.load_translate_fn` and
:func:`tfxformer.serving.load_nbest_fn` take it as any model on disk, so
`scripts/translate.py` and `scripts/evaluate.py` take either. CTranslate2 is an extra:
`pip install -e ".[ctranslate2]"`.

Decoding (§6.1) as the SavedModel's, with these differences (docs/serving.md):

* Source pieces are cut to `max_input_tokens` - 1, then "</s>", blank lines give "".
* Output limit: ours is min(max_output_tokens, |source| + extra_length) per sentence;
  CTranslate2 takes one `max_decoding_length` per batch, so batches are cut by source
  length and given their longest sentence's limit; an output that runs past its own
  sentence's limit is decoded again alone with that limit.
* Length penalty (`length_normalization`): "length" (|Y|^α, EOS not counted) is
  CTranslate2's own, given as it is. "gnmt" (§6.1: ((5 + |Y|) / 6)^α, EOS counted) has no
  CTranslate2 equivalent: it divides by |Y|^β, here with the EOS counted
  (`return_end_token`), and :func:`ct2_length_penalty` takes the β whose penalty grows at
  the same rate (d log lp / d|Y|) at the batch's typical output length n (its longest
  source, EOS counted): β = α · n / (5 + n), which agrees with the SavedModel far more
  often than β = α (docs/serving.md).
* Stop (`stopping`): "finished" (K hypotheses have finished) is CTranslate2's rule.
  "bound" (no alive hypothesis can beat the K finished) has none: CTranslate2 stops at
  `patience` · K finished (default 1, CTranslate2's; 2 agrees more often, and costs time).

With `--stopping finished --length-normalization length` both runtimes run the same
search. Agreement with the SavedModel is tested on 200 Multi30k val sentences
(tests/test_ctranslate2.py); docs/serving.md, "CTranslate2", has the figures.
"""

from __future__ import annotations

import itertools
import math
import os

import sentencepiece

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.ids import SPM_FILENAME, UNK_ID
from tfxformer.locate import (  # noqa: F401 (the format's names, re-exported from here)
    CT2_FORMAT as FORMAT,
)
from tfxformer.locate import (  # noqa: F401
    CT2_FORMAT_VERSION as FORMAT_VERSION,
)
from tfxformer.locate import CT2_MARKER_FILENAME as MARKER_FILENAME
from tfxformer.locate import is_ctranslate2_dir, read_ctranslate2_marker
from tfxformer.serving.nbest import Hypothesis, line_constraints, split_lines
from tfxformer.serving.reading import ReadingOptions, nbest_read, translate_read

__all__ = ["MARKER_FILENAME", "QUANTIZATIONS", "Ct2NBestFn", "Ct2TranslateFn",
           "ct2_length_penalty", "is_ctranslate2_dir", "load_ct2_translate_fn",
           "read_marker"]

INSTALL = 'pip install -e ".[ctranslate2]"'
# Converter.convert's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES),
# listed here so that --help and argument checks work without CTranslate2.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")
COMPUTE_TYPES = ("default", "auto") + QUANTIZATIONS
# Our ids 0..3 (tfxformer.ids) under CTranslate2's default token names.
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
EOS = SPECIAL_PIECES[3]
# As the SavedModel's translator: raw input cut to this many characters per allowed
# token before tokenizing (tfxformer.serving.text.CHARS_PER_TOKEN).
CHARS_PER_TOKEN = 64
# "gnmt" sources are batched by length class, lengths within a factor of this: the β of
# each class (ct2_length_penalty at r^class) is within 3.2 % of each of its lengths' own.
LENGTH_CLASS_RATIO = 1.25


def import_ctranslate2():
    """The `ctranslate2` module; ImportError saying how to install it otherwise."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(f"CTranslate2 is not installed ({error}); install it with "
                          f"`{INSTALL}` (or `pip install ctranslate2`).") from None
    return ctranslate2


def read_marker(path) -> dict:
    """The tfxformer.json record of the CTranslate2 directory `path`
    (:func:`tfxformer.locate.read_ctranslate2_marker`).

    Raises:
        FileNotFoundError: `path` is no CTranslate2 directory.
        ValueError: a CTranslate2 model not exported by this package, or an unreadable
            or unknown record.
    """
    return read_ctranslate2_marker(path)


def ct2_length_penalty(alpha: float, length: int) -> float:
    """CTranslate2's length penalty β (it divides log P by |Y|^β) for our α (we divide by
    ((5 + |Y|) / 6)^α, §6.1), matched at output length `length` (EOS counted): the β at
    which d log lp / d|Y| is the same, α / (5 + n) = β / n, so β = α · n / (5 + n)."""
    return float(alpha) * length / (5.0 + length)


class Ct2TranslateFn:
    """`translate(lines) -> list[str]` with a CTranslate2 model directory of this package;
    the same interface as :class:`tfxformer.serving.TranslateFn`.

    Lines (str or UTF-8 bytes) are cut and tokenized as the SavedModel does, sorted by
    length, translated in batches of at most `batch_size` that share a length class (one
    β each, so a line's translation does not depend on the lines beside it), and
    returned in order.

    Attributes: `path`, `kind` ("ctranslate2"), `options` (beam_size, alpha,
    extra_length), `decoding` (every :class:`tfxformer.config.DecodingOptions`),
    `batch_size`, `patience`, `compute_type` (CTranslate2's, as resolved), `record`
    (tfxformer.json).
    """

    kind = "ctranslate2"

    def __init__(self, translator, processor, path, record, decoding: DecodingOptions,
                 patience=1):
        self._translator, self._sp = translator, processor
        self.path, self.record, self.decoding = path, record, decoding
        self.options = decoding.search_options()
        self.batch_size = decoding.batch_size
        self.patience = checks.number(patience, "patience", 1.0)
        self.compute_type = translator.compute_type

    def __call__(self, lines) -> list[str]:
        """Each line read as an export reads it (its sentences, their case; the export
        options' defaults: :func:`tfxformer.serving.reading.translate_read`)."""
        return translate_read(lines, self.translate_rows, self.reading, self._has_unknown)

    @property
    def reading(self) -> ReadingOptions:
        """How lines are read: sentences split by the source language's rules, recased."""
        return ReadingOptions(language=self.record.get("src"))

    def _has_unknown(self, row) -> bool:
        return UNK_ID in self._sp.encode(row)

    def translate_rows(self, lines) -> list[str]:
        """Each line translated as one sentence, as it is."""
        sources = [self._source(line) for line in lines]
        outputs = [""] * len(sources)  # blank lines stay blank, as in the SavedModel
        # Every batch is queued at once; CTranslate2 decodes `threads` of them in parallel.
        queued = [(rows, self._search([sources[i] for i in rows]))
                  for rows in self._batches(sources)]
        for rows, searched in queued:
            for i, text in zip(rows, self._finish([sources[i] for i in rows], searched),
                               strict=True):
                outputs[i] = text
        return outputs

    def _batches(self, sources):
        """Indices of the non-blank `sources` sorted by length, in batches of at most
        `batch_size` whose sources share one length class (so one β)."""
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        for _, rows in itertools.groupby(order, key=lambda i: self._class(sources[i])):
            rows = list(rows)
            for start in range(0, len(rows), self.batch_size):
                yield rows[start:start + self.batch_size]

    def _class(self, source) -> int:
        """The source's length class: round(log_r |source|), r = LENGTH_CLASS_RATIO, for
        the "gnmt" normalization (whose β depends on the length); 0 for "length"."""
        if self.decoding.length_normalization != "gnmt":
            return 0
        return round(math.log(len(source)) / math.log(LENGTH_CLASS_RATIO))

    def _source(self, line) -> list[str]:
        """The source pieces, cut to max_input_tokens - 1, then "</s>" ([] if blank)."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        limit = self.decoding.max_input_tokens
        pieces = self._sp.encode(line[:limit * CHARS_PER_TOKEN], out_type=str)
        return pieces[:limit - 1] + [EOS] if pieces else []

    def _limit(self, source) -> int:
        """Output tokens allowed, EOS included: min(max_output_tokens, |source| + extra)."""
        return min(self.decoding.max_output_tokens, len(source) + self.decoding.extra_length)

    def _finish(self, sources, searched) -> list[str]:
        """The translations of one queued batch (:meth:`_search`); a hypothesis that ran
        past its own sentence's limit (the batch's is its longest sentence's) is decoded
        again alone with that limit."""
        hypotheses = self._best(searched)
        for i, (source, pieces) in enumerate(zip(sources, hypotheses, strict=True)):
            own = self._limit(source)
            if len(pieces) > own:  # tokens, EOS included
                hypotheses[i] = self._best(self._search([source], own))[0]
        return [self._sp.decode([p for p in pieces if p != EOS]) for pieces in hypotheses]

    def _search(self, sources, limit=None, **extra):
        """Queues one batch (one length class): -> (its output limit, CTranslate2's
        asynchronous results); `extra` options go to `translate_batch` too."""
        options = self.decoding
        limit = limit or max(self._limit(s) for s in sources)
        gnmt = options.length_normalization == "gnmt"
        beta = options.alpha
        if gnmt:
            beta = ct2_length_penalty(beta, LENGTH_CLASS_RATIO ** self._class(sources[0]))
        return limit, self._translator.translate_batch(
            sources, beam_size=options.beam_size, patience=self.patience,
            length_penalty=beta, return_end_token=gnmt, max_decoding_length=limit,
            max_input_length=0, max_batch_size=0, suppress_sequences=[["<pad>"], ["<s>"]],
            repetition_penalty=options.repetition_penalty,
            no_repeat_ngram_size=options.no_repeat_ngram_size, asynchronous=True, **extra)

    def nbest(self, lines, num_hypotheses=None) -> list[list[Hypothesis]]:
        """Each line's `num_hypotheses` (<= beam size; None: the beam size) best
        translations, best first, with CTranslate2's scores (its length penalty, as
        :meth:`_search` sets it), as :class:`tfxformer.serving.NBestFn` gives them; a
        line may be a :class:`tfxformer.serving.nbest.Line` with a target prefix. A line
        is read as the SavedModel's `translate_nbest` reads a text (its sentences, their
        case: :func:`tfxformer.serving.reading.nbest_read`, docs/robust_input.md): the
        prefix goes with its first sentence, hypothesis j joins its sentences' j-th, the
        score is their sum. A blank line's list is "" with score 0."""
        beam = self.options["beam_size"]
        count = beam if num_hypotheses is None else checks.integer(
            num_hypotheses, "num_hypotheses", 1, beam)
        if any(line_constraints(lines)):
            raise ValueError("CTranslate2 has no terminology constraints: translate with "
                             "constraints with a SavedModel (scripts/export.py's default "
                             "format) or a run dir of the same model.")
        texts, prefixes = split_lines(lines)
        found = nbest_read(texts, prefixes,
                           lambda rows, row_prefixes: self.nbest_rows(rows, row_prefixes,
                                                                      count),
                           self.reading, count, self._has_unknown)
        return [[Hypothesis(text, score) for text, score in hypotheses]
                for hypotheses in found]

    def nbest_rows(self, rows, prefixes, count) -> list[list[tuple[str, float]]]:
        """Each row's `count` best (text, score), each row one sentence as it is, with its
        target prefix ("": none; its pieces cut to the output limit less one; more than
        one hypothesis: CTranslate2's `return_alternatives`). A sentence whose hypotheses
        run past its own output limit is decoded again alone with that limit."""
        sources = [self._source(row) for row in rows]
        prefixes = [self._prefix(p, s) for p, s in zip(prefixes, sources, strict=True)]
        outputs = [[("", 0.0)] for _ in sources]
        queued = []
        for batch in self._batches(sources):
            for steered in (False, True):  # rows without a prefix, then those with one
                part = [i for i in batch if bool(prefixes[i]) == steered]
                if part:
                    search = self._nbest_options(count, [prefixes[i] for i in part], steered)
                    queued.append((part, self._search([sources[i] for i in part],
                                                      **search)))
        for part, (limit, results) in queued:
            for i, result in zip(part, results, strict=True):
                found = self._hypotheses(result.result(), limit)
                own = self._limit(sources[i])
                if any(len(pieces) > own for pieces, _ in found):
                    again = self._nbest_options(count, [prefixes[i]], bool(prefixes[i]))
                    limit, (retry,) = self._search([sources[i]], own, **again)
                    found = self._hypotheses(retry.result(), limit)
                outputs[i] = [(self._sp.decode([p for p in pieces if p != EOS]), float(score))
                              for pieces, score in found]
        return outputs

    def _prefix(self, prefix, source) -> list[str]:
        """A line's target prefix pieces, cut to its output limit less one ([] if none or
        the line is blank)."""
        if isinstance(prefix, bytes):
            prefix = prefix.decode("utf-8", errors="replace")
        if not prefix or not source:
            return []
        limit = self._limit(source) - 1
        return self._sp.encode(prefix[:(limit + 1) * CHARS_PER_TOKEN], out_type=str)[:limit]

    @staticmethod
    def _nbest_options(count, prefixes, steered) -> dict:
        """translate_batch's n-best options for a batch with (or without) prefixes."""
        options = dict(num_hypotheses=count, return_scores=True)
        if steered:
            options.update(target_prefix=prefixes, return_alternatives=count > 1)
        return options

    def _hypotheses(self, result, limit):
        """[(pieces, score)] of one CTranslate2 result, "</s>" last where it ended."""
        found = [list(h) for h in result.hypotheses]
        if self.decoding.length_normalization != "gnmt":
            found = [h + [EOS] if len(h) < limit else h for h in found]
        return list(zip(found, result.scores, strict=True))

    def _best(self, searched) -> list[list[str]]:
        """The best hypothesis of each source of a queued batch: its pieces, "</s>" last
        where it ended (CTranslate2 leaves it out for "length": it is put back)."""
        limit, results = searched
        hypotheses = [list(r.result().hypotheses[0]) for r in results]
        if self.decoding.length_normalization != "gnmt":  # ended: shorter than the limit
            hypotheses = [h + [EOS] if len(h) < limit else h for h in hypotheses]
        return hypotheses

    def describe(self) -> str:
        """One line for a log: the model and its decoding options."""
        options = self.options
        return (f"model: {self.path} (CTranslate2, {self.compute_type}); beam size "
                f"{options['beam_size']}, alpha {options['alpha']} "
                f"({self.decoding.length_normalization}), extra length "
                f"{options['extra_length']}")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def load_ct2_translate_fn(path, beam_size=None, alpha=None, extra_length=None,
                          batch_size=None, compute_type="default", threads=None, patience=1,
                          marker=None):
    """The :class:`Ct2TranslateFn` of the CTranslate2 directory `path` of this package.

    Args:
        beam_size, alpha, extra_length: decoding options (§6.1); None: the export's.
        batch_size: sentences per CTranslate2 call (None: the export's).
        compute_type: CTranslate2's compute type ("default": the type the weights were
            stored in; "int8", "int8_float32", "float32", ... as the CPU supports).
        threads: batches decoded at once, one core each (CTranslate2's `inter_threads`;
            `intra_threads` is 1, its throughput setting, which also never stalls on a
            machine whose cores other jobs hold) (None: the cores this process may use).
        patience: CTranslate2's beam search stops a sentence at `patience` · beam_size
            finished hypotheses (>= 1; see the module doc, "Stop").
        marker: the directory's tfxformer.json record as already read
            (:attr:`tfxformer.locate.CTranslate2Loader.marker`), or None to read it
            (:func:`read_marker`).

    Raises:
        ImportError: CTranslate2 is not installed (the message says how).
        FileNotFoundError, ValueError: as :func:`read_marker`; a bad option.
    """
    ctranslate2 = import_ctranslate2()
    record = read_marker(path) if marker is None else marker
    decoding = DecodingOptions.from_dict(record["decoding"]).replace(
        beam_size=beam_size, alpha=alpha, extra_length=extra_length,
        batch_size=batch_size).validate()
    if decoding.sampling:
        raise ValueError(f"{path!r} records sampling options ({decoding.sampling_options()}); "
                         "translation with CTranslate2 here is beam search only.")
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type {compute_type!r} is not one of {list(COMPUTE_TYPES)}.")
    threads = _cores() if threads is None else checks.integer(threads, "threads", 1)
    spm_path = os.path.join(path, SPM_FILENAME)
    if not os.path.isfile(spm_path):
        raise FileNotFoundError(f"{path!r} has no {SPM_FILENAME}: export it again with "
                                "`scripts/export.py --format ctranslate2`.")
    try:  # CTranslate2's throughput setting: `threads` batches at once, one core each
        translator = ctranslate2.Translator(
            os.fspath(path), device="cpu", compute_type=compute_type, inter_threads=threads,
            intra_threads=1)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"CTranslate2 cannot load {path!r} with compute_type "
                         f"{compute_type!r}: {error}") from None
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    return Ct2TranslateFn(translator, processor, os.fspath(path), record, decoding, patience)


class Ct2NBestFn:
    """`nbest(lines) -> list[list[Hypothesis]]` with a CTranslate2 model directory: the
    interface of :class:`tfxformer.serving.NBestFn` over :meth:`Ct2TranslateFn.nbest`."""

    def __init__(self, translate_fn: Ct2TranslateFn, num_hypotheses=None):
        beam = translate_fn.options["beam_size"]
        self.num_hypotheses = beam if num_hypotheses is None else checks.integer(
            num_hypotheses, "num_hypotheses", 1, beam)
        self._fn, self.path, self.kind = translate_fn, translate_fn.path, translate_fn.kind
        self.options = translate_fn.options

    def __call__(self, lines) -> list[list[Hypothesis]]:
        return self._fn.nbest(lines, self.num_hypotheses)

    def describe(self) -> str:
        return f"{self._fn.describe()}; {self.num_hypotheses}-best lists"
