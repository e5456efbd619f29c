"""End to end: scripts/train_wmt.py's library function on real text (Multi30k), 2 replicas."""

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import SHARED_DATA
from support.data_tfds_source import tfds_metadata

from tfxformer import Transformer, precision
from tfxformer.pretrained import load_run_dir
from tfxformer.train_config import settings_as_flags
from tfxformer.training import TrainConfig, resolve_precision, train_and_evaluate

MULTI30K = os.path.join(SHARED_DATA, "multi30k")


def _small_corpus(tmp_path, lines=1500):
    """The first `lines` Multi30k pairs as a text folder (train and val)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for lang in ("en", "de"):
        with open(os.path.join(MULTI30K, f"train.{lang}"), encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        (folder / f"train.{lang}").write_text("".join(text), encoding="utf-8")
        (folder / f"val.{lang}").write_text("".join(text[:40]), encoding="utf-8")
    return str(folder)


def _config(data, model_dir, steps, **overrides):
    # Tokenized on the fly: the token cache gives the same batches (test_token_cache.py)
    # and resumes like it (test_reliability_kill.py); building it takes seconds per run.
    values = dict(model_dir=str(model_dir), data=data, src="en", tgt="de", preset="tiny",
                  vocab_size=400, batch_tokens=1024, max_length=64, train_steps=steps,
                  warmup_steps=20, checkpoint_every=10, log_every=10, eval_every=0,
                  eval_sentences=0, cpu_devices=2, average_last=0, shuffle_buffer=2000,
                  dropout=0.0, keep_checkpoints=10, token_cache=False)
    values.update(overrides)
    return TrainConfig(**values)


def _weights(model_dir, step, folder="checkpoints"):
    """All model weights of checkpoint `folder/ckpt-<step>`, restored through the model."""
    path = os.path.join(model_dir, folder, f"ckpt-{step}")
    model, _, _ = load_run_dir(Transformer, str(model_dir), checkpoint=path)
    return model.get_weights()


def _script(name):
    """Imports scripts/<name>.py as a module."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _small_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_train_on_real_text_lowers_the_loss_and_stop_and_resume_equals_a_straight_run(
        corpus, tmp_path):
    """Two replicas on real text. One update per call straight to 40 equals 3 per call
    (intervals of 10: calls of 3, 3, 3, 1) to 20, resumed with 8 per call to 40: the same
    batches, the same weights (the straight run without validation: it changes no update,
    and it spares a trace of the eval step). The loss falls; the scalars of both calls, the
    averaged checkpoint and the training curve are checked on these runs (one training
    each)."""
    straight = tmp_path / "straight"
    train_and_evaluate(_config(corpus, straight, 40, deterministic=True, steps_per_loop=1,
                               average_last=3))
    resumed = tmp_path / "resumed"
    train_and_evaluate(_config(corpus, resumed, 20, deterministic=True, steps_per_loop=3,
                               eval_every=10))
    later = train_and_evaluate(_config(corpus, resumed, 40, deterministic=True,
                                       steps_per_loop=8, eval_every=10))
    straight_40 = _weights(straight, 40)
    for a, b in zip(straight_40, _weights(resumed, 40), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # The training curve (scripts/plot_training.py) reads the TensorBoard scalars of both
    # calls of the resumed run.
    plot_training = _script("plot_training")
    series = plot_training.read_scalars(str(resumed / "logs"))
    assert [step for step, _ in series["loss"]] == [10, 20, 30, 40]
    assert [step for step, _ in series["val_loss"]] == [10, 20, 30, 40]
    first = {name: series[name][0][1] for name in ("loss", "val_loss")}
    assert later["step"] == 40
    assert later["loss"] < first["loss"] - 0.5, (first, later)
    assert later["val_loss"] < first["val_loss"]
    assert series["loss"][-1][1] == pytest.approx(later["loss"], rel=1e-6)
    plot_training.plot(series, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").stat().st_size > 10_000
    with open(straight / "config.json", encoding="utf-8") as f:
        assert json.load(f)["model"]["vocab_size"] == 400

    # Checkpoint averaging (§6.1): the averaged weights are the mean of the last 3.
    averaged = _weights(straight, 40, folder="averaged")
    last_three = zip(_weights(straight, 20), _weights(straight, 30), straight_40, strict=True)
    assert len(averaged) == 85  # every weight of the tiny model, not only the embedding
    for average, weights in zip(averaged, last_three, strict=True):
        np.testing.assert_allclose(average, np.mean(weights, axis=0), rtol=1e-5, atol=1e-6)
    assert os.path.exists(straight / "spm.model")


def _tfds_pairs(builder, split, **kwargs):
    """Every split of a mocked TFDS translation dataset: the same 64 random sentences per
    language, from tensors (a checkpoint holds the position of the input pipeline, which
    mock_data's own `from_generator` examples cannot give)."""
    rng = np.random.default_rng(0)
    columns = {}
    for language in builder.info.features.languages:
        words = ["".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 7)))
                 for _ in range(40)]
        columns[language] = [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(64)]
    return tf.data.Dataset.from_tensor_slices(columns)


@pytest.mark.slow
def test_train_wmt_on_a_tfds_dataset_with_auto_precision(tmp_path, capsys):
    """`train_wmt.py --data tfds:wmt14_translate/fr-en --src en --tgt fr` (TFDS mocked:
    random sentences, no network) trains, validates on the dataset's validation split, and
    config.json records the data and the precision `auto` chose for this machine."""
    metadata = tfds_metadata(tmp_path / "tfds", "wmt14_translate/fr-en",
                             {"train": 64, "validation": 8, "test": 8})
    run = tmp_path / "run"
    with tfds.testing.mock_data(data_dir=metadata, as_dataset_fn=_tfds_pairs):
        status = _script("train_wmt").main([
            "--data", "tfds:wmt14_translate/fr-en", "--src", "en", "--tgt", "fr",
            "--preset", "tiny", "--vocab-size", "300", "--batch-tokens", "512",
            "--max-length", "32", "--train-steps", "4", "--warmup-steps", "2",
            "--checkpoint-every", "4", "--log-every", "2", "--eval-every", "4",
            "--eval-sentences", "0", "--average-last", "0", "--cpu-devices", "1",
            "--model-dir", str(run)])
    assert status == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["step"] == 4 and np.isfinite(metrics["val_loss"])
    with open(run / "config.json", encoding="utf-8") as f:
        record = json.load(f)
    assert (record["src"], record["tgt"], record["train"]["data"]) == \
        ("en", "fr", "tfds:wmt14_translate/fr-en")
    chosen, why = precision.choose(precision.this_machine())
    assert record["train"]["precision"] == chosen
    log = (run / "train.log").read_text(encoding="utf-8")
    assert f"Precision {chosen}: auto: {why}" in log
    assert "tfds wmt14_translate/fr-en split validation" in log


def test_auto_precision_of_a_resumed_run_is_the_recorded_one(tmp_path):
    """A run dir that records bf16 resumes in bf16 whatever this machine would choose;
    a given precision is kept as given."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model": {"vocab_size": 64}, "train": {"precision": "bf16"}}), encoding="utf-8")
    resumed, why = resolve_precision(TrainConfig(model_dir=str(tmp_path)))
    assert resumed.precision == "bf16" and "the run dir records bf16" in why
    given, why = resolve_precision(TrainConfig(model_dir=str(tmp_path), precision="fp32"))
    assert given.precision == "fp32" and why == "given (`precision`)"
    chosen, reason = precision.choose(precision.this_machine())
    new, why = resolve_precision(TrainConfig(model_dir=str(tmp_path / "new")))
    assert (new.precision, why) == (chosen, f"auto: {reason}")


def test_train_flags_come_from_the_config_fields(capsys):
    """One flag per TrainConfig field, typed by its annotation, with the field's help."""
    train_wmt = _script("train_wmt")
    config = train_wmt.parse_args(["--model-dir", "runs/x", "--max-length", "100",
                                   "--dropout", "0.2", "--xla", "--cpu-devices", "2",
                                   "--steps-per-loop", "4"])
    assert (config.max_length, config.dropout, config.xla, config.cpu_devices,
            config.steps_per_loop) == (100, 0.2, True, 2, 4)
    assert config.max_positions is None and config.model_config().vocab_size == 37_000
    with pytest.raises(SystemExit):
        train_wmt.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--max-positions MAX_POSITIONS size of the model's position table" in help_text
    assert "or --max-length if larger" in help_text and "(default: 256)" in help_text


def _positions(config):
    return config.model_config().max_positions


def test_the_position_table_size_is_explicit():
    """The preset's 1024 rows, raised to the training length filter; or --max-positions."""
    base = dict(model_dir="runs/x", preset="tiny")
    assert _positions(TrainConfig(**base, max_length=256)) == 1024
    assert _positions(TrainConfig(**base, max_length=2000)) == 2000
    assert _positions(TrainConfig(**base, max_length=64, max_positions=128)) == 128
    bad = TrainConfig(**base, max_length=256, max_positions=128)
    with pytest.raises(ValueError, match="`max_positions` 128 is below `max_length` 256"):
        bad.validate()


def test_library_errors_name_settings_and_the_script_names_flags():
    message = "`max_positions` 128 is below `max_length` 256; `other` stays"
    assert settings_as_flags(message) == \
        "--max-positions 128 is below --max-length 256; `other` stays"


def test_steps_per_loop_must_be_positive():
    with pytest.raises(ValueError, match="`steps_per_loop` must be an integer >= 1, got 0"):
        TrainConfig(model_dir="runs/x", steps_per_loop=0).validate()


def test_the_three_dropouts_override_the_preset_and_are_checked():
    """--dropout, --attention-dropout and --activation-dropout reach the model; unset, the
    preset's are kept; a rate outside [0, 1) is an error naming it."""
    base = dict(model_dir="runs/x", preset="multi30k")
    kept = TrainConfig(**base).model_config()
    assert (kept.dropout, kept.attention_dropout, kept.activation_dropout) == (0.3, 0.0, 0.0)
    model = TrainConfig(**base, attention_dropout=0.1, activation_dropout=0.2).model_config()
    assert (model.dropout, model.attention_dropout, model.activation_dropout) == (0.3, 0.1, 0.2)
    with pytest.raises(ValueError, match="attention_dropout"):
        TrainConfig(**base, attention_dropout=1.5).model_config()
