"""What the training tests share (test_reliability.py, test_reliability_kill.py,
test_multiworker.py, test_pretrained.py, ...): a tiny corpus, scripts/train_wmt.py's flags
of a tiny run and the script itself, the environment of a training subprocess, and readers
of a run dir's checkpoints."""

import glob
import importlib.util
import os

import tensorflow as tf

from support.environment import SHARED_DATA

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_WMT = os.path.join(ROOT, "scripts", "train_wmt.py")


def tiny_corpus(folder, lines=300):
    """The first `lines` Multi30k pairs as a text folder (train; val = its first 20)."""
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(SHARED_DATA, "multi30k", f"train.{lang}"), encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        with open(os.path.join(folder, f"train.{lang}"), "w", encoding="utf-8") as f:
            f.write("".join(text))
        with open(os.path.join(folder, f"val.{lang}"), "w", encoding="utf-8") as f:
            f.write("".join(text[:20]))
    return str(folder)


def script_args(data, model_dir, steps, **overrides):
    """train_wmt.py flags of a tiny run: ~20 ms per step on one CPU."""
    flags = dict(data=data, model_dir=model_dir, train_steps=steps, preset="tiny",
                 vocab_size=400, batch_tokens=512, max_length=32, warmup_steps=10,
                 checkpoint_every=2, keep_checkpoints=5, log_every=1, eval_every=0,
                 eval_sentences=0, average_last=0, shuffle_buffer=300, cpu_devices=1)
    flags.update(overrides)
    args = []
    for name, value in flags.items():
        if value is True:
            args.append("--" + name.replace("_", "-"))
        elif value is not False:
            args += ["--" + name.replace("_", "-"), str(value)]
    return args


def clean_env(**extra):
    """The environment of a training subprocess, without the fault-injection switches."""
    env = {k: v for k, v in os.environ.items()
           if k not in (KILL_AT_SAVE_ENV, NONFINITE_FAULT_ENV, "TF_CONFIG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **extra)
    return env


def checkpoint_state(model_dir):
    """(latest, all listed) checkpoint names of the run dir's state file."""
    state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
    return (os.path.basename(state.model_checkpoint_path),
            [os.path.basename(p) for p in state.all_model_checkpoint_paths])


def assert_complete(model_dir, name):
    prefix = os.path.join(model_dir, "checkpoints", name)
    assert os.path.exists(prefix + ".index"), prefix
    assert glob.glob(prefix + ".data-*"), prefix


def model_tensors(model_dir, name):
    """The model weights (and dropout seed states) stored in checkpoint `name`."""
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints", name))
    keys = sorted(k for k in reader.get_variable_to_shape_map()
                  if k.startswith(("model/", "model_state/")) and "OPTIMIZER" not in k)
    return {k: reader.get_tensor(k) for k in keys}


def _load_train_wmt():
    spec = importlib.util.spec_from_file_location("train_wmt", TRAIN_WMT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_wmt = _load_train_wmt()
KILL_AT_SAVE_ENV = train_wmt.KILL_AT_SAVE_ENV  # read only by the script
NONFINITE_FAULT_ENV = train_wmt.NONFINITE_FAULT_ENV


def run_main(capsys, args):
    """scripts/train_wmt.py's main() in this process: (exit status, last line of stderr)."""
    capsys.readouterr()
    status = train_wmt.main(args)
    return status, capsys.readouterr().err.strip().splitlines()[-1]
