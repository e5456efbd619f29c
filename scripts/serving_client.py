#!/usr/bin/env python
"""Query a TF Serving that serves a tfxformer export, over REST or gRPC.

    python scripts/serving_client.py --model-name en_de "A dog runs." "Two men talk."
    echo "A dog runs." | python scripts/serving_client.py --model-name en_de --protocol grpc

REST posts JSON to http://HOST:8501/v1/models/NAME[/versions/V]:predict (standard
library only). gRPC sends a PredictRequest to HOST:8500 and needs
`pip install tensorflow-serving-api==2.21.*` (and TensorFlow).

Without decoding options the `serving_default` signature is used: the export's own beam
size, α and extra length. With any of them, `translate_per_example` (the signature TF
Serving's `--enable_batching` batches; `translate_with_options` takes scalars, which it
rejects), each text with the options given and the export's for the others: TF Serving
does not tell them, so they are read from the export's `assets/config.json` (`--export`,
the directory the server serves) unless all three are given.
Prints "score<TAB>translation" per input with --scores, else the translation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

OPTIONS = ("beam_size", "alpha", "extra_length")
OPTION_TYPES = dict(beam_size="int32", alpha="float32", extra_length="int32",
                    max_input_tokens="int32")
INT32_MAX = 2**31 - 1  # max_input_tokens above the export's limit is lowered to it


def export_options(path):
    """The decoding options recorded in an export: `path` is a SavedModel version dir,
    its export dir (the highest version) or an `assets/config.json`. Returns
    {beam_size, alpha, extra_length, max_input_tokens}."""
    config = path
    if os.path.isdir(path):
        version = path
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            versions = [v for v in os.listdir(path)
                        if v.isdigit() and os.path.isfile(os.path.join(path, v, "saved_model.pb"))]
            if not versions:
                raise ValueError(f"--export {path!r} is no SavedModel: it holds neither "
                                 "saved_model.pb nor version dirs <N>/saved_model.pb.")
            version = os.path.join(path, max(versions, key=int))
        config = os.path.join(version, "assets", "config.json")
    try:
        with open(config, encoding="utf-8") as f:
            decoding = json.load(f)["decoding"]
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"Cannot read the decoding options of --export {path!r} from "
                         f"{config} ({err}); give an export dir, a version dir or its "
                         "assets/config.json.") from None
    return {name: decoding[name] for name in (*OPTIONS, "max_input_tokens")}


def request_inputs(texts, options=None, defaults=None):
    """(signature name, inputs) of a request: `serving_default` without options; with
    some, `translate_per_example` with one value per text, the unset ones from
    `defaults` (an export's recorded options, :func:`export_options`)."""
    options = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"Unknown options {sorted(unknown)}; accepted: {', '.join(OPTIONS)}.")
    texts = list(texts)
    if not options:
        return "serving_default", {"text": texts}
    missing = [name for name in OPTIONS if name not in options]
    if missing and not defaults:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise ValueError(f"{flags} not given: TF Serving does not tell an export's options, "
                         "so give --export EXPORT_DIR (the directory the server serves) to "
                         "use the export's, or set them too.")
    full = {name: options.get(name, (defaults or {}).get(name)) for name in OPTIONS}
    full["max_input_tokens"] = (defaults or {}).get("max_input_tokens", INT32_MAX)
    inputs = {"text": texts}
    inputs.update({name: [value] * len(texts) for name, value in full.items()})
    return "translate_per_example", inputs


def predict_rest(texts, model_name, host="localhost", port=8501, options=None, version=None,
                 timeout=60.0, defaults=None):
    """Translations and scores of `texts` (a list of str) from TF Serving's REST API;
    `options` and `defaults` as in :func:`request_inputs`."""
    signature, inputs = request_inputs(texts, options, defaults)
    path = f"/v1/models/{model_name}" + (f"/versions/{version}" if version else "")
    url = f"http://{host}:{port}{path}:predict"
    body = json.dumps({"signature_name": signature, "inputs": inputs}).encode()
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
                 timeout=60.0, defaults=None):
    """Translations and scores of `texts` from TF Serving's gRPC PredictionService;
    `options` and `defaults` as in :func:`request_inputs`."""
    grpc, tf, predict_pb2, service = _grpc_modules()
    signature, inputs = request_inputs(texts, options, defaults)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    if version:
        request.model_spec.version.value = int(version)
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(
            tf.make_tensor_proto(value, dtype=OPTION_TYPES.get(name, tf.string)))
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
    parser.add_argument("--beam-size", type=int, help="beam size; any of the three "
                        "options sends the request to translate_per_example (default: the "
                        "export's)")
    parser.add_argument("--alpha", type=float, help="length penalty α (default: the export's)")
    parser.add_argument("--extra-length", type=int, help="output tokens beyond the "
                        "source length (default: the export's)")
    parser.add_argument("--export", metavar="DIR", help="the export the server serves (export "
                        "dir, version dir or its assets/config.json): the options not given "
                        "are read from it (needed when some but not all of the three are given)")
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
        defaults = export_options(args.export) if args.export else None
        translations, scores = predict(texts, args.model_name, host=args.host, port=port,
                                       options=options, version=args.version,
                                       timeout=args.timeout, defaults=defaults)
    except (RuntimeError, ValueError) as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    for translation, score in zip(translations, scores, strict=True):
        print(f"{score:.4f}\t{translation}" if args.scores else translation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
