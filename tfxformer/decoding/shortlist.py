"""Vocabulary shortlist: logits and top-k over a batch's likely target tokens only.

In beam-4 decoding of a large vocabulary the output projection (D × V per hypothesis and
step) and the log-softmax and top-k over K·V candidates are a large share of the work,
yet a sentence's translation uses few of the V tokens. A *shortlist* (Marian's lexical
shortlist; CTranslate2's `use_vmap` vocabulary map) restricts them, per batch, to the
union of the likely target tokens of the batch's source tokens plus the most frequent
target tokens. The table behind it is built from the training data at export time
(:func:`build_shortlist_table`) and stored in the SavedModel.

Column space. :func:`shortlist_ids` returns a sorted list of unique vocabulary ids that
always starts with the special ids 0..3 (PAD, UNK, BOS, EOS; :mod:`tfxformer.ids`), so
column c of the shortlist *is* id c for the specials. The searches therefore run
unchanged on the L shortlist columns: EOS ends a hypothesis, PAD fills after it, BOS is
the first input and PAD/BOS are never generated, all by their usual ids. Only the step
function (:func:`tfxformer.decoding.adapter.transformer_decoder`) maps an incoming column
to its vocabulary id (`tf.gather(shortlist, ids)`) and computes the logits over the L
shortlist rows of the shared embedding (gathered once per batch, outside the loop);
:func:`to_vocabulary` maps the search's output columns back to vocabulary ids.

The scores are then log-probabilities normalized over the shortlist, not the full
vocabulary: a shortlist that covers every token the search would pick gives the same
output ids, with scores a little higher.

Shapes: B batch, S source length, V vocabulary, K table entries per source token, N most
frequent target tokens, L shortlist length.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding.common import NEG_INF
from tfxformer.ids import NUM_SPECIAL_IDS, PAD_ID

__all__ = [
    "ShortlistTable", "build_shortlist_table", "pad_shortlist", "shortlist_ids",
]

_DEFAULT_PER_SOURCE = 50
_DEFAULT_FREQUENT = 500
_SCORE = "dice"
# Co-occurrence keys gathered before they are merged into the running counts.
_FLUSH_KEYS = 4_000_000


class ShortlistTable(NamedTuple):
    """What :func:`build_shortlist_table` returns.

    table: (V, K) int32, row s = the K target ids most associated with source id s,
        best first, PAD (0) where s has fewer (and on the rows of the special ids);
    frequent: (N',) int32, the N most frequent target ids, most frequent first (N' < N
        when fewer distinct target tokens were seen);
    info: how it was built ({"score", "per_source", "frequent", "pairs", "vocab_size"}).
    """

    table: np.ndarray
    frequent: np.ndarray
    info: dict


def _pair_ids(ids, vocab_size, where):
    """One side of a pair -> (M,) int64 ids, checked to lie in [0, vocab_size)."""
    array = np.asarray(ids)
    if array.size == 0:
        return np.zeros([0], np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{where} must be a 1-D sequence of integer token ids, got shape "
                         f"{array.shape} of {array.dtype}.")
    bad = (array < 0) | (array >= vocab_size)
    if bad.any():
        raise ValueError(f"{where} holds id {int(array[bad][0])}, outside the vocabulary "
                         f"[0, {vocab_size}) (`vocab_size` {vocab_size}).")
    return array.astype(np.int64)


class _Counts:
    """Sentence-level counts c(s), c(t), c(s, t) and target token frequencies, sparse."""

    def __init__(self, vocab_size):
        self.vocab = vocab_size
        self.source = np.zeros(vocab_size, np.int64)  # c(s): pairs whose source holds s
        self.target = np.zeros(vocab_size, np.int64)  # c(t): pairs whose target holds t
        self.tokens = np.zeros(vocab_size, np.int64)  # target occurrences of t
        self.keys = np.zeros([0], np.int64)  # s * V + t, sorted
        self.joint = np.zeros([0], np.int64)  # c(s, t)
        self._pending = ([], [], [], [])  # source uniques, target uniques, targets, keys
        self._pending_keys = 0
        self.pairs = 0

    def add(self, source, target):
        source = np.unique(source[source >= NUM_SPECIAL_IDS])
        target = target[target >= NUM_SPECIAL_IDS]
        unique_target = np.unique(target)
        keys = (source[:, None] * self.vocab + unique_target[None, :]).ravel()
        for pending, values in zip(self._pending, (source, unique_target, target, keys),
                                   strict=True):
            pending.append(values)
        self._pending_keys += keys.size
        self.pairs += 1
        if self._pending_keys >= _FLUSH_KEYS:
            self.flush()

    def flush(self):
        sources, targets, tokens, keys = (np.concatenate(p) if p else np.zeros([0], np.int64)
                                          for p in self._pending)
        self.source += np.bincount(sources, minlength=self.vocab)
        self.target += np.bincount(targets, minlength=self.vocab)
        self.tokens += np.bincount(tokens, minlength=self.vocab)
        keys, counts = np.unique(keys, return_counts=True)
        merged, index = np.unique(np.concatenate([self.keys, keys]), return_inverse=True)
        self.joint = np.bincount(index, weights=np.concatenate([self.joint, counts]),
                                 minlength=merged.size).astype(np.int64)
        self.keys = merged
        self._pending = ([], [], [], [])
        self._pending_keys = 0


def build_shortlist_table(pairs, vocab_size, per_source=_DEFAULT_PER_SOURCE,
                          frequent=_DEFAULT_FREQUENT, progress=False, total=None):
    """Builds the shortlist table from parallel training data (numpy).

    Counts, over sentence pairs, c(s) = pairs whose source holds token s, c(t) = pairs
    whose target holds t and c(s, t) = pairs holding both (each token once per pair).
    Each source token keeps its top `per_source` target tokens by the Dice coefficient

        Dice(s, t) = 2 c(s, t) / (c(s) + c(t)),

    ties broken by c(s, t), then by id. Why Dice and not p(t | s) = c(s, t) / c(s): the
    conditional probability ranks the target tokens that occur in nearly every sentence
    ("."; "Ein", "der", "einem") first for every source token, so they would take most of
    each source token's K slots, while the `frequent` list already holds them; Dice
    divides by c(t) too, so it ranks what goes *with s* first (its translation: in the
    shipped model's table "▁dog" -> "▁Hund", "▁brauner", "▁schwarzer", "▁rennt", ...).
    Special ids (< 4) are not counted; their rows stay PAD.

    Args:
        pairs: iterable of (source ids, target ids), each side a 1-D sequence of ints
            (list, numpy array; `zip(sources, targets)` for two lists). Ids in
            [0, vocab_size); special ids are ignored.
        vocab_size: V, the model's vocabulary size (the table has V rows).
        per_source: K >= 1 target tokens kept per source token (default 50).
        frequent: N >= 0 most frequent target tokens (by occurrences), always in the
            shortlist (default 500).
        progress: show a tqdm progress bar (`total`: the number of pairs, if known).

    Returns:
        :class:`ShortlistTable` (table (V, K) int32, frequent (N',) int32, info).

    Raises:
        ValueError: a bad `vocab_size`, `per_source` or `frequent`, or a pair that is not
            two 1-D integer sequences of ids in [0, vocab_size) (naming the pair).

    Example:
    >>> t = build_shortlist_table([([5, 6], [7, 8]), ([5], [7])], 10, per_source=1,
    ...                           frequent=1)
    >>> t.table[5].tolist(), t.table[6].tolist(), t.frequent.tolist()
    ([7], [8], [7])
    """
    vocab_size = checks.integer(vocab_size, "vocab_size", NUM_SPECIAL_IDS + 1, 2 ** 31 - 1)
    per_source = checks.integer(per_source, "per_source", 1, vocab_size)
    frequent = checks.integer(frequent, "frequent", 0, vocab_size)
    counts = _Counts(vocab_size)
    iterator = iter(pairs)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, total=total, unit=" pairs", desc="shortlist table")
    for i, pair in enumerate(iterator):
        try:
            source, target = pair
        except (TypeError, ValueError):
            raise ValueError(f"pairs[{i}] must be (source ids, target ids), got "
                             f"{type(pair).__name__} {str(pair)[:60]}.") from None
        counts.add(_pair_ids(source, vocab_size, f"pairs[{i}][0] (source ids)"),
                   _pair_ids(target, vocab_size, f"pairs[{i}][1] (target ids)"))
    counts.flush()
    info = dict(score=_SCORE, per_source=per_source, frequent=frequent, pairs=counts.pairs,
                vocab_size=vocab_size)
    return ShortlistTable(_top_targets(counts, per_source), _most_frequent(counts, frequent),
                          info)


def _top_targets(counts, per_source):
    """(V, K) int32: per source token its `per_source` best target tokens by Dice."""
    source, target = counts.keys // counts.vocab, counts.keys % counts.vocab
    dice = 2.0 * counts.joint / (counts.source[source] + counts.target[target])
    order = np.lexsort((target, -counts.joint, -dice, source))  # last key sorts first
    source, target = source[order], target[order]
    rank = np.arange(source.size) - np.searchsorted(source, source)  # within its row
    keep = rank < per_source
    table = np.full([counts.vocab, per_source], PAD_ID, np.int32)
    table[source[keep], rank[keep]] = target[keep]
    return table


def _most_frequent(counts, frequent):
    seen = np.flatnonzero(counts.tokens)
    order = np.lexsort((seen, -counts.tokens[seen]))
    return seen[order][:frequent].astype(np.int32)


def check_table(table, vocab_size):
    """Checks a :class:`ShortlistTable` against a model's vocabulary; returns it.

    Raises:
        ValueError: not a ShortlistTable-like (table, frequent[, info]); a table that is
            not (vocab_size, K >= 1) integers; ids outside [0, vocab_size).
    """
    try:
        rows, frequent = np.asarray(table[0]), np.asarray(table[1])
    except (TypeError, IndexError, KeyError):
        raise ValueError("A shortlist must be a ShortlistTable (table, frequent, info) from "
                         f"build_shortlist_table, got {type(table).__name__}.") from None
    if rows.ndim != 2 or rows.shape[1] < 1 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"The shortlist table must be (vocab_size, K >= 1) integer ids, got "
                         f"shape {rows.shape} of {rows.dtype}.")
    if rows.shape[0] != vocab_size:
        raise ValueError(f"The shortlist table has {rows.shape[0]} rows (built for a "
                         f"vocabulary of {rows.shape[0]}), but the model's vocabulary has "
                         f"{vocab_size} ids: build it with vocab_size={vocab_size}.")
    if frequent.ndim != 1 or (frequent.size and not np.issubdtype(frequent.dtype, np.integer)):
        raise ValueError(f"The shortlist's frequent ids must be 1-D integers, got shape "
                         f"{frequent.shape} of {frequent.dtype}.")
    for name, ids in (("table", rows), ("frequent ids", frequent)):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"The shortlist {name} hold ids outside [0, {vocab_size}): "
                             f"{int(ids.min())} .. {int(ids.max())}.")
    info = dict(table[2]) if len(table) > 2 and table[2] else {}
    return ShortlistTable(rows.astype(np.int32), frequent.astype(np.int32), info)


def shortlist_ids(source_ids, table, frequent=None):
    """The batch's shortlist: (L,) int32 sorted unique vocabulary ids (graph-safe).

    The union of the table rows of the batch's non-PAD source tokens, the `frequent`
    ids and the special ids 0..3, so column c == id c for the specials (module doc).

    Args:
        source_ids: (B, S) int source ids, PAD 0.
        table: (V, K) int target ids per source id (:attr:`ShortlistTable.table`; a
            tensor or tf.Variable in a graph).
        frequent: (N,) int ids always included, or None.

    Returns:
        (L,) int32, 4 <= L <= V.

    Example:
    >>> shortlist_ids([[5, 0]], [[0]] * 5 + [[9]] + [[0]] * 4, [7]).numpy().tolist()
    [0, 1, 2, 3, 7, 9]
    """
    table = tf.convert_to_tensor(table)
    table = tf.cast(table, tf.int32)
    source = tf.reshape(tf.cast(source_ids, tf.int32), [-1])
    source = tf.boolean_mask(source, tf.not_equal(source, PAD_ID))
    ids = [tf.reshape(tf.gather(table, source), [-1]), tf.range(NUM_SPECIAL_IDS)]
    if frequent is not None:
        ids.append(tf.reshape(tf.cast(frequent, tf.int32), [-1]))
    ids = tf.concat(ids, axis=0)
    hit = tf.scatter_nd(ids[:, None], tf.ones_like(ids), tf.shape(table)[:1]) > 0  # (V,)
    return tf.cast(tf.where(hit)[:, 0], tf.int32)


def check_shortlist(shortlist, vocab_size):
    """A shortlist (L,) for the searches, as int32: sorted, unique, starting with the
    special ids 0..3, every id < vocab_size. A concrete value is checked now
    (ValueError); a graph tensor gets one graph assertion (InvalidArgument)."""
    if isinstance(shortlist, (tf.Tensor, tf.Variable)):
        value = tf.get_static_value(shortlist) if isinstance(shortlist, tf.Tensor) else None
    else:
        value = np.asarray(shortlist)
    if value is not None:
        value = np.asarray(value)
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"`shortlist` must be 1-D integer vocabulary ids, got shape "
                             f"{value.shape} of {value.dtype}.")
        if value[:NUM_SPECIAL_IDS].tolist() != list(range(NUM_SPECIAL_IDS)) \
                or (np.diff(value) <= 0).any() or value[-1] >= vocab_size:
            raise ValueError(f"`shortlist` must be sorted unique ids in [0, {vocab_size}) "
                             f"starting with the special ids 0..{NUM_SPECIAL_IDS - 1} (as "
                             f"shortlist_ids returns), got {value[:8].tolist()}"
                             f"{' ...' if value.size > 8 else ''} (length {value.size}).")
        return tf.constant(value, tf.int32)
    shortlist = tf.cast(tf.convert_to_tensor(shortlist), tf.int32)
    head = tf.concat([shortlist, tf.fill([NUM_SPECIAL_IDS], -1)], 0)[:NUM_SPECIAL_IDS]
    valid = (tf.reduce_all(tf.equal(head, tf.range(NUM_SPECIAL_IDS)))
             & tf.reduce_all(shortlist[1:] > shortlist[:-1])
             & tf.reduce_all(shortlist < vocab_size))
    message = (f"`shortlist` must be sorted unique ids in [0, {vocab_size}) starting with "
               f"0..{NUM_SPECIAL_IDS - 1}")
    with tf.control_dependencies([tf.debugging.Assert(valid, [message])]):
        return tf.identity(shortlist)


def to_vocabulary(ids, shortlist):
    """Output ids of a search in column space (any shape) -> vocabulary ids."""
    return tf.gather(shortlist, ids)


def pad_shortlist(shortlist, size, vocab_size):
    """A shortlist (L,) padded to `size` columns (L <= size <= vocab_size; graph-safe), for
    a search whose shapes must be fixed (XLA): ((size,) int32 sorted unique ids, the
    shortlist and the size - L smallest ids not in it; (size,) bool usable, False on those
    padding columns). A search given both (`beam_search(..., shortlist=ids,
    shortlist_mask=usable)`) never generates a padding column: its logits are -inf before
    the softmax (:func:`mask_columns`), so the output is the unpadded shortlist's.

    Example:
    >>> ids, usable = pad_shortlist([0, 1, 2, 3, 7], 7, 10)
    >>> ids.numpy().tolist(), usable.numpy().tolist()
    ([0, 1, 2, 3, 4, 5, 7], [True, True, True, True, False, False, True])
    """
    shortlist = tf.cast(tf.convert_to_tensor(shortlist), tf.int32)
    listed = tf.scatter_nd(shortlist[:, None], tf.ones_like(shortlist), [vocab_size]) > 0
    padding = tf.cast(tf.where(~listed)[:, 0], tf.int32)[:size - tf.size(shortlist)]
    chosen = listed | (tf.scatter_nd(padding[:, None], tf.ones_like(padding), [vocab_size]) > 0)
    ids = tf.cast(tf.where(chosen)[:, 0], tf.int32)  # sorted
    return ids, tf.gather(listed, ids)


def mask_columns(fn, usable):
    """A step (or prefill) function `fn` -> (logits, cache) whose logits (..., V') are
    NEG_INF (float32) in the shortlist columns not `usable` ((V',) bool), before the
    softmax: those columns take no probability and are never generated."""
    def masked(*args):
        logits, cache = fn(*args)
        return tf.where(usable, tf.cast(logits, tf.float32), NEG_INF), cache

    return masked
