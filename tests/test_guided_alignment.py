"""Guided alignment (Garg et al., 2019): word links of training pairs as piece links, the
alignment loss in the train step, the supervised head as the model's alignments, and
scripts/align.py, which makes the links from a model's own attention."""

import contextlib
import io
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over
from support.reliability import ROOT, script_args, tiny_corpus, train_wmt

from tfxformer import Transformer
from tfxformer.analysis.word_alignment import symmetrized
from tfxformer.config import ModelConfig
from tfxformer.data import alignments, pipeline
from tfxformer.data.tokenizer import Tokenizer
from tfxformer.losses import guided_alignment_nll
from tfxformer.schedules import paper_adam
from tfxformer.trainer import Trainer

VOCAB = 40


# --- links -------------------------------------------------------------------------------

def test_piece_words_start_a_word_at_the_marker_and_at_each_rows_first_piece():
    pieces = tf.ragged.constant([["▁A", "▁dog", "s", "▁runs"], ["x", "y", "▁b"], []])
    assert alignments.piece_words(pieces).to_list() == [[0, 1, 1, 2], [0, 0, 1], []]


def test_parse_pharaoh_reads_links_and_names_a_bad_one():
    links = alignments.parse_pharaoh(tf.constant(["0-0 1-2", "", " 3-1 "]))
    assert links.to_list() == [[[0, 0], [1, 2]], [], [[3, 1]]]
    with pytest.raises(tf.errors.InvalidArgumentError, match="1x2"):
        alignments.parse_pharaoh(tf.constant(["0-0 1x2"]))
    with pytest.raises(ValueError, match="'1-'"):
        alignments.read_links("0-0 1-")


def test_link_matrix_links_every_piece_of_both_words_and_drops_links_past_the_words():
    source_words = tf.constant([0, 1, 1, 2, -1])  # "▁A ▁do gs ▁run </s>"
    target_words = tf.constant([0, 0, 1, -1])  # "▁Ei n ▁Hund </s>"
    links = tf.constant([[0, 0], [1, 1], [5, 0], [0, 7]])
    np.testing.assert_array_equal(alignments.link_matrix(source_words, target_words, links), [
        [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])


def test_symmetrize_follows_koehns_heuristics():
    forward = {(0, 0), (1, 1), (2, 1), (3, 3)}
    backward = {(0, 0), (1, 1), (2, 2), (3, 2)}
    assert alignments.symmetrize(forward, backward, "intersection") == {(0, 0), (1, 1)}
    assert alignments.symmetrize(forward, backward, "union") == forward | backward
    # grown from the intersection: (2, 1) and (2, 2) touch (1, 1) with a word unaligned;
    # then (3, 3) and (3, 2) touch (2, 2)... (3, 2) links source 3, still unaligned
    assert alignments.symmetrize(forward, backward, "grow-diag-final-and") == {
        (0, 0), (1, 1), (2, 1), (2, 2), (3, 2), (3, 3)}
    # a link of two words aligned to nothing else: only "-and" ... both must be free
    lone = alignments.symmetrize({(0, 0), (1, 1)}, {(0, 0), (1, 0)}, "grow-diag-final-and")
    assert lone == {(0, 0), (1, 1), (1, 0)}
    assert alignments.symmetrize({(0, 0), (2, 0)}, {(0, 0)}, "grow-diag-final-and") == {(0, 0)}
    assert alignments.symmetrize({(0, 0), (2, 0)}, {(0, 0)}, "grow-diag-final") == {
        (0, 0), (2, 0)}
    with pytest.raises(ValueError, match="accepted"):
        alignments.symmetrize(forward, backward, "grow")
    assert list(symmetrized(["0-0 1-1"], ["0-0 1-1"], "intersection")) == ["0-0 1-1"]
    assert list(symmetrized(["0-1"], ["0-1"], "intersection")) == [""]  # j-i swapped


def test_train_dataset_carries_each_pairs_piece_links(spm_model):
    tokenizer = Tokenizer(spm_model)
    pairs = tf.data.Dataset.from_tensor_slices((["a b", "c d e"], ["x y", "z w v"]))
    links = tf.data.Dataset.from_tensor_slices(["0-1 1-0", "2-0"])
    options = dict(batch_tokens=16, max_length=8, shuffle_buffer=0, repeat=False)
    for reverse in (False, True):
        (source, _), labels, matrix = next(iter(pipeline.train_dataset(
            pairs, tokenizer, word_links=links, reverse_target=reverse, **options)))
        assert matrix.shape == (2, 8, 8) and matrix.dtype == tf.float32
        for row in range(2):
            source_pieces = tokenizer.id_to_piece(source[row]).numpy()
            label_pieces = tokenizer.id_to_piece(labels[row]).numpy()
            for t, s in zip(*np.nonzero(matrix[row].numpy()), strict=True):
                assert source_pieces[s] not in (b"</s>", b"<pad>")
                assert label_pieces[t] not in (b"</s>", b"<pad>")
        words = [tokenizer.id_to_piece(labels[0]).numpy()[t] for t in
                 np.nonzero(matrix[0].numpy()[:, 0])[0]]  # source word 0 "a" -> target 1 "y"
        assert b"".join(words).replace("▁".encode(), b"") == b"y"
    with pytest.raises(ValueError, match="token cache"):
        pipeline.train_dataset(None, tokenizer, token_cache=object(), word_links=links,
                               **options)


# --- loss and train step -----------------------------------------------------------------

def test_guided_alignment_nll_is_the_cross_entropy_against_the_normalised_links():
    attention = tf.constant([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]])
    links = tf.constant([[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    loss, pieces = guided_alignment_nll(attention, links)
    expected = -(0.5 * np.log(0.5) + 0.5 * np.log(0.25)) - np.log(0.6)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    assert float(pieces) == 2.0


def _batch(size=4, length=6):
    rng = np.random.default_rng(3)
    source = rng.integers(4, VOCAB, (size, length)).astype("int32")
    source[:, -1] = 3
    target = rng.integers(4, VOCAB, (size, length)).astype("int32")
    decoder_in = np.concatenate([np.full((size, 1), 2, "int32"), target[:, :-1]], axis=1)
    labels = np.concatenate([target[:, :-1], np.full((size, 1), 3, "int32")], axis=1)
    links = np.zeros((size, length, length), "float32")
    for t in range(length - 1):  # piece t of the target is linked to piece t of the source
        links[:, t, t] = 1.0
    return (source, decoder_in), labels, links


def _trainer(weight, strategy=None, weights=None):
    strategy = strategy or strategy_over(1)
    with strategy.scope():
        model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0,
                                        alignment_heads=1)
        model.build()
        if weights is not None:
            model.set_weights(weights)
        optimizer = paper_adam(3e-3)
    return Trainer(model, optimizer, strategy, alignment_weight=weight)


def test_the_train_step_adds_lambda_times_the_alignment_loss_of_the_models_alignment_head():
    inputs, labels, links = _batch()
    guided = _trainer(0.5)
    plain = _trainer(0.0, weights=guided.model.get_weights())
    loss, _ = guided.gradients((inputs, labels, links))
    base, _ = plain.gradients((inputs, labels))
    model = guided.model
    memory, mask = model.encode(inputs[0])
    attention = model.cross_attention(inputs[1], memory, mask)  # the model's: layer -2, head 0
    _, weights = model.decode(inputs[1], memory, mask, return_attention_scores=True)
    np.testing.assert_allclose(attention, weights[-2]["cross"][:, 0], rtol=1e-6)
    tokens = float(np.sum(labels != 0))
    expected = float(base) + 0.5 * float(guided_alignment_nll(attention, links)[0]) / tokens
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="R-Drop"):
        Trainer(model, paper_adam(1e-3), strategy_over(1), r_drop=0.1,
                alignment_weight=0.05)


def test_two_replicas_take_the_same_guided_step_as_one():
    inputs, labels, links = _batch()
    one = _trainer(1.0)
    two = _trainer(1.0, strategy_over(2), one.model.get_weights())
    batches = iter([(inputs, labels, links)] * 2)
    a, b = one.train_step(batches), two.train_step(batches)
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)


def test_training_with_links_teaches_the_head_to_attend_as_they_say():
    inputs, labels, links = _batch()
    guided = _trainer(1.0)
    plain = _trainer(0.0, weights=guided.model.get_weights())

    def linked_mass(trainer):
        model = trainer.model
        memory, mask = model.encode(inputs[0])
        attention = model.cross_attention(inputs[1], memory, mask).numpy()
        return float(np.sum(attention * links) / np.sum(links))

    before = linked_mass(guided)
    for _ in range(30):
        guided.train_step(iter([(inputs, labels, links)]))
        plain.train_step(iter([(inputs, labels)]))
    assert linked_mass(guided) > max(0.6, 2 * before), (before, linked_mass(guided))
    assert linked_mass(plain) < 0.5 * linked_mass(guided)


# --- the model's alignment head ----------------------------------------------------------

def test_alignment_settings_round_trip_and_are_checked():
    config = ModelConfig(vocab_size=50, num_heads=4, alignment_layer=-1, alignment_heads=2)
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert ModelConfig.from_dict({"vocab_size": 50}).alignment_heads == 0  # older records
    with pytest.raises(ValueError, match="alignment_heads"):
        ModelConfig(num_heads=4, alignment_heads=5)
    model = Transformer(config)
    assert Transformer.from_config(model.get_config()).model_config == config
    source = tf.constant([[5, 6, 7, 3]])
    target = tf.constant([[2, 8, 9]])
    memory, mask = model.encode(source)
    _, weights = model.decode(target, memory, mask, return_attention_scores=True)
    np.testing.assert_allclose(model.cross_attention(target, memory, mask),
                               tf.reduce_mean(weights[-1]["cross"][:, :2], axis=1), rtol=1e-6)
    np.testing.assert_allclose(model.cross_attention(target, memory, mask, layer=0, heads=0),
                               tf.reduce_mean(weights[0]["cross"], axis=1), rtol=1e-6)


# --- the scripts -------------------------------------------------------------------------

def _align_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "align_script", os.path.join(ROOT, "scripts", "align.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_align_script_writes_a_line_per_pair_and_checks_the_reverse_direction(
        one_replica_reference, tmp_path, capsys):
    corpus, run = one_replica_reference["corpus"], one_replica_reference["run"]
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    for path, lang in ((src, "en"), (tgt, "de")):
        with open(os.path.join(corpus, f"train.{lang}"), encoding="utf-8") as f:
            path.write_text("".join(f.readlines()[:7]) + "\n", encoding="utf-8")  # + an empty
    script = _align_script()
    output = tmp_path / "a.align"
    assert script.main(["--model", run, "--src", str(src), "--tgt", str(tgt),
                        "--output", str(output), "--batch-size", "3"]) == 0
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 8 and lines[-1] == ""
    sources = src.read_text(encoding="utf-8").splitlines()
    targets = tgt.read_text(encoding="utf-8").splitlines()
    for line, source, target in zip(lines[:-1], sources[:-1], targets[:-1], strict=True):
        links = alignments.read_links(line)
        assert links and all(i < len(source.split()) and j < len(target.split())
                             for i, j in links)
        assert {j for _, j in links} == set(range(len(target.split())))  # each target word
    assert "aligned 8 pairs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        script.main(["--model", run, "--reverse-model", run, "--src", str(src),
                     "--tgt", str(tgt)])
    assert stop.value.code == 2
    assert "translates en->de; the reverse of --model is de->en" in capsys.readouterr().err


def test_train_wmt_guided_alignment_trains_the_head_its_exports_read(tmp_path):
    corpus = tiny_corpus(tmp_path / "data", lines=120)
    links = tmp_path / "train.align"
    with open(os.path.join(corpus, "train.en"), encoding="utf-8") as f:
        links.write_text("".join(" ".join(f"{i}-{i}" for i in range(len(line.split()) - 1))
                                 + "\n" for line in f), encoding="utf-8")
    short = tmp_path / "short.align"
    short.write_text("0-0\n" * 5)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert train_wmt.main(script_args(corpus, str(tmp_path / "bad"), 2,
                                          guided_alignment=str(short))) == 2
    assert "has 5 lines, the training split" in err.getvalue()
    with contextlib.redirect_stderr(err):
        assert train_wmt.main(script_args(corpus, str(tmp_path / "bad"), 2, r_drop=0.1,
                                          guided_alignment=str(links))) == 2
    assert "--guided-alignment and --r-drop do not go together" in err.getvalue()
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert train_wmt.main(script_args(corpus, str(run), 4, guided_alignment=str(links),
                                          guided_alignment_weight=0.5)) == 0
    from tfxformer.pretrained import load_run_dir

    model, record, _ = load_run_dir(Transformer, str(run))
    assert (model.model_config.alignment_layer, model.model_config.alignment_heads) == (-2, 1)
    assert record.train["guided_alignment"] == str(links)
