"""Reliability of training: non-finite steps, broken run dirs, hostile data (in process).

Kills of a running training are in test_reliability_kill.py, lost workers of a multi-worker
run in test_multiworker.py, hostile input to the exported translator in
test_reliability_serving.py. The helpers they share are in support/reliability.py.
"""

import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2
from support.reliability import (
    NONFINITE_FAULT_ENV,
    TRAIN_WMT,
    checkpoint_state,
    clean_env,
    model_tensors,
    run_main,
    script_args,
    tiny_corpus,
    train_wmt,
)

from tfxformer import Transformer, rundir
from tfxformer.checkpoints import average_checkpoints
from tfxformer.data.pipeline import count_filtered
from tfxformer.data.sources import load_corpus
from tfxformer.data.tokenizer import Tokenizer
from tfxformer.pretrained import load_run_dir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "data")


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A run dir trained for 4 steps: spm.model, config.json, ckpt-2 and ckpt-4."""
    model_dir = str(tmp_path_factory.mktemp("trained") / "run")
    assert train_wmt.main(script_args(corpus, model_dir, 4)) == 0
    return model_dir


@pytest.mark.slow
def test_a_nonfinite_step_is_skipped_and_named(corpus, tmp_path, monkeypatch, capsys):
    """4 updates per call on two replicas, poisoned updates 3 and 5: update 3 is skipped
    and retried inside a call, update 5 at the end of one and retried in the next. One
    update per call is the same loop (training.train_loop) with calls of one, so this most
    demanding case holds it too."""
    monkeypatch.setenv(NONFINITE_FAULT_ENV, "3,5")
    model_dir = str(tmp_path / "run")
    status, _ = run_main(capsys, script_args(corpus, model_dir, 6, steps_per_loop=4,
                                             checkpoint_every=6, log_every=6, cpu_devices=2))
    assert status == 0
    with open(os.path.join(model_dir, "train.log"), encoding="utf-8") as f:
        log = f.read()
    for step in (3, 5):
        assert f"Non-finite loss or gradient at step {step} (loss nan)" in log
    assert log.count("skipped (--on-nonfinite skip)") == 2
    assert checkpoint_state(model_dir) == ("ckpt-6", ["ckpt-6"])
    assert "step 6 loss" in log


@pytest.mark.slow
def test_a_nonfinite_step_stops_keeping_the_last_good_checkpoint(corpus, tmp_path,
                                                                monkeypatch, capsys):
    """With 3 per call and checkpoints every 4 updates the calls are 3, 1 (ckpt-4), then
    5 (poisoned), 6, 7: the halt holds inside the call and the error names update 5. One
    update per call is the same loop with calls of one, where the halt comes at the end of
    a call: this most demanding case holds it too.

    The corpus has two absurdly long lines per language appended (a 200,000-word line and
    a 1,000,000-character one): they are counted and skipped, and training goes on up to
    the fault (one training shows both)."""
    data = str(tmp_path / "data")
    shutil.copytree(corpus, data)
    for lang in ("en", "de"):
        with open(os.path.join(data, f"train.{lang}"), "a", encoding="utf-8") as f:
            f.write(("word " * 200_000).strip() + "\n" + "x" * 1_000_000 + "\n")
    monkeypatch.setenv(NONFINITE_FAULT_ENV, "5")
    model_dir = str(tmp_path / "run")
    status, err = run_main(capsys, script_args(data, model_dir, 8, on_nonfinite="stop",
                                               steps_per_loop=3, checkpoint_every=4,
                                               log_every=4))
    assert status == 2
    assert err.startswith("train_wmt.py: error: Non-finite loss or gradient at step 5 ")
    assert "--on-nonfinite stop" in err and os.path.join("checkpoints", "ckpt-4") in err
    assert checkpoint_state(model_dir) == ("ckpt-4", ["ckpt-4"])
    assert not glob.glob(os.path.join(model_dir, "checkpoints", "ckpt-[5-8].*"))

    with open(os.path.join(model_dir, "train.log"), encoding="utf-8") as f:
        log = f.read()
    assert "4 skipped as longer than" in log  # by the vocabulary training, 2 per language
    clean = count_filtered(load_corpus(corpus).train.dataset(),
                           Tokenizer.load(os.path.join(model_dir, "spm.model")), max_length=32)
    assert f"{clean.too_long + 2} over-long (> 32 tokens incl. BOS/EOS) of 302 pairs; kept " \
           f"{clean.kept}" in log
    assert "step 4 loss" in log  # trained on the kept pairs


def _truncate(path, size=100):
    with open(path, "r+b") as f:
        f.truncate(size)


def _write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)


def _other_vocabulary(path):
    """The same vocabulary with one piece's score changed: valid, same size, other bytes."""
    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    proto.pieces[300].score -= 1.0
    _write(path, proto.SerializeToString())


BROKEN_RUN_DIRS = {  # name: (damage, file named in the error, phrase of the error)
    "truncated data": (lambda d: _truncate(glob.glob(f"{d}/checkpoints/ckpt-4.data-*")[0]),
                       "checkpoints/ckpt-4", "is corrupt or truncated"),
    "garbage index": (lambda d: _write(f"{d}/checkpoints/ckpt-4.index", b"garbage" * 9),
                      "checkpoints/ckpt-4", "is corrupt or truncated"),
    "missing index": (lambda d: os.remove(f"{d}/checkpoints/ckpt-4.index"),
                      "checkpoints/ckpt-4", "is incomplete"),
    "garbage state": (lambda d: _write(f"{d}/checkpoints/checkpoint", b"garbage {"),
                      "checkpoints/checkpoint", "is unreadable"),
    "garbage vocabulary": (lambda d: _write(f"{d}/spm.model", b"\x00garbage"),
                           "spm.model", "is not a valid SentencePiece model"),
    "other vocabulary": (lambda d: _other_vocabulary(f"{d}/spm.model"),
                         "config.json", "spm.model is not the vocabulary"),
    "config not JSON": (lambda d: _write(f"{d}/config.json", b'{"model": {"d_mod'),
                        "config.json", "Cannot read"),
    "config not an object": (lambda d: _write(f"{d}/config.json", b"[1, 2]"),
                             "config.json", "holds a JSON list"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BROKEN_RUN_DIRS))
def test_a_broken_run_dir_is_refused_naming_the_file(case, corpus, trained, tmp_path, capsys):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    damage, file, phrase = BROKEN_RUN_DIRS[case]
    damage(model_dir)
    status, err = run_main(capsys, script_args(corpus, model_dir, 6))
    assert status == 2, err
    assert err.startswith("train_wmt.py: error: ")
    assert os.path.join(model_dir, file) in err and phrase in err, err


@pytest.mark.slow
def test_a_different_preset_is_refused_naming_the_settings(corpus, trained, capsys):
    status, err = run_main(capsys, script_args(corpus, trained, 6, preset="small"))
    assert status == 2
    assert os.path.join(trained, "config.json") in err
    assert "model.num_layers: 2 in the run dir, 3 now" in err


@pytest.mark.slow
def test_deleted_latest_checkpoint_resumes_from_the_previous_one(corpus, trained, tmp_path,
                                                                capsys):
    """What the errors above advise: delete the broken checkpoint's files, rerun."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    for path in glob.glob(os.path.join(model_dir, "checkpoints", "ckpt-4.*")):
        os.remove(path)
    # A different token budget as well: the saved pipeline position cannot be restored
    # into another pipeline (that hung tf.data), so the pipeline restarts instead.
    status, err = run_main(capsys, script_args(corpus, model_dir, 6, batch_tokens=1024))
    assert status == 0, err
    with open(os.path.join(model_dir, "train.log"), encoding="utf-8") as f:
        log = f.read()
    assert "has no files; resuming from" in log and "at step 2" in log
    assert "batch_tokens: 512 -> 1024" in log
    assert checkpoint_state(model_dir)[0] == "ckpt-6"


@pytest.mark.slow
def test_a_checkpoint_no_state_file_names_is_neither_resumed_nor_loaded(corpus, trained,
                                                                        tmp_path, capsys):
    """Complete files of ckpt-9 (a save cut short before the state file named it): resume,
    export and translation all take ckpt-4, the latest the state file names."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    for path in glob.glob(os.path.join(model_dir, "checkpoints", "ckpt-2.*")):
        shutil.copy(path, path.replace("ckpt-2.", "ckpt-9."))
    latest = os.path.join(model_dir, "checkpoints", "ckpt-4")
    assert rundir.find_checkpoint(model_dir) == latest
    loaded, _, _ = load_run_dir(Transformer, model_dir)
    named, _, _ = load_run_dir(Transformer, model_dir, checkpoint=latest)
    for got, want in zip(loaded.get_weights(), named.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    status, err = run_main(capsys, script_args(corpus, model_dir, 6))
    assert status == 0, err
    with open(os.path.join(model_dir, "train.log"), encoding="utf-8") as f:
        assert f"Resumed from {latest} at step 4" in f.read()
    assert checkpoint_state(model_dir) == ("ckpt-6", ["ckpt-2", "ckpt-4", "ckpt-6"])


@pytest.mark.slow
def test_averaging_leaves_out_listed_checkpoints_whose_files_are_gone(trained, tmp_path):
    """A kill while old checkpoints are deleted leaves them listed in the state file."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    for path in glob.glob(os.path.join(model_dir, "checkpoints", "ckpt-2.*")):
        os.remove(path)
    saved = average_checkpoints(model_dir, last=2)
    averaged = tf.train.load_checkpoint(saved)
    for key, value in model_tensors(model_dir, "ckpt-4").items():
        if key.startswith("model/"):
            np.testing.assert_allclose(averaged.get_tensor(key), value, err_msg=key)


def _bad_data(folder, name):
    tiny_corpus(folder, lines=40)
    if name == "not UTF-8":
        with open(os.path.join(folder, "train.en"), "r+b") as f:
            lines = f.read().split(b"\n")
            lines[2] = b"caf\xe9 au lait"  # Latin-1
            f.seek(0)
            f.write(b"\n".join(lines))
    elif name == "misaligned":
        with open(os.path.join(folder, "train.de"), "a", encoding="utf-8") as f:
            f.write("eine Zeile zu viel\n")
    elif name == "empty":
        for lang in ("en", "de"):
            _write(os.path.join(folder, f"train.{lang}"), b"")
    elif name == "empty validation":
        for lang in ("en", "de"):
            _write(os.path.join(folder, f"val.{lang}"), b"")
    return str(folder)


BAD_DATA = {  # name: (extra flags, phrases of the error)
    "not UTF-8": ({}, ["train.en:3: not valid UTF-8"]),
    "misaligned": ({}, ["Misaligned", "train.en has 40 lines", "train.de has 41 lines"]),
    "empty": ({}, ["train.en", "is empty"]),
    "empty validation": ({"eval_every": 2}, ["val.en", "is empty", "--eval-every 0"]),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_is_refused_naming_the_file(case, tmp_path, capsys):
    data = _bad_data(tmp_path / "data", case)
    flags, phrases = BAD_DATA[case]
    status, err = run_main(capsys, script_args(data, str(tmp_path / "run"), 2, **flags))
    assert status == 2 and err.startswith("train_wmt.py: error: "), err
    for phrase in phrases:
        assert phrase in err, err


@pytest.mark.slow
def test_no_usable_pair_is_an_error_not_a_hang(corpus, tmp_path):
    """Every pair longer than --max-length: tf.data would filter forever; it must fail."""
    result = subprocess.run(
        [sys.executable, TRAIN_WMT, *script_args(corpus, str(tmp_path / "run"), 2,
                                                 max_length=8, batch_tokens=64)],
        env=clean_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "train_wmt.py: error: No training pair of" in result.stderr
    assert "of 300 pairs; kept 0" in result.stderr and "--max-length 8" in result.stderr
