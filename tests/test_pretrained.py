"""Trained models as Keras models and as the start of a new run (tfxformer.pretrained):
`Transformer.from_preset(path)`, `Tokenizer.from_preset(path)`, `save_to_preset`, and
`scripts/train_wmt.py --init-from`."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import grappler_on, strategy_over
from support.reliability import (
    KILL_AT_SAVE_ENV,
    TRAIN_WMT,
    checkpoint_state,
    clean_env,
    model_tensors,
    run_main,
    script_args,
    tiny_corpus,
    train_wmt,
)
from support.serving import load_script

from tfxformer import Transformer, pretrained, rundir
from tfxformer.data import Tokenizer
from tfxformer.data.sources import load_corpus
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.schedules import TransformerSchedule, paper_adam
from tfxformer.trainer import Trainer
from tfxformer.training import training_dataset

SOURCE_STEPS = 30
PROCESS_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "data")


@pytest.fixture(scope="module")
def source(one_replica_reference):
    """conftest's tiny run: 30 steps, ckpt-28 and ckpt-30 averaged, and its export."""
    run, export = one_replica_reference["run"], one_replica_reference["export"]
    assert one_replica_reference["final"]["step"] == SOURCE_STEPS
    return {"run": run, "export": export, "version": os.path.join(export, "1")}


@pytest.fixture(scope="module")
def exported(source):
    """Transformer.from_preset of the source's export, loaded once (a SavedModel load is
    the slow part of these tests). Read-only: tests that train load their own."""
    return Transformer.from_preset(source["export"])


def _checkpoint_model(run, path):
    return pretrained.load_run_dir(Transformer, run, os.path.join(run, path))[0]


def _assert_same_weights(model, reference):
    keys = {pretrained.weight_key(w.path): w for w in reference.weights}
    assert len(model.weights) == len(keys)
    for weight in model.weights:
        np.testing.assert_array_equal(weight.numpy(), keys[pretrained.weight_key(weight.path)]
                                      .numpy(), err_msg=weight.path)


@pytest.mark.slow
def test_from_preset_loads_the_weights_of_a_run_dir_export_and_version_dir(source):
    averaged = _checkpoint_model(source["run"], "averaged/ckpt-30")
    latest = _checkpoint_model(source["run"], "checkpoints/ckpt-30")
    assert not np.array_equal(averaged.weights[0].numpy(), latest.weights[0].numpy())
    for path in (source["run"], source["export"], source["version"]):
        model = Transformer.from_preset(path)
        assert model.model_config == averaged.model_config
        _assert_same_weights(model, averaged)  # the run dir's averaged checkpoint first
    ids = (tf.constant([[5, 6, 7, 0]]), tf.constant([[2, 8, 9]]))
    np.testing.assert_allclose(model(ids), averaged(ids), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_tokenizer_from_preset_is_the_vocabulary_the_model_was_trained_with(source, exported,
                                                                             tmp_path):
    with open(os.path.join(source["run"], "spm.model"), "rb") as f:
        trained = f.read()
    exported.save_to_preset(tmp_path / "preset")
    for path in (source["run"], source["export"], source["version"], tmp_path / "preset"):
        tokenizer = Tokenizer.from_preset(path)
        assert tokenizer.spm_bytes == trained
    ids = Tokenizer(trained).tokenize(["A dog runs."]).to_list()
    assert tokenizer.tokenize(["A dog runs."]).to_list() == ids


@pytest.mark.slow
def test_save_to_preset_round_trips_weights_config_and_vocabulary(exported, tmp_path):
    model = exported
    folder = model.save_to_preset(str(tmp_path / "preset"))
    assert sorted(os.listdir(folder)) == ["config.json", "metadata.json", "model.weights.h5",
                                          "spm.model"]
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["registered_name"] == "tfxformer>Transformer"
    assert config["config"] == model.model_config.to_dict()
    again = Transformer.from_preset(folder)
    _assert_same_weights(again, model)
    again.save_to_preset(tmp_path / "twice")  # the vocabulary travels with the model
    with open(tmp_path / "twice" / "spm.model", "rb") as a, \
            open(os.path.join(folder, "spm.model"), "rb") as b:
        assert a.read() == b.read()


@pytest.mark.slow
def test_save_to_preset_without_a_vocabulary_and_with_a_wrong_one(source, tmp_path):
    fresh = Transformer.from_preset("tiny", vocab_size=400)
    fresh.save_to_preset(tmp_path / "bare")
    _assert_same_weights(Transformer.from_preset(tmp_path / "bare"), fresh)
    with pytest.raises(FileNotFoundError, match=r"no vocabulary \(spm.model\).*tokenizer="):
        Tokenizer.from_preset(tmp_path / "bare")
    other = Transformer.from_preset("tiny", vocab_size=300)
    with pytest.raises(ValueError, match="tokenizer has 400 pieces, the model a vocabulary "
                                         "of 300"):
        other.save_to_preset(tmp_path / "wrong", tokenizer=Tokenizer.from_preset(source["run"]))


@pytest.mark.slow
def test_overrides_that_change_no_weight_are_taken(source, exported):
    model = Transformer.from_preset(source["export"], dropout=0.25, vocab_size=400,
                                    dtype="mixed_bfloat16")
    assert model.get_config()["dropout"] == 0.25 and model.compute_dtype == "bfloat16"
    _assert_same_weights(model, exported)


@pytest.mark.slow
def test_a_weight_that_does_not_fit_is_named_with_both_shapes(source):
    with pytest.raises(ValueError, match=r"encoder/layer_0/feed_forward/inner/kernel: "
                                         r"\(32, 64\) in run dir .*, \(32, 128\) in the model"):
        Transformer.from_preset(source["run"], d_ff=128)
    with pytest.raises(ValueError, match="vocab_size=500 given, but the model at .* has a "
                                         "vocabulary of 400"):
        Transformer.from_preset(source["export"], vocab_size=500)


def test_paths_that_are_no_model_of_this_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="'.*missing' does not exist; expected a "
                                                "SavedModel export dir"):
        Transformer.from_preset(str(tmp_path / "missing"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("hello")
    (tmp_path / "notes" / "data").mkdir()
    with pytest.raises(ValueError, match=r"not a model of this package: it holds "
                                         r"README.txt, data/; expected"):
        Tokenizer.from_preset(tmp_path / "notes")
    foreign = tmp_path / "foreign" / "1"
    (foreign / "assets").mkdir(parents=True)
    (foreign / "saved_model.pb").write_bytes(b"")
    (foreign / "assets" / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"not an export of this package: its assets/ holds "
                                         r"vocab.txt, not config.json and spm.model"):
        Transformer.from_preset(tmp_path / "foreign")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match=r"must hold \{'model'.*got keys \['hidden_size'\]"):
        Transformer.from_preset(tmp_path / "other")


@pytest.mark.slow
def test_model_fit_trains_a_loaded_model(source):
    model = Transformer.from_preset(source["export"], dropout=0.0)
    before = model.get_weights()
    model.compile(optimizer=paper_adam(TransformerSchedule(32, warmup_steps=10)),
                  loss=LabelSmoothedCrossEntropy(0.1),
                  run_eagerly=True)  # the claim is the loaded weights' training, not a graph
    source_ids = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")
    decoder_in, labels = np.array([[2, 10, 11], [2, 12, 0]]), np.array([[10, 11, 3], [12, 3, 0]])
    history = model.fit((source_ids, decoder_in), labels, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(),
                                                         strict=True))


def _fine_tune_args(corpus, model_dir, steps, init_from, **overrides):
    """train_wmt.py flags of a tiny fine-tuning run: no --preset, no --vocab-size."""
    flags = dict(init_from=init_from, preset=False, vocab_size=False)
    return script_args(corpus, model_dir, steps, **{**flags, **overrides})


def _first_batch_losses(args, corpus, source_model):
    """The label-smoothed losses on the first batch the run of `args` trains on of a fresh
    tiny model and of `source_model`'s weights (the Trainer's eval step: the training
    loss without dropout, run eagerly: no trace)."""
    config = pretrained.fine_tune_config(train_wmt.parse_args(args))
    data = load_corpus(corpus, "en", "de")
    batch = next(iter(training_dataset(config, data, Tokenizer.from_preset(config.init_from),
                                       1)))
    strategy = strategy_over(1)
    with strategy.scope():
        model = Transformer.from_preset("tiny", vocab_size=400, dropout=0.0)
        model.build()
        optimizer = paper_adam(TransformerSchedule(32, config.warmup_steps))
    assert model.model_config == source_model.model_config.replace(dropout=0.0)
    trainer = Trainer(model, optimizer, strategy, config.label_smoothing)
    losses = []
    tf.config.run_functions_eagerly(True)
    try:
        for weights in (None, source_model.weights):
            if weights is not None:
                pretrained.assign_weights(model, {pretrained.weight_key(w.path): w.numpy()
                                                  for w in weights}, "the source model")
            smoothed, _, tokens = trainer.eval_step(batch)
            losses.append(float(smoothed) / float(tokens))
    finally:
        tf.config.run_functions_eagerly(False)
    return losses


@pytest.mark.slow
def test_a_fine_tune_run_starts_from_the_source_model_and_resumes_after_a_kill(
        source, exported, corpus, tmp_path, capsys):
    """One fine-tuning run from the source's run dir, 6 updates: its first update is the
    source model's on the first batch, with a schedule started again; its run dir records
    where it came from (and a run from the export would record the SavedModel). The same
    run killed at its second checkpoint (a subprocess) resumes from its own checkpoint, not
    from the source: the same weights as the unbroken run. (From the run dir, not the
    export: the run, its rerun and its killed copy each read the source's weights, and a
    checkpoint reads in a fraction of a SavedModel's load; from_preset reads both alike.)"""
    straight = str(tmp_path / "straight")
    flags = dict(dropout=0.0, warmup_steps=7, lr_scale=0.5, deterministic=True)
    args = _fine_tune_args(corpus, straight, 6, source["run"], **flags)
    capsys.readouterr()
    with grappler_on():  # as in the killed process below
        assert train_wmt.main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 6
    scalars = _plot_training().read_scalars(os.path.join(straight, "logs"))
    (first_step, first_loss), (lr_step, first_lr) = scalars["loss"][0], scalars["lr"][0]
    assert first_step == lr_step == 1  # one log line per update: the first is update 1's
    fresh, expected = _first_batch_losses(args, corpus, exported)
    # A traced step against an eager one: float32 sums in another order (Eigen: 2e-5 apart).
    assert first_loss == pytest.approx(expected, rel=1e-4)
    assert first_loss < fresh - 0.3
    # The schedule starts again at step 1, with this run's warmup and scale.
    assert first_lr == pytest.approx(float(TransformerSchedule(32, 7, 0.5)(1)), rel=1e-6)
    with open(os.path.join(straight, "spm.model"), "rb") as a, \
            open(os.path.join(source["version"], "assets", "spm.model"), "rb") as b:
        assert a.read() == b.read()
    record = rundir.read_config(straight)
    assert record["init_from"] == {
        "path": source["run"], "kind": "run_dir",
        "weights": os.path.join(source["run"], "averaged", "ckpt-30"),
        "vocabulary_sha256": record["vocabulary_sha256"]}
    assert record["model"] == exported.model_config.replace(dropout=0.0).to_dict()
    assert record["train"]["init_from"] == source["run"] and record["preset"] == "tiny"
    from_export = train_wmt.parse_args(_fine_tune_args(corpus, straight, 6, source["export"]))
    assert pretrained.init_record(from_export, _exported_spm(source)) == {
        "path": source["export"], "kind": "saved_model", "weights": source["version"],
        "vocabulary_sha256": record["vocabulary_sha256"]}

    killed = str(tmp_path / "killed")
    args = _fine_tune_args(corpus, killed, 6, source["run"], **flags)
    with open(tmp_path / "1.log", "w") as out:
        status = subprocess.run([sys.executable, TRAIN_WMT, *args], stdout=out,
                                stderr=subprocess.STDOUT, timeout=PROCESS_TIMEOUT_S,
                                env=clean_env(**{KILL_AT_SAVE_ENV: "4"})).returncode
    assert status == -signal.SIGKILL, (tmp_path / "1.log").read_text()[-3000:]
    assert checkpoint_state(killed) == ("ckpt-2", ["ckpt-2"])
    # The rerun needs no fresh process (what the kill leaves is on disk): in this one.
    capsys.readouterr()
    with grappler_on():
        assert train_wmt.main(args) == 0
    assert os.path.join("checkpoints", "ckpt-2 at step 2") in capsys.readouterr().err
    assert checkpoint_state(killed)[0] == "ckpt-6"
    straight_tensors = model_tensors(straight, "ckpt-6")
    resumed = model_tensors(killed, "ckpt-6")
    assert sorted(straight_tensors) == sorted(resumed)
    for key, value in straight_tensors.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
    assert rundir.read_config(killed)["init_from"] == record["init_from"]


def _exported_spm(source):
    """The vocabulary of the source's export (its assets/spm.model)."""
    with open(os.path.join(source["version"], "assets", "spm.model"), "rb") as f:
        return f.read()


def _plot_training():
    """scripts/plot_training.py as a module (its reader of a run's TensorBoard scalars)."""
    return load_script("plot_training")


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (dict(preset="small"), r"--preset 'small' given \(num_layers=3, d_model=256, "
                           r"d_ff=1024\), the model of --init-from '.*' has num_layers=2, "
                           r"d_model=32, d_ff=64"),
    (dict(vocab_size=8000), r"--vocab-size 8000 given, 400 in the model of --init-from"),
    (dict(max_positions=64), r"--max-positions 64 given, 1024 in the model of --init-from"),
    (dict(max_length=2000), r"--max-length 2000 is above the 1024 positions of the model"),
], ids=["preset", "vocab_size", "max_positions", "max_length"])
def test_settings_that_conflict_with_init_from_are_named(source, corpus, tmp_path, capsys,
                                                         flags, message):
    args = _fine_tune_args(corpus, str(tmp_path / "run"), 1, source["run"], **flags)
    status, err = run_main(capsys, args)
    assert status == 2 and not os.path.exists(tmp_path / "run")
    assert err.startswith("train_wmt.py: error: Settings conflict with --init-from: ")
    assert re.search(message, err), err


def test_init_from_a_path_that_is_no_model(corpus, tmp_path, capsys):
    status, err = run_main(capsys, _fine_tune_args(corpus, str(tmp_path / "run"), 1,
                                                   str(tmp_path / "nowhere")))
    assert status == 2 and "nowhere' does not exist; expected a SavedModel" in err
