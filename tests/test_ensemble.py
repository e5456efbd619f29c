"""Ensemble decoding (tfxformer.decoding.ensemble): members' probabilities averaged in one
search, the Translator over an ensemble, its SavedModel export and scripts/export.py."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import BOS_ID, EOS_ID, beam_search, greedy_decode
from tfxformer.decoding.common import next_token_log_probs
from tfxformer.decoding.ensemble import ensemble_decoder, ensemble_log_probs

VOCAB = 40
SOURCE = tf.constant([[5, 6, 7, 3], [10, 11, 3, 0], [12, 3, 0, 0]])


def _tiny(seed, vocab_size=VOCAB, max_positions=32):
    tf.random.set_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=vocab_size, max_positions=max_positions)
    model.build()
    return model


@pytest.fixture(scope="module")
def pair():
    return _tiny(7), _tiny(8, max_positions=24)


def _assert_same(out, ref):
    np.testing.assert_array_equal(out.ids.numpy(), ref.ids.numpy())
    np.testing.assert_array_equal(out.lengths.numpy(), ref.lengths.numpy())
    np.testing.assert_allclose(out.scores.numpy(), ref.scores.numpy(), atol=1e-5)


def test_an_ensemble_of_one_model_twice_is_that_model(pair):
    model = pair[0]
    _assert_same(beam_search([model, model], SOURCE, beam_size=3, extra_length=2),
                 beam_search(model, SOURCE, beam_size=3, extra_length=2))
    _assert_same(greedy_decode((model, model), SOURCE, extra_length=2),
                 greedy_decode(model, SOURCE, extra_length=2))
    _assert_same(greedy_decode([model], SOURCE, extra_length=2),
                 greedy_decode(model, SOURCE, extra_length=2))


def _teacher_forced_probs(model, source, prefix):
    """(B, V) next-token probabilities of `model` after `prefix` (B, T), BOS first."""
    logits = model((source, prefix), training=False)
    return tf.nn.softmax(tf.cast(logits[:, -1], tf.float32)).numpy()


def test_greedy_ensemble_takes_the_argmax_of_the_averaged_probabilities(pair):
    out = greedy_decode(list(pair), SOURCE, extra_length=2, eos_id=None)
    prefix = np.full([SOURCE.shape[0], 1], BOS_ID)
    for t in range(out.ids.shape[1]):
        probs = (_teacher_forced_probs(pair[0], SOURCE, prefix)
                 + _teacher_forced_probs(pair[1], SOURCE, prefix)) / 2
        probs[:, [0, BOS_ID]] = 0.0  # PAD and BOS are never generated
        expected = probs.argmax(axis=1)
        running = out.lengths.numpy() > t
        np.testing.assert_array_equal(out.ids.numpy()[running, t], expected[running])
        prefix = np.concatenate([prefix, out.ids.numpy()[:, t:t + 1]], axis=1)
    # The limits are those of the smaller position table (24) and the source lengths.
    np.testing.assert_array_equal(out.lengths.numpy(), [4 + 2, 3 + 2, 2 + 2])


def test_ensemble_log_probs_are_normalized_and_left_as_they_are():
    logits = [tf.random.normal([5, VOCAB]), tf.random.normal([5, 1, VOCAB]) * 3.0]
    log_probs = ensemble_log_probs(logits)
    expected = np.log((tf.nn.softmax(logits[0]).numpy()
                       + tf.nn.softmax(logits[1][:, 0]).numpy()) / 2)
    np.testing.assert_allclose(log_probs.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(tf.reduce_logsumexp(log_probs, axis=-1).numpy(), 0.0,
                               atol=1e-5)
    renormalized = next_token_log_probs(log_probs).numpy()
    allowed = [i for i in range(VOCAB) if i not in (0, BOS_ID)]
    np.testing.assert_allclose(renormalized[:, allowed], log_probs.numpy()[:, allowed],
                               atol=1e-5)


def test_beam_ensemble_keeps_each_members_cache_with_its_beams(pair):
    """Sentences leave the batch and beams reorder: the growing-cache search equals the
    static-cache one, where nothing leaves."""
    growing = beam_search(list(pair), SOURCE, beam_size=3, extra_length=2)
    static = beam_search(list(pair), SOURCE, beam_size=3, extra_length=2, static_cache=True)
    _assert_same(growing, static)
    assert (growing.ids.numpy()[:, :, 0] != 0).all()


def test_members_share_the_vocabulary_and_the_smallest_position_table(pair):
    start = ensemble_decoder(list(pair), SOURCE, extra_length=50)  # tables of 32 and 24
    assert int(start.output_columns) == 24
    np.testing.assert_array_equal(start.limits.numpy(), [24, 24, 24])
    assert int(ensemble_decoder(list(pair), SOURCE, max_output_length=5).output_columns) == 5
    other = _tiny(9, vocab_size=VOCAB + 2)
    with pytest.raises(ValueError, match=r"vocabulary sizes are \[40, 42\]"):
        ensemble_decoder([pair[0], other], SOURCE)
    with pytest.raises(ValueError, match="at least one model"):
        beam_search([], SOURCE)


def test_an_ensemble_takes_a_shortlist(pair):
    model = pair[0]
    shortlist = tf.constant([0, 1, 2, 3, 5, 8, 13, 21, 34], tf.int32)
    _assert_same(beam_search([model, model], SOURCE, beam_size=2, extra_length=2,
                             shortlist=shortlist),
                 beam_search(model, SOURCE, beam_size=2, extra_length=2, shortlist=shortlist))
    assert EOS_ID in shortlist.numpy()


# --- serving: the Translator, export_ensemble, scripts/export.py --------------------------

SPM_VOCAB = 320
TEXTS = ["A dog runs in the park.", "", "Two men are talking.", "Ein Hund."]


@pytest.fixture(scope="module")
def members():
    return _tiny(3, SPM_VOCAB, max_positions=40), _tiny(4, SPM_VOCAB, max_positions=40)


@pytest.fixture(scope="module")
def ensemble_translator(members, spm_model):
    """The in-process Translator over both members (conftest's `spm_model`): beam 2, extra
    length 2, chunks of 3 (what test_ensemble_export_round_trip exports)."""
    from tfxformer.serving import Translator

    return Translator(list(members), spm_model, beam_size=2, extra_length=2, max_batch_size=3)


def _strings(output):
    return [t.decode("utf-8") for t in output["translation"].numpy()]


@pytest.mark.slow
def test_translator_over_an_ensemble_captures_every_member(members, spm_model,
                                                          ensemble_translator):
    """The same model twice translates as the model; the graph of two members reads the
    variables of both (what the export saves)."""
    from tfxformer.serving import Translator

    one = Translator(members[0], spm_model, beam_size=2, extra_length=2)
    twice = Translator([members[0], members[0]], spm_model, beam_size=2, extra_length=2)
    assert _strings(twice(tf.constant(TEXTS))) == _strings(one(tf.constant(TEXTS)))
    both = ensemble_translator
    captured = {id(v) for v in both.__call__.get_concrete_function().variables}
    # each member's own weights, or those its search derives from them beforehand
    derived = [[v for v in tf.nest.flatten(d) if v is not None] for d in both.derived_weights]
    assert len(derived) == len(members) and all(derived)
    assert captured >= {id(v) for d in derived for v in d}
    assert captured >= {id(m.embedding.embeddings.value) for m in members}
    assert both.model == list(members) and one.model is members[0]


def _preset_dirs(members, spm_model, root, other_vocabulary=None):
    paths = []
    for i, model in enumerate(members):
        vocabulary = other_vocabulary if i == 1 and other_vocabulary else spm_model
        paths.append(model.save_to_preset(str(root / f"member{i}"), tokenizer=vocabulary))
    return paths


def test_export_ensemble_refuses_other_vocabularies_naming_both_paths(members, spm_model,
                                                                      tmp_path):
    from support.serving import train_sentencepiece

    from tfxformer.serving import export_ensemble

    other = train_sentencepiece(lines=300)
    assert other != spm_model
    paths = _preset_dirs(members, spm_model, tmp_path, other_vocabulary=other)
    with pytest.raises(ValueError, match="member0.* and of .*member1.* differ"):
        export_ensemble(paths, str(tmp_path / "export"))
    with pytest.raises(ValueError, match="at least 2 models, got 1"):
        export_ensemble(paths[:1], str(tmp_path / "export"))
    assert not (tmp_path / "export").exists()


def test_export_script_takes_model_or_ensemble(capsys):
    from support.serving import load_script

    script = load_script("export")
    parser = script.build_parser()
    for argv in (["--export-dir", "x"], ["--model", "a", "--ensemble", "b", "c",
                                         "--export-dir", "x"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
    assert "one of the arguments --model --ensemble is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        script.main(["--ensemble", "a", "--export-dir", "x"])
    assert exit_.value.code == 2
    assert "--ensemble needs at least 2 models, got 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--ensemble", "a", "b", "--checkpoint", "c", "--export-dir", "x"])
    assert "--checkpoint applies to --model" in capsys.readouterr().err
    args = parser.parse_args(["--ensemble", "a", "b", "--export-dir", "x", "--beam-size", "2"])
    assert (args.ensemble, args.model, args.beam_size) == (["a", "b"], None, 2)


def _run_dir(model, spm_model, path):
    """A run dir as training writes it: config.json, spm.model, checkpoints/ckpt-3."""
    import json

    checkpoint = tf.train.Checkpoint(model=model)
    tf.train.CheckpointManager(checkpoint, str(path / "checkpoints"), max_to_keep=1,
                               checkpoint_name="ckpt").save(checkpoint_number=3)
    (path / "spm.model").write_bytes(spm_model)
    (path / "config.json").write_text(json.dumps(
        {"model": model.model_config.to_dict(), "src": "en", "tgt": "de", "max_length": 40}))
    return str(path)


@pytest.mark.slow
@pytest.mark.user_env
def test_ensemble_export_round_trip(members, spm_model, ensemble_translator, tmp_path,
                                    load_each_saved_model_once):
    """scripts/export.py --ensemble of a run dir and a preset dir → tf.saved_model.load →
    serving_default gives the in-process ensemble's strings; the export records its
    members and refuses to load as one model.

    The export holds all six signatures (the suite's ensemble export of every one:
    test_model_forms.py's holds the ones its tools read). load_translate_fn shares this
    test's load (its own load of an ensemble export: test_model_forms.py)."""
    import base64
    import json
    import os
    import sys

    import tensorflow_text  # noqa: F401
    from support.serving import FRESH_PROCESS, load_script, run_checked

    from tfxformer.serving import load_translate_fn

    run = _run_dir(members[0], spm_model, tmp_path / "run")
    preset = _preset_dirs(members, spm_model, tmp_path)[1]
    base = str(tmp_path / "export")
    assert load_script("export").main(["--ensemble", run, preset, "--export-dir", base,
                                       "--beam-size", "2", "--extra-length", "2",
                                       "--batch-size", "3"]) == 0
    version = os.path.join(base, "1")
    loaded = tf.saved_model.load(version)
    assert set(loaded.signatures) == {"serving_default", "translate_per_example",
                                      "translate_with_options", "translate_sampled",
                                      "translate_nbest", "score"}
    expected = ensemble_translator(tf.constant(TEXTS))
    served = loaded.signatures["serving_default"](text=tf.constant(TEXTS))
    assert _strings(served) == _strings(expected)
    np.testing.assert_allclose(served["score"].numpy(), expected["score"].numpy(), atol=1e-5)
    assert load_translate_fn(base)(TEXTS) == _strings(expected)
    # A process without tfxformer, and the session loader TF Serving uses, agree.
    inputs = json.dumps([base64.b64encode(t.encode()).decode() for t in TEXTS])
    fresh = json.loads(run_checked([sys.executable, "-c", FRESH_PROCESS, version,
                                    "translation"], input=inputs.encode()).strip().splitlines()[-1])
    assert fresh["translation"] == fresh["session"] == _strings(expected)
    assert not fresh["tfxformer_loaded"] and not fresh["unknown"]
    assert len(loaded.model_variables) == sum(len(m.weights) for m in members)
    for name in ("tf_serving_warmup_requests", "batching_parameters.txt"):
        assert os.path.isfile(os.path.join(version, "assets.extra", name))
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert [m["source"] for m in config["ensemble"]] == ["run", "member1"]
    assert config["ensemble"][1]["model"] == members[1].model_config.to_dict()
    assert (config["decoding"]["beam_size"], config["max_length"]) == (2, 40)
    with pytest.raises(ValueError, match=r"is an ensemble export of 2 models \(run, member1\); "
                                         r"expected a SavedModel export dir of one model"):
        Transformer.from_preset(version)
    with pytest.raises(ValueError, match="ensemble export of 2 models"):
        Transformer.from_preset(base)
