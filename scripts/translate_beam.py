#!/usr/bin/env python
"""Translate text files on Apache Beam: one output line per input line, in input order.

    python scripts/translate_beam.py --model saved_models/multi30k_en_de \\
        --input 'mono/*.en.gz' --output mono.de \\
        --runner DirectRunner --direct_num_workers 2 --direct_running_mode multi_processing

Every line of the files --input matches (globs on any of Beam's file systems: local,
gs://, hdfs://; .gz, .bz2, .zst read by name) is keyed by (file, line number), batched
and translated by RunInference, each worker process loading the model once; the sharded
outputs are merged into --output in input order (the files sorted by name), each line
exactly once. The flags after this script's own are Beam's pipeline options (--runner,
--direct_num_workers, --project, --temp_location, ...; default: the DirectRunner in one
process). docs/beam.md has the Dataflow, Flink and Spark commands. Needs
`pip install tfxformer[beam]`.

--signature picks what each line gives, as the export's signature of that name does:

    serving_default    (default) a translation: one output line per input line
    translate_nbest    "source[<TAB>target prefix[<TAB>phrase<TAB>phrase...]]" lines -> the
                       --n-best K best translations, as Moses n-best lines
                       "i ||| translation ||| score" (scripts/translate.py --n-best)
    translate_sampled  a translation sampled with --sampling-topk K (--seed: each worker
                       starts from it)
    score              "source<TAB>target" lines -> "log P<TAB>log P per token" (with
                       --tokens, a third column; scripts/score.py's lines)

Files named *.tfrecord or *.tfrecords (or any with --input-format tfrecord) hold
tf.train.Example records, each line the bytes feature --tfrecord-feature of one record.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402

SIGNATURES = ("serving_default", "translate_nbest", "translate_sampled", "score")
FORMATS = ("auto", "text", "tfrecord")


def parse_args(argv=None):
    from tfxformer.config import DecodingOptions

    defaults = DecodingOptions()
    parser = argparse.ArgumentParser(
        prog="python scripts/translate_beam.py", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other flag is handed to Beam as a pipeline option, e.g. --runner "
               "DirectRunner --direct_num_workers 2 --direct_running_mode multi_processing; "
               "--runner DataflowRunner --project P --region R --temp_location gs://... "
               "--setup_file ./setup.py; "
               "--runner FlinkRunner --flink_master HOST:PORT; --runner SparkRunner "
               "--spark_master_url spark://HOST:PORT; --environment_type LOOPBACK "
               "(docs/beam.md). python -m apache_beam.examples.wordcount --help lists "
               "them all.")
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="any model of this package (SavedModel version or export dir, "
                             "ensemble export, run dir, preset dir, CTranslate2 dir) on a path "
                             "every worker reads: local, or gs:// / hdfs:// (copied to each "
                             "worker)")
    parser.add_argument("--input", required=True, action="append", metavar="GLOB",
                        help="text files, one input a line (a path or a glob; repeat for "
                             "several; files compressed by name: .gz, .bz2, .zst), or "
                             "TFRecord files (.tfrecord, .tfrecords)")
    parser.add_argument("--output", required=True, metavar="PATH",
                        help="the --signature's lines for each input line, the input files' "
                             "lines in order (.gz compresses); the shards go to "
                             "PATH.shards/ meanwhile")
    parser.add_argument("--signature", choices=SIGNATURES, default="serving_default",
                        help="what each line gives (see above) (default: %(default)s)")
    parser.add_argument("--input-format", choices=FORMATS, default="auto",
                        help="auto: TFRecord files by the extension .tfrecord or .tfrecords "
                             "(before .gz, ...), text otherwise (default: %(default)s)")
    parser.add_argument("--tfrecord-feature", default="source", metavar="NAME",
                        help="the bytes feature of each TFRecord record's tf.train.Example "
                             "that holds the line (default: %(default)s)")
    cli.add_search_flags(parser, defaults, own="the model's")
    parser.add_argument("--max-batch-lines", type=cli.int_at_least(1), metavar="N",
                        help="the most lines Beam hands one inference call, sorted by length "
                             "there and translated --batch-size at a time (default: 16 "
                             "batches, as scripts/translate.py reads ahead)")
    parser.add_argument("--retries", type=cli.int_at_least(0), default=2, metavar="N",
                        help="runs of the pipeline after a failed one (a worker killed), each "
                             "for the lines not yet translated (default: %(default)s)")
    parser.add_argument("--target-language", metavar="LANG",
                        help="the language a multilingual model translates into")
    cli.add_nbest_flags(parser.add_argument_group("--signature translate_nbest"))
    cli.add_sampling_flags(parser.add_argument_group("--signature translate_sampled"),
                           defaults)
    parser.add_argument_group("--signature score").add_argument(
        "--tokens", action="store_true", help="add a third column, the log-probability of "
        "each target token (pieces, then EOS), space-separated")
    args, pipeline_args = parser.parse_known_args(argv)
    check_mode_flags(parser, args)
    return parser, args, pipeline_args


MODE_FLAGS = {"translate_nbest": ("n_best", "token_scores", "no_repeat_ngram_size",
                                  "repetition_penalty"),
              "translate_sampled": ("sampling_topk", "sampling_temperature", "sampling_topp",
                                    "seed"),
              "score": ("tokens",)}
SEARCH_FLAGS = ("beam_size", "alpha")  # not with sampling or scoring


def check_mode_flags(parser, args):
    """Errors for flags of another --signature than the one given."""
    for signature, names in MODE_FLAGS.items():
        given = [name for name in names if getattr(args, name) not in (None, False)]
        if given and signature != args.signature:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"{flags}: only with --signature {signature} (given: "
                         f"{args.signature})")
    if args.signature in ("translate_sampled", "score"):
        given = [name for name in SEARCH_FLAGS if getattr(args, name) is not None]
        if given:
            parser.error(f"--{given[0].replace('_', '-')} is a beam search option; "
                         f"--signature {args.signature} does not search")
    if args.signature == "translate_sampled" and args.sampling_topk is None:
        parser.error("--signature translate_sampled needs --sampling-topk K (0 = the whole "
                     "vocabulary, K > 1 = the K most probable tokens)")
    if args.signature == "translate_nbest" and args.n_best and args.beam_size and \
            args.n_best > args.beam_size:
        parser.error(f"--n-best {args.n_best} needs --beam-size >= {args.n_best}: a beam "
                     "holds beam-size hypotheses")


def mode_of(args):
    """The mode (tfxformer.beam.modes) the flags ask for."""
    import random

    from tfxformer.beam import modes

    def given(*names):
        return {name: getattr(args, name) for name in names if getattr(args, name) is not None}

    language = given("target_language")
    if args.signature == "score":
        return modes.Score(args.tokens, **language)
    if args.signature == "translate_sampled":
        seed = random.randrange(2**31) if args.seed is None else args.seed
        print(f"sampling seed {seed}", file=sys.stderr)
        return modes.Sample(seed=seed, **language, **given(
            "sampling_topk", "sampling_temperature", "sampling_topp", "extra_length"))
    search = given("beam_size", "alpha", "extra_length")
    if args.signature == "translate_nbest":
        return modes.NBest(args.n_best or 1, args.token_scores, **search, **language,
                           **given("no_repeat_ngram_size", "repetition_penalty"))
    return modes.Translate(**search, **language)


def main(argv=None) -> int:
    parser, args, pipeline_args = parse_args(argv)
    try:
        from tfxformer.beam import translate_files
    except ImportError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    start = time.perf_counter()
    try:
        count = translate_files(args.model, args.input, args.output, pipeline_args,
                                args.batch_size, args.max_batch_lines, args.retries,
                                mode_of(args), args.input_format, args.tfrecord_feature)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    rate = count / max(time.perf_counter() - start, 1e-9)
    print(f"{args.output}: {count} input lines, {rate:.2f} sentences/s ({args.signature})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
