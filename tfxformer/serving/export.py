"""Export a :class:`Translator` as a SavedModel for TF Serving (`<export-dir>/<version>/`).

Signatures:
    serving_default: text (tf.string, [None]) -> translation (tf.string, [None]),
        score (tf.float32, [None]); the decoding options fixed at export time.
    translate_with_options: text, beam_size (int32 scalar), alpha (float32 scalar),
        extra_length (int32 scalar) -> translation, score.
Assets: `spm.model` (SentencePiece) and `config.json` (run config + decoding options).
The graph holds only core TensorFlow and tensorflow-text ops: it loads where
`import tensorflow, tensorflow_text` works, or in a stock TF Serving.

Command line: `python -m tfxformer.serving.export --model RUN_DIR --export-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import tensorflow as tf

from tfxformer.decoding import DEFAULT_ALPHA, DEFAULT_BEAM_SIZE, DEFAULT_EXTRA_LENGTH
from tfxformer.serving.loading import (
    CONFIG_FILENAME,
    SPM_FILENAME,
    load_run_dir,
    saved_model_versions,
)
from tfxformer.serving.translator import DEFAULT_MAX_BATCH_SIZE, Translator


def next_version(export_dir):
    """The next SavedModel version in `export_dir`: 1 + the largest existing, or 1."""
    if os.path.isdir(export_dir):
        taken = [int(name) for name in os.listdir(export_dir) if name.isdigit()]
    else:
        taken = []
    return max(taken, default=0) + 1


def _asset_config(translator, config):
    """The config.json asset: the run config plus the model and decoding settings."""
    config = dict(config or {})
    config["model"] = dict(translator.model.model_config)
    config["compute_dtype"] = translator.model.compute_dtype
    config["decoding"] = dict(
        beam_size=translator.beam_size, alpha=translator.alpha,
        extra_length=translator.extra_length, max_batch_size=translator.max_batch_size,
        max_input_length=translator.max_input_length)
    return config


def export_translator(translator, export_dir, config=None, version=None):
    """Saves `translator` to `<export_dir>/<version>/`; returns that path.

    `version` defaults to :func:`next_version`. The SavedModel is written to a hidden
    temporary directory and renamed into place, so a TF Serving watching `export_dir`
    never sees a half-written version.

    Raises:
        FileExistsError: `<export_dir>/<version>` exists.
    """
    version = next_version(export_dir) if version is None else int(version)
    if version < 1:
        raise ValueError(f"`version` must be a positive integer, got {version}.")
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"SavedModel version dir {final!r} exists; versions taken: "
                              f"{saved_model_versions(export_dir)}.")
    os.makedirs(export_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=export_dir)
    try:
        with tempfile.TemporaryDirectory() as sources:
            _save(translator, os.path.join(staging, "model"), sources,
                  _asset_config(translator, config))
        os.rename(os.path.join(staging, "model"), final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _save(translator, path, sources, config):
    """Saves an export root holding the two functions, the tf.Variables they capture and
    the assets, and no Keras object: Keras 3 layers saved as children of the root fail in
    session-based loaders (TF Serving, `saved_model_cli run`: "Could not find variable",
    keras-team/keras#20095). Keras' own ExportArchive saves such a root too."""
    root = tf.Module(name="translator")
    root.translate = translator.__call__
    root.translate_with_options = translator.translate_with_options
    signatures = {
        "serving_default": translator.__call__.get_concrete_function(),
        "translate_with_options": translator.translate_with_options.get_concrete_function(),
    }
    captured = {}
    for function in signatures.values():
        captured.update((id(v), v) for v in function.variables)
    root.model_variables = list(captured.values())
    contents = {SPM_FILENAME: translator.sentencepiece_model,
                CONFIG_FILENAME: json.dumps(config, indent=2, sort_keys=True).encode()}
    for name, filename in (("sentencepiece_asset", SPM_FILENAME),
                           ("config_asset", CONFIG_FILENAME)):
        with open(os.path.join(sources, filename), "wb") as f:
            f.write(contents[filename])
        setattr(root, name, tf.saved_model.Asset(os.path.join(sources, filename)))
    tf.saved_model.save(root, path, signatures=signatures)


def export_run_dir(model_dir, export_dir, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                   extra_length=DEFAULT_EXTRA_LENGTH, max_batch_size=DEFAULT_MAX_BATCH_SIZE,
                   checkpoint=None, version=None, precision="fp32"):
    """Loads a trained run dir (:func:`load_run_dir`) and exports its translator
    (`precision` "bf16": computes in bfloat16, float32 weights)."""
    model, config, spm_bytes = load_run_dir(model_dir, checkpoint, precision=precision)
    translator = Translator(model, spm_bytes, beam_size=beam_size, alpha=alpha,
                            extra_length=extra_length, max_batch_size=max_batch_size)
    return export_translator(translator, export_dir, config=config, version=version)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tfxformer.serving.export",
        description="Export a trained run dir as a TF Serving SavedModel "
                    "<export-dir>/<version>/ (version: next integer).")
    parser.add_argument("--model", required=True,
                        help="trained run dir (config.json, spm.model, checkpoints/)")
    parser.add_argument("--export-dir", required=True,
                        help="model base path for TF Serving, e.g. saved_models/en_de")
    parser.add_argument("--checkpoint", help="checkpoint prefix (default: newest, averaged "
                        "ones first)")
    parser.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help="default beam size of serving_default (default: %(default)s)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="default length penalty α (default: %(default)s)")
    parser.add_argument("--max-extra-length", type=int, default=DEFAULT_EXTRA_LENGTH,
                        help="output tokens beyond the source length (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help="sentences decoded together inside the graph "
                             "(default: %(default)s)")
    parser.add_argument("--version", type=int, help="version number (default: next free)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="compute type of the exported graph: bf16 is faster on CPUs "
                             "with AVX512-BF16 (weights stay float32) (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        path = export_run_dir(args.model, args.export_dir, beam_size=args.beam_size,
                              alpha=args.alpha, extra_length=args.max_extra_length,
                              max_batch_size=args.batch_size, checkpoint=args.checkpoint,
                              version=args.version, precision=args.precision)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
