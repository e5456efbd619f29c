"""Translate test sets with a model and score them: sacreBLEU, chrF, compound-split BLEU.

    python scripts/evaluate.py --model saved_models/multi30k_en_de \\
        --data ../shared/data/multi30k --sets test_2016_flickr test_2017_flickr --greedy

--model is an exported SavedModel (its export's decoding options; greedy rows with beam 1,
alpha 0; an ensemble export too), a trained run dir (optionally --checkpoint, e.g.
RUN/checkpoints/ckpt-5000 for the model before averaging), a preset dir of
Transformer.save_to_preset (evaluated as a run dir is), or a CTranslate2 model directory
(scripts/export.py --format ctranslate2; optionally --compute-type), loaded by
tfxformer.serving.load_translate_fn. With --metric multi30k each row also has
the BLEU Multi30k papers report (lowercased, normalised, Moses tokenized, against
DATA/tok/SET.lc.norm.tok.TGT). Prints a markdown table and one JSON line per row; --hyp-dir
keeps the translations.
"""

import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer.config import (  # noqa: E402
    LENGTH_NORMALIZATIONS,
    STOPPING_RULES,
    DecodingOptions,
)

METRICS = ("multi30k", "tokenized")


def load(model_path, checkpoint=None, precision="fp32", batch_size=None, greedy=False,
         beam_size=None, alpha=None, target_language=None, compute_type=None,
         stopping=None, length_normalization=None, pipeline=None):
    """Returns (path, {mode: translate(list[str]) -> list[str]}) for "beam" (and "greedy");
    beam_size/alpha None = the model's own (the export's, or the run's); batch_size None
    = DecodingOptions'; `target_language`: a multilingual model's; `compute_type`: a
    CTranslate2 model's; `stopping`, `length_normalization`: the beam rows' rules (a run
    dir's; an export's are fixed when exported); `pipeline`: Beam pipeline options to
    translate with (tfxformer.beam), None = in this process."""
    from tfxformer.serving import load_translate_fn  # any model dir

    if pipeline is not None:
        from tfxformer.beam import load_translate_fn as beam_translate_fn

        load_translate_fn = functools.partial(beam_translate_fn, pipeline_args=pipeline)

    defaults = DecodingOptions()
    batch_size = defaults.batch_size if batch_size is None else batch_size
    common = dict(batch_size=batch_size, precision=precision, checkpoint=checkpoint,
                  target_language=target_language, compute_type=compute_type)
    rules = {k: v for k, v in (("stopping", stopping),
                               ("length_normalization", length_normalization)) if v}
    beam = load_translate_fn(model_path, beam_size=beam_size, alpha=alpha, **rules, **common)
    translators = {"beam": beam}
    if greedy:
        translators["greedy"] = load_translate_fn(
            model_path, beam_size=1, alpha=0.0, extra_length=defaults.extra_length, **common)
    return beam.path, translators


def multi30k_references(data, name, tgt):
    """The lines of Multi30k's tokenized reference file DATA/tok/NAME.lc.norm.tok.TGT."""
    from tfxformer.data.sources import iter_lines

    path = os.path.join(data, "tok", f"{name}.lc.norm.tok.{tgt}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--metric multi30k needs the tokenized reference {path} "
                                "(Multi30k's tok/ folder).")
    return [*iter_lines(path)]


def _parser():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="any trained model: a SavedModel version or export dir (an "
                             "ensemble export too), a run dir, a preset dir of "
                             "Transformer.save_to_preset, or a CTranslate2 dir")
    parser.add_argument("--checkpoint", help="checkpoint prefix of a run dir (default: the "
                        "newest that the state file names, averaged first)")
    parser.add_argument("--data", required=True, help="folder with NAME.SRC / NAME.TGT files")
    parser.add_argument("--sets", nargs="+", required=True, help="test set names, e.g. "
                        "test_2016_flickr")
    parser.add_argument("--src", default="en", help="source suffix (default: %(default)s)")
    parser.add_argument("--tgt", default="de", help="target suffix (default: %(default)s)")
    parser.add_argument("--greedy", action="store_true", help="also score greedy decoding")
    parser.add_argument("--target-language", metavar="LANG",
                        help="a multilingual model's target language (default: --tgt for "
                             "such a model; not used for a model of one target)")
    parser.add_argument("--metric", choices=METRICS, action="append", default=[],
                        help="also score with this metric: multi30k = the literature's "
                        "Multi30k BLEU (lowercased, tokenized references in DATA/tok/); "
                        "tokenized = BLEU of the output as it is against NAME.TGT, with no "
                        "further tokenisation (multi-bleu; for a model trained on tokenized "
                        "text, see scripts/literature_setup.py)")
    parser.add_argument("--batch-size", type=int, default=DecodingOptions().batch_size,
                        help="sentences per call (default: %(default)s)")
    parser.add_argument("--hyp-dir", help="write each set's translations here")
    parser.add_argument("--label", default="", help="label of this model in the table")
    parser.add_argument("--beam-size", type=int, help="beam size of the beam rows (default: "
                        "the export's, or the run's --beam-size)")
    parser.add_argument("--alpha", type=float, help="length penalty alpha of the beam rows "
                        "(default: the export's, or the run's --alpha)")
    parser.add_argument("--stopping", choices=STOPPING_RULES,
                        help="beam search's stopping rule for a run dir: 'bound' (no alive "
                             "hypothesis can still win) or 'finished' (beam-size hypotheses "
                             "have ended); an export's is fixed when exported (default: "
                             "the model's)")
    parser.add_argument("--length-normalization", choices=LENGTH_NORMALIZATIONS,
                        help="a finished hypothesis' score for a run dir: 'gnmt' (log P / "
                             "((5 + |Y|) / 6)^alpha) or 'length' (log P / |Y|^alpha, "
                             "CTranslate2's); an export's is fixed (default: the model's)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="compute type for a run dir (bf16: bfloat16 matmuls, float32 "
                             "weights and softmax) (default: %(default)s)")
    parser.add_argument("--compute-type", metavar="TYPE",
                        help="compute type for a CTranslate2 model directory: default (the "
                             "type its weights were exported in), int8, int8_float32, "
                             "float32, ... (default: default)")
    parser.add_argument("--beam-pipeline", metavar="OPTIONS",
                        help="translate through an Apache Beam pipeline with these pipeline "
                             "options, e.g. \"--runner DirectRunner --direct_num_workers 2 "
                             "--direct_running_mode multi_processing\" (docs/beam.md; needs "
                             "pip install tfxformer[beam])")
    return parser


def _score(hyps, references, tgt, multi30k_refs, tokenized=False):
    from tfxformer.bleu import compound_split_bleu, sacrebleu_scores, tokenized_bleu

    scores = dict(**sacrebleu_scores(hyps, references),
                  bleu_compound_split=compound_split_bleu(hyps, references, tgt))
    if tokenized:
        scores["bleu_tokenized"] = tokenized_bleu(hyps, references)
    if multi30k_refs is not None:
        from tfxformer.bleu import multi30k_bleu

        scores["bleu_multi30k"] = multi30k_bleu(hyps, multi30k_refs, tgt)
    return scores


def _table(rows, multi30k, tokenized):
    extra = (" multi30k |" * multi30k + " tokenized |" * tokenized,
             "---|" * (multi30k + tokenized))
    print("\n| model | set | decoding | sacreBLEU | lowercased | chrF | compound-split |"
          + extra[0])
    print("|---|---|---|---|---|---|---|" + extra[1])
    for r in rows:
        cell = "".join(f" {r[key]:.2f} |" for key, on in
                       (("bleu_multi30k", multi30k), ("bleu_tokenized", tokenized)) if on)
        print(f"| {r['model']} | {r['set']} | {r['decoding']} | {r['bleu']:.2f} | "
              f"{r['bleu_lowercase']:.2f} | {r['chrf']:.2f} | {r['bleu_compound_split']:.2f} |"
              + cell)
    print(f"\nsacreBLEU signature: {rows[0]['signature']}")


def _target_language(args):
    """--target-language, or --tgt where the model is multilingual (None otherwise)."""
    if args.target_language is not None:
        return args.target_language
    from tfxformer.locate import resolve

    languages = resolve(args.model, tool="scripts/evaluate.py --model").target_languages
    return args.tgt if languages else None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from tfxformer.data.sources import iter_lines

    multi30k, tokenized = "multi30k" in args.metric, "tokenized" in args.metric
    try:
        if multi30k:
            from tfxformer.bleu import multi30k_bleu  # noqa: F401  (fail early if missing)
        data = {name: ([*iter_lines(os.path.join(args.data, f"{name}.{args.src}"))],
                       [*iter_lines(os.path.join(args.data, f"{name}.{args.tgt}"))],
                       multi30k_references(args.data, name, args.tgt) if multi30k else None)
                for name in args.sets}
        path, translators = load(args.model, args.checkpoint, args.precision,
                                 args.batch_size, args.greedy, args.beam_size, args.alpha,
                                 _target_language(args), args.compute_type,
                                 args.stopping, args.length_normalization,
                                 args.beam_pipeline)
    except (OSError, ValueError, ImportError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 2
    rows = []
    for name, (sources, references, multi30k_refs) in data.items():
        for mode, translate in translators.items():
            start = time.perf_counter()
            hyps = translate(sources)
            seconds = time.perf_counter() - start
            options = translate.options  # the beam size and alpha actually used
            row = dict(model=args.label or path, set=name, decoding=mode,
                       beam_size=options["beam_size"], alpha=options["alpha"],
                       precision=(f"ctranslate2 {translate.compute_type}"
                                  if hasattr(translate, "compute_type") else args.precision),
                       sentences=len(hyps),
                       seconds=round(seconds, 1),
                       **_score(hyps, references, args.tgt, multi30k_refs, tokenized))
            rows.append(row)
            if args.hyp_dir:
                os.makedirs(args.hyp_dir, exist_ok=True)
                with open(os.path.join(args.hyp_dir, f"{name}.{mode}.{args.tgt}"), "w",
                          encoding="utf-8") as f:
                    f.write("".join(h + "\n" for h in hyps))
            print(json.dumps(row), flush=True)
    _table(rows, multi30k, tokenized)
    return 0


if __name__ == "__main__":
    sys.exit(main())
