"""Per-token log-probabilities of beam search hypotheses (`beam_search(...,
token_log_probs=True)`): they add up to each hypothesis' log P, equal a teacher-forced
pass over it, and leave the default search as it was."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS, tiny_export_translator
from support.serving import run_script
from support.steering import SOURCES, cleaned, nbest_inputs

from tfxformer import Transformer
from tfxformer.decoding import beam_search, score_targets
from tfxformer.decoding.beam_search import length_normalizer
from tfxformer.decoding.steering import make_steering
from tfxformer.ids import EOS_ID
from tfxformer.serving import Translator
from tfxformer.serving.nbest import Hypothesis, moses_lines

VOCAB = 40
SOURCE = tf.constant([[7, 8, 9, 10, EOS_ID], [11, 12, EOS_ID, 0, 0], [13, EOS_ID, 0, 0, 0]])


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(3)
    return Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)


def _search(model, **options):
    options = {"beam_size": 3, "alpha": 0.6, "extra_length": 6, **options}
    return beam_search(model, SOURCE, **options)


@pytest.fixture(scope="module")
def tracked(model):
    """_search(model, token_log_probs=True), searched once for the module's tests (the
    search is deterministic; eagerly it runs op by op)."""
    return _search(model, token_log_probs=True)


def _assert_sums(out, alpha, length_normalization):
    """Each real hypothesis' token log-probabilities add up to score × normalizer and
    are 0 after its end."""
    ids, lengths = out.ids.numpy(), out.lengths.numpy()
    token = out.token_log_probs.numpy()
    assert token.shape == ids.shape and token.dtype == np.float32
    ends = ids[np.arange(ids.shape[0])[:, None], np.arange(ids.shape[1])[None, :],
               np.maximum(lengths - 1, 0)] == EOS_ID
    normalizer = length_normalizer(lengths, alpha, length_normalization, ends).numpy()
    real = out.scores.numpy() > -1e8
    assert real.any()
    np.testing.assert_allclose(token.sum(-1)[real], (out.scores.numpy() * normalizer)[real],
                               rtol=1e-5, atol=1e-4)
    after = np.arange(ids.shape[2])[None, None, :] >= lengths[..., None]
    assert np.all(token[after & real[..., None]] == 0.0)


@pytest.mark.parametrize("length_normalization", ["gnmt", "length"])
def test_token_log_probs_add_up_to_the_score(model, length_normalization):
    out = _search(model, length_normalization=length_normalization, token_log_probs=True)
    _assert_sums(out, 0.6, length_normalization)


def test_default_search_is_unchanged(model, tracked):
    """Without the flag no log-probabilities are returned; with it the hypotheses, scores
    and steps are the same."""
    plain = _search(model)
    assert plain.token_log_probs is None
    for name in ("ids", "lengths", "scores", "steps"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(tracked, name))


def test_token_log_probs_equal_teacher_forced_scores(model, tracked):
    """Without steering the search's distribution is the model's: each hypothesis'
    log-probabilities are those of a teacher-forced pass over it."""
    out = tracked
    for k in range(3):
        forced = score_targets(model, SOURCE, out.ids[:, k])
        np.testing.assert_allclose(out.token_log_probs[:, k], forced.token_log_probs,
                                   rtol=1e-4, atol=1e-4)


def test_static_cache_gives_the_same_token_log_probs(model, tracked):
    dynamic = tracked
    static = _search(model, token_log_probs=True, static_cache=True)
    np.testing.assert_array_equal(dynamic.ids, static.ids)
    np.testing.assert_allclose(dynamic.token_log_probs, static.token_log_probs, atol=1e-5)


def test_steered_and_constrained_token_log_probs_add_up(model):
    """Under a repetition penalty, a forced prefix and constraints the log-probabilities
    are those of the steered distribution: they still add up to the score."""
    steering = make_steering(3, repetition_penalty=1.5,
                             prefix=tf.ragged.constant([[5, 6], [], []]),
                             constraints=tf.ragged.constant([[[20]], [[21, 22]], []],
                                                            ragged_rank=2))
    out = _search(model, steering=steering, token_log_probs=True)
    _assert_sums(out, 0.6, "gnmt")
    assert np.all(out.ids.numpy()[0, :, :2] == [5, 6])


@pytest.fixture(scope="module")
def processor(spm_model):
    return spm.SentencePieceProcessor(model_proto=spm_model)


@pytest.fixture(scope="module")
def translator(tiny_export, spm_model):
    """The tiny export in process (conftest): beam 3, extra length 4, chunks of 3."""
    return tiny_export_translator(tiny_export, spm_model)


def test_translate_nbest_returns_pieces_and_their_log_probs(translator, processor):
    """`tokens` and `token_log_probs` (N, K, T): each hypothesis' pieces, EOS "</s>", their
    log-probabilities adding up to score × normalizer; "" / 0 for blank texts, padding and
    cells beyond a text's count; with a target prefix's alternatives too."""
    out = translator.translate_nbest(tf.constant(SOURCES), **nbest_inputs(
        len(SOURCES), num_hypotheses=[3, 2, 3, 2, 2], target_prefix=["", "", "", "Ein", ""]))
    words, values = out["tokens"].numpy(), out["token_log_probs"].numpy()
    n, k = out["scores"].shape
    assert words.shape[:2] == (n, k) == values.shape[:2] and values.dtype == np.float32
    for i in range(n):
        for j in range(k):
            pieces = [w.decode("utf-8") for w in words[i, j] if w]
            score = out["scores"].numpy()[i, j]
            if not np.isfinite(score) or not SOURCES[i]:
                assert pieces == [] and not values[i, j].any()
                continue
            text = out["translations"].numpy()[i, j].decode("utf-8")
            assert cleaned(processor.decode_pieces([p for p in pieces if p != "</s>"])) == text
            length = len(pieces)
            normalizer = ((5.0 + length) / 6.0) ** 0.6
            np.testing.assert_allclose(values[i, j].sum(), score * normalizer,
                                       rtol=1e-5, atol=1e-4)
            assert not values[i, j, length:].any()


def test_hypotheses_keep_the_two_field_form_and_write_a_token_field():
    """`Hypothesis(text, score)` still works (no pieces); `moses_lines(...,
    token_scores=True)` adds the field of 'piece=log-prob' pairs."""
    plain = Hypothesis("Ein Hund.", -0.5)
    assert plain.tokens == () and plain.token_log_probs == ()
    scored = Hypothesis("Ein Hund.", -0.5, ("▁Ein", "▁Hund", ".", "</s>"),
                        (-0.25, -0.5, -0.125, -0.0625))
    assert moses_lines(3, [plain]) == ["3 ||| Ein Hund. ||| -0.500000"]
    assert moses_lines(3, [scored], token_scores=True) == [
        "3 ||| Ein Hund. ||| -0.500000 ||| ▁Ein=-0.250000 ▁Hund=-0.500000 .=-0.125000 "
        "</s>=-0.062500"]


def test_token_scores_need_n_best_and_no_ctranslate2_model(tmp_path, capsys):
    from support.ctranslate2 import fake_ct2_dir
    from support.serving import load_script

    with pytest.raises(SystemExit) as exit_:
        load_script("translate").main(["--model", str(tmp_path), "--token-scores"])
    assert exit_.value.code == 2 and "--token-scores adds a field" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        load_script("translate").main(["--model", fake_ct2_dir(tmp_path / "ct2"),
                                       "--n-best", "2", "--token-scores"])
    assert exit_.value.code == 2
    assert "not each token's log-probability" in capsys.readouterr().err


@pytest.mark.slow
def test_translate_script_writes_token_scores(tiny_export, translator):
    """translate.py --n-best 2 --token-scores on the export: the fourth field holds the
    signature's pieces and log-probabilities, adding up to score × normalizer."""
    stdout = run_script("translate", ["--model", tiny_export, "--n-best", "2",
                                      "--token-scores", "--batch-size", "3"],
                        stdin="".join(s + "\n" for s in SOURCES).encode())
    rows = [line.split(" ||| ") for line in stdout.split("\n")[:-1]]
    here = translator.translate_nbest(tf.constant(SOURCES),
                                      **nbest_inputs(5, num_hypotheses=2))
    expected = [(i, j) for i, scores in enumerate(here["scores"].numpy())
                for j, s in enumerate(scores) if s != -np.inf]
    assert len(rows) == len(expected) and all(len(r) == 4 for r in rows)
    for row, (i, j) in zip(rows, expected, strict=True):
        pairs = [pair.rsplit("=", 1) for pair in row[3].split()]
        pieces = [w.decode("utf-8") for w in here["tokens"].numpy()[i, j] if w]
        assert [p for p, _ in pairs] == pieces
        values = np.array([float(v) for _, v in pairs])
        np.testing.assert_allclose(values, here["token_log_probs"].numpy()[i, j, :len(pieces)],
                                   atol=2e-6)
        normalizer = ((5.0 + len(pieces)) / 6.0) ** 0.6 if pieces else 1.0
        np.testing.assert_allclose(values.sum(), float(row[2]) * normalizer, atol=1e-3)


@pytest.mark.slow  # traces translate_nbest once more
def test_right_to_left_pieces_are_in_reading_order(tiny_export, spm_model, processor):
    """A right-to-left model's (`reverse_target`) pieces come in reading order, each with
    its own log-probability, an EOS last: they read as the translation and add up."""
    rtl = Translator(Transformer.from_preset(tiny_export), spm_model, reverse_target=True,
                     **TINY_EXPORT_OPTIONS)
    out = rtl.translate_nbest(tf.constant(SOURCES[:2]), **nbest_inputs(2, num_hypotheses=2))
    for i in range(2):
        for j in range(2):
            pieces = [w.decode("utf-8") for w in out["tokens"].numpy()[i, j] if w]
            assert "</s>" not in pieces[:-1]  # last where it ended (else at its limit)
            assert cleaned(processor.decode_pieces([p for p in pieces if p != "</s>"])) == \
                out["translations"].numpy()[i, j].decode("utf-8")
            normalizer = ((5.0 + len(pieces)) / 6.0) ** 0.6
            np.testing.assert_allclose(out["token_log_probs"].numpy()[i, j].sum(),
                                       out["scores"].numpy()[i, j] * normalizer, atol=1e-4)
