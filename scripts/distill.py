#!/usr/bin/env python
"""Make training data with teachers: sequence-level distillation and data diversification.

Translates the training split of a text folder with one or more teachers (SavedModel
exports, ensemble exports, run dirs, preset dirs, CTranslate2 dirs) into a new text folder
that `scripts/train_wmt.py --data OUT` trains on; validation and test files are copied
unchanged.

    # Kim & Rush (2016): the student learns the teacher's beam-search outputs
    python scripts/distill.py --data ../shared/data/multi30k --src en --tgt de \\
        --teacher saved_models/multi30k_en_de --out runs/m30k_distilled
    # Nguyen et al. (2020): forward and backward teachers, with the original pairs
    python scripts/distill.py --data ../shared/data/multi30k --src en --tgt de \\
        --teacher runs/en_de_a --teacher runs/en_de_b --reverse-teacher runs/de_en_a \\
        --keep-original --out runs/m30k_diversified

Work goes in chunks to OUT/.chunks/; rerunning the same command after a kill keeps the
finished chunks and translates the rest. What was done: OUT/distill.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402


def build_parser():
    from tfxformer.config import DecodingOptions

    defaults = DecodingOptions()
    parser = argparse.ArgumentParser(
        prog="python scripts/distill.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="text folder to distill: train.SRC, train.TGT, val.SRC, val.TGT "
                             "and optional test pairs (.gz accepted)")
    parser.add_argument("--src", default="en", help="source language, a file suffix "
                        "(default: %(default)s)")
    parser.add_argument("--tgt", default="de", help="target language, a file suffix "
                        "(default: %(default)s)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="text folder to write (created; rerun the same command to resume)")
    parser.add_argument("--teacher", action="append", default=[], metavar="MODEL",
                        help="forward teacher SRC -> TGT, giving the pairs (source, "
                             "teacher(source)): a SavedModel version dir, an export dir "
                             "(highest version), an ensemble export, a run dir, a preset dir "
                             "of Transformer.save_to_preset (saved with its languages) or a "
                             "CTranslate2 dir; repeat for several")
    parser.add_argument("--reverse-teacher", action="append", default=[], metavar="MODEL",
                        help="backward teacher TGT -> SRC, giving the pairs "
                             "(teacher(target), target), as --teacher; repeat for several")
    parser.add_argument("--keep-original", action="store_true",
                        help="also keep the original training pairs (data diversification "
                             "trains on the union)")
    cli.add_search_flags(parser, defaults)
    parser.add_argument("--chunk-lines", type=cli.int_at_least(1), default=2000, metavar="N",
                        help="training pairs per chunk, sorted by length inside it; a kill "
                             "loses at most one chunk (default: %(default)s)")
    parser.add_argument("--limit", type=cli.int_at_least(1), metavar="N",
                        help="distill only the first N training pairs, for a trial (its "
                             "complete chunks are reused by a later run without --limit)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="compute type of run-dir and preset-dir teachers; a SavedModel "
                             "computes as it was exported (default: %(default)s)")
    parser.add_argument("--beam-pipeline", metavar="OPTIONS",
                        help="translate through an Apache Beam pipeline with these pipeline "
                             "options, e.g. \"--runner DirectRunner --direct_num_workers 2 "
                             "--direct_running_mode multi_processing\" (docs/beam.md; needs "
                             "pip install tfxformer[beam])")
    return parser


def _teacher(path, reverse):
    """The loader of the model at `path` (:func:`tfxformer.locate.resolve`), reading its
    records only; its direction must be known."""
    from tfxformer.locate import KINDS, resolve

    flag = "--reverse-teacher" if reverse else "--teacher"
    source = resolve(path, KINDS, f"scripts/distill.py {flag}")
    if source.direction is None:
        raise ValueError(f"scripts/distill.py {flag}: {path!r} is {source.what} that records "
                         "no languages, so its direction cannot be checked; save it with "
                         "`model.save_to_preset(dir, src=..., tgt=...)` or export it from "
                         "its run dir.")
    return source


def make_teacher(path, reverse, args):
    """A :class:`tfxformer.data.distill.Teacher` for `path`, its direction checked now and
    its model loaded only when a chunk is left to translate."""
    from tfxformer.data.distill import Teacher, check_direction
    from tfxformer.serving import load_translate_fn  # any form

    if args.beam_pipeline is not None:
        from tfxformer.beam import load_translate_fn as beam_translate_fn

        load_translate_fn = functools.partial(beam_translate_fn,
                                              pipeline_args=args.beam_pipeline)
    source = _teacher(path, reverse)
    record = source.record()
    language = check_direction(path, record.src, record.tgt, record.target_languages,
                               args.src, args.tgt, reverse)
    settings = dict(model=os.path.abspath(source.path), kind=source.kind,
                    beam_size=args.beam_size, alpha=args.alpha,
                    extra_length=args.extra_length, target_language=language)
    settings.update(source.load_settings(args.precision))
    precision = {k: v for k, v in settings.items() if k == "precision"}

    def load():
        translate = load_translate_fn(path, beam_size=args.beam_size, alpha=args.alpha,
                                      extra_length=args.extra_length,
                                      batch_size=args.batch_size, target_language=language,
                                      **precision)
        print(f"\n{'reverse' if reverse else 'forward'} teacher {translate.describe()}",
              file=sys.stderr)
        return translate

    return Teacher(name=os.path.normpath(path), load=load, reverse=reverse, settings=settings)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.teacher and not args.reverse_teacher:
        parser.error("give at least one --teacher or --reverse-teacher")
    from tfxformer.data.distill import distill_folder

    start = time.perf_counter()
    try:
        teachers = [make_teacher(p, False, args) for p in args.teacher] + \
                   [make_teacher(p, True, args) for p in args.reverse_teacher]
        record = distill_folder(args.data, args.out, teachers, src=args.src, tgt=args.tgt,
                                keep_original=args.keep_original,
                                chunk_lines=args.chunk_lines, limit=args.limit)
    except (OSError, ValueError, ImportError) as error:
        print(f"distill.py: error: {error}", file=sys.stderr)
        return 2
    for teacher in record["teachers"]:
        lines, seconds = teacher["translated_now"], teacher["seconds_now"]
        rate = f", {lines / seconds:.2f} sentences/s" if seconds else ""
        print(f"{teacher['direction']} {teacher['name']}: {teacher['pairs']} pairs, "
              f"{lines} translated now in {seconds:.1f} s{rate}, "
              f"{teacher['empty_translations']} empty", file=sys.stderr)
    print(f"wrote {record['train_pairs']} training pairs to "
          f"{os.path.join(args.out, f'train.{{{args.src},{args.tgt}}}')} in "
          f"{time.perf_counter() - start:.1f} s; train with: python scripts/train_wmt.py "
          f"--data {args.out} --src {args.src} --tgt {args.tgt} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
