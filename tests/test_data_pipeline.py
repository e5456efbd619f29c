"""Tests of tfxformer.data.pipeline: examples, length filter, token-budget batches (§5.1)."""

import itertools
import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import shared_data

from tfxformer.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    TokenBudget,
    bucket_plan,
    count_filtered,
    eval_dataset,
    iter_lines,
    make_examples,
    tokenize_pairs,
    train_dataset,
    train_tokenizer,
)


def _lines(split: str, lang: str, n: int) -> list[str]:
    return list(itertools.islice(iter_lines(shared_data("multi30k", f"{split}.{lang}")), n))


@pytest.fixture(scope="module")
def tokenizer():
    en, de = _lines("train", "en", 2000), _lines("train", "de", 2000)
    return train_tokenizer(en + de, vocab_size=500)


@pytest.fixture(scope="module")
def pairs() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((_lines("train", "en", 1500),
                                               _lines("train", "de", 1500)))


def _pairs(*pairs: tuple[str, str]) -> tf.data.Dataset:
    src, tgt = zip(*pairs, strict=True)
    return tf.data.Dataset.from_tensor_slices((list(src), list(tgt)))


def test_make_examples_places_bos_and_eos():
    src = tf.ragged.constant([[5, 6], [7]], dtype=tf.int32)
    tgt = tf.ragged.constant([[8], [9, 10, 11]], dtype=tf.int32)
    (source, decoder_input), labels = make_examples(src, tgt)
    assert source.to_list() == [[5, 6, EOS_ID], [7, EOS_ID]]
    assert decoder_input.to_list() == [[BOS_ID, 8], [BOS_ID, 9, 10, 11]]
    assert labels.to_list() == [[8, EOS_ID], [9, 10, 11, EOS_ID]]


def test_make_examples_of_a_right_to_left_model_reverses_the_target_pieces_only():
    src = tf.ragged.constant([[5, 6], [7]], dtype=tf.int32)
    tgt = tf.ragged.constant([[8], [9, 10, 11]], dtype=tf.int32)
    (source, decoder_input), labels = make_examples(src, tgt, reverse_target=True)
    assert source.to_list() == [[5, 6, EOS_ID], [7, EOS_ID]]
    assert decoder_input.to_list() == [[BOS_ID, 8], [BOS_ID, 11, 10, 9]]
    assert labels.to_list() == [[8, EOS_ID], [11, 10, 9, EOS_ID]]


def _check_row(source, decoder_input, labels):
    """One padded row obeys the example contract; returns its (source, target) lengths."""
    n_src, n_tgt = int(np.sum(source != PAD_ID)), int(np.sum(labels != PAD_ID))
    assert (source[n_src:] == PAD_ID).all() and (labels[n_tgt:] == PAD_ID).all()
    assert source[n_src - 1] == EOS_ID and EOS_ID not in source[:n_src - 1]
    assert labels[n_tgt - 1] == EOS_ID and decoder_input[0] == BOS_ID
    np.testing.assert_array_equal(decoder_input[1:n_tgt], labels[:n_tgt - 1])
    assert (decoder_input[n_tgt:] == PAD_ID).all()
    return n_src, n_tgt


@pytest.mark.parametrize("num_replicas", [1, 3, 4])
def test_batches_respect_budget_and_replicas(tokenizer, pairs, num_replicas):
    batch_tokens, max_length = 600, 40
    dataset = train_dataset(pairs, tokenizer, batch_tokens=batch_tokens, max_length=max_length,
                            num_replicas=num_replicas, seed=0, repeat=False)
    plan = dict(bucket_plan(batch_tokens, max_length, num_replicas))
    rows = 0
    for (source, decoder_input), labels in dataset.as_numpy_iterator():
        batch, length = source.shape
        assert source.dtype == decoder_input.dtype == labels.dtype == np.int32
        assert decoder_input.shape == labels.shape == (batch, length)
        assert length % 8 == 0 and plan[length] == batch
        assert batch % num_replicas == 0 and batch * length <= batch_tokens
        assert (batch // num_replicas) * length <= batch_tokens // num_replicas
        for row in zip(source, decoder_input, labels, strict=True):
            assert length - 8 < max(_check_row(*row)) <= min(length, max_length)
        rows += batch
    assert rows > 500


def test_bucket_plan_values_and_too_small_budget():
    assert bucket_plan(1000, max_length=20, num_replicas=3) == [(8, 123), (16, 60), (24, 39)]
    with pytest.raises(ValueError, match=r"batch_tokens=100 is too small.* = 128"):
        bucket_plan(100, max_length=64, num_replicas=2)
    with pytest.raises(ValueError, match="`num_replicas` must be an integer >= 1, got 0"):
        bucket_plan(100, num_replicas=0)


def test_token_budget():
    budget = TokenBudget(25_000, num_replicas=8, accumulation_steps=2)
    assert (budget.per_step, budget.per_replica) == (12_500, 1_562)
    with pytest.raises(ValueError, match="accumulation_steps=0"):
        TokenBudget(25_000, accumulation_steps=0)


def test_global_batches_split_evenly_over_replicas(tokenizer, pairs):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs 2 logical CPU devices (set up by tests/conftest.py)")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = train_dataset(pairs, tokenizer, batch_tokens=512, max_length=32,
                            num_replicas=2, seed=0)
    distributed = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in range(5):
        (source, _), labels = next(distributed)
        shapes = [t.shape for t in strategy.experimental_local_results(source)]
        assert len(shapes) == 2 and shapes[0] == shapes[1] and shapes[0][0] > 0
        assert shapes[0][0] * shapes[0][1] <= 512 // 2


def test_filter_counts_on_toy_corpus(tokenizer, caplog):
    src_ids = tokenizer.tokenize("Two young men are outside.").numpy()
    max_length = len(src_ids) + 1  # this sentence plus EOS fits exactly
    toy = _pairs(
        ("Two young men are outside.", "Zwei Männer."),   # kept (exactly max_length)
        ("Two young men are outside!!", "Zwei Männer."),  # over-long by one token or more
        ("", "Hallo."),                                   # empty source
        ("Hello.", "   "),                                # whitespace-only target: empty
        ("A dog.", "Ein Hund läuft " * 20),               # over-long target
        ("w" * 1_000_000, ""),                            # huge line: over-long, not tokenized
        ("A cat.", "Eine Katze."),                        # kept
    )
    with caplog.at_level(logging.INFO, logger="tfxformer.data.pipeline"):
        stats = count_filtered(toy, tokenizer, max_length=max_length, batch_size=3)
    assert (stats.total, stats.empty, stats.too_long, stats.kept) == (7, 2, 3, 2)
    assert f"filtered 2 empty, 3 over-long (> {max_length} tokens incl. BOS/EOS) of 7 pairs" in (
        caplog.text)
    kept = list(tokenize_pairs(toy, tokenizer, max_length=max_length).as_numpy_iterator())
    assert len(kept) == stats.kept
    (source, _), _ = kept[0]
    np.testing.assert_array_equal(source, [*src_ids, EOS_ID])


def test_eval_dataset_keeps_order_and_references(tokenizer):
    en, de = _lines("val", "en", 10), _lines("val", "de", 10)
    dataset = eval_dataset(_pairs(*zip(en, de, strict=True)), tokenizer, batch_size=4)
    references, sizes = [], []
    for (source, decoder_input), labels, texts in dataset.as_numpy_iterator():
        sizes.append(len(source))
        assert source.shape == decoder_input.shape == labels.shape
        assert source.shape[1] % 8 == 0
        for row in zip(source, decoder_input, labels, strict=True):
            _check_row(*row)
        decoded = tokenizer.detokenize(labels).numpy().tolist()
        assert decoded == texts["reference"].tolist()
        assert tokenizer.detokenize(source).numpy().tolist() == texts["source"].tolist()
        references += [t.decode() for t in texts["reference"]]
    assert sizes == [4, 4, 2] and references == de
    plain = eval_dataset(_pairs(("a", "b")), tokenizer, with_text=False)
    assert len(plain.element_spec) == 2
