"""Tests of tfxformer.data.sampling: BPE-dropout subword regularisation of training text."""

import itertools
import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import shared_data
from sentencepiece import sentencepiece_model_pb2

from tfxformer.data import iter_lines, tokenize_pairs, train_dataset, train_tokenizer
from tfxformer.data.sampling import SubwordSampler
from tfxformer.train_config import TrainConfig
from tfxformer.training import _data_settings, prepare_token_cache

PAIRS = 300
SENTENCE = "Two young, White males are outside near many bushes."
OPTIONS = dict(batch_tokens=800, max_length=48, shuffle_buffer=100, seed=3)


def _lines(lang: str) -> list[str]:
    return list(itertools.islice(iter_lines(shared_data("multi30k", f"train.{lang}")), PAIRS))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_lines("en") + _lines("de"), vocab_size=400)


@pytest.fixture(scope="module")
def pairs() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((_lines("en"), _lines("de")))


def _rows(dataset) -> list[tuple]:
    """The source ids of each example of `tokenize_pairs`."""
    return [tuple(source.numpy().tolist()) for (source, _), _ in dataset]


def _batches(dataset, count: int) -> list:
    iterator = iter(dataset)
    return [tf.nest.map_structure(lambda t: t.numpy(), next(iterator)) for _ in range(count)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and (x == y).all()
        for p, q in zip(a, b, strict=True)
        for x, y in zip(tf.nest.flatten(p), tf.nest.flatten(q), strict=True))


def test_alpha_is_the_merge_dropout_probability(tokenizer):
    """SentencePiece's BPE-dropout: alpha 0 is the deterministic segmentation; a larger
    alpha drops more merges, so more distinct and longer segmentations of the same text;
    near 1 almost every piece is one character. The text never changes."""
    deterministic = tokenizer.tokenize(SENTENCE).numpy().tolist()
    distinct, lengths = [], []
    for alpha in (0.0, 0.05, 0.1, 0.3):
        rows = SubwordSampler(tokenizer.spm_bytes, alpha, seed=0).sample([SENTENCE] * 200, 0)
        if alpha == 0.0:
            assert all(row == deterministic for row in rows)
        distinct.append(len({tuple(row) for row in rows}))
        lengths.append(np.mean([len(row) for row in rows]))
        texts = tokenizer.detokenize(tf.ragged.constant(rows)).numpy()
        assert set(texts.tolist()) == {SENTENCE.encode()}
    assert distinct[0] == 1 and distinct[1] < distinct[2] < distinct[3], distinct
    assert lengths[0] < lengths[1] < lengths[2] < lengths[3], lengths
    rows = SubwordSampler(tokenizer.spm_bytes, 0.99, seed=0).sample([SENTENCE] * 20, 0)
    pieces = tokenizer.id_to_piece(tf.ragged.constant(rows).flat_values).numpy().tolist()
    single = sum(len(p.decode().lstrip("\u2581")) <= 1 for p in pieces)
    assert single > 0.95 * len(pieces), (single, len(pieces))


def test_the_same_seed_gives_the_same_segmentations_the_next_epoch_others(tokenizer, pairs):
    def rows():
        sampler = SubwordSampler(tokenizer.spm_bytes, 0.1, seed=0)
        return _rows(tokenize_pairs(pairs.repeat(2), tokenizer, sampler=sampler,
                                    batch_size=64))

    first = rows()
    assert len(first) == 2 * PAIRS and first == rows()
    epoch_1, epoch_2 = first[:PAIRS], first[PAIRS:]
    assert sum(a != b for a, b in zip(epoch_1, epoch_2, strict=True)) > 0.8 * PAIRS
    text = [tokenizer.detokenize([row]).numpy()[0] for row in (*epoch_1[:20], *epoch_2[:20])]
    assert text[:20] == text[20:]  # the same sentences, segmented anew
    batch = [SENTENCE] * 50
    one, other = (SubwordSampler(tokenizer.spm_bytes, 0.1, seed=seed) for seed in (0, 1))
    assert one.sample(batch, 4) == one.sample(batch, 4) != other.sample(batch, 4)
    assert one.sample(batch, 4) != one.sample(batch, 5)


def test_alpha_zero_gives_the_batches_of_the_unsampled_pipeline(tokenizer, pairs):
    count = 2 * PAIRS * 14 // OPTIONS["batch_tokens"]  # ~2 epochs
    sampler = SubwordSampler(tokenizer.spm_bytes, 0.0, seed=5)
    plain = _batches(train_dataset(pairs, tokenizer, **OPTIONS), count)
    assert _same(_batches(train_dataset(pairs, tokenizer, sampler=sampler, **OPTIONS), count),
                 plain)


def test_resume_mid_epoch_samples_what_an_unbroken_run_samples(tokenizer, pairs, tmp_path):
    """The tf.data checkpoint the training loop saves holds the stream position the
    sampling seeds come from: a restored pipeline continues as the unbroken one (here
    over 2 replicas: every batch splits evenly)."""
    def pipeline():
        sampler = SubwordSampler(tokenizer.spm_bytes, 0.1, seed=7)
        return train_dataset(pairs, tokenizer, sampler=sampler, num_replicas=2, **OPTIONS)

    straight = iter(pipeline())
    for _ in range(6):
        next(straight)
    saved = tf.train.Checkpoint(data=straight).write(str(tmp_path / "data"))
    want = [tf.nest.map_structure(lambda t: t.numpy(), next(straight)) for _ in range(15)]
    resumed = iter(pipeline())
    tf.train.Checkpoint(data=resumed).read(saved).assert_consumed()
    assert _same([tf.nest.map_structure(lambda t: t.numpy(), next(resumed))
                  for _ in range(15)], want)
    assert all(batch[1].shape[0] % 2 == 0 for batch in want)


def test_bad_alpha_and_a_non_bpe_vocabulary_are_refused(tokenizer):
    for alpha in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="`alpha` must be"):
            SubwordSampler(tokenizer.spm_bytes, alpha)
        with pytest.raises(ValueError, match="`subword_sampling` must be"):
            TrainConfig(model_dir="runs/x", subword_sampling=alpha).validate()
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.spm_bytes)
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    with pytest.raises(ValueError, match="UNIGRAM"):
        SubwordSampler(proto.SerializeToString(), 0.1)


def test_sampling_bypasses_the_token_cache_and_keys_the_pipeline_position(tmp_path, caplog):
    config = TrainConfig(model_dir=str(tmp_path), subword_sampling=0.1)
    logger = logging.getLogger("tfxformer")
    logger.addHandler(caplog.handler)  # the run's logger does not propagate
    try:
        with caplog.at_level(logging.INFO, logger="tfxformer"):
            assert prepare_token_cache(config, None, None, None, True) is None
    finally:
        logger.removeHandler(caplog.handler)
    assert "Token cache: not used with `subword_sampling` 0.1" in caplog.text
    assert _data_settings(config, 2)["subword_sampling"] == 0.1
    assert "subword_sampling" not in _data_settings(TrainConfig(model_dir="x"), 2)
