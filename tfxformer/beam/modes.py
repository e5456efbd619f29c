"""What a pipeline computes per input line, one class per signature of a translator export:
`serving_default` (:class:`Translate`), `translate_nbest` (:class:`NBest`),
`translate_sampled` (:class:`Sample`) and `score` (:class:`Score`).

A mode reads an input line's columns (:meth:`Translate.columns`, in the read step, where a
bad line is named by file and line), loads the model's function once per worker
(:meth:`Translate.load`), turns a batch of lines into one shard value each, a line of
text (:meth:`Translate.run`), and turns a value into its output lines at the merge
(:meth:`Translate.output`), where each line's index in the whole input is known.

Input columns, tab-separated (docs/beam.md):

    serving_default, translate_sampled:  source
    translate_nbest:  source[<TAB>target prefix[<TAB>phrase<TAB>phrase...]]
    score:            source<TAB>target
"""

from __future__ import annotations

import json
import logging

SIGNATURES = ("serving_default", "translate_nbest", "translate_sampled", "score")


def one_line(text: str) -> str:
    """`text` on one line: a translation's CR and LF become spaces (one output line per
    input line, as scripts/translate.py writes)."""
    return text.replace("\r", " ").replace("\n", " ")


class Translate:
    """`serving_default`: one translation per line, on one line (scripts/translate.py's
    output). `options`: the keyword arguments of
    :func:`tfxformer.serving.load_translate_fn`."""

    signature = "serving_default"

    def __init__(self, **options):
        self.options = options

    def columns(self, line: bytes) -> tuple:
        """The input line's columns (bytes); ValueError for a line the mode cannot take."""
        return (line,)

    def load(self, model: str, batch_size: int):
        from tfxformer.serving import load_translate_fn

        return load_translate_fn(model, batch_size=batch_size, **self.options)

    def run(self, function, rows: list) -> list[str]:
        """One shard value (one line of text) per row of columns."""
        return [one_line(text) for text in function([row[0] for row in rows])]

    def output(self, index: int, value: bytes) -> bytes:
        """The output lines of the input line `index` (from 0, over all input files)."""
        return value + b"\n"


class Sample(Translate):
    """`translate_sampled`: one translation per line drawn from the model. `options`: the
    keyword arguments of :func:`tfxformer.serving.load_sample_fn` (sampling_topk, seed,
    ...); each worker starts from `seed`."""

    signature = "translate_sampled"

    def load(self, model, batch_size):
        from tfxformer.serving import load_sample_fn

        return load_sample_fn(model, batch_size=batch_size, **self.options)


class NBest(Translate):
    """`translate_nbest`: each line's `num_hypotheses` best translations as Moses n-best
    lines "i ||| translation ||| score" (scripts/translate.py --n-best), with `token_scores`
    a fourth field of pieces and their log-probabilities; a line's second column is its
    target prefix, the columns after it its terminology constraints. `options`: the
    keyword arguments of :func:`tfxformer.serving.load_nbest_fn`."""

    signature = "translate_nbest"

    def __init__(self, num_hypotheses=1, token_scores=False, **options):
        super().__init__(**options)
        self.num_hypotheses, self.token_scores = num_hypotheses, token_scores

    def columns(self, line):
        source, _, rest = line.partition(b"\t")
        prefix, _, constraints = rest.partition(b"\t")
        return source, prefix, constraints

    def load(self, model, batch_size):
        from tfxformer.serving import load_nbest_fn

        nbest = load_nbest_fn(model, self.num_hypotheses, batch_size=batch_size,
                              **self.options)
        if self.token_scores and not nbest.gives_token_scores:
            raise ValueError(f"token scores: {nbest.path!r} was exported before "
                             "translate_nbest returned token log-probabilities: re-export it "
                             "with scripts/export.py")
        return nbest

    def run(self, function, rows):
        from tfxformer.serving.nbest import Line

        lists = function([Line(*row) for row in rows])
        for row, warning in zip(rows, getattr(function, "warnings", []), strict=False):
            if warning:
                logging.warning("%r: %s", row[0][:60], warning)
        return [json.dumps([list(h) for h in hypotheses]) for hypotheses in lists]

    def output(self, index, value):
        from tfxformer.serving.nbest import Hypothesis, moses_lines

        hypotheses = [Hypothesis(text, score, tuple(tokens), tuple(log_probs), *alignment)
                      for text, score, tokens, log_probs, *alignment in json.loads(value)]
        return "".join(line + "\n" for line in moses_lines(
            index, hypotheses, self.token_scores)).encode("utf-8")


class Score(Translate):
    """`score`: log P(target | source) of each "source<TAB>target" line, teacher-forced,
    as scripts/score.py prints it: the total and the length-normalised log-probability,
    with `tokens` a third column of the per-token ones. `options`: the keyword arguments of
    :func:`tfxformer.serving.load_score_fn`."""

    signature = "score"

    def __init__(self, tokens=False, **options):
        super().__init__(**options)
        self.tokens = tokens

    def columns(self, line):
        source, tab, target = line.partition(b"\t")
        if not tab:
            raise ValueError(f"the score signature takes 'source<TAB>target' lines; this "
                             f"one has no TAB: {line[:60]!r}")
        return source, target

    def load(self, model, batch_size):
        from tfxformer.serving import load_score_fn

        return load_score_fn(model, batch_size=batch_size, **self.options)

    def run(self, function, rows):
        from tfxformer.serving.scoring import format_score

        scores = function([row[0] for row in rows], [row[1] for row in rows])
        if cut := sum(score.truncated for score in scores):
            logging.warning("%d pairs were cut to the model's token limits: their scores are "
                            "those of the kept tokens", cut)
        return [format_score(score, self.tokens) for score in scores]
