"""Translate test sets with a model and score them both ways (sacreBLEU, compound-split BLEU).

    python scripts/evaluate.py --model saved_models/multi30k_en_de \\
        --data ../shared/data/multi30k --sets test_2016_flickr test_2017_flickr --greedy

--model is an exported SavedModel (scored through its `serving_default` signature; greedy
rows through `translate_with_options` with beam 1, alpha 0) or a trained run dir (optionally
--checkpoint, e.g. RUN/checkpoints/ckpt-5000 for the model before averaging). Prints a
markdown table and one JSON line per row; --hyp-dir keeps the translations.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def load(model_path, checkpoint=None, precision="fp32"):
    """Returns {mode: translate(list[str]) -> list[str]} for "beam" and "greedy"."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from tfxformer.serving.loading import resolve_model_dir

    kind, path = resolve_model_dir(model_path)
    if kind == "saved_model":
        if precision != "fp32":
            raise ValueError(f"--precision {precision} applies to run dirs; a SavedModel "
                             "computes in the type it was exported with.")
        model = tf.saved_model.load(path)
        default = model.signatures["serving_default"]
        options = model.signatures["translate_with_options"]
        beam = lambda text: default(text=text)  # noqa: E731
        greedy = lambda text: options(text=text, beam_size=tf.constant(1),  # noqa: E731
                                      alpha=tf.constant(0.0), extra_length=tf.constant(50))
    else:
        from tfxformer.serving import Translator, load_run_dir

        model, _, spm_bytes = load_run_dir(path, checkpoint, precision=precision)
        translator = Translator(model, spm_bytes)
        beam = translator.__call__
        greedy = lambda text: translator.translate_with_options(  # noqa: E731
            text, tf.constant(1), tf.constant(0.0), tf.constant(50))

    def wrap(function):
        def translate(lines, _owner=model):
            out = function(tf.constant(lines, tf.string))["translation"].numpy()
            return [t.decode("utf-8") for t in out]
        return translate
    return path, {"beam": wrap(beam), "greedy": wrap(greedy)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="SavedModel (or export dir) or run dir")
    parser.add_argument("--checkpoint", help="checkpoint prefix of a run dir (default: newest, "
                        "averaged first)")
    parser.add_argument("--data", required=True, help="folder with NAME.SRC / NAME.TGT files")
    parser.add_argument("--sets", nargs="+", required=True, help="test set names, e.g. "
                        "test_2016_flickr")
    parser.add_argument("--src", default="en", help="source suffix (default: %(default)s)")
    parser.add_argument("--tgt", default="de", help="target suffix (default: %(default)s)")
    parser.add_argument("--greedy", action="store_true", help="also score greedy decoding")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per call "
                        "(default: %(default)s)")
    parser.add_argument("--hyp-dir", help="write each set's translations here")
    parser.add_argument("--label", default="", help="label of this model in the table")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="compute type for a run dir (bf16: bfloat16 matmuls, float32 "
                             "weights and softmax) (default: %(default)s)")
    args = parser.parse_args(argv)

    from tfxformer.bleu import compound_split_bleu, sacrebleu_scores
    from tfxformer.data.sources import iter_lines
    from tfxformer.serving.batching import translate_in_length_order

    try:
        path, translators = load(args.model, args.checkpoint, args.precision)
        data = {name: ([*iter_lines(os.path.join(args.data, f"{name}.{args.src}"))],
                       [*iter_lines(os.path.join(args.data, f"{name}.{args.tgt}"))])
                for name in args.sets}
    except (OSError, ValueError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 2
    modes = ["beam", "greedy"] if args.greedy else ["beam"]
    rows = []
    for name, (sources, references) in data.items():
        for mode in modes:
            start = time.perf_counter()
            hyps = translate_in_length_order(translators[mode], sources, args.batch_size)
            seconds = time.perf_counter() - start
            row = dict(model=args.label or path, set=name, decoding=mode,
                       precision=args.precision,
                       sentences=len(hyps), seconds=round(seconds, 1),
                       **sacrebleu_scores(hyps, references),
                       bleu_compound_split=compound_split_bleu(hyps, references, args.tgt))
            rows.append(row)
            if args.hyp_dir:
                os.makedirs(args.hyp_dir, exist_ok=True)
                with open(os.path.join(args.hyp_dir, f"{name}.{mode}.{args.tgt}"), "w",
                          encoding="utf-8") as f:
                    f.write("".join(h + "\n" for h in hyps))
            print(json.dumps(row), flush=True)
    print("\n| model | set | decoding | sacreBLEU | lowercased | chrF | compound-split |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['set']} | {r['decoding']} | {r['bleu']:.2f} | "
              f"{r['bleu_lowercase']:.2f} | {r['chrf']:.2f} | {r['bleu_compound_split']:.2f} |")
    print(f"\nsacreBLEU signature: {rows[0]['signature']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
