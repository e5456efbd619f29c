"""Tests of tfxformer.data.tokenizer: shared SentencePiece BPE vocabulary (§5.1)."""

import io
import itertools
import logging
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import shared_data

from tfxformer.data import (
    BOS_ID,
    EOS_ID,
    MODEL_FILENAME,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    iter_lines,
    keras_tokenizer,
    train_tokenizer,
)

VOCAB_SIZE = 500


def _train_lines(n: int) -> list[str]:
    en = itertools.islice(iter_lines(shared_data("multi30k", "train.en")), n)
    de = itertools.islice(iter_lines(shared_data("multi30k", "train.de")), n)
    return [line for pair in zip(en, de, strict=True) for line in pair]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(_train_lines(2000), vocab_size=VOCAB_SIZE)


def _normalized(text: str) -> str:
    """What SentencePiece's nmt_nfkc normalisation makes of plain text."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _round_trip(tokenizer: Tokenizer, texts: list[str]) -> list[str]:
    decoded = tokenizer.detokenize(tokenizer.tokenize(texts)).numpy()
    return [t.decode("utf-8") for t in decoded]


def test_special_ids_are_pad_unk_bos_eos(tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    pieces = tokenizer.id_to_piece([0, 1, 2, 3]).numpy().tolist()
    assert pieces == [b"<pad>", b"<unk>", b"<s>", b"</s>"]
    assert tokenizer.vocab_size == VOCAB_SIZE


def test_round_trip_on_unseen_multi30k_lines(tokenizer):
    lines = []
    for lang in ("en", "de"):
        lines += list(itertools.islice(iter_lines(shared_data("multi30k", f"val.{lang}")), 300))
    assert sum(any(c in line for c in "äöüÄÖÜß") for line in lines) > 50
    ids = tokenizer.tokenize(lines)
    assert ids.dtype == tf.int32
    flat = ids.flat_values.numpy()
    assert flat.min() >= 4, "real text must not produce pad/unk/bos/eos"
    assert _round_trip(tokenizer, lines) == [_normalized(line) for line in lines]


def test_round_trip_on_odd_strings(tokenizer):
    odd = ["", "   ", "a  b\t c ", "Grüße aus Köln, Straße Nr. 5!", "😀 emoji", "漢字テスト",
           "ﬁne ligature", "„Anführungszeichen“ «guillemets»", "\u00a0nbsp", "x" * 3000,
           "ÄÖÜ äöü ß ẞ", "tab\tand\nnewline"]
    ids = tokenizer.tokenize(odd)
    assert UNK_ID not in ids.flat_values.numpy(), "byte fallback must spell unseen chars"
    assert _round_trip(tokenizer, odd) == [_normalized(s) for s in odd]


def test_detokenize_drops_specials_and_stops_at_first_eos(tokenizer):
    ids = tokenizer.tokenize("Ein Hund läuft.").numpy().tolist()
    noisy = [BOS_ID, *ids[:2], UNK_ID, *ids[2:], EOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]
    dense = np.array([noisy, [BOS_ID, *ids] + [PAD_ID] * (len(noisy) - len(ids) - 1)])
    expected = [b"Ein Hund l\xc3\xa4uft.", b"Ein Hund l\xc3\xa4uft."]
    assert tokenizer.detokenize(dense).numpy().tolist() == expected
    ragged = tf.ragged.constant([noisy, [*ids, EOS_ID]], dtype=tf.int32)
    assert tokenizer.detokenize(ragged).numpy().tolist() == expected
    assert tokenizer.detokenize(tf.constant(noisy)).numpy() == expected[0]  # one sequence
    assert tokenizer.detokenize([[EOS_ID, *ids]]).numpy().tolist() == [b""]
    beams = tokenizer.detokenize(np.stack([dense, dense]))  # (2, 2, T) -> (2, 2)
    assert beams.shape == (2, 2) and beams.numpy().tolist() == [expected, expected]


def test_works_inside_tf_function(tokenizer):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return tokenizer.detokenize(tokenizer.tokenize(texts))

    assert round_trip(tf.constant(["Zwei Männer."])).numpy().tolist() == [b"Zwei M\xc3\xa4nner."]


def test_save_and_load(tokenizer, tmp_path):
    path = tokenizer.save(str(tmp_path / "run"))
    assert path == str(tmp_path / "run" / MODEL_FILENAME)
    for source in (str(tmp_path / "run"), path):
        loaded = Tokenizer.load(source)
        assert loaded.spm_bytes == tokenizer.spm_bytes
    with pytest.raises(FileNotFoundError, match=r"nothing.*spm\.model"):
        Tokenizer.load(str(tmp_path / "nothing"))


def test_rejects_model_with_other_special_ids():
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_train_lines(200)),
                                   model_writer=writer, vocab_size=100, minloglevel=2)
    with pytest.raises(ValueError, match=r"requires \{'pad': 0, 'unk': 1, 'bos': 2, 'eos': 3\}"):
        Tokenizer(writer.getvalue())


def test_survives_set_seed(tokenizer):
    # tf.random.set_seed clears the eager kernel cache (tensorflow/text issue 570).
    expected = tokenizer.tokenize(["Ein Hund."]).to_list()
    tf.random.set_seed(7)
    assert tokenizer.tokenize(["Ein Hund."]).to_list() == expected


def test_saved_model_round_trip(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.round_trip = tf.function(
        lambda texts: tokenizer.detokenize(tokenizer.tokenize(texts).to_tensor()),
        input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    assert loaded.round_trip(tf.constant(["Grüße!"])).numpy().tolist() == ["Grüße!".encode()]


def test_keras_tokenizer_gives_the_same_ids(tokenizer):
    lines = _train_lines(5)
    keras_ids = keras_tokenizer(tokenizer)(tf.constant(lines))
    keras_ids = keras_ids if isinstance(keras_ids, list) else keras_ids.to_list()
    assert keras_ids == tokenizer.tokenize(lines).to_list()


def test_training_is_bounded_and_logged(caplog):
    lines = _train_lines(1000) + ["y" * 5000]
    with caplog.at_level(logging.INFO, logger="tfxformer.data.tokenizer"):
        tokenizer = train_tokenizer(lines, vocab_size=400, max_sentences=500)
    assert tokenizer.vocab_size == 400
    assert "from 2001 lines (500 sampled at most, 1 skipped as longer than 4192 bytes)" in (
        caplog.text)


def test_impossible_vocab_size_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab_size=5000"):
        train_tokenizer(_train_lines(10), vocab_size=5000)
