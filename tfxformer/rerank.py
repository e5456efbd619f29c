"""N-best reranking: pick each source's translation from its n-best list by a weighted sum
of scores (Och, 2003; noisy-channel reranking, Yee et al., 2019; MBR, Kumar & Byrne, 2004).

Not in the paper. A model's beam search keeps a few hypotheses per source (an n-best
list, e.g. a SavedModel's `translate_nbest` signature or `scripts/translate.py --n-best`);
other scores then choose among them, each weighted, and the best sum wins:

    score(y) = sum over scorers s of weights[s] * s(x, y)

Scorers (:class:`Scorer`; each gives one number per candidate, higher = better):

- :func:`forward_score`: the n-best list's own score (the search's log P(y | x) / lp(y)).
- :func:`length_score`: |y| in words (a word bonus, or a penalty with a negative weight).
- :func:`model_score` with a `score` function (:func:`tfxformer.serving.load_score_fn`):
  `channel` — log P(x | y) by a model of the other direction (scoring the source given
  the candidate); `right_to_left` — log P(y | x) by a model trained with `reverse_target`
  (its `score` reverses the candidate's pieces itself); or log P(y | x) by any model.
  `mean=True` divides by the scored tokens.
- :func:`mbr_score`: minimum Bayes risk, each candidate's mean utility (sacreBLEU's
  sentence BLEU or chrF) against the other candidates of its list.

Example (a toy n-best list; `forward` alone keeps each list's first candidate)::

    from tfxformer.rerank import Candidate, forward_score, mbr_score, rerank
    nbest = [[Candidate("Ein Hund läuft.", -0.3), Candidate("Ein Hund rennt.", -0.4),
              Candidate("Hund rennt.", -0.9)]]
    result = rerank(nbest, ["A dog runs."],
                    {"forward": forward_score(), "mbr": mbr_score("chrf")},
                    {"forward": 1.0, "mbr": 0.01})
    result.best  # ['Ein Hund rennt.']

Features are computed once (:func:`score_features`) and combined for any weights
(:func:`combine`), so a grid over the weights costs no model call. The weighted sum
(:func:`weighted_sum`) and the choice (:func:`best_index`) are the ones an export
reranking in its graph runs (:mod:`tfxformer.serving.reranking`), on tensors; the score
names are :data:`WEIGHTS`. docs/reranking.md describes the script (scripts/rerank.py)
and what reranking gave on Multi30k.

Non-finite scores: a weight of 0 drops its score (so a -inf score weighted 0 adds
nothing); a candidate whose combined score is not a finite number (NaN, +inf or -inf)
never wins; ties, and a list none of whose candidates has a finite combined score, go to
the earliest candidate (the search's better one).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import sacrebleu

__all__ = [
    "GRAPH_WEIGHTS", "WEIGHTS", "Candidate", "RerankResult", "Scorer", "Weight",
    "best_index", "combine",
    "forward_score", "length_score", "mbr_score", "model_score", "read_nbest", "rerank",
    "role_weights", "score_features", "scorer", "weighted_sum",
]


class Weight(NamedTuple):
    """What a score name weighs: `role`, the rescoring model it needs ("channel",
    "right_to_left", "forward_model"; None: the n-best list's own), that model's
    `direction` (:func:`model_score`), `mean` (per scored token) and MBR's `utility`
    (None: not MBR; an export's graph cannot compute MBR)."""

    role: str | None = None
    direction: str | None = None
    mean: bool = False
    utility: str | None = None


# The score names, in the order messages list them: the list's own, then per rescoring
# model (sum, per token), then MBR. scripts/rerank.py's --weight, scripts/export.py's
# --rerank-weight (those without a utility) and bench/rerank_grid.py's features.
WEIGHTS = {
    "forward": Weight(), "length": Weight(),
    "channel": Weight("channel", "channel"),
    "channel_mean": Weight("channel", "channel", True),
    "right_to_left": Weight("right_to_left", "forward"),
    "right_to_left_mean": Weight("right_to_left", "forward", True),
    "forward_model": Weight("forward_model", "forward"),
    "forward_model_mean": Weight("forward_model", "forward", True),
    "mbr_bleu": Weight(utility="bleu"), "mbr_chrf": Weight(utility="chrf"),
}


# The scores an export's graph computes (every one but MBR's).
GRAPH_WEIGHTS = tuple(name for name, weight in WEIGHTS.items() if weight.utility is None)


def role_weights(role: str) -> tuple[str, ...]:
    """The score names of the rescoring model of `role` (the sum, then per token)."""
    return tuple(name for name, weight in WEIGHTS.items() if weight.role == role)


class Candidate(NamedTuple):
    """One hypothesis of an n-best list: its text and the search's score of it."""

    text: str
    score: float = 0.0


# A scorer: (sources, candidates) -> one list of floats per source, one per candidate.
Scorer = Callable[[Sequence[str], Sequence[Sequence[Candidate]]], list]


@dataclasses.dataclass(frozen=True)
class RerankResult:
    """What :func:`rerank` chose.

    best: one text per source, the highest combined score ("" for a source with no
        candidate). index: the chosen candidate's position in its list (-1 for none).
    scores: per source, the combined score of each candidate.
    features: per scorer name, per source, each candidate's score.
    """

    best: list
    index: list
    scores: list
    features: dict


def _text(value) -> str:
    """A candidate's or source's text: str, or bytes decoded as UTF-8 (invalid bytes become
    U+FFFD, as the translators read them)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise TypeError(f"Expected text (str or UTF-8 bytes), got {type(value).__name__}: "
                        f"{value!r}.")
    return value


def _candidates(lists) -> list:
    """`lists` as lists of :class:`Candidate` (a bare string scores 0)."""
    out = []
    for items in lists:
        row = []
        for item in items:
            if isinstance(item, (str, bytes)):
                row.append(Candidate(_text(item), 0.0))
            else:
                text, score = item
                row.append(Candidate(_text(text), float(score)))
        out.append(row)
    return out


def read_nbest(lines, num_sources: int | None = None, origin: str = "the n-best list"):
    """The n-best lists of Moses n-best lines, one list per source, in the lines' order.

    A line is `i ||| translation ||| score` (i counts sources from 0; as
    `scripts/translate.py --n-best` writes), or Moses' `i ||| translation ||| features |||
    score`. Lines are str, or bytes decoded as UTF-8 with invalid bytes replaced by
    U+FFFD; blank lines are skipped. A source no line names gets an empty list.

    Args:
        lines: the lines (a file opened in binary or text mode).
        num_sources: how many sources there are (default: the largest index + 1).
        origin: what the lines are, for errors.

    Raises:
        ValueError: a line of another shape, an index that is not an integer >= 0 or not
            below `num_sources`, or a score that is not a number (naming the line).
    """
    lists: dict[int, list] = {}
    for number, line in enumerate(lines, 1):
        line = _text(line).rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split(" ||| ")
        if len(fields) not in (3, 4):
            raise ValueError(f"{origin}, line {number}: expected 'i ||| translation ||| "
                             f"score' (or Moses' 4 fields), got {line[:200]!r}.")
        index, text, score = fields[0].strip(), fields[1], fields[-1].strip()
        if not index.isdigit():
            raise ValueError(f"{origin}, line {number}: the index {index!r} is not an integer "
                             ">= 0.")
        if num_sources is not None and int(index) >= num_sources:
            raise ValueError(f"{origin}, line {number}: index {index} but there are "
                             f"{num_sources} sources (indices 0 to {num_sources - 1}).")
        try:
            value = float(score)
        except ValueError:
            raise ValueError(f"{origin}, line {number}: the score {score!r} is not a "
                             "number.") from None
        lists.setdefault(int(index), []).append(Candidate(text.strip(), value))
    count = num_sources if num_sources is not None else max(lists, default=-1) + 1
    return [lists.get(i, []) for i in range(count)]


def forward_score() -> Scorer:
    """The n-best list's own score of each candidate (the search's log P(y|x) / lp(y))."""
    def score(sources, candidates):
        return [[c.score for c in row] for row in candidates]
    return score


def length_score() -> Scorer:
    """|y|: each candidate's number of words (whitespace-separated)."""
    def score(sources, candidates):
        return [[float(len(c.text.split())) for c in row] for row in candidates]
    return score


def model_score(score_fn, direction: str = "forward", mean: bool = False) -> Scorer:
    """Log-probabilities of a model's `score` function (:func:`tfxformer.serving.
    load_score_fn`: `score_fn(sources, targets) -> [PairScore]`).

    Args:
        score_fn: the scoring model's function.
        direction: "forward" (log P(y | x): the candidate scored as the translation of the
            source; also a right-to-left model's, whose `score` reverses the pieces) or
            "channel" (log P(x | y): the source scored as the translation of the
            candidate, by a model of the other direction).
        mean: the score per scored token (`mean_log_prob`) instead of the sum.
    """
    if direction not in ("forward", "channel"):
        raise ValueError(f"direction {direction!r} not in ('forward', 'channel').")

    def score(sources, candidates):
        pairs = [(source, c.text) for source, row in zip(sources, candidates, strict=True)
                 for c in row]
        if direction == "channel":
            pairs = [(target, source) for source, target in pairs]
        scored = score_fn([p[0] for p in pairs], [p[1] for p in pairs]) if pairs else []
        values = iter([s.mean_log_prob if mean else s.log_prob for s in scored])
        return [[float(next(values)) for _ in row] for row in candidates]
    return score


_UTILITIES = {"bleu": lambda: sacrebleu.metrics.BLEU(effective_order=True),
              "chrf": sacrebleu.metrics.CHRF}


def mbr_score(utility: str = "bleu") -> Scorer:
    """Minimum Bayes risk: each candidate's mean `utility` ("bleu": sacreBLEU's sentence
    BLEU with effective order; "chrf": chrF) against the other candidates of its list,
    each weighing the same (a list of one candidate scores 0)."""
    if utility not in _UTILITIES:
        raise ValueError(f"utility {utility!r} not in {tuple(_UTILITIES)}.")
    metric = _UTILITIES[utility]()

    def score(sources, candidates):
        out = []
        for row in candidates:
            texts = [c.text for c in row]
            values = []
            for i, text in enumerate(texts):
                others = [t for j, t in enumerate(texts) if j != i]
                total = sum(metric.sentence_score(text, [other]).score for other in others)
                values.append(total / len(others) if others else 0.0)
            out.append(values)
        return out
    return score


def scorer(name: str, score_fn=None) -> Scorer:
    """The scorer of score `name` (:data:`WEIGHTS`); a rescoring model's needs its
    `score_fn` (:func:`model_score`)."""
    weight = WEIGHTS[name]
    if weight.utility is not None:
        return mbr_score(weight.utility)
    if weight.role is not None:
        return model_score(score_fn, weight.direction, weight.mean)
    return {"forward": forward_score, "length": length_score}[name]()


def weighted_sum(features: Mapping, weights: Mapping[str, float], xp=np):
    """sum of `weights[name] * features[name]` over the weights that are not 0 (zeros
    where none is): the combined score of every candidate. `features` are arrays of one
    shape: numpy's (`xp` numpy) or tensors in a graph (`xp` tf.experimental.numpy)."""
    total = xp.zeros_like(next(iter(features.values())))
    for name, weight in weights.items():
        if weight != 0:
            total = total + float(weight) * features[name]
    return total


def best_index(combined, xp=np):
    """The index of the best candidate along the last axis of `combined`
    (:func:`weighted_sum`): the highest finite score; a score that is not finite (NaN,
    +inf, -inf) never wins; ties, and a list with no finite score, go to the earliest."""
    return xp.argmax(xp.where(xp.isfinite(combined), combined, -np.inf), axis=-1)


def score_features(candidates, sources, scorers: Mapping[str, Scorer]) -> dict:
    """{scorer name: per source, one score per candidate} for every scorer of `scorers`.

    Raises:
        ValueError: not one candidate list per source, or a scorer whose output does not
            have one number per candidate.
    """
    candidates, sources = _candidates(candidates), [_text(s) for s in sources]
    if len(candidates) != len(sources):
        raise ValueError(f"One candidate list per source: got {len(candidates)} lists and "
                         f"{len(sources)} sources.")
    features = {}
    for name, scorer in scorers.items():
        values = scorer(sources, candidates)
        if [len(v) for v in values] != [len(row) for row in candidates]:
            raise ValueError(f"Scorer {name!r} did not return one score per candidate.")
        features[name] = [[float(x) for x in v] for v in values]
    return features


def combine(features: Mapping[str, list], weights: Mapping[str, float]) -> tuple[list, list]:
    """(index, scores): per source, the combined score of each candidate
    (:func:`weighted_sum`) and the index of the best (:func:`best_index`; -1 for an empty
    list). A feature without a weight counts 0; the module doc says how non-finite
    scores count.

    Raises:
        ValueError: a weight for a feature not in `features` (naming the ones there), or a
            weight that is not a finite number.
    """
    unknown = sorted(set(weights) - set(features))
    if unknown:
        raise ValueError(f"Weights for {unknown}, which are no feature here; features: "
                         f"{sorted(features)}.")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight):
            raise ValueError(f"The weight of {name!r} must be a finite number, got {weight!r}.")
    if not features:
        return [], []
    counts = [len(row) for row in next(iter(features.values()))]
    flat = {name: np.fromiter(itertools.chain.from_iterable(values), np.float64,
                              count=sum(counts))
            for name, values in features.items() if weights.get(name, 0) != 0}
    total = weighted_sum(flat or {"": np.zeros(sum(counts))}, weights)
    indices, scores, start = [], [], 0
    for count in counts:
        row = total[start:start + count]
        indices.append(int(best_index(row)) if count else -1)
        scores.append(row.tolist())
        start += count
    return indices, scores


def rerank(candidates, sources, scorers: Mapping[str, Scorer],
           weights: Mapping[str, float]) -> RerankResult:
    """Chooses each source's best candidate by the weighted sum of `scorers`.

    Args:
        candidates: per source, its n-best list: :class:`Candidate` (text, search score)
            pairs, or bare strings (search score 0); text as str or UTF-8 bytes. An empty
            list gives the empty translation.
        sources: the source texts, one per list.
        scorers: {name: scorer} (:func:`forward_score`, :func:`length_score`,
            :func:`model_score`, :func:`mbr_score`, or any function of that shape).
        weights: {name: weight} over the names of `scorers`; a scorer without a weight
            counts 0 (and is still computed: leave it out of `scorers` to save the time).

    Returns:
        A :class:`RerankResult`.
    """
    candidates = _candidates(candidates)
    features = score_features(candidates, sources, scorers)
    if not features:
        raise ValueError("No scorer given: pass at least one, e.g. {'forward': "
                         "forward_score()}.")
    index, scores = combine(features, weights)
    best = [row[k].text if k >= 0 else "" for row, k in zip(candidates, index, strict=True)]
    return RerankResult(best, index, scores, features)
