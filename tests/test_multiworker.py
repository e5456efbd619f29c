"""Two worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy, TF_CONFIG), one run dir.

They must train like one worker with the same global batch (each reads the same global
batches and takes its replicas' slices), only the chief writes to the run dir, a killed
worker makes the other exit with a clear error instead of hanging, and restarting both
resumes from the last checkpoint; the restart runs several updates per call and still
trains like one worker running one per call.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from support.reliability import (
    TRAIN_WMT,
    checkpoint_state,
    clean_env,
    model_tensors,
    script_args,
    tiny_corpus,
)

pytestmark = pytest.mark.slow  # spawns two training processes

STEPS = 8
TIMEOUT_S = 300  # start-up of two processes sharing two busy cores, then training
LOST_TIMEOUT_S = 120  # the coordination service's heartbeat timeout is well below this


def _free_ports(count):
    """Ports on 127.0.0.1 that nothing listens on (bound to port 0, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _start_workers(args, folder, tag):
    """Two workers of one cluster on fresh loopback ports; their stdout+stderr in files."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        with open(folder / f"{tag}-{index}.log", "w") as out:
            processes.append(subprocess.Popen(
                [sys.executable, TRAIN_WMT, *args], stdout=out, stderr=subprocess.STDOUT,
                env=clean_env(TF_CONFIG=json.dumps(config))))
    return processes


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _wait(process, timeout, output):
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"hung for {timeout} s: {_read(output)[-3000:]}") from None


def _wait_for_checkpoint(model_dir, processes, name):
    deadline = time.time() + TIMEOUT_S
    index = os.path.join(model_dir, "checkpoints", f"{name}.index")
    while not os.path.exists(index):
        assert time.time() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)


def test_two_workers_train_like_one_survive_a_lost_worker_and_resume(tmp_path,
                                                                     one_worker_reference):
    """Against conftest's one-worker reference (8 updates, 2 replicas, one per call, a log
    line each)."""
    corpus = tiny_corpus(tmp_path / "data")
    one, reference = one_worker_reference["run"], one_worker_reference["final"]
    assert reference["step"] == STEPS
    model_dir = str(tmp_path / "two_workers")
    args = script_args(corpus, model_dir, STEPS, deterministic=True)

    # A worker dies mid-run: the chief notices (heartbeats) and exits, status 3.
    chief, worker = _start_workers(args, tmp_path, "first")
    _wait_for_checkpoint(model_dir, (chief, worker), "ckpt-2")
    worker.send_signal(signal.SIGKILL)
    started = time.time()
    status = _wait(chief, LOST_TIMEOUT_S, tmp_path / "first-0.log")
    output = _read(tmp_path / "first-0.log")
    assert status == 3, output[-3000:]
    assert "train_wmt.py: error: Lost contact with another worker" in output
    assert "/job:worker/replica:0/task:1" in output and "Restart every worker" in output
    print(f"the chief noticed the lost worker in {time.time() - started:.0f} s")
    latest, _ = checkpoint_state(model_dir)
    resumed_at = int(latest.split("-")[1])
    assert 2 <= resumed_at <= STEPS - 2, latest

    # Both restart: they resume from the chief's last checkpoint and finish, with 4
    # updates per call (calls of up to 4 to the one sync point, the end: a log line with
    # the mean loss of the updates since the restart), like one worker with one per call.
    processes = _start_workers(
        script_args(corpus, model_dir, STEPS, deterministic=True, steps_per_loop=4,
                    checkpoint_every=STEPS, log_every=STEPS), tmp_path, "second")
    for index, process in enumerate(processes):
        output = tmp_path / f"second-{index}.log"
        assert _wait(process, TIMEOUT_S, output) == 0, _read(output)[-3000:]
        assert f"{latest} at step" in _read(output)
    finals = [json.loads(_read(tmp_path / f"second-{i}.log").strip().splitlines()[-1])
              for i in range(2)]
    assert finals[0]["step"] == finals[1]["step"] == STEPS
    assert finals[0]["loss"] == finals[1]["loss"]
    np.testing.assert_allclose(finals[0]["loss"],
                               np.mean(one_worker_reference["losses"][resumed_at:]), rtol=1e-5)
    two, single = model_tensors(model_dir, f"ckpt-{STEPS}"), model_tensors(one, f"ckpt-{STEPS}")
    assert sorted(two) == sorted(single)
    for key, value in single.items():
        np.testing.assert_allclose(two[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    # Only the chief wrote into the run dir; the other worker read the chief's token cache.
    assert sorted(os.listdir(model_dir)) == ["checkpoints", "config.json", "logs", "spm.model",
                                             "token_cache", "train.log"]
    for index in range(2):
        assert "Token cache: using" in _read(tmp_path / f"second-{index}.log")
    assert "Token cache: wrote" in _read(tmp_path / "first-0.log")
    assert "Token cache: wrote" not in _read(tmp_path / "first-1.log")
