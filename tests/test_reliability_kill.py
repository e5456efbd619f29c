"""SIGKILL at any moment of scripts/train_wmt.py, restart until done: nothing is lost.

One run dir goes through: a kill between writing a checkpoint's files and naming it in the
state file (fault injection), a kill while TensorFlow writes a checkpoint, a kill at a
random moment of training, then a run to the end (in the test's process). It must end at
the requested step with the right checkpoints and, with op determinism, the weights and
loss of a run that was never interrupted.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import grappler_on
from support.reliability import (
    KILL_AT_SAVE_ENV,
    TRAIN_WMT,
    assert_complete,
    checkpoint_state,
    clean_env,
    model_tensors,
    script_args,
    tiny_corpus,
    train_wmt,
)

pytestmark = pytest.mark.slow  # kills and restarts training processes

STEPS, KEEP = 30, 3
PROCESS_TIMEOUT_S = 240


def _start(args, output, **env):
    with open(output, "w") as out:
        return subprocess.Popen([sys.executable, TRAIN_WMT, *args], env=clean_env(**env),
                                stdout=out, stderr=subprocess.STDOUT)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _assert_consistent(model_dir):
    """What a restart relies on: the state file names only complete checkpoints."""
    if os.path.exists(os.path.join(model_dir, "checkpoints", "checkpoint")):
        latest, listed = checkpoint_state(model_dir)
        assert latest == listed[-1]
        for name in listed[-KEEP:]:
            assert_complete(model_dir, name)


def _kill(process):
    process.send_signal(signal.SIGKILL)
    process.wait(PROCESS_TIMEOUT_S)


def _wait_for_line(process, output, text):
    deadline = time.time() + PROCESS_TIMEOUT_S
    while text not in _read(output):
        assert process.poll() is None and time.time() < deadline, _read(output)[-3000:]
        time.sleep(0.01)


def _kill_during_a_save(process, model_dir):
    """Kills `process` while a checkpoint is being written; returns what was on disk."""
    folder = os.path.join(model_dir, "checkpoints")
    deadline = time.time() + PROCESS_TIMEOUT_S
    while process.poll() is None and time.time() < deadline:
        entries = os.listdir(folder) if os.path.isdir(folder) else []
        if any("_temp" in entry for entry in entries):  # TensorFlow's staging folder
            process.send_signal(signal.SIGKILL)
            process.wait()
            return entries
        time.sleep(0.001)
    raise AssertionError(f"no checkpoint save seen before the run ended ({process.poll()})")


def test_sigkill_anywhere_then_restart_ends_like_an_unbroken_run(tmp_path, capsys,
                                                                 one_replica_reference):
    """The unbroken run is conftest's `one_replica_reference` (the same flags, 30 updates,
    every checkpoint kept)."""
    corpus = tiny_corpus(tmp_path / "data")
    straight, reference = one_replica_reference["run"], one_replica_reference["final"]
    assert reference["step"] == STEPS
    model_dir = str(tmp_path / "killed")
    args = script_args(corpus, model_dir, STEPS, keep_checkpoints=KEEP, deterministic=True)

    # 1. Killed after ckpt-8's files are written, before the state file names them.
    process = _start(args, tmp_path / "1.log", **{KILL_AT_SAVE_ENV: "8"})
    assert process.wait(PROCESS_TIMEOUT_S) == -signal.SIGKILL, _read(tmp_path / "1.log")
    assert checkpoint_state(model_dir) == ("ckpt-6", ["ckpt-2", "ckpt-4", "ckpt-6"])
    assert_complete(model_dir, "ckpt-8")  # complete on disk, but never confirmed

    # 2. Killed while TensorFlow writes a checkpoint; the restart ignored ckpt-8.
    process = _start(args, tmp_path / "2.log")
    on_disk = _kill_during_a_save(process, model_dir)
    assert "Resumed from" in _read(tmp_path / "2.log")
    assert os.path.join("checkpoints", "ckpt-6 at step 6") in _read(tmp_path / "2.log")
    assert any("_temp" in entry for entry in on_disk)
    _assert_consistent(model_dir)

    # 3. Killed at a random moment of training.
    process = _start(args, tmp_path / "3.log")
    _wait_for_line(process, tmp_path / "3.log", " loss ")
    time.sleep(random.Random(0).uniform(0.0, 0.3))
    _kill(process)
    assert process.returncode == -signal.SIGKILL  # killed, not finished
    _assert_consistent(model_dir)

    # 4. Run to the end. The restart needs no fresh process (what the kills left is on
    # disk): in this one.
    capsys.readouterr()
    with grappler_on():  # as in the killed processes and the reference's
        assert train_wmt.main(args) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert checkpoint_state(model_dir) == (f"ckpt-{STEPS}",
                                           [f"ckpt-{STEPS - 4}", f"ckpt-{STEPS - 2}",
                                            f"ckpt-{STEPS}"])
    straight = model_tensors(straight, f"ckpt-{STEPS}")
    resumed = model_tensors(model_dir, f"ckpt-{STEPS}")
    assert sorted(straight) == sorted(resumed) and any("model_state/" in k for k in straight)
    for key, value in straight.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
    assert final["step"] == STEPS and final["loss"] == reference["loss"]
