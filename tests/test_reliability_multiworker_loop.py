"""Several updates per call on two worker processes (MultiWorkerMirroredStrategy).

Two workers running 4 updates per `tf.function` call train like one worker with the same
global batch running one update per call: the same losses and weights.
"""

import json

import numpy as np
import pytest
from test_multiworker import TIMEOUT_S, _read, _start_workers, _wait
from test_reliability import model_tensors, script_args, tiny_corpus

STEPS = 8
pytestmark = pytest.mark.slow  # worker processes


def test_two_workers_with_4_updates_per_call_train_like_one_with_one(tmp_path,
                                                                      one_worker_reference):
    """Against conftest's one-worker reference (one update per call, 2 replicas): the
    workers log once, the mean loss of the 8 updates."""
    corpus = tiny_corpus(tmp_path / "data")
    every = dict(checkpoint_every=STEPS, log_every=STEPS, deterministic=True)
    one = one_worker_reference["run"]
    assert len(one_worker_reference["losses"]) == STEPS
    reference = {"loss": np.mean(one_worker_reference["losses"])}
    model_dir = str(tmp_path / "two_workers")
    processes = _start_workers(script_args(corpus, model_dir, STEPS, steps_per_loop=4,
                                           **every), tmp_path, "loop")
    for index, process in enumerate(processes):
        output = tmp_path / f"loop-{index}.log"
        assert _wait(process, TIMEOUT_S, output) == 0, _read(output)[-3000:]
    final = json.loads(_read(tmp_path / "loop-0.log").strip().splitlines()[-1])
    assert final["step"] == STEPS
    np.testing.assert_allclose(final["loss"], reference["loss"], rtol=1e-5)
    two, single = model_tensors(model_dir, f"ckpt-{STEPS}"), model_tensors(one, f"ckpt-{STEPS}")
    assert sorted(two) == sorted(single)
    for key, value in single.items():
        np.testing.assert_allclose(two[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
