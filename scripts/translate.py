#!/usr/bin/env python
"""Translate stdin to stdout, one line out per line in, in order (beam search, §6.1).

    python scripts/translate.py --model saved_models/en_de < input.en > output.de

--model is any trained model of tfxformer: an exported SavedModel (a version dir, or its
export dir: the highest version is taken; an ensemble export too), a trained run dir
(config.json, spm.model, checkpoints/; averaged first), a preset dir of
`Transformer.save_to_preset` (translated as a run dir is), or a CTranslate2 model directory
(`scripts/export.py --format ctranslate2`; --compute-type, --threads).
Progress and throughput go to stderr.

With --sampling-topk K each line gets one translation sampled from the model instead of
beam search (back-translation, Edunov et al., 2018), reproducible with --seed:

    python scripts/translate.py --model saved_models/en_de --sampling-topk 10 --seed 1 \
        < mono.de > sampled.en

With --n-best K each line gets its K best translations as Moses n-best lines,
"i ||| translation ||| score" (i counts input lines from 0; docs/steering.md), and with
--token-scores a fourth field of each SentencePiece piece and its log-probability;
--no-repeat-ngram-size, --repetition-penalty, --target-prefix-file and --constraints-file
steer the output:

    python scripts/translate.py --model saved_models/en_de --target-prefix-file starts.de \
        --n-best 3 < input.en
    python scripts/translate.py --model saved_models/en_de --constraints-file terms.de \
        < input.en
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402

BUFFER_BATCHES = 16  # lines read ahead, in batches, and sorted by length to batch well





def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Translate lines from stdin to stdout with a tfxformer model. One output "
                    "line per input line, in order; progress and throughput on stderr.")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="exported SavedModel version dir or its parent export dir "
                             "(highest version taken; an ensemble export too), a trained run "
                             "dir with checkpoints, a preset dir of Transformer.save_to_preset, "
                             "or a CTranslate2 model directory of scripts/export.py --format "
                             "ctranslate2 (not with --sampling-topk)")
    from tfxformer.config import LENGTH_NORMALIZATIONS, STOPPING_RULES, DecodingOptions

    defaults = DecodingOptions()
    parser.add_argument("--beam-size", type=cli.int_at_least(1), metavar="N",
                        help="beam size, 1 = greedy (default: the export's, else "
                             f"{defaults.beam_size})")
    parser.add_argument("--alpha", type=cli.non_negative_float, metavar="A",
                        help="length penalty exponent α in ((5 + |Y|) / 6)^α, 0 = none "
                             f"(default: the export's, else {defaults.alpha})")
    parser.add_argument("--batch-size", type=cli.int_at_least(1), default=defaults.batch_size,
                        metavar="N", help="sentences per translation call (default: "
                        "%(default)s)")
    parser.add_argument("--extra-length", type=cli.int_at_least(0), metavar="N",
                        help="maximum output length = source tokens + N "
                             f"(default: the export's, else {defaults.extra_length})")
    parser.add_argument("--target-language", metavar="LANG",
                        help="the language a multilingual model translates into (one of "
                             "its target languages, e.g. de; required for such a model)")
    parser.add_argument("--stopping", choices=STOPPING_RULES,
                        help="beam search's stopping rule, for a run dir: 'finished' (a "
                             "sentence ends once beam-size hypotheses have ended) or 'bound' "
                             "(once no alive hypothesis can still win); a SavedModel's is "
                             "fixed when exported (default: the model's)")
    parser.add_argument("--length-normalization", choices=LENGTH_NORMALIZATIONS,
                        help="a finished hypothesis' score, for a run dir: 'gnmt' (log P / "
                             "((5 + |Y|) / 6)^alpha) or 'length' (log P / |Y|^alpha, "
                             "CTranslate2's); a SavedModel's is fixed (default: the model's)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32",
                        help="compute type of a run dir's or preset dir's model: auto = bf16 "
                             "where this CPU has AVX512_BF16 or AMX, else fp32 (a SavedModel "
                             "computes as exported; auto accepts that) (default: %(default)s)")
    steering = parser.add_argument_group(
        "steering", "control of the output (docs/steering.md; a SavedModel needs the "
        "`translate_nbest` signature: re-export an older one with scripts/export.py)")
    cli.add_nbest_flags(steering)
    steering.add_argument("--alignments", action="store_true",
                          help="also print each translation's word alignment to its source "
                               "line, Pharaoh pairs 'i-j' (source word i, target word j, "
                               "whitespace-separated words counted from 0), from the "
                               "encoder-decoder attention (docs/markup.md): each line "
                               "'translation ||| 0-0 1-1 ...', or with --n-best a last field "
                               "of each n-best line. Not with a CTranslate2 model")
    steering.add_argument("--target-prefix-file", metavar="FILE",
                          help="one target prefix per input line (an empty line = none): "
                               "each output starts with it; with --n-best K > 1 the list "
                               "holds the K best alternatives after it")
    steering.add_argument("--constraints-file", metavar="FILE",
                          help="terminology constraints, one line per input line: target "
                               "phrases separated by TABs (an empty line = none); every "
                               "translation that ends before its length limit holds each "
                               "phrase (not with a CTranslate2 model)")
    ct2 = parser.add_argument_group("CTranslate2", "for a CTranslate2 model directory only")
    ct2.add_argument("--compute-type", metavar="TYPE",
                     help="CTranslate2's compute type: default (the type its weights were "
                          "exported in), int8, int8_float32, float32, ... (default: default)")
    ct2.add_argument("--threads", type=cli.int_at_least(1), metavar="N",
                     help="batches CTranslate2 decodes at once, one core each (its "
                          "inter_threads; intra_threads 1) (default: the cores this process "
                          "may use)")
    sampling = parser.add_argument_group(
        "sampling", "one translation per line drawn from the model instead of beam search "
        "(a SavedModel needs the `translate_sampled` signature: re-export an older one "
        "with scripts/export.py)")
    cli.add_sampling_flags(sampling, defaults)
    args = parser.parse_args(argv)
    _check_sampling_flags(parser, args)
    return parser, args


def _check_sampling_flags(parser, args):
    """Errors for flags that do not go together with (or without) --sampling-topk."""
    given = [flag for flag, value in (("--sampling-temperature", args.sampling_temperature),
                                      ("--sampling-topp", args.sampling_topp),
                                      ("--seed", args.seed)) if value is not None]
    if args.token_scores and args.n_best is None:
        parser.error("--token-scores adds a field to the Moses n-best lines of --n-best K: "
                     "give --n-best K (K >= 1)")
    if args.sampling_topk is None:
        if args.n_best is not None and args.beam_size is not None \
                and args.n_best > args.beam_size:
            parser.error(f"--n-best {args.n_best} needs --beam-size >= {args.n_best}: a "
                         "beam holds beam-size hypotheses")
        if given:
            parser.error(f"{', '.join(given)} need --sampling-topk K (0 = the whole "
                         "vocabulary, K > 1 = the K most probable tokens)")
        return
    steered = [flag for flag, value in (("--n-best", args.n_best),
                                        ("--no-repeat-ngram-size", args.no_repeat_ngram_size),
                                        ("--repetition-penalty", args.repetition_penalty),
                                        ("--target-prefix-file", args.target_prefix_file),
                                        ("--constraints-file", args.constraints_file))
               if value is not None]
    if steered:
        parser.error(f"{', '.join(steered)} steer beam search (the translate_nbest "
                     "signature); they do not go with --sampling-topk")
    if args.beam_size not in (None, 1):
        parser.error(f"--sampling-topk samples one translation per line: --beam-size must be "
                     f"1 or left out, got {args.beam_size}")
    if args.alpha is not None:
        parser.error("--alpha is beam search's length penalty; it does not apply with "
                     "--sampling-topk")


def translate_stream(translate, lines, batch_size):
    """Yields one output per input line, in order: reads `batch_size * BUFFER_BATCHES`
    lines ahead and calls `translate` on batches of similar length."""
    from tfxformer.serving.batching import translate_in_length_order

    buffer = []
    for line in lines:
        buffer.append(line)
        if len(buffer) == batch_size * BUFFER_BATCHES:
            yield from translate_in_length_order(translate, buffer, batch_size)
            buffer = []
    yield from translate_in_length_order(translate, buffer, batch_size)


def steered(args) -> bool:
    """Whether a flag asks for the `translate_nbest` signature (n-best lists, repetition
    control, target prefixes or constraints)."""
    return args.alignments or any(value is not None for value in (
        args.n_best, args.no_repeat_ngram_size, args.repetition_penalty,
        args.target_prefix_file, args.constraints_file))


class Steered:
    """An n-best function whose per-line warnings (a prefix cut or ignored) go to
    stderr; with `best`, `translate(lines) -> list[str]`, the first of each list."""

    def __init__(self, nbest, best=False, alignments=False):
        self.nbest, self.best, self.alignments = nbest, best, alignments

    def __call__(self, lines):
        lists = self.nbest(lines)
        for line, warning in zip(lines, getattr(self.nbest, "warnings", []), strict=False):
            if warning:
                text = getattr(line, "text", line)
                print(f"warning: {text[:60]!r}: {warning}", file=sys.stderr)
        if not self.best:
            return lists
        if self.alignments:  # "translation ||| pairs", as Marian's --alignment prints
            return [f"{row[0].text} ||| {row[0].alignment}" if row else " ||| "
                    for row in lists]
        return [row[0].text if row else "" for row in lists]

    def describe(self):
        return self.nbest.describe()


def paired(lines, path, flag, what):
    """(line, the next line of file `path` without its line end) for each input line;
    exits with an error naming `flag` if the two counts differ (`what`: one line of the
    file, for the message)."""
    number = 0
    with open(path, "rb") as f:
        for number, line in enumerate(lines, 1):
            value = f.readline()
            if not value:
                sys.exit(f"translate.py: error: {flag} {path!r} has {number - 1} lines; the "
                         f"input has more: give {what} (or an empty line) per input line.")
            yield line, value.rstrip(b"\r\n")
        if f.readline():
            sys.exit(f"translate.py: error: {flag} {path!r} has more lines than the input "
                     f"({number}).")


def with_prefixes(lines, path):
    """The input lines paired with the lines of the prefix file `path`
    (:class:`tfxformer.serving.nbest.Line`); exits with an error if the counts differ."""
    from tfxformer.serving.nbest import Line

    for line, prefix in paired(lines, path, "--target-prefix-file", "one prefix"):
        yield Line(line, prefix)


def with_constraints(lines, path):
    """The input lines (plain or :class:`tfxformer.serving.nbest.Line` s) with the lines of
    the constraints file `path` (phrases separated by TABs); exits with an error if the
    counts differ."""
    from tfxformer.serving.nbest import Line

    for line, phrases in paired(lines, path, "--constraints-file", "one line of phrases"):
        if isinstance(line, Line):
            yield Line(line.text, line.prefix, phrases)
        else:
            yield Line(line, "", phrases)


def load(args):
    """The translate function the flags ask for: beam search, or sampling."""
    from tfxformer.locate import KINDS, resolve
    from tfxformer.serving import load_translate_fn
    from tfxformer.serving.signatures import KINDS as GRAPHS  # CTranslate2: beam search only

    source = resolve(args.model, KINDS if args.sampling_topk is None else GRAPHS,
                     "scripts/translate.py --model" + (" with --sampling-topk"
                                                       if args.sampling_topk is not None
                                                       else ""))
    for flag, feature in (("--constraints-file", "constraints"),
                          ("--token-scores", "token_scores"), ("--alignments", "alignments")):
        if getattr(args, flag[2:].replace("-", "_")) and feature in source.lacks:
            raise ValueError(f"{flag}: {source.path!r} is {source.what}, "
                             f"{source.lacks[feature]}: give the SavedModel or run dir of "
                             "the model instead.")
    if args.sampling_topk is None:  # any model dir, CTranslate2's too
        rules = {k: v for k, v in (("stopping", args.stopping),
                                   ("length_normalization", args.length_normalization)) if v}
        if steered(args):
            from tfxformer.serving import load_nbest_fn

            nbest = load_nbest_fn(args.model, args.n_best or 1, beam_size=args.beam_size,
                                  alpha=args.alpha, extra_length=args.extra_length,
                                  batch_size=args.batch_size,
                                  target_language=args.target_language,
                                  compute_type=args.compute_type, threads=args.threads,
                                  no_repeat_ngram_size=args.no_repeat_ngram_size,
                                  repetition_penalty=args.repetition_penalty, **rules)
            if args.constraints_file and not getattr(nbest, "takes_constraints", True):
                raise ValueError(f"--constraints-file: {nbest.path!r} was exported before "
                                 "translate_nbest took constraints: re-export it with "
                                 f"python scripts/export.py --model {nbest.path} --export-dir "
                                 "NEW_EXPORT_DIR")
            if args.token_scores and not getattr(nbest, "gives_token_scores", False):
                raise ValueError(f"--token-scores: {nbest.path!r} was exported before "
                                 "translate_nbest returned token log-probabilities: re-export "
                                 f"it with python scripts/export.py --model {nbest.path} "
                                 "--export-dir NEW_EXPORT_DIR")
            if args.alignments and not getattr(nbest, "gives_alignments", False):
                raise ValueError(f"--alignments: {nbest.path!r} was exported before "
                                 "translate_nbest returned word alignments: re-export it "
                                 f"with python scripts/export.py --model {nbest.path} "
                                 "--export-dir NEW_EXPORT_DIR")
            return Steered(nbest, best=args.n_best is None, alignments=args.alignments)
        return load_translate_fn(args.model, beam_size=args.beam_size, alpha=args.alpha,
                                 extra_length=args.extra_length, batch_size=args.batch_size,
                                 target_language=args.target_language,
                                 compute_type=args.compute_type, threads=args.threads,
                                 precision=args.precision, **rules)
    if args.compute_type or args.threads:
        raise ValueError("--sampling-topk samples with a SavedModel, run dir or preset dir; "
                         "a CTranslate2 model (--compute-type, --threads) translates with "
                         "beam search.")
    import random

    from tfxformer.config import DecodingOptions
    from tfxformer.serving import load_sample_fn

    defaults = DecodingOptions()
    seed = random.randrange(2**31) if args.seed is None else args.seed
    return load_sample_fn(
        args.model, args.sampling_topk,
        sampling_temperature=args.sampling_temperature or defaults.sampling_temperature,
        sampling_topp=args.sampling_topp or defaults.sampling_topp, seed=seed,
        extra_length=args.extra_length, batch_size=args.batch_size,
        target_language=args.target_language)


def main(argv=None):
    parser, args = parse_args(argv)
    try:
        translate = load(args)
    except (FileNotFoundError, ValueError, ImportError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(translate.describe(), file=sys.stderr)
    from tqdm import tqdm

    lines = (line.rstrip(b"\r\n") for line in sys.stdin.buffer)
    if args.target_prefix_file:
        lines = with_prefixes(lines, args.target_prefix_file)
    if args.constraints_file:
        lines = with_constraints(lines, args.constraints_file)
    count, words, start = 0, 0, time.perf_counter()
    with tqdm(unit=" sent", file=sys.stderr, desc="translating") as progress:
        for text in translate_stream(translate, lines, args.batch_size):
            if args.n_best is not None:  # Moses n-best lines; split() drops \r and \n
                from tfxformer.serving.nbest import moses_lines

                out = "".join(line + "\n" for line in moses_lines(
                    count, text, args.token_scores, args.alignments))
                words += len(text[0].text.split()) if text else 0
            else:
                text = text.replace("\r", " ").replace("\n", " ")  # one line per line in
                out, words = text + "\n", words + len(text.split())
            sys.stdout.buffer.write(out.encode("utf-8"))
            count += 1
            progress.update()
    sys.stdout.flush()
    seconds = time.perf_counter() - start
    print(f"translated {count} lines in {seconds:.1f} s: {count / max(seconds, 1e-9):.2f} "
          f"sentences/s, {words / max(seconds, 1e-9):.1f} words/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
