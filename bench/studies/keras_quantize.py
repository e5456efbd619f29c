#!/usr/bin/env python
"""Keras 3 int8 quantization (`model.quantize("int8")`) of the shipped model: size, speed, BLEU.

Conclusion: Keras int8 is the Keras-native path, not a speed-up on this CPU: it quantizes only the
feed-forward kernels, saves 16% of the `.keras` file and keeps BLEU (39.78 vs 39.82), but
runs 0.75x fp32 (bench/results/keras_quantize.log).

The shipped model (`saved_models/multi30k_en_de`, its highest version) is a translator
SavedModel, not a `.keras` file, so the Keras `Transformer` is rebuilt from it:
`Transformer.from_config(config["model"])` from `assets/config.json`, each of its variables
set from the SavedModel variable of the same
Keras path and shape (all must match), and the rebuild checked against the SavedModel's own
`serving_default` translations (--check sentences, beam 4). A copy is then quantized with
`model.quantize("int8")` (Keras int8: the `keras.layers.Dense` kernels of the position-wise
feed-forward networks become int8 with per-channel scales, inputs quantized per token at run
time; the shared embedding and the attention projections are tfxformer weights Keras does
not quantize) and round-tripped through `model.save` / `keras.models.load_model`.

Measured in one run, fp32 and int8 alternating: `.keras` size on disk, translation speed
(sentences/s) of tfxformer's Translator (tokenize, sort by length, decode, detokenize: the
SavedModel's graph) with beam 4, α 0.6 and greedy (beam 1, α 0), and sacreBLEU (cased, 13a)
of each on the first --sentences lines of Multi30k test_2016_flickr.

  python bench/studies/keras_quantize.py                 # 1000 sentences, 2 repeats
  python bench/studies/keras_quantize.py --sentences 200 --repeats 1

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(REPO, "saved_models", "multi30k_en_de")
DEFAULT_DATA = os.path.join(REPO, "..", "shared", "data", "multi30k")
MODES = {"beam4": (4, 0.6), "greedy": (1, 0.0)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="translator SavedModel: a version dir or its export dir (highest version)")
    ap.add_argument("--data", default=DEFAULT_DATA, help="Multi30k dir (test_2016_flickr.*)")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--check", type=int, default=16,
                    help="sentences the rebuilt fp32 model must translate exactly as the "
                         "SavedModel does")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per model and mode")
    ap.add_argument("--batch-size", type=int, default=64)
    return ap.parse_args(argv)


def rebuild(saved_model, config):
    """The Keras Transformer with the SavedModel's weights, matched by Keras path."""
    from tfxformer import Transformer

    model = Transformer.from_config(config["model"])  # accepts the old `max_length` key
    model.build()
    saved = {v.name.rsplit(":", 1)[0]: v for v in saved_model.model_variables}
    wanted = {v.path: v for v in model.weights}
    if set(saved) != set(wanted):
        raise ValueError(f"SavedModel variables {sorted(set(saved) ^ set(wanted))[:6]} do "
                         "not match the Transformer of its config.json.")
    for path, variable in wanted.items():
        if tuple(saved[path].shape) != tuple(variable.shape):
            raise ValueError(f"{path}: SavedModel shape {saved[path].shape}, model "
                             f"{variable.shape}.")
        variable.assign(saved[path])
    return model


def translate(translator, lines, mode):
    import tensorflow as tf

    beam, alpha = MODES[mode]
    out = translator.translate_with_options(tf.constant(lines), tf.constant(beam, tf.int32),
                                            tf.constant(alpha, tf.float32),
                                            tf.constant(translator.extra_length, tf.int32))
    return [t.decode("utf-8") for t in out["translation"].numpy()]


def quantized_copy(model, tmp):
    """`model` quantized to int8, saved and loaded back; (loaded model, its .keras path)."""
    import keras
    import numpy as np

    from tfxformer import Transformer

    copy = Transformer.from_config(model.get_config())
    copy.build()
    copy.set_weights(model.get_weights())
    copy.quantize("int8")
    path = os.path.join(tmp, "int8.keras")
    copy.save(path)
    loaded = keras.models.load_model(path)
    probe = (np.array([[5, 6, 7, 8, 3]], "int32"), np.array([[2, 9, 10]], "int32"))
    if not np.array_equal(copy(probe).numpy(), loaded(probe).numpy()):
        raise AssertionError("The int8 model changed through save/load.")
    return loaded, path


def main(argv=None):
    from tfxformer.serving import resolve_model_dir

    args = parse_args(argv)
    args.model = resolve_model_dir(args.model)[1]  # an export dir: its highest version
    bl.quiet_tf()
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

    from tfxformer.bleu import sacrebleu_scores
    from tfxformer.serving.translator import Translator

    saved_model = tf.saved_model.load(args.model)
    with open(os.path.join(args.model, "assets", "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(args.model, "assets", "spm.model"), "rb") as f:
        spm_bytes = f.read()
    src, tgt = (config.get("src", "en"), config.get("tgt", "de"))
    with open(os.path.join(args.data, f"test_2016_flickr.{src}")) as f:
        sources = [line.rstrip("\n") for line in f][: args.sentences]
    with open(os.path.join(args.data, f"test_2016_flickr.{tgt}")) as f:
        references = [line.rstrip("\n") for line in f][: len(sources)]

    fp32 = rebuild(saved_model, config)
    expected = [t.decode() for t in saved_model.signatures["serving_default"](
        text=tf.constant(sources[: args.check]))["translation"].numpy()]
    with tempfile.TemporaryDirectory() as tmp:
        fp32_path = os.path.join(tmp, "fp32.keras")
        fp32.save(fp32_path)
        int8, int8_path = quantized_copy(fp32, tmp)
        sizes = {"fp32": os.path.getsize(fp32_path), "int8": os.path.getsize(int8_path)}
    models = {"fp32": fp32, "int8": int8}
    translators = {name: Translator(model, spm_bytes, max_batch_size=args.batch_size)
                   for name, model in models.items()}
    rebuilt = translate(translators["fp32"], sources[: args.check], "beam4")
    if rebuilt != expected:
        pairs = zip(rebuilt, expected, strict=True)
        raise AssertionError("The rebuilt fp32 model does not translate as the SavedModel: "
                             f"{[(a, b) for a, b in pairs if a != b][:2]}")
    bl.log(f"rebuilt fp32 model == SavedModel on {args.check} sentences (beam 4)")

    result = {"bench": "keras_quantize", "model": os.path.relpath(args.model, REPO),
              "sentences": len(sources), "batch_size": args.batch_size,
              "int8_kernels": sorted(w.path for w in int8.weights if w.dtype == "int8"),
              "size_bytes": sizes, "modes": {}}
    for mode in MODES:
        timings = {"fp32": [], "int8": []}
        outputs = {}
        for translator in translators.values():  # warm-up: tracing, not timed
            translate(translator, sources[:8], mode)
        for _ in range(args.repeats):
            for name, translator in translators.items():
                start = time.perf_counter()
                outputs[name] = translate(translator, sources, mode)
                timings[name].append(time.perf_counter() - start)
        entry = {}
        for name in models:
            scores = sacrebleu_scores(outputs[name], references)
            best = min(timings[name])
            entry[name] = {"seconds": bl.spread(timings[name]),
                           "sentences_per_s": round(len(sources) / best, 1),
                           "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                           "signature": scores["signature"]}
        entry["identical_translations"] = sum(
            a == b for a, b in zip(outputs["fp32"], outputs["int8"], strict=True))
        result["modes"][mode] = entry
        bl.log(f"{mode}: " + json.dumps(entry))
    result["machine"] = bl.machine()
    result["peak_rss_mib"] = bl.peak_rss_mib()
    bl.emit(result)


if __name__ == "__main__":
    main()
