"""tfxformer.checkpoints: averaging the last checkpoints (§6.1), on a run dir written by hand."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.checkpoints import average_checkpoints
from tfxformer.rundir import find_checkpoint


def _run_dir(path, weights_per_step):
    """config.json and checkpoints/ckpt-<step> whose every weight is the given constant."""
    model = Transformer.from_preset("tiny", vocab_size=16, max_positions=16)
    model.build()
    checkpoint = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(checkpoint, str(path / "checkpoints"), max_to_keep=5,
                                         checkpoint_name="ckpt")
    for step, value in weights_per_step.items():
        model.set_weights([np.full(w.shape, value, w.dtype) for w in model.get_weights()])
        manager.save(checkpoint_number=step)
    (path / "config.json").write_text(json.dumps({"model": model.model_config.to_dict()}))
    return str(path)


def test_the_last_checkpoints_are_averaged_weight_by_weight(tmp_path):
    run_dir = _run_dir(tmp_path, {2: 1.0, 4: 2.0, 6: 6.0})
    saved = average_checkpoints(run_dir, last=2)
    assert saved.endswith("averaged/ckpt-6")
    assert find_checkpoint(run_dir) == saved  # export and translation prefer the average
    reader = tf.train.load_checkpoint(saved)
    values = [reader.get_tensor(name) for name, _ in tf.train.list_variables(saved)
              if name.startswith("model/") and name.endswith("VARIABLE_VALUE")]
    assert values and all(np.allclose(v, 4.0) for v in values)  # (2 + 6) / 2


def test_nothing_to_average_is_an_error_naming_the_folder(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="No checkpoints to average in .*checkpoints"):
        average_checkpoints(str(tmp_path), last=5)
