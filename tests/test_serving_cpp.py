"""The export through TF Serving's C++ path: a small program linked against the installed
TensorFlow wheel (`libtensorflow_cc.so.2`) loads tensorflow-text's SentencePiece op library
with `TF_LoadLibrary`, the SavedModel with `tensorflow::LoadSavedModel(..., {"serve"})`, and
replays the warm-up records and a batch of PredictionLog requests with `Session::Run`; its
answers must equal `tf.saved_model.load`'s. XLA:CPU is disabled in it, as in a
tensorflow_model_server started without --xla_cpu_compilation_enabled: the default export
serves every signature there (test_compiled_search.py runs the compiled search with the
flag). The compiled program is cached (pytest cache) under a hash of its source and the
compile flags."""

import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_export_translator
from support.environment import user_env
from support.serving import ROBUST_INPUTS
from support.serving_cpp import OP_LIBRARY

from tfxformer.serving.warmup import (
    BATCHABLE_SIGNATURES,
    read_warmup_records,
    signature_inputs,
)

# compiles and runs a C++ program, in the environment a user has
pytestmark = [pytest.mark.slow, pytest.mark.user_env]

@pytest.fixture(scope="module")
def export(tiny_export, spm_model):
    """(translator, version dir) of conftest's tiny export."""
    return tiny_export_translator(tiny_export, spm_model), tiny_export


def _batch_requests(translator, path):
    """A PredictionLog file: hostile inputs through the batchable signatures."""
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    texts = list(ROBUST_INPUTS[:14]) + [b"x" * 5000]
    with tf.io.TFRecordWriter(path) as writer:
        for signature in BATCHABLE_SIGNATURES:
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = signature
            inputs = signature_inputs(translator, signature, texts)
            if signature == "translate_per_example":
                inputs["beam_size"][::2] = 1
                inputs["max_input_tokens"][::3] = 4
            if signature == "translate_nbest":  # every steering option on some texts
                inputs["num_hypotheses"][::2] = 1
                inputs["target_prefix"][1::3] = "Ein Hund"
                inputs["target_prefix"][2] = b"\xff Hund " * 40
                inputs["no_repeat_ngram_size"][::4] = 2
                inputs["repetition_penalty"][1::4] = 1.3
                inputs["constraints"][::3] = "Hund\tim Park"
                inputs["constraints"][4] = b"\xff Park\t" * 40
            if signature == "score":
                inputs["target"] = inputs["target"][::-1]
            for name, value in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())


def test_cpp_load_and_run_equals_tf_saved_model_load(program, export, tmp_path):
    translator, version = export
    batch, output = str(tmp_path / "batch.tfrecord"), str(tmp_path / "out.tfrecord")
    _batch_requests(translator, batch)
    warmup = os.path.join(version, "assets.extra", "tf_serving_warmup_requests")
    result = subprocess.run([program, OP_LIBRARY, version, output, warmup, batch],
                            capture_output=True, timeout=300,
                            env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    requests = read_warmup_records(warmup) + read_warmup_records(batch)
    assert f"ran {len(requests)} requests" in result.stdout.decode()

    records = [r.numpy() for r in tf.data.TFRecordDataset(output)]
    answers = {}
    for name, raw in zip(records[::2], records[1::2], strict=True):
        proto = tf.make_tensor_proto(0)
        proto.ParseFromString(raw)
        answers.setdefault(name.decode(), []).append(tf.make_ndarray(proto))
    loaded = tf.saved_model.load(version)
    for i, log in enumerate(requests):
        request = log.predict_log.request
        signature = request.model_spec.signature_name
        expected = loaded.signatures[signature](**{k: tf.make_ndarray(v)
                                                   for k, v in request.inputs.items()})
        got = {k: answers[f"{signature}/{k}"].pop(0) for k in expected}
        for key, value in expected.items():
            if value.dtype.is_floating:
                np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)
            else:
                assert got[key].tolist() == value.numpy().tolist(), (i, key)
    assert all(not left for left in answers.values())
