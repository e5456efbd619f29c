"""tf.data input pipelines: tokenize, filter, and batch by length (§5.1).

§5.1: "Sentence pairs were batched together by approximate sequence length. Each training
batch contained a set of sentence pairs containing approximately 25000 source tokens and
25000 target tokens."

Example contract (ids from `tfxformer.data.tokenizer`: PAD 0, BOS 2, EOS 3)::

    source_ids        = src_tokens + [EOS]
    decoder_input_ids = [BOS] + tgt_tokens
    labels            = tgt_tokens + [EOS]

Training and evaluation elements are `((source_ids, decoder_input_ids), labels)`, int32,
padded with 0, ready for `keras.Model.fit`.

Length filter: a pair is kept when both sides are non-empty and
`len(src_tokens) + 1 <= max_length` and `len(tgt_tokens) + 1 <= max_length` (lengths with
their EOS/BOS). Removed pairs are counted (:func:`count_filtered`, :class:`FilterStats`).

Token budget (the exact definition): every training batch is padded to its bucket length
L (a multiple of `bucket_step`, the same L for all three tensors) and holds
`B = floor(floor(batch_tokens / L) / R) * R` pairs, `R = num_replicas`. So per global
step, counting padding,

    B * L <= batch_tokens   for the source AND for the target side (B * L each)

and each replica gets `B / R` pairs, i.e. at most `batch_tokens / R` padded tokens. The
paper's ~25000 is `TokenBudget(tokens_per_update=25000).per_step`; with padding to
multiples of 8 a batch holds slightly fewer real tokens than the budget.
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from tfxformer import checks
from tfxformer.data import alignments
from tfxformer.data.sampling import SubwordSampler
from tfxformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

__all__ = [
    "FilterStats", "TokenBudget", "bucket_plan", "count_filtered", "eval_dataset",
    "make_examples", "tokenize_pairs", "train_dataset",
]

logger = logging.getLogger(__name__)

# Lines longer than this many UTF-8 bytes per allowed token count as over-long without being
# tokenized; no real sentence of `max_length` subwords is that long, and it keeps
# pathological lines (a whole document on one line) away from the tokenizer.
_MAX_BYTES_PER_TOKEN = 64
_GATHER_BATCH = 1024  # pairs of a token cache gathered per call


@dataclasses.dataclass(frozen=True)
class TokenBudget:
    """Padded-token budget per optimizer update, global step and replica (§5.1).

    One update of `tokens_per_update` tokens (per side) is made of `accumulation_steps`
    global steps (gradient accumulation is done by the training loop); each global step
    is split evenly over `num_replicas` replicas. Pass `per_step` as `batch_tokens` of
    :func:`train_dataset`.

    Example:

    >>> TokenBudget(25_000, num_replicas=8, accumulation_steps=2).per_step   # 12500
    """

    tokens_per_update: int = 25_000
    num_replicas: int = 1
    accumulation_steps: int = 1

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TokenBudget.{field.name}={value!r}; expected an int >= 1.")
        if self.per_replica < 1:
            raise ValueError(f"{self} leaves no token per replica and step.")

    @property
    def per_step(self) -> int:
        """Padded tokens (per side) of one global batch."""
        return self.tokens_per_update // self.accumulation_steps

    @property
    def per_replica(self) -> int:
        """Padded tokens (per side) of one replica's share of a global batch."""
        return self.per_step // self.num_replicas


@dataclasses.dataclass(frozen=True)
class FilterStats:
    """How many pairs the length filter removes; `str()` is the log line."""

    total: int
    empty: int
    too_long: int
    max_length: int

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long

    def __str__(self) -> str:
        return (
            f"filtered {self.empty} empty, {self.too_long} over-long (> {self.max_length} "
            f"tokens incl. BOS/EOS) of {self.total} pairs; kept {self.kept}"
        )


def make_examples(src_ids: tf.RaggedTensor, tgt_ids: tf.RaggedTensor,
                  reverse_target: bool = False):
    """Adds special ids to a batch of token rows (the module's example contract).

    Args:
        src_ids, tgt_ids: int32 RaggedTensors `(N, None)` of subword ids (no specials).
        reverse_target: a right-to-left model's examples: each target's pieces reversed
            before BOS/EOS are added (`decoder_input_ids = [BOS] + reversed(tgt_tokens)`,
            `labels = reversed(tgt_tokens) + [EOS]`).

    Returns:
        `((source_ids, decoder_input_ids), labels)`, int32 RaggedTensors `(N, None)`.
    """
    column = tf.ones([src_ids.nrows(), 1], tf.int32)
    eos = tf.RaggedTensor.from_tensor(column * EOS_ID)
    bos = tf.RaggedTensor.from_tensor(column * BOS_ID)
    src_ids, tgt_ids = tf.cast(src_ids, tf.int32), tf.cast(tgt_ids, tf.int32)
    if reverse_target:
        tgt_ids = tf.reverse(tgt_ids, axis=[1])
    source = tf.concat([src_ids, eos], axis=1)
    decoder_input = tf.concat([bos, tgt_ids], axis=1)
    labels = tf.concat([tgt_ids, eos], axis=1)
    return (source, decoder_input), labels


def tokenize_and_classify(tokenizer: Tokenizer, src, tgt, max_length: int, max_bytes: int):
    """Tokenizes a batch of pairs; returns (src_ids, tgt_ids, is_empty, is_too_long).

    The one place where the length filter is decided: :func:`tokenize_pairs`,
    :func:`count_filtered` and the token cache (:mod:`tfxformer.data.token_cache`) call it.

    Precedence: a line over `max_bytes` bytes makes the pair over-long (it is not
    tokenized); otherwise a side without tokens makes it empty; otherwise a side with
    more than `max_length - 1` tokens makes it over-long.

    `tokenizer` is a :class:`Tokenizer` or a sampler at one batch position
    (:meth:`tfxformer.data.sampling.SubwordSampler.at`); both sides are segmented in one
    `tokenize` call, sources first.
    """
    huge = tf.logical_or(tf.strings.length(src) > max_bytes, tf.strings.length(tgt) > max_bytes)
    rows = tf.shape(src, out_type=tf.int64)[0]
    ids = tokenizer.tokenize(tf.concat([tf.where(huge, "", src), tf.where(huge, "", tgt)], 0))
    src_ids, tgt_ids = ids[:rows], ids[rows:]
    src_len = tf.cast(src_ids.row_lengths(), tf.int32)
    tgt_len = tf.cast(tgt_ids.row_lengths(), tf.int32)
    empty = tf.logical_and(tf.logical_not(huge), tf.minimum(src_len, tgt_len) == 0)
    long = tf.maximum(src_len, tgt_len) + 1 > max_length
    too_long = tf.logical_or(huge, tf.logical_and(long, tf.logical_not(empty)))
    return src_ids, tgt_ids, empty, too_long


def line_byte_limit(max_length: int, max_line_bytes: int | None = None) -> int:
    """UTF-8 bytes above which a line counts as over-long without being tokenized."""
    return max_line_bytes or _MAX_BYTES_PER_TOKEN * max_length


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        checks.integer(value, name, 1)


def tokenize_pairs(
    pairs: tf.data.Dataset,
    tokenizer: Tokenizer,
    *,
    max_length: int = 256,
    max_line_bytes: int | None = None,
    batch_size: int = 1024,
    sampler: SubwordSampler | None = None,
    reverse_target: bool = False,
) -> tf.data.Dataset:
    """Tokenizes `(src, tgt)` string pairs into filtered, unpadded model examples.

    Args:
        pairs: dataset of `(src, tgt)` scalar tf.string pairs, or `(src, tgt,
            alignment)` with each pair's Pharaoh word links (guided alignment): then each
            example has a third element, its (T, S) float32 piece links
            (:func:`tfxformer.data.alignments.link_matrix`, T the labels', S the source's).
        tokenizer: the shared :class:`Tokenizer`.
        max_length: maximum sequence length including EOS/BOS (see module docstring).
        max_line_bytes: lines longer than this count as over-long untokenized; default
            `_MAX_BYTES_PER_TOKEN * max_length`.
        batch_size: pairs tokenized per (vectorized) call; does not affect the output
            without `sampler`.
        sampler: subword regularisation (:class:`SubwordSampler`, BPE-dropout, for
            training text only): each batch of `batch_size` pairs is segmented by
            sampling at its position `k` in `pairs` (the k-th batch), so the same `pairs`
            stream gives the same segmentations and a repeated stream new ones. The
            length filter applies to the sampled segmentations.
        reverse_target: right-to-left examples (:func:`make_examples`).

    Returns:
        dataset of `((source_ids, decoder_input_ids), labels)`, 1-D int32 tensors (and
        the links, with alignments).
    """
    _check_positive(max_length=max_length, batch_size=batch_size)
    max_bytes = line_byte_limit(max_length, max_line_bytes)

    def tokenize(src, tgt, links=None, segmenter=tokenizer):
        src_ids, tgt_ids, empty, too_long = tokenize_and_classify(
            segmenter, src, tgt, max_length, max_bytes)
        keep = tf.logical_not(tf.logical_or(empty, too_long))
        src_ids = tf.ragged.boolean_mask(src_ids, keep)
        tgt_ids = tf.ragged.boolean_mask(tgt_ids, keep)
        examples = make_examples(src_ids, tgt_ids, reverse_target)
        if links is None:
            return examples
        return (*examples, _piece_words(tokenizer, src_ids, tgt_ids, reverse_target)
                + (alignments.parse_pharaoh(tf.boolean_mask(links, keep)),))

    def sample(position, pair):
        return tokenize(*pair, segmenter=sampler.at(position))

    batches = pairs.batch(batch_size)
    if sampler is None:
        batches = batches.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        batches = batches.enumerate().map(sample, num_parallel_calls=tf.data.AUTOTUNE)
    return unbatch_examples(batches)


def _piece_words(tokenizer: Tokenizer, src_ids, tgt_ids, reverse_target: bool):
    """(N, None) int32 the word of each source piece and of each label (their order, EOS
    -1): what a Pharaoh line's word indices are read against."""
    minus_one = tf.RaggedTensor.from_tensor(-tf.ones([src_ids.nrows(), 1], tf.int32))
    source = alignments.piece_words(tokenizer.id_to_piece(src_ids))
    target = alignments.piece_words(tokenizer.id_to_piece(tgt_ids))
    if reverse_target:
        target = tf.reverse(target, axis=[1])
    return tf.concat([source, minus_one], axis=1), tf.concat([target, minus_one], axis=1)


def unbatch_examples(batches: tf.data.Dataset) -> tf.data.Dataset:
    """Rows of ragged batches of :func:`make_examples` (with piece words and word links:
    guided alignment), as plain Tensors (the links as each example's (T, S) matrix)."""
    # unbatch() yields rows typed as 0-ragged-rank RaggedTensors; an identity map retypes
    # them as plain Tensors, which padded_batch (used by the bucketing) requires.
    def example(inputs, labels, words=None):
        if words is None:
            return inputs, labels
        return inputs, labels, alignments.link_matrix(*words)

    return batches.unbatch().map(example, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True)


def count_filtered(
    pairs: tf.data.Dataset,
    tokenizer: Tokenizer,
    *,
    max_length: int = 256,
    max_line_bytes: int | None = None,
    batch_size: int = 1024,
) -> FilterStats:
    """Counts, in one in-graph pass over `pairs`, what :func:`tokenize_pairs` removes.

    The result is also logged (INFO), e.g. "Data filter: filtered 3 empty, 120 over-long
    (> 256 tokens incl. BOS/EOS) of 4500966 pairs; kept 4500843".
    """
    _check_positive(max_length=max_length, batch_size=batch_size)
    max_bytes = line_byte_limit(max_length, max_line_bytes)

    def count(src, tgt):
        _, _, empty, too_long = tokenize_and_classify(tokenizer, src, tgt, max_length,
                                                       max_bytes)
        flags = tf.cast(tf.stack([tf.ones_like(empty), empty, too_long]), tf.int64)
        return tf.reduce_sum(flags, axis=1)

    counts = pairs.batch(batch_size).map(count, num_parallel_calls=tf.data.AUTOTUNE)
    total, empty, too_long = counts.reduce(tf.zeros([3], tf.int64), tf.add).numpy().tolist()
    stats = FilterStats(total, empty, too_long, max_length)
    logger.info("Data filter: %s", stats)
    return stats


def bucket_plan(
    batch_tokens: int, max_length: int = 256, num_replicas: int = 1, bucket_step: int = 8
) -> list[tuple[int, int]]:
    """Returns `(padded_length L, global_batch_size B)` of every length bucket.

    `L` runs over the multiples of `bucket_step` up to `max_length` rounded up; `B` is the
    largest multiple of `num_replicas` with `B * L <= batch_tokens` (module docstring).

    Raises:
        ValueError: `batch_tokens` cannot hold `num_replicas` pairs of the longest bucket.
    """
    _check_positive(batch_tokens=batch_tokens, max_length=max_length,
                    num_replicas=num_replicas, bucket_step=bucket_step)
    longest = -(-max_length // bucket_step) * bucket_step
    if batch_tokens < num_replicas * longest:
        raise ValueError(
            f"batch_tokens={batch_tokens} is too small: the longest bucket ({longest} tokens, "
            f"max_length={max_length} rounded up to a multiple of {bucket_step}) needs at "
            f"least num_replicas={num_replicas} x {longest} = {num_replicas * longest}."
        )
    lengths = range(bucket_step, longest + 1, bucket_step)
    return [(length, batch_tokens // length // num_replicas * num_replicas)
            for length in lengths]


def batch_by_length(
    examples: tf.data.Dataset, plan: list[tuple[int, int]], *, drop_remainder: bool = True
) -> tf.data.Dataset:
    """Groups examples of :func:`tokenize_pairs` into the padded batches of `plan`.

    An example goes to the first bucket whose length `L >= max(len(source_ids),
    len(labels))`; all three tensors are padded with 0 to `(B, L)`. With
    `drop_remainder`, incomplete batches (only at the end of a finite dataset) are
    dropped, so every batch has exactly its bucket's `B` rows.
    """
    lengths, sizes = zip(*plan, strict=True)

    def length(inputs, labels, *links):
        return tf.maximum(tf.shape(inputs[0])[0], tf.shape(labels)[0])

    pad = tf.constant(PAD_ID, tf.int32)
    links = (tf.constant(0.0),) if len(examples.element_spec) == 3 else ()
    return examples.bucket_by_sequence_length(
        length,
        bucket_boundaries=[n + 1 for n in lengths],
        # One more size for lengths > the last boundary, which the length filter excludes.
        bucket_batch_sizes=[*sizes, sizes[-1]],
        padding_values=((pad, pad), pad, *links),
        pad_to_bucket_boundary=True,
        drop_remainder=drop_remainder,
    )


def order_for_training(items: tf.data.Dataset, *, shuffle_buffer: int, seed: int | None,
                       repeat: bool) -> tf.data.Dataset:
    """The training order of `items` (pairs, or pair indices of a token cache): shuffled
    with a buffer of `shuffle_buffer` (0: not shuffled), reshuffled each epoch, repeated.

    tf.data's shuffle picks buffer slots from its seed alone, whatever the elements are, so
    the pairs of a corpus and their indices `range(N)` come out in the same order; this is
    what makes :mod:`tfxformer.data.token_cache` give the batches of :func:`train_dataset`.
    """
    if shuffle_buffer:
        items = items.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return items.repeat() if repeat else items


def batches_for_training(examples: tf.data.Dataset, *, batch_tokens: int, max_length: int,
                         num_replicas: int, bucket_step: int) -> tf.data.Dataset:
    """The token-budget batches of `examples` (:func:`batch_by_length`), prefetched."""
    plan = bucket_plan(batch_tokens, max_length, num_replicas, bucket_step)
    logger.info("Batches: <= %d padded tokens per side and global step over %d replica(s); "
                "(length, batch size) buckets: %s", batch_tokens, num_replicas, plan)
    return batch_by_length(examples, plan).prefetch(tf.data.AUTOTUNE)


def train_dataset(
    pairs: tf.data.Dataset,
    tokenizer: Tokenizer,
    *,
    batch_tokens: int,
    max_length: int = 256,
    num_replicas: int = 1,
    bucket_step: int = 8,
    shuffle_buffer: int = 100_000,
    seed: int | None = None,
    repeat: bool = True,
    max_line_bytes: int | None = None,
    sampler: SubwordSampler | None = None,
    reverse_target: bool = False,
    token_cache=None,
    word_links: tf.data.Dataset | None = None,
) -> tf.data.Dataset:
    """The training pipeline: shuffle, repeat, tokenize, filter, batch by length (§5.1).

    Tokenizes on every epoch; with `token_cache`, the same batches from token ids saved
    once.

    Args:
        pairs: dataset of `(src, tgt)` strings, e.g. `corpus.train.dataset()` (not read
            with a `token_cache`: may be None).
        tokenizer: the shared :class:`Tokenizer` (not used with a `token_cache`).
        batch_tokens: padded tokens per side of one GLOBAL batch (all replicas), e.g.
            `TokenBudget(25000, R, k).per_step`; see the module docstring.
        max_length: length filter, tokens including EOS/BOS.
        num_replicas: `strategy.num_replicas_in_sync`; every batch size is divisible by it,
            so `strategy.experimental_distribute_dataset` (used by `Model.fit`) gives each
            replica `B / R` rows and at most `batch_tokens / R` tokens.
        bucket_step: padded lengths are multiples of this.
        shuffle_buffer: pairs in the shuffle buffer (0: no shuffle).
        seed: shuffle seed.
        repeat: repeat forever (training); if False, one epoch, last partial batches
            dropped.
        max_line_bytes: see :func:`tokenize_pairs`.
        sampler: subword regularisation (:func:`tokenize_pairs`): each read of a pair
            samples a segmentation, seeded by the sampler's seed and the position in the
            shuffled, repeated stream (a checkpoint of the iterator saves it).
        reverse_target: right-to-left examples (:func:`make_examples`); a token cache
            holds the targets in reading order, so one cache serves both directions.
        token_cache: the pairs' ids, tokenized and filtered once
            (:class:`tfxformer.data.token_cache.TokenCache`,
            `token_cache.open_or_build`): the same batches as from `pairs`; its
            `max_length` must be this one (its filter is applied already), and it does
            not go with `sampler` (which needs the text).
        word_links: guided alignment: a dataset of one Pharaoh line per pair of `pairs`,
            in their order (:mod:`tfxformer.data.alignments`); each batch then has a third
            element, its (B, L, L) float32 piece links (not with a `token_cache`).

    Returns:
        dataset of `((source_ids, decoder_input_ids), labels)`, int32 `(B, L)` each (and
        the (B, L, L) links with `word_links`).

    Raises:
        ValueError: a token budget too small for the longest bucket, a `token_cache`
            of another `max_length` or with a `sampler` or `word_links`.
    """
    if token_cache is not None and word_links is not None:
        raise ValueError("A token cache holds no word links: read the pairs (`pairs`) "
                         "with `word_links`.")
    order = dict(shuffle_buffer=shuffle_buffer, seed=seed, repeat=repeat)
    if token_cache is not None:
        examples = _cached_examples(token_cache, max_length, sampler, reverse_target, order)
    bucket_plan(batch_tokens, max_length, num_replicas, bucket_step)  # errors first
    if word_links is not None:
        pairs = tf.data.Dataset.zip(pairs, word_links).map(lambda pair, links: (*pair, links))
    if token_cache is None:
        examples = tokenize_pairs(order_for_training(pairs, **order), tokenizer,
                                  max_length=max_length, max_line_bytes=max_line_bytes,
                                  sampler=sampler, reverse_target=reverse_target)
    return batches_for_training(examples, batch_tokens=batch_tokens, max_length=max_length,
                                num_replicas=num_replicas, bucket_step=bucket_step)


def _cached_examples(cache, max_length, sampler, reverse_target, order) -> tf.data.Dataset:
    """The examples of :func:`train_dataset` from a token cache's ids: its pair indices
    in the training order, gathered `_GATHER_BATCH` at a time."""
    if max_length != cache.max_length:
        raise ValueError(f"max_length={max_length}, but the token cache {cache.directory} was "
                         f"built with max_length={cache.max_length}; open the cache with "
                         "the training's max_length.")
    if sampler is not None:
        raise ValueError("Subword sampling segments the text on every read: train it "
                         "without a token cache.")

    def gather(indices):  # (n,) int64 -> the kept pairs' examples, in order
        return make_examples(*cache.pairs_at(indices), reverse_target)

    indices = order_for_training(tf.data.Dataset.range(cache.num_pairs), **order)
    return unbatch_examples(indices.batch(_GATHER_BATCH).map(
        gather, num_parallel_calls=tf.data.AUTOTUNE))


def eval_dataset(
    pairs: tf.data.Dataset,
    tokenizer: Tokenizer,
    *,
    batch_size: int = 64,
    with_text: bool = True,
    pad_multiple: int = 8,
    reverse_target: bool = False,
) -> tf.data.Dataset:
    """The evaluation pipeline: every pair, in order, in batches of `batch_size`.

    No shuffle, no repeat, no length filter (BLEU must cover the whole test set). Each
    batch is padded with 0 to its longest sequence rounded up to `pad_multiple`; the last
    batch may be smaller. `reverse_target`: right-to-left examples
    (:func:`make_examples`; the texts stay as they are).

    Returns:
        dataset of `((source_ids, decoder_input_ids), labels, texts)` with `texts =
        {"source": (B,) tf.string, "reference": (B,) tf.string}` (raw, for BLEU on
        detokenized text); with `with_text=False`, `((source_ids, decoder_input_ids),
        labels)` as `Model.evaluate` expects (it would read a third element as sample
        weights).
    """
    _check_positive(batch_size=batch_size, pad_multiple=pad_multiple)

    def to_batch(src, tgt):
        (source, decoder_input), labels = make_examples(
            tokenizer.tokenize(src), tokenizer.tokenize(tgt), reverse_target)
        longest = tf.maximum(tf.reduce_max(source.row_lengths()),
                             tf.reduce_max(labels.row_lengths()))
        shape = tf.stack([source.nrows(), -(-longest // pad_multiple) * pad_multiple])
        source, decoder_input, labels = (
            x.to_tensor(default_value=PAD_ID, shape=shape)
            for x in (source, decoder_input, labels))
        if with_text:
            return (source, decoder_input), labels, {"source": src, "reference": tgt}
        return (source, decoder_input), labels

    batches = pairs.batch(batch_size).map(to_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)
