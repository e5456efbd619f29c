"""Export a trained model (run dir, preset dir, or a SavedModel to re-export) for TF Serving.

    python scripts/export.py --model runs/base --export-dir saved_models/en_de
    python scripts/export.py --model runs/adapted_preset --export-dir saved_models/adapted
                                  # a preset dir of model.save_to_preset(dir) (after fit)
    python scripts/export.py --model saved_models/multi30k_en_de \
        --export-dir saved_models/multi30k_en_de          # re-export with today's code
                                  # (beam, α, rules and limits: the source's unless flags say)
    python scripts/export.py --model runs/base --export-dir /tmp/en_de \
        --stopping finished                               # end a sentence at K finished
    python scripts/export.py --model runs/base --export-dir /tmp/en_de \
        --shortlist 50,500                                # with a vocabulary shortlist
    python scripts/export.py --ensemble runs/base runs/base_seed2 \
        --export-dir saved_models/en_de_ensemble          # several models, one beam search
    python scripts/export.py --model runs/base --export-dir /tmp/en_de \
        --signatures serving_default translate_per_example   # only these two: loads leaner
    python scripts/export.py --model saved_models/multi30k_en_de --format ctranslate2 \
        --quantization int8 --export-dir ct2/en_de_int8   # a CTranslate2 model directory

Writes `<export-dir>/<next version>/` (saved_model.pb, variables/, assets/, and
assets.extra/ with TF Serving warm-up records and an example batching_parameters.txt)
and prints its path. --model is a run dir (averaged checkpoint first, or --checkpoint), a
preset dir of `Transformer.save_to_preset`, or a SavedModel export or version dir of one
model (re-exported with today's code); an ensemble export or a CTranslate2 dir is an error
naming what it is. `--ensemble` takes two or more trained models in place of `--model`
(run dirs, SavedModels of one model, or preset dirs, all with the same spm.model): the
SavedModel then decodes with all of them at once, each step scored with their averaged
probabilities. See README, "Serving", and docs/serving.md, "Ensembles".

`--format ctranslate2` writes a CTranslate2 model directory at `--export-dir` itself
(model.bin, config.json, shared_vocabulary.json, spm.model and tfxformer.json; needs
`pip install -e ".[ctranslate2]"`), with weights stored as `--quantization`;
scripts/translate.py and scripts/evaluate.py take it as --model. See docs/serving.md,
"CTranslate2".
"""

from __future__ import annotations

import argparse
import sys

from tfxformer import cli
from tfxformer.config import LENGTH_NORMALIZATIONS, STOPPING_RULES, DecodingOptions
from tfxformer.locate import ONE_MODEL, resolve
from tfxformer.rerank import GRAPH_WEIGHTS
from tfxformer.serving.compiled import DEFAULT_MAX_BATCH
from tfxformer.serving.ctranslate2 import QUANTIZATIONS
from tfxformer.serving.export import export_ensemble, export_run_dir
from tfxformer.serving.signatures import SIGNATURES, check_signatures

DEFAULTS = DecodingOptions()
# --rerank-weight names: the scores an export computes in its graph.
RERANK_WEIGHTS = GRAPH_WEIGHTS
FORMATS = ("saved_model", "ctranslate2")
# What --format ctranslate2 does not take: flag -> its value when not given.
SAVED_MODEL_ONLY = {"--ensemble": None, "--precision": "fp32", "--shortlist": None,
                    "--shortlist-data": None, "--shortlist-max-pairs": None,
                    "--version": None, "--batch-threads": None,
                    "--xla-max-batch": DEFAULT_MAX_BATCH, "--rerank-with": None,
                    "--signatures": None}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python scripts/export.py",
        description="Export a trained run dir (or an ensemble of trained models) as a TF "
                    "Serving SavedModel <export-dir>/<version>/ (version: next integer), "
                    "with warm-up records and an example batching_parameters.txt in "
                    "assets.extra/.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model",
                       help="the trained model: a run dir (config.json, spm.model, "
                            "checkpoints/; averaged first), a preset dir of "
                            "Transformer.save_to_preset (config.json, model.weights.h5, "
                            "spm.model), or a SavedModel of one model (version dir or export "
                            "dir: its variables are re-exported with the current code); with "
                            "--format ctranslate2, one of one target language")
    which.add_argument("--ensemble", nargs="+", metavar="PATH",
                       help="two or more trained models exported as one ensemble (in place "
                            "of --model): run dirs (averaged checkpoint first), SavedModels "
                            "of one model or preset dirs, all with the same spm.model; beam "
                            "search scores each step with their averaged probabilities "
                            "(config and decoding defaults: the first's)")
    parser.add_argument("--export-dir", required=True,
                        help="model base path for TF Serving, e.g. saved_models/en_de; with "
                             "--format ctranslate2 the new model directory itself (it must "
                             "not exist, or be empty)")
    parser.add_argument("--format", choices=FORMATS, default=FORMATS[0],
                        help="saved_model: a TF Serving SavedModel; ctranslate2: a model "
                             "directory for CTranslate2, OpenNMT's fast CPU runtime (one "
                             "model, not multilingual; needs `pip install -e "
                             "\".[ctranslate2]\"`) (default: %(default)s)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="with --format ctranslate2: the type CTranslate2 stores the "
                             "weights in; int8 is its fast CPU type (default: float32)")
    parser.add_argument("--checkpoint", help="checkpoint prefix of a run dir (default: "
                        "newest, averaged ones first); not with --ensemble")
    parser.add_argument("--beam-size", type=int,
                        help="beam size of serving_default (default: a re-exported "
                             f"SavedModel's, else {DEFAULTS.beam_size}, §6.1)")
    parser.add_argument("--alpha", type=float,
                        help="length penalty α of serving_default (default: a re-exported "
                             f"SavedModel's, else {DEFAULTS.alpha}, §6.1)")
    parser.add_argument("--extra-length", type=int,
                        help="output tokens allowed beyond the source length (default: a "
                             f"re-exported SavedModel's, else {DEFAULTS.extra_length}, §6.1)")
    parser.add_argument("--stopping", choices=STOPPING_RULES,
                        help="when beam search ends a sentence before its limit, fixed in the "
                             "graph for every signature: bound = once no alive hypothesis "
                             "could still beat the worst of the beam-size finished ones (the "
                             "full search's n-best list); finished = once beam-size "
                             "hypotheses have finished (CTranslate2's and fairseq's rule: "
                             "fewer steps) (default: a re-exported SavedModel's, else "
                             f"{DEFAULTS.stopping})")
    parser.add_argument("--length-normalization", choices=LENGTH_NORMALIZATIONS,
                        help="what a finished hypothesis' log-probability is divided by, "
                             "fixed in the graph: gnmt = ((5 + |Y|) / 6)^alpha, |Y| with the "
                             "EOS (§6.1); length = |Y|^alpha, |Y| without the EOS "
                             "(CTranslate2's) (default: a re-exported SavedModel's, else "
                             f"{DEFAULTS.length_normalization})")
    parser.add_argument("--max-input-tokens", type=int,
                        help="source tokens kept, EOS included; longer inputs are cut and "
                             "flagged in the `truncated` output (default: a re-exported "
                             "SavedModel's, else the run's training max_length, else "
                             f"{DEFAULTS.max_input_tokens}; at most the model's positions)")
    parser.add_argument("--max-output-tokens", type=int,
                        help="decode limit in tokens, EOS included, whatever the source "
                             "length (default: a re-exported SavedModel's, else the run's "
                             f"training max_length, else {DEFAULTS.max_output_tokens}; at most "
                             "the model's positions)")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                        help="sentences decoded together inside the graph; also the "
                             "max_batch_size of batching_parameters.txt and the tuned "
                             "warm-up batch size (default: %(default)s)")
    parser.add_argument("--batch-threads", type=int,
                        help="num_batch_threads of batching_parameters.txt (default: this "
                             "machine's cores)")
    parser.add_argument("--version", type=int, help="version number (default: next free)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32",
                        help="compute type of the exported graph (weights stay float32): "
                             "bf16 is faster on CPUs with AVX512_BF16 or AMX, slower on "
                             "others; auto = bf16 where this machine has them, else fp32, "
                             "the reason recorded in config.json (default: %(default)s)")
    parser.add_argument("--shortlist", type=shortlist_sizes, metavar="K,N",
                        help="decode over a vocabulary shortlist: per batch, the K target "
                             "tokens most associated (Dice coefficient of sentence "
                             "co-occurrence counts) with each of its source tokens, plus "
                             "the N most frequent target tokens and the special ids; the "
                             "table is built from the training data now and saved in the "
                             "SavedModel, e.g. 50,500 (default: off, the full vocabulary)")
    parser.add_argument("--shortlist-data", metavar="DATA",
                        help="training data of the shortlist table: a folder with "
                             "train.SRC/train.TGT (languages from the model's config) or "
                             "wmt14 (default: the `train.data` that the run's config.json, "
                             "or the SavedModel's assets/config.json, names)")
    parser.add_argument("--shortlist-max-pairs", type=int, metavar="M",
                        help="build the shortlist table from the first M training pairs "
                             "only (default: all)")
    parser.add_argument("--rerank-with", nargs="+", metavar="PATH",
                        help="rerank each translation's n-best list in the graph with these "
                             "models' `score` computations: a channel model (translating "
                             "the other way), a right-to-left model (--reverse-target) or "
                             "another forward model, each with its own vocabulary; "
                             "serving_default (and the translate_* signatures) then return "
                             "the candidate with the best weighted score, --rerank-weight "
                             "(docs/reranking.md)")
    parser.add_argument("--rerank-weight", type=cli.named_weight(RERANK_WEIGHTS),
                        action="append", default=[], metavar="NAME=VALUE",
                        help="with --rerank-with, repeatable: the weight of a score, NAME one "
                             f"of {', '.join(RERANK_WEIGHTS)} (forward: the search's own "
                             "score; length: words; the others a rescoring model's log "
                             "P, summed or per token); a score not given weighs 0")
    parser.add_argument("--rerank-hypotheses", type=cli.int_at_least(1), metavar="K",
                        help="with --rerank-with: candidates per sentence (default: the beam "
                             "size; the beam is made at least this wide)")
    parser.add_argument("--signatures", nargs="+", metavar="NAME",
                        help="export only these signatures (serving_default always): a "
                             "smaller graph that loads in less memory and time; a "
                             "signature left out cannot be called on this export. "
                             + "; ".join(f"{name}: {what}" for name, what in SIGNATURES.items())
                             + " (default: all)")
    parser.add_argument("--xla-max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                        help="chunks of at most N sentences run an XLA-compiled beam "
                             "search, several times faster per sentence (1: for interactive "
                             "serving, one sentence a request); it compiles a program per "
                             "length bucket (and shortlist bucket, with --shortlist) when the "
                             "version loads and TF Serving then needs "
                             "--xla_cpu_compilation_enabled=true (docs/serving.md); "
                             "default: %(default)s, off")
    parser.add_argument("--no-sentence-split", dest="sentence_split", action="store_false",
                        help="read each text as one sentence (SavedModel exports): by "
                             "default every signature but `score` cuts a text into its "
                             "sentences (the source "
                             "language's rules), decodes them together and joins their "
                             "translations with the text's own spaces and newlines "
                             "(docs/robust_input.md)")
    parser.add_argument("--no-recase", dest="recase", action="store_false",
                        help="give ALL CAPS and Title Case text to the model as it is "
                             "(SavedModel exports): by default such a sentence is "
                             "translated in normal case and its "
                             "translation cast back (docs/robust_input.md)")
    parser.add_argument("--no-markup", dest="markup", action="store_false",
                        help="read inline markup (XML/HTML tags, entities, placeholders such "
                             "as {0} or %%s) as text (SavedModel exports): by default it is "
                             "taken out of a text, the text translated, and the markup put "
                             "back at the words aligned to what it wrapped (docs/markup.md)")
    return parser


def shortlist_sizes(text):
    """'K,N' -> (K, N): the --shortlist sizes, K >= 1, N >= 0."""
    try:
        per_source, frequent = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected K,N (two integers, e.g. 50,500), got {text!r}") from None
    if per_source < 1 or frequent < 0:
        raise argparse.ArgumentTypeError(
            f"K must be >= 1 and N >= 0, got K={per_source}, N={frequent}")
    return per_source, frequent


def export_ctranslate2(args, options):
    """Exports `args.model` as a CTranslate2 directory (`options`: decoding options);
    returns it."""
    given = [flag for flag, unset in SAVED_MODEL_ONLY.items()
             if getattr(args, flag[2:].replace("-", "_")) != unset]
    if given:
        raise ValueError(f"{', '.join(given)} apply to --format saved_model; --format "
                         "ctranslate2 exports one model, computing as --quantization says.")
    from tfxformer.serving.ctranslate2_export import export_ctranslate2 as export_ct2

    resolve(args.model, ONE_MODEL, "scripts/export.py --format ctranslate2 --model",
            multilingual=False)
    options = {("batch_size" if k == "max_batch_size" else k): v for k, v in options.items()}
    return export_ct2(args.model, args.export_dir, quantization=args.quantization,
                      checkpoint=args.checkpoint, **options)


def export_reranked(args, options):
    """Exports `args.model` with in-graph reranking by the `--rerank-with` models."""
    for flag, given in (("--ensemble", args.ensemble), ("--shortlist", args.shortlist),
                        ("--checkpoint", args.checkpoint)):
        if given:
            raise ValueError(f"{flag} does not go with --rerank-with (one forward model, "
                             "its averaged checkpoint first, over the full vocabulary).")
    if not args.rerank_weight:
        raise ValueError("--rerank-with needs the scores' weights: --rerank-weight NAME=VALUE "
                         "(e.g. forward=1 channel=0.02 length=0.05).")
    from tfxformer.serving.reranking import export_reranking

    for name in ("shortlist", "shortlist_data", "shortlist_max_pairs", "xla_max_batch"):
        options.pop(name, None)
    return export_reranking(args.model, args.rerank_with, args.export_dir,
                            dict(args.rerank_weight), args.rerank_hypotheses, **options)


def export(args):
    """Exports as `args` says; returns the new version dir (or CTranslate2 directory)."""
    if args.format == "saved_model" and args.quantization is not None:
        raise ValueError(f"--quantization {args.quantization} applies to --format ctranslate2; "
                         "a SavedModel computes in --precision (fp32 or bf16).")
    if args.ensemble is not None and len(args.ensemble) < 2:
        raise ValueError(f"--ensemble needs at least 2 models, got {len(args.ensemble)}: "
                         f"{args.ensemble}; for one model use --model.")
    if args.ensemble is not None and args.checkpoint:
        raise ValueError("--checkpoint applies to --model; --ensemble loads each run dir's "
                         "averaged checkpoint first, else its latest.")
    # Unset decoding flags: a re-exported SavedModel's own (export_saved_model), else the
    # defaults of export_run_dir.
    decoding = dict(beam_size=args.beam_size, alpha=args.alpha, stopping=args.stopping,
                    length_normalization=args.length_normalization,
                    extra_length=args.extra_length, max_input_tokens=args.max_input_tokens,
                    max_output_tokens=args.max_output_tokens)
    options = {name: value for name, value in decoding.items() if value is not None}
    options.update(max_batch_size=args.batch_size)
    check_signatures(args.signatures)  # before any model is loaded
    if args.format == "ctranslate2":
        return export_ctranslate2(args, options)
    if args.shortlist is None and (args.shortlist_data or args.shortlist_max_pairs):
        raise ValueError("--shortlist-data and --shortlist-max-pairs need --shortlist K,N.")
    if args.shortlist_max_pairs is not None and args.shortlist_max_pairs < 1:
        raise ValueError(f"--shortlist-max-pairs must be >= 1, got {args.shortlist_max_pairs}.")
    options.update(version=args.version, precision=args.precision,
                   num_batch_threads=args.batch_threads, shortlist=args.shortlist,
                   shortlist_data=args.shortlist_data,
                   shortlist_max_pairs=args.shortlist_max_pairs)
    if args.xla_max_batch < 0:
        raise ValueError(f"--xla-max-batch must be >= 0 (0: off), got {args.xla_max_batch}.")
    options.update(xla_max_batch=args.xla_max_batch, signatures=args.signatures,
                   sentence_split=args.sentence_split, recase=args.recase,
                   markup=args.markup)
    if args.rerank_with is not None:
        return export_reranked(args, options)
    if args.rerank_weight or args.rerank_hypotheses:
        raise ValueError("--rerank-weight and --rerank-hypotheses need --rerank-with PATH.")
    if args.ensemble is not None:
        return export_ensemble(args.ensemble, args.export_dir, **options)
    resolve(args.model, ONE_MODEL, "scripts/export.py --model")
    return export_run_dir(args.model, args.export_dir, checkpoint=args.checkpoint, **options)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        path = export(args)
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
