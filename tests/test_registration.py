"""`import tfxformer` alone registers every Keras class of the package: a `.keras` file
built from its layers, and a compiled Transformer with its loss, metric and schedule, load
in a fresh process that imports nothing else of it, with the same predictions."""

import ast
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import tfxformer
from tfxformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SharedEmbedding,
)
from tfxformer.layers.norm import LayerNorm

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "tfxformer")
SOURCE = np.array([[5, 6, 7, 3, 0, 0], [8, 9, 3, 0, 0, 0]], "int32")
TARGET = np.array([[2, 5, 6, 7], [2, 8, 9, 0]], "int32")


def _registered_names():
    """"tfxformer>Name" of every class the package's source registers."""
    names = set()
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if not file.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(folder, file), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                        "register_keras_serializable" in ast.unparse(d)
                        for d in node.decorator_list):
                    names.add(f"tfxformer>{node.name}")
    return sorted(names)


def _layers_model():
    """A functional model through every public layer that takes tensors."""
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    embedding = SharedEmbedding(40, 16)
    position = PositionalEncoding("learned", 32)
    x = position(embedding(source))
    x = EncoderLayer(16, 2, 32)(x)
    memory = Encoder(1, 16, 2, 32)(x)
    y = position(embedding(target))
    y = DecoderLayer(16, 2, 32)(y, memory)
    y = Decoder(1, 16, 2, 32)(y, memory)
    y = MultiHeadAttention(2, 16)(y, memory)
    y = LayerNorm()(PositionwiseFeedForward(32)(y))
    return keras.Model([source, target], keras.layers.Dense(40)(y))


def _transformer():
    model = tfxformer.Transformer.from_preset("tiny", vocab_size=40)
    model.compile(optimizer=tfxformer.paper_adam(tfxformer.TransformerSchedule(32, 10)),
                  loss=tfxformer.LabelSmoothedCrossEntropy(0.1),
                  metrics=[tfxformer.MaskedTokenAccuracy()],
                  run_eagerly=True)  # one eager step builds the optimizer: no trace needed
    model.fit((SOURCE, TARGET), TARGET, epochs=1, verbose=0)
    return model


@pytest.mark.slow
def test_keras_files_load_after_import_tfxformer_alone(tmp_path):
    files = {}
    for name, model in (("layers", _layers_model()), ("transformer", _transformer())):
        files[name] = str(tmp_path / f"{name}.keras")
        model.save(files[name])
        np.save(tmp_path / f"{name}.npy", np.asarray(model((SOURCE, TARGET))))  # no trace
    program = textwrap.dedent(f"""
        import sys
        import keras
        import numpy as np
        import tfxformer
        loaded = [m for m in sys.modules if m.startswith("tfxformer.")]
        assert not any(m.startswith(("tfxformer.serving", "tfxformer.decoding"))
                       for m in loaded), loaded
        missing = [n for n in {_registered_names()!r}
                   if keras.saving.get_registered_object(n) is None]
        assert not missing, f"not registered by import tfxformer: {{missing}}"
        source, target = np.array({SOURCE.tolist()}, "int32"), np.array({TARGET.tolist()}, "int32")
        for name in ("layers", "transformer"):
            model = keras.models.load_model(f"{tmp_path}/{{name}}.keras")
            expected = np.load(f"{tmp_path}/{{name}}.npy")
            np.testing.assert_allclose(np.asarray(model((source, target))), expected,
                                       rtol=1e-5, atol=1e-5)
        optimizer = keras.models.load_model(f"{tmp_path}/transformer.keras").optimizer
        schedule = optimizer.get_config()["learning_rate"]
        assert schedule["registered_name"] == "tfxformer>TransformerSchedule", schedule
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_scan_finds_the_registered_classes():
    names = _registered_names()
    assert {"tfxformer>Transformer", "tfxformer>PositionalEncoding",
            "tfxformer>TransformerSchedule", "tfxformer>LabelSmoothedCrossEntropy",
            "tfxformer>MaskedTokenAccuracy"} <= set(names)
    assert all(keras.saving.get_registered_object(n) is not None for n in names)
