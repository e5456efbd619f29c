#!/usr/bin/env python
"""Query a TF Serving that serves a tfxformer export, over REST or gRPC.

    python scripts/serving_client.py --model-name en_de "A dog runs." "Two men talk."
    echo "A dog runs." | python scripts/serving_client.py --model-name en_de --protocol grpc

REST posts JSON to http://HOST:8501/v1/models/NAME[/versions/V]:predict (standard
library only). gRPC sends a PredictRequest to HOST:8500 and needs
`pip install tensorflow-serving-api==2.21.*`; both read the default options from
tfxformer.config, which loads without TensorFlow. Without decoding options the
`serving_default` signature is used; with any of them, `translate_with_options`.
Prints "score<TAB>translation" per input with --scores, else the translation.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from tfxformer.config import DecodingOptions

DEFAULT_OPTIONS = DecodingOptions().search_options()  # §6.1, the export default
OPTION_TYPES = dict(beam_size="int32", alpha="float32", extra_length="int32")


def _signature(options):
    return "translate_with_options" if options else "serving_default"


def _full_options(options):
    """The options signature takes all three inputs: unset ones get the paper's values."""
    return {name: options.get(name, default) for name, default in DEFAULT_OPTIONS.items()}


def predict_rest(texts, model_name, host="localhost", port=8501, options=None, version=None,
                 timeout=60.0):
    """Translations and scores of `texts` (a list of str) from TF Serving's REST API."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    inputs = {"text": list(texts)}
    if options:
        inputs.update(_full_options(options))
    path = f"/v1/models/{model_name}" + (f"/versions/{version}" if version else "")
    url = f"http://{host}:{port}{path}:predict"
    body = json.dumps({"signature_name": _signature(options), "inputs": inputs}).encode()
    request = urllib.request.Request(url, data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.load(response)
    except urllib.error.HTTPError as err:
        detail = err.read().decode("utf-8", "replace")
        raise RuntimeError(f"TF Serving at {url} answered HTTP {err.code}: {detail}") from None
    except urllib.error.URLError as err:
        raise RuntimeError(f"Cannot reach TF Serving at {url}: {err.reason}") from None
    outputs = reply["outputs"]
    return list(outputs["translation"]), [float(s) for s in outputs["score"]]


def _grpc_modules():
    try:
        import grpc
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    except ImportError as err:
        raise RuntimeError(
            f"gRPC needs the TF Serving API ({err}); install it with "
            "`pip install tensorflow-serving-api==2.21.*`, or use --protocol rest.") from None
    return grpc, tf, predict_pb2, prediction_service_pb2_grpc


def predict_grpc(texts, model_name, host="localhost", port=8500, options=None, version=None,
                 timeout=60.0):
    """Translations and scores of `texts` from TF Serving's gRPC PredictionService."""
    grpc, tf, predict_pb2, service = _grpc_modules()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = _signature(options)
    if version:
        request.model_spec.version.value = int(version)
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(list(texts), dtype=tf.string))
    if options:
        for name, value in _full_options(options).items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=OPTION_TYPES[name]))
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            response = service.PredictionServiceStub(channel).Predict(request, timeout=timeout)
        except grpc.RpcError as err:
            raise RuntimeError(f"TF Serving gRPC at {host}:{port} failed: {err.code()} "
                               f"{err.details()}") from None
    translations = tf.make_ndarray(response.outputs["translation"])
    scores = tf.make_ndarray(response.outputs["score"])
    return [t.decode("utf-8") for t in translations], [float(s) for s in scores]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("texts", nargs="*", help="sentences to translate (default: stdin lines)")
    parser.add_argument("--model-name", required=True, help="TF Serving --model_name")
    parser.add_argument("--host", default="localhost", help="server host (default: localhost)")
    parser.add_argument("--protocol", choices=("rest", "grpc"), default="rest",
                        help="REST (port 8501) or gRPC (port 8500) (default: rest)")
    parser.add_argument("--port", type=int, help="server port (default: 8501 REST, 8500 gRPC)")
    parser.add_argument("--version", type=int, help="model version (default: the latest)")
    parser.add_argument("--beam-size", type=int, help="beam size (uses translate_with_options)")
    parser.add_argument("--alpha", type=float, help="length penalty α (same)")
    parser.add_argument("--extra-length", type=int, help="output tokens beyond the "
                        "source length (same)")
    parser.add_argument("--scores", action="store_true", help="print score<TAB>translation")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds (default: 60)")
    args = parser.parse_args(argv)
    texts = args.texts or [line.rstrip("\r\n") for line in sys.stdin]
    if not texts:
        return 0
    options = dict(beam_size=args.beam_size, alpha=args.alpha,
                   extra_length=args.extra_length)
    predict = predict_rest if args.protocol == "rest" else predict_grpc
    port = args.port or (8501 if args.protocol == "rest" else 8500)
    try:
        translations, scores = predict(texts, args.model_name, host=args.host, port=port,
                                       options=options, version=args.version,
                                       timeout=args.timeout)
    except RuntimeError as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    for translation, score in zip(translations, scores, strict=True):
        print(f"{score:.4f}\t{translation}" if args.scores else translation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
