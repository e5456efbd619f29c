"""TF Serving warm-up records and batching parameters written beside each export.

TF Serving replays `<version>/assets.extra/tf_serving_warmup_requests` (a TFRecord of
`tensorflow.serving.PredictionLog`, at most 1,000 records) through the signatures the
records name before the version takes traffic, so the first client request does not pay
for graph optimization and kernel set-up. `batching_parameters.txt` is an example
`--batching_parameters_file` for `tensorflow_model_server --enable_batching`.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tfxformer.decoding.shortlist import shortlist_ids
from tfxformer.ids import EOS_ID

__all__ = [
    "BATCHABLE_SIGNATURES", "LONG_TEXT", "SHORT_TEXT", "batching_parameters",
    "bucket_texts", "read_warmup_records", "signature_inputs",
]

_EXTRA_DIR = "assets.extra"
_WARMUP_FILENAME = "tf_serving_warmup_requests"
_BATCHING_FILENAME = "batching_parameters.txt"
_MAX_RECORDS = 1000  # TF Serving reads no more warm-up records than this
# The signatures a client calls whose every input and output is batch-major (TF Serving
# batching concatenates requests along dimension 0); translate_with_options and
# translate_sampled (scalar options) are not.
BATCHABLE_SIGNATURES = ("serving_default", "translate_per_example", "translate_nbest",
                        "score")
SHORT_TEXT = "A dog runs in the park."
LONG_TEXT = ("A group of young men in red and white uniforms is playing football on a green "
             "field near the old stone church, while their families watch from the wooden "
             "benches and a small brown dog runs after the ball along the white line.")
_BATCH_TIMEOUT_MICROS = 1000  # small against a warm single-sentence request (~0.2 s)


def _serving_apis():
    try:
        from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
    except ImportError as err:  # pinned in setup.py; a clear message if it is missing
        raise ImportError("Warm-up records need the TF Serving protos: pip install "
                          "tensorflow-serving-api==2.21.*") from err
    return predict_pb2, prediction_log_pb2


def signature_inputs(translator, signature, texts):
    """The request inputs of `signature` for `texts`: {name: numpy array}, batch-major.

    `translate_per_example` and `translate_nbest` get the export's own options, one value
    per text (`translate_nbest`: n-best lists of the beam size); `score` scores each text
    as its own target; a multilingual model's `target_language` takes its languages in
    turn."""
    inputs = {"text": np.array(texts, dtype=object)}
    languages = translator.target_languages
    if languages:
        inputs["target_language"] = np.array(
            [languages[i % len(languages)] for i in range(len(texts))], dtype=object)
    if signature in ("translate_per_example", "translate_nbest"):
        size = len(texts)
        inputs.update(
            beam_size=np.full([size], translator.beam_size, np.int32),
            alpha=np.full([size], translator.alpha, np.float32),
            extra_length=np.full([size], translator.extra_length, np.int32),
            max_input_tokens=np.full([size], translator.max_input_tokens, np.int32))
        if signature == "translate_nbest":  # the steering options off but the n-best
            inputs.update(num_hypotheses=np.full([size], translator.beam_size, np.int32),
                          no_repeat_ngram_size=np.zeros([size], np.int32),
                          repetition_penalty=np.ones([size], np.float32),
                          target_prefix=np.array([""] * size, dtype=object),
                          constraints=np.array([""] * size, dtype=object))
    elif signature == "score":
        inputs["target"] = inputs["text"]
    elif signature != "serving_default":
        raise ValueError(f"No warm-up inputs for signature {signature!r}; batchable "
                         f"signatures: {BATCHABLE_SIGNATURES}.")
    return inputs


def _warmup_batch_sizes(translator):
    """Batch size 1 and the size the export is tuned for (its `max_batch_size`)."""
    return sorted({1, translator.max_batch_size})


def warmup_requests(translator, signatures=BATCHABLE_SIGNATURES, batch_sizes=None):
    """PredictionLog protos: for each signature and batch size, a batch of short and a
    batch of long sentences (the tuned-size batches also hold a blank input)."""
    predict_pb2, prediction_log_pb2 = _serving_apis()
    logs = []
    for signature in signatures:
        for size in batch_sizes or _warmup_batch_sizes(translator):
            for text in (SHORT_TEXT, LONG_TEXT):
                texts = [text] * size
                if size > 1:
                    texts[-1] = ""
                request = predict_pb2.PredictRequest()
                request.model_spec.signature_name = signature
                for name, value in signature_inputs(translator, signature, texts).items():
                    request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
                logs.append(prediction_log_pb2.PredictionLog(
                    predict_log=prediction_log_pb2.PredictLog(request=request)))
    if "serving_default" in signatures:  # the compiled programs are the signatures' own
        for text in bucket_texts(translator):
            logs.append(_request(predict_pb2, prediction_log_pb2, translator,
                                 "serving_default", [text]))
    if len(logs) > _MAX_RECORDS:
        raise ValueError(f"{len(logs)} warm-up records; TF Serving reads at most "
                         f"{_MAX_RECORDS}.")
    return logs


def _request(predict_pb2, prediction_log_pb2, translator, signature, texts):
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    for name, value in signature_inputs(translator, signature, texts).items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))


def bucket_texts(translator):
    """The texts whose replay at load compiles the programs a lone sentence commonly needs
    in the translator's XLA-compiled search (:class:`tfxformer.serving.compiled.
    CompiledSearch`; none without it): LONG_TEXT's words repeated (as one sentence), per
    source-length bucket the fewest that pass the bucket below and, with a shortlist, "the"
    repeated as long (the smallest shortlist a sentence of that length has) and the first
    of LONG_TEXT's that reaches each further shortlist bucket on the way to the bucket's
    length."""
    compiled = getattr(translator, "compiled_search", None)
    if compiled is None:
        return []
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=translator.sentencepiece_model)
    words = LONG_TEXT.rstrip(".").split()  # no sentence end, however often repeated

    def text(count):
        return " ".join(words[i % len(words)] for i in range(count)) or SHORT_TEXT

    texts, below, count = [], 0, 0
    for bucket in compiled.length_buckets:
        while len(sp.encode(text(count))) < below:
            count += 1
        reached = set()
        if compiled.shortlist_buckets:
            plain = _repeated(sp, "the", below)
            reached.add(_shortlist_bucket(translator, sp.encode(plain)))
            texts.append(plain)
        while True:
            shortlist = _shortlist_bucket(translator, sp.encode(text(count)))
            if shortlist not in reached:
                reached.add(shortlist)
                texts.append(text(count))
            if shortlist is None or len(sp.encode(text(count + 1))) >= bucket:  # EOS too
                break
            count += 1
        below = bucket
    return texts


def _repeated(sp, word, pieces):
    """`word` repeated until the text has at least `pieces` pieces (at least once)."""
    count = 1
    while len(sp.encode(" ".join([word] * count))) < pieces:
        count += 1
    return " ".join([word] * count)


def _shortlist_bucket(translator, pieces):
    """The compiled search's shortlist bucket of one sentence of `pieces` (None without a
    shortlist)."""
    buckets = translator.compiled_search.shortlist_buckets
    if not buckets:
        return None
    size = int(tf.size(shortlist_ids([pieces + [EOS_ID]], *translator.shortlist_variables)))
    return min(b for b in buckets if b >= size)


def write_warmup_records(version_dir, logs):
    """Writes `logs` to `<version_dir>/assets.extra/tf_serving_warmup_requests`."""
    os.makedirs(os.path.join(version_dir, _EXTRA_DIR), exist_ok=True)
    path = os.path.join(version_dir, _EXTRA_DIR, _WARMUP_FILENAME)
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return path


def read_warmup_records(path):
    """The PredictionLog protos of a warm-up file (a version dir or the file itself)."""
    _, prediction_log_pb2 = _serving_apis()
    if os.path.isdir(path):
        path = os.path.join(path, _EXTRA_DIR, _WARMUP_FILENAME)
    logs = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        logs.append(log)
    return logs


def batching_parameters(max_batch_size, num_batch_threads=None,
                        batch_timeout_micros=_BATCH_TIMEOUT_MICROS):
    """An example `--batching_parameters_file` (text BatchingParameters proto) for CPU,
    its comments giving the server's thread flags to use with it."""
    threads = num_batch_threads or os.cpu_count() or 1
    return (
        "# tensorflow_model_server --enable_batching --batching_parameters_file=THIS_FILE \\\n"
        f"#   --tensorflow_intra_op_parallelism=1 --tensorflow_inter_op_parallelism={threads}\n"
        "# CPU example written at export: num_batch_threads = the exporting machine's cores\n"
        "# (set it and --tensorflow_inter_op_parallelism to the server's): one batch per core\n"
        "# at a time, each op on one thread, the faster setting for a model this size\n"
        "# (tfxformer's bench/README.md); max_batch_size = the export's in-graph chunk size,\n"
        "# so a batch is decoded in one go. Clients send at most max_batch_size texts a\n"
        "# request.\n"
        f"max_batch_size {{ value: {int(max_batch_size)} }}\n"
        f"batch_timeout_micros {{ value: {int(batch_timeout_micros)} }}\n"
        f"max_enqueued_batches {{ value: {max(4, 4 * threads)} }}\n"
        f"num_batch_threads {{ value: {threads} }}\n"
        "pad_variable_length_inputs: false\n")


def write_batching_parameters(version_dir, max_batch_size, num_batch_threads=None):
    """Writes `<version_dir>/assets.extra/batching_parameters.txt`; returns its path."""
    os.makedirs(os.path.join(version_dir, _EXTRA_DIR), exist_ok=True)
    path = os.path.join(version_dir, _EXTRA_DIR, _BATCHING_FILENAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(batching_parameters(max_batch_size, num_batch_threads))
    return path
