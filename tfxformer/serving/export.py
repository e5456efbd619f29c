"""Export a :class:`Translator` as a SavedModel for TF Serving (`<export-dir>/<version>/`).

Signatures: serving_default (text, tf.string [None]; the decoding options fixed at export
time), translate_per_example and translate_nbest (options one value per text: TF Serving
batches them), translate_with_options and translate_sampled (scalar options), score
(teacher-forced log P(target | text)); their inputs and outputs are those of
:class:`Translator`'s methods of the same names (docs/serving.md lists them).
A multilingual export's signatures take `target_language` (tf.string, [None]) too.
`signatures` (`scripts/export.py --signatures`) exports only some of them, always with
serving_default: a smaller graph that loads in less memory and time; config.json lists
the ones an export holds (`signatures`).
Assets: `spm.model` (SentencePiece) and `config.json` (run config + decoding options,
`precision`, and `shortlist`: how the vocabulary shortlist table was built, or null);
`assets.extra/`: `tf_serving_warmup_requests` and an example `batching_parameters.txt`
(:mod:`tfxformer.serving.warmup`). The graph holds only core TensorFlow and
tensorflow-text ops: it loads where `import tensorflow, tensorflow_text` works, or in a
stock TF Serving.

A vocabulary shortlist's table (:mod:`tfxformer.serving.shortlist_data`) is saved as
`shortlist_table` and `shortlist_frequent` beside `model_variables`; the weights a search
step derives from the model's (:func:`tfxformer.models.search_step.derived_weights`: the
embedding transposed, the self-attention projections joined) as `derived_weights`.

An ensemble (:func:`export_ensemble`) is one SavedModel of several trained models that
share a vocabulary: the same signatures and assets, its beam search scoring each step
with the members' averaged probabilities; config.json lists the members (`ensemble`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile

import tensorflow as tf

from tfxformer import checks, locate, pretrained
from tfxformer import precision as machine_precision
from tfxformer.config import PRECISION_POLICIES
from tfxformer.locate import saved_model_versions
from tfxformer.models.transformer import Transformer
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME, RunRecord
from tfxformer.serving.compiled import DEFAULT_MAX_BATCH
from tfxformer.serving.multilingual_translator import make_translator
from tfxformer.serving.reading import ReadingOptions
from tfxformer.serving.shortlist_data import shortlist_for
from tfxformer.serving.signatures import check_signatures
from tfxformer.serving.warmup import (
    BATCHABLE_SIGNATURES,
    warmup_requests,
    write_batching_parameters,
    write_warmup_records,
)


def next_version(export_dir):
    """The next SavedModel version in `export_dir`: 1 + the largest existing, or 1."""
    if os.path.isdir(export_dir):
        taken = [int(name) for name in os.listdir(export_dir) if name.isdigit()]
    else:
        taken = []
    return max(taken, default=0) + 1


_PRECISION_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


# Training settings that name where a run was made (its run dir, export dir, dataset
# folders): an export travels to other machines, so its record keeps none of them.
_LOCAL_PATHS = ("model_dir", "export_dir", "tfds_data_dir", "tfds_manual_dir")


def _portable(record: RunRecord) -> RunRecord:
    """`record` without this machine's paths: the run and export dirs dropped, an absolute
    training data folder or `init_from` path cut to its last component."""
    train = {k: v for k, v in record.train.items() if k not in _LOCAL_PATHS}
    for key in ("data", "init_from"):
        if isinstance(train.get(key), str) and os.path.isabs(train[key]):
            train[key] = os.path.basename(os.path.normpath(train[key]))
    init_from = record.init_from
    if init_from is not None:
        init_from = {k: v for k, v in init_from.items() if k in ("kind", "vocabulary_sha256")}
    return dataclasses.replace(record, train=train, init_from=init_from)


def export_precision(precision):
    """`(precision, reason)` of an export asked for `precision`: "fp32" or "bf16" as given,
    or "auto": bf16 where this machine's CPU has AVX512_BF16 or AMX-BF16, else fp32 (the
    rule of :func:`tfxformer.precision.choose`; an export computes in fp32 or bf16, so a
    GPU's fp16 becomes fp32). Exports are usually served where they are made; serving on
    another CPU kind, choose for that one (docs/serving.md)."""
    if precision != machine_precision.AUTO:
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision {precision!r} not in ['auto', 'bf16', 'fp32'].")
        return precision, "given (`precision`)"
    chosen, why = machine_precision.choose(machine_precision.this_machine())
    if chosen not in ("fp32", "bf16"):
        return "fp32", f"auto: {why}; an export computes in fp32 or bf16: fp32"
    return chosen, f"auto: {why}"


def _asset_config(translator, config, precision_reason=None, signatures=None):
    """The config.json asset: the run record `config` (a :class:`RunRecord`, a dict of
    its entries, or None) with the translator's model, decoding options, precision,
    shortlist and exported `signatures` (each set anew, so a re-export never keeps a stale
    one), and none of the training machine's paths (:func:`_portable`)."""
    given = config.to_dict() if isinstance(config, RunRecord) else dict(config or {})
    model = translator.models[0]
    record = _portable(RunRecord.from_dict({**given, "model": model.model_config.to_dict()}))
    export = dict(precision=_PRECISION_OF_DTYPE.get(model.compute_dtype, model.compute_dtype),
                  compute_dtype=model.compute_dtype, shortlist=translator.shortlist_info,
                  xla_max_batch=translator.xla_max_batch,
                  signatures=list(check_signatures(signatures)),
                  input=translator.reading.to_dict())
    if precision_reason is not None:
        export["precision_reason"] = precision_reason
    if len(translator.models) > 1:
        export["ensemble"] = given.get("ensemble") or _ensemble_record(
            translator, [None] * len(translator.models))
    if getattr(translator, "rerank_info", None):  # tfxformer.serving.reranking
        export["rerank"] = translator.rerank_info
    return dataclasses.replace(record, decoding=translator.options, export=export).to_dict()


def _ensemble_record(translator, sources):
    """The config.json `ensemble` entry: per member its `source` (the basename of the path
    it was loaded from, or None), the vocabulary's SHA-256 and its ModelConfig."""
    digest = hashlib.sha256(translator.sentencepiece_model).hexdigest()
    return [{"source": source, "vocabulary_sha256": digest, "model": m.model_config.to_dict()}
            for source, m in zip(sources, translator.models, strict=True)]


def export_translator(translator, export_dir, config=None, version=None,
                      num_batch_threads=None, precision_reason=None, signatures=None):
    """Saves `translator` to `<export_dir>/<version>/`; returns that path.

    `version` defaults to :func:`next_version`. The SavedModel is written to a hidden
    temporary directory and renamed into place, so a TF Serving watching `export_dir`
    never sees a half-written version. `assets.extra/` gets the warm-up records and an
    example `batching_parameters.txt` (`num_batch_threads`: default, this machine's cores).
    `precision_reason`: why the model computes in its precision, recorded in config.json.
    `signatures`: the names of the signatures to export
    (:data:`tfxformer.serving.signatures.SIGNATURES`; None: all); `serving_default` is
    always one. Fewer signatures make a smaller graph that loads in less memory and time
    (bench/README.md); config.json records them (`signatures`).

    Raises:
        FileExistsError: `<export_dir>/<version>` exists.
        ValueError: an unknown signature name.
    """
    names = check_signatures(signatures)
    version = next_version(export_dir) if version is None else \
        checks.integer(version, "version", 1)
    final = os.path.join(export_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"SavedModel version dir {final!r} exists; versions taken: "
                              f"{saved_model_versions(export_dir)}.")
    os.makedirs(export_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=export_dir)
    try:
        with tempfile.TemporaryDirectory() as sources:
            _save(translator, os.path.join(staging, "model"), sources,
                  _asset_config(translator, config, precision_reason, names), names)
        write_warmup_records(os.path.join(staging, "model"), warmup_requests(
            translator, [name for name in BATCHABLE_SIGNATURES if name in names]))
        write_batching_parameters(os.path.join(staging, "model"), translator.max_batch_size,
                                  num_batch_threads)
        os.rename(os.path.join(staging, "model"), final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


# Where the export root keeps each signature's function (serving_default as `translate`).
_ROOT_ATTRIBUTES = {"serving_default": "translate"}


def _save(translator, path, sources, config, names):
    """Saves an export root holding the functions of the signatures `names` (only those
    are traced), the tf.Variables they capture and the assets, and no Keras object: Keras
    3 layers saved as children of the root fail in session-based loaders (TF Serving,
    `saved_model_cli run`: "Could not find variable", keras-team/keras#20095). Keras' own
    ExportArchive saves such a root too."""
    root = tf.Module(name="translator")
    signatures = {name: getattr(translator, "__call__" if name == "serving_default" else name)
                  .get_concrete_function() for name in names}
    # The concrete functions themselves, not the tf.functions: a tf.function on the root
    # is traced again in the saver's context, and the SavedModel would hold each graph twice.
    for name, function in signatures.items():
        setattr(root, _ROOT_ATTRIBUTES.get(name, name), function)
    captured = {}
    for function in signatures.values():
        captured.update((id(v), v) for v in function.variables)
    # Every weight of the models, also those a search reads only through the derived
    # weights (a re-export or a CTranslate2 conversion of any export loses nothing).
    for model in translator.models:
        captured.update((id(w.value), w.value) for w in model.weights)  # Keras' tf.Variable
    shortlist = {id(v) for v in translator.shortlist_variables}
    derived = {id(v) for v in tf.nest.flatten(translator.derived_weights) if v is not None}
    root.model_variables = [v for k, v in captured.items()
                            if k not in shortlist and k not in derived]
    root.derived_weights = [v for k, v in captured.items() if k in derived]
    if shortlist:
        root.shortlist_table, root.shortlist_frequent = translator.shortlist_variables
    contents = {SPM_FILENAME: translator.sentencepiece_model,
                CONFIG_FILENAME: json.dumps(config, indent=2, sort_keys=True).encode()}
    for name, filename in (("sentencepiece_asset", SPM_FILENAME),
                           ("config_asset", CONFIG_FILENAME)):
        with open(os.path.join(sources, filename), "wb") as f:
            f.write(contents[filename])
        setattr(root, name, tf.saved_model.Asset(os.path.join(sources, filename)))
    tf.saved_model.save(root, path, signatures=signatures)


def _make_translator(model, record, spm_bytes, beam_size=None, alpha=None, extra_length=None,
                    max_batch_size=None, max_input_tokens=None, max_output_tokens=None,
                    shortlist=None, stopping=None, length_normalization=None,
                    xla_max_batch=DEFAULT_MAX_BATCH, sentence_split=True, recase=True,
                    markup=True):
    """A :class:`Translator` whose unset limits default to the run's training length
    filter (`record.max_length` of the :class:`RunRecord`: the model never saw a longer
    source nor produced a longer target) and whose other unset options (None) are
    :class:`tfxformer.config.DecodingOptions`' (`shortlist`: a
    :class:`tfxformer.decoding.ShortlistTable` or None; `stopping` and
    `length_normalization`: beam search's rules, fixed in the graph) and which reads
    each text as sentence rows (`sentence_split`, `recase`, `markup`; the sentence rules of the
    record's source language: :class:`tfxformer.serving.reading.ReadingOptions`)."""
    trained = record.max_length
    return make_translator(model, spm_bytes, record.target_languages, beam_size=beam_size,
                           alpha=alpha, extra_length=extra_length,
                           max_batch_size=max_batch_size,
                           max_input_tokens=max_input_tokens or trained,
                           max_output_tokens=max_output_tokens or trained, shortlist=shortlist,
                           stopping=stopping, length_normalization=length_normalization,
                           reverse_target=record.reverse_target, xla_max_batch=xla_max_batch,
                           reading=reading_options(record, sentence_split, recase, markup))


def reading_options(record, sentence_split=True, recase=True, markup=True):
    """The :class:`ReadingOptions` of an export of `record`'s model: its source language's
    sentence rules, with `sentence_split`, `recase` and `markup` as given."""
    return ReadingOptions(bool(sentence_split), bool(recase), record.src, bool(markup))


def export_run_dir(model_dir, export_dir, beam_size=None, alpha=None, extra_length=None,
                   max_batch_size=None, checkpoint=None, version=None, precision="fp32",
                   max_input_tokens=None, max_output_tokens=None, num_batch_threads=None,
                   shortlist=None, shortlist_data=None, shortlist_max_pairs=None,
                   stopping=None, length_normalization=None, xla_max_batch=DEFAULT_MAX_BATCH,
                   signatures=None, sentence_split=True, recase=True, markup=True):
    """Loads a trained run dir (:func:`tfxformer.pretrained.load_run_dir`), a preset dir
    of `Transformer.save_to_preset` or a SavedModel of one model
    (:func:`tfxformer.pretrained.load_source`; a SavedModel's decoding options not given
    are its own, :func:`export_saved_model`) and exports its translator (`precision`
    "bf16": computes in bfloat16, float32 weights). The input and
    output limits default to the run's training `max_length` (:func:`_make_translator`), else
    256 tokens each; both are capped by the model's positions. `shortlist` (K, N): a
    vocabulary shortlist built from the run's training data (or `shortlist_data`, its
    first `shortlist_max_pairs` pairs), :func:`shortlist_from_data`; default off.
    `stopping` / `length_normalization`: beam search's rules (None: DecodingOptions'),
    fixed in the graph and recorded in config.json. `xla_max_batch`: chunks of at most
    this many sentences run an XLA-compiled beam search (:mod:`tfxformer.serving.compiled`;
    TF Serving then needs `--xla_cpu_compilation_enabled=true`); 0 turns it off; recorded
    in config.json (`export`). `precision` "auto": :func:`export_precision`.
    `signatures`: the signatures to export (:func:`export_translator`; None: all).
    `sentence_split`, `recase`, `markup`: how every signature but `score` reads a text
    (:mod:`tfxformer.serving.reading`; on by default; docs/robust_input.md, docs/markup.md),
    recorded in config.json (`input`)."""
    check_signatures(signatures)
    precision, reason = export_precision(precision)
    model, record, spm_bytes = pretrained.load_source(Transformer, model_dir, checkpoint,
                                                      precision, "export_run_dir")
    options = with_source_options(record, dict(
        beam_size=beam_size, alpha=alpha, extra_length=extra_length,
        max_batch_size=max_batch_size, max_input_tokens=max_input_tokens,
        max_output_tokens=max_output_tokens, stopping=stopping,
        length_normalization=length_normalization, xla_max_batch=xla_max_batch))
    table = shortlist_for(record, spm_bytes, model, shortlist, shortlist_data,
                           shortlist_max_pairs)
    translator = _make_translator(model, record, spm_bytes, shortlist=table,
                                  sentence_split=sentence_split, recase=recase, markup=markup,
                                  **options)
    return export_translator(translator, export_dir, config=record, version=version,
                             num_batch_threads=num_batch_threads, precision_reason=reason,
                             signatures=signatures)


# Decoding options a re-export takes from its source SavedModel unless given.
_INHERITED_OPTIONS = ("beam_size", "alpha", "extra_length", "max_input_tokens",
                     "max_output_tokens", "stopping", "length_normalization")


def with_source_options(record, options):
    """`options` without its None values, the unset _INHERITED_OPTIONS taken from the
    decoding options of `record` (a SavedModel's config asset; a run dir has none)."""
    source = {} if record.decoding is None else record.decoding.to_dict()
    options = dict(options)
    for name in _INHERITED_OPTIONS:
        if options.get(name) is None and name in source:
            options[name] = source[name]
    return {name: value for name, value in options.items() if value is not None}


def export_saved_model(version_dir, export_dir, precision="fp32", version=None,
                       num_batch_threads=None, shortlist=None, shortlist_data=None,
                       shortlist_max_pairs=None, signatures=None, **options):
    """Re-exports a SavedModel of this package
    (:func:`tfxformer.pretrained.load_saved_model_weights`) with
    today's code, at `precision`, with a `shortlist` (K, N) built from `shortlist_data`
    (default: the training data its config asset names) or none; `options` as
    :func:`_make_translator`'s. Beam size, α, extra length, token limits, stopping rule
    and length normalization not given (or None) are the source's (its config asset's
    `decoding`; an asset without the two rules ran "bound" and "gnmt"). `precision`
    "auto": :func:`export_precision`. `signatures`: the signatures to export
    (:func:`export_translator`; None: all, whichever the source has)."""
    locate.resolve(version_dir, ("saved_model",), "export_saved_model")
    return export_run_dir(version_dir, export_dir, precision=precision, version=version,
                          num_batch_threads=num_batch_threads, shortlist=shortlist,
                          shortlist_data=shortlist_data,
                          shortlist_max_pairs=shortlist_max_pairs, signatures=signatures,
                          **options)


def _check_vocabularies(paths, sources):
    """Raises ValueError unless every member has the first one's spm.model, byte for
    byte, and its vocabulary size; returns those bytes."""
    first = sources[0].spm_bytes
    for path, source in zip(paths[1:], sources[1:], strict=True):
        if source.spm_bytes != first:
            raise ValueError(
                f"The models of an ensemble must share one vocabulary, but the {SPM_FILENAME} "
                f"of {paths[0]!r} (SHA-256 {hashlib.sha256(first).hexdigest()[:12]}...) and "
                f"of {path!r} (SHA-256 "
                f"{hashlib.sha256(source.spm_bytes).hexdigest()[:12]}...) differ.")
        if source.model.vocab_size != sources[0].model.vocab_size:
            raise ValueError(
                f"The models of an ensemble must share one vocabulary size: "
                f"{sources[0].model.vocab_size} in {paths[0]!r}, {source.model.vocab_size} "
                f"in {path!r}.")
    return first


def export_ensemble(member_paths, export_dir, beam_size=None, alpha=None, extra_length=None,
                    max_batch_size=None, version=None, precision="fp32",
                    max_input_tokens=None, max_output_tokens=None, num_batch_threads=None,
                    shortlist=None, shortlist_data=None, shortlist_max_pairs=None,
                    stopping=None, length_normalization=None, xla_max_batch=DEFAULT_MAX_BATCH,
                    signatures=None, sentence_split=True, recase=True, markup=True):
    """Exports one SavedModel that decodes with every model of `member_paths` at once:
    beam search on their averaged probabilities (:mod:`tfxformer.decoding.ensemble`).

    Each member is any trained model :func:`tfxformer.pretrained.load_model` reads (a run
    dir, its averaged checkpoint first; a SavedModel export or version dir of one model; a
    preset dir); all must have the same spm.model, byte for byte. The signatures, warm-up
    records and batching_parameters.txt are those of a one-model export; config.json is
    the first member's record (its training settings; a SavedModel's decoding options
    unless given) and `ensemble`: per member its `source` (the basename of its path),
    `vocabulary_sha256` and `model`. Options as :func:`export_run_dir`'s (`signatures`
    too); the shortlist table is built from the first member's training data (or
    `shortlist_data`).

    Raises:
        ValueError: fewer than two members, vocabularies that differ (naming both paths),
            a bad precision or signature name, or a member that is no model of this
            package.
        FileNotFoundError: a member path does not exist.
    """
    paths = [os.fspath(p) for p in member_paths]
    if len(paths) < 2:
        raise ValueError(f"An ensemble needs at least 2 models, got {len(paths)}: {paths}.")
    check_signatures(signatures)
    precision, reason = export_precision(precision)
    sources = [locate.resolve(p, locate.ONE_MODEL, "an ensemble member") for p in paths]
    spm_bytes = _check_vocabularies(paths, sources)
    directions = [source.record().reverse_target for source in sources]
    if len(set(directions)) > 1:
        raise ValueError("The models of an ensemble must write their targets in one "
                         "direction; `reverse_target` (right to left) is "
                         + ", ".join(f"{d} in {p!r}" for d, p in zip(directions, paths,
                                                                     strict=True)) + ".")
    dtype = {} if precision == "fp32" else {"dtype": PRECISION_POLICIES[precision]}
    models = [pretrained.load_model(Transformer, p, **dtype) for p in paths]
    record = sources[0].record()
    options = with_source_options(record, dict(
        beam_size=beam_size, alpha=alpha, extra_length=extra_length, stopping=stopping,
        length_normalization=length_normalization,
        max_batch_size=max_batch_size, max_input_tokens=max_input_tokens,
        max_output_tokens=max_output_tokens))
    table = shortlist_for(record, spm_bytes, models[0], shortlist, shortlist_data,
                           shortlist_max_pairs)
    translator = _make_translator(models, record, spm_bytes, shortlist=table,
                                  xla_max_batch=xla_max_batch, sentence_split=sentence_split,
                                  recase=recase, markup=markup, **options)
    config = {**record.to_dict(),
              "ensemble": _ensemble_record(translator, [locate.source_name(p) for p in paths])}
    return export_translator(translator, export_dir, config=config, version=version,
                             num_batch_threads=num_batch_threads, precision_reason=reason,
                             signatures=signatures)
