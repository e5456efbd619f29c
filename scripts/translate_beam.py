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
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402


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
                        help="text files, one sentence a line (a path or a glob; repeat for "
                             "several; files compressed by name: .gz, .bz2, .zst)")
    parser.add_argument("--output", required=True, metavar="PATH",
                        help="the translations, one line per input line, the input files' "
                             "lines in order (.gz compresses); the shards go to "
                             "PATH.shards/ meanwhile")
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
    return parser, *parser.parse_known_args(argv)


def main(argv=None) -> int:
    parser, args, pipeline_args = parse_args(argv)
    try:
        from tfxformer.beam import translate_files
    except ImportError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    options = {k: v for k, v in (("beam_size", args.beam_size), ("alpha", args.alpha),
                                 ("extra_length", args.extra_length),
                                 ("target_language", args.target_language)) if v is not None}
    start = time.perf_counter()
    try:
        count = translate_files(args.model, args.input, args.output, pipeline_args,
                                args.batch_size, args.max_batch_lines, args.retries,
                                **options)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    rate = count / max(time.perf_counter() - start, 1e-9)
    print(f"{args.output}: {count} lines, one per input line, {rate:.2f} sentences/s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
