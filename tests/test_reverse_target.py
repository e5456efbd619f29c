"""Right-to-left models (`reverse_target`): the tools put their pieces back in order."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer, rundir
from tfxformer.data.tokenizer import sentencepiece_tokenizer
from tfxformer.decoding import score_targets
from tfxformer.ids import EOS_ID
from tfxformer.serving import Translator
from tfxformer.serving.export import _make_translator

TEXT = "A dog runs through the snow."


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(5)
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=48)
    model.build()
    return model


def _pieces(spm_model, text):
    return sentencepiece_tokenizer(spm_model).tokenize(tf.constant([text])).to_list()[0]


def test_detokenize_puts_a_right_to_left_output_back_in_reading_order(model, spm_model):
    pieces = _pieces(spm_model, TEXT)
    assert len(pieces) > 3
    forward = Translator(model, spm_model)
    backward = Translator(model, spm_model, reverse_target=True)
    ids = tf.constant([pieces + [EOS_ID, 0], pieces[::-1] + [EOS_ID, 0]], tf.int32)
    lengths = tf.constant([len(pieces) + 1] * 2, tf.int32)
    assert forward.detokenize(ids[:1], lengths[:1]).numpy()[0].decode() == TEXT
    assert backward.detokenize(ids[1:], lengths[1:]).numpy()[0].decode() == TEXT


def test_score_of_a_right_to_left_model_scores_the_reversed_pieces(model, spm_model):
    source = "Two dogs play."
    backward = Translator(model, spm_model, reverse_target=True)
    got = backward.score_pairs(tf.constant([source]), tf.constant([TEXT]))
    pieces = _pieces(spm_model, TEXT)
    src = tf.constant([_pieces(spm_model, source) + [EOS_ID]], tf.int32)
    want = score_targets(model, src, tf.constant([pieces[::-1] + [EOS_ID]], tf.int32))
    np.testing.assert_allclose(got["token_log_probs"].numpy()[0], want.token_log_probs[0],
                               rtol=1e-5, atol=1e-5)
    forward = Translator(model, spm_model).score_pairs(tf.constant([source]),
                                                       tf.constant([TEXT]))
    assert abs(float(forward["log_prob"][0]) - float(got["log_prob"][0])) > 1e-3


def test_the_run_record_carries_the_direction_to_the_export_and_to_a_resume(
        model, spm_model, tmp_path):
    record = rundir.RunRecord.from_dict({"model": model.model_config.to_dict(),
                                         "train": {"reverse_target": True}})
    assert record.reverse_target
    assert not rundir.RunRecord.from_dict({"model": model.model_config.to_dict()}).reverse_target
    assert _make_translator(model, record, spm_model).reverse_target
    written = rundir.make_record(model.model_config, "en", "de", 64, "tiny", spm_model,
                                 {"reverse_target": True})
    rundir.write_config(str(tmp_path), written)
    rundir.check_compatible(str(tmp_path), written)
    with pytest.raises(ValueError, match="reverse_target: True in the run dir, False now"):
        rundir.check_compatible(str(tmp_path), {**written, "train": {}})
