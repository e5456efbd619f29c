#!/usr/bin/env python
"""Paragraphs, ALL CAPS and Title Case input through an export's own `serving_default`:
the export as made by default (sentences split, recased) against one made with
--no-sentence-split --no-recase ("raw").

The --model's weights are exported twice (serving_default only) into a temporary
directory (nothing is written into the repository). Then:

- clean: test_2016 and the first --news-limit lines of newstest2014 through both exports;
  how many translations differ (each listed, with the rows the default export read);
- paragraphs: --group consecutive captions joined by a space, and by a newline, through
  the default export, against the raw export on the same paragraphs and on the captions
  one by one joined by a space; cased sacreBLEU against the --group references joined;
- case: the captions ALL CAPS (str.upper) or Title Case (each space-separated word's first
  letter upper-cased, the rest lower-cased) through both exports; case-insensitive
  sacreBLEU beside the normal captions' (raw export), and the share of outputs in the
  source's case;
- time: each input's seconds per caption against the clean captions through raw.

  PYTHONPATH=$PWD python bench/robust_input.py --model saved_models/multi30k_en_de

Prints a JSON line per part, and the whole report last.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import benchlib  # noqa: F401  (quiet TensorFlow logs)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "saved_models", "multi30k_en_de"),
                    help="SavedModel version dir or export dir (its highest version)")
    ap.add_argument("--data", default=DATA, help="folder holding multi30k/ and wmt14/")
    ap.add_argument("--set", default="test_2016_flickr", help="multi30k set (test_2016)")
    ap.add_argument("--src", default="en", help="source file suffix (default: en)")
    ap.add_argument("--tgt", default="de", help="target file suffix (default: de)")
    ap.add_argument("--group", type=int, default=4, help="captions a paragraph (default: 4)")
    ap.add_argument("--batch", type=int, default=64, help="texts a call (default: 64)")
    ap.add_argument("--limit", type=int, help="first N captions only (default: all)")
    ap.add_argument("--news-limit", type=int, default=1000,
                    help="first N lines of newstest2014 (default: 1000; 0: none)")
    return ap.parse_args(argv)


def read(path, limit):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def translate(signature, texts, batch):
    """(translations, seconds) of `texts` through `signature`, `batch` a call."""
    import tensorflow as tf

    out, start = [], time.perf_counter()
    for i in range(0, len(texts), batch):
        result = signature(text=tf.constant(texts[i:i + batch]))["translation"]
        out += [t.decode("utf-8") for t in result.numpy()]
    return out, time.perf_counter() - start


def bleu(hypotheses, references, lowercase=False):
    import sacrebleu

    return round(sacrebleu.metrics.BLEU(lowercase=lowercase).corpus_score(
        hypotheses, [references]).score, 2)


def title(text):
    return " ".join(w[:1].upper() + w[1:].lower() for w in text.split(" "))


def all_caps(text):
    return any(c.isupper() for c in text) and not any(c.islower() for c in text)


def title_cased(text):
    return all(title(w) == w for w in text.split(" ") if sum(c.isalpha() for c in w) > 1)


def export_both(model, folder):
    """{"default": signature, "raw": signature}, each exported from `model` into `folder`."""
    import tensorflow as tf

    from tfxformer.locate import resolve_model_dir
    from tfxformer.serving.export import export_saved_model

    _, path = resolve_model_dir(model)
    signatures = {}
    for name, flags in (("default", {}), ("raw", dict(sentence_split=False, recase=False))):
        version = export_saved_model(path, os.path.join(folder, name),
                                     signatures=["serving_default"], **flags)
        signatures[name] = tf.saved_model.load(version).signatures["serving_default"]
    return os.path.relpath(path, REPO), signatures


def read_rows(lines):
    """How the default export reads each line: its rows (sentences, recased)."""
    from tfxformer.serving.reading import ReadingOptions, read_texts

    rows, mapping = read_texts(lines, ReadingOptions(language="en"))
    rows = [r.decode("utf-8") for r in rows.numpy()]
    text_of = mapping.text_of.numpy()
    return [[r for r, t in zip(rows, text_of, strict=True) if t == i] for i in range(len(lines))]


def clean(signatures, name, lines, batch):
    """The default and raw exports' translations of clean `lines`, and where they differ."""
    default, default_s = translate(signatures["default"], lines, batch)
    raw, raw_s = translate(signatures["raw"], lines, batch)
    differ = [i for i, (a, b) in enumerate(zip(default, raw, strict=True)) if a != b]
    rows = read_rows([lines[i] for i in differ]) if differ else []
    return raw, {"set": name, "lines": len(lines), "differ": len(differ),
                 "seconds_default": round(default_s, 1), "seconds_raw": round(raw_s, 1),
                 "differing": [{"source": lines[i], "rows": r, "default": default[i],
                                "raw": raw[i]} for i, r in zip(differ, rows, strict=True)]}


def paragraphs(signatures, sources, references, singles, clean_seconds, args):
    """BLEU of paragraphs through the default export, the raw one, and one by one."""
    n = len(sources) // args.group * args.group
    cut = lambda lines, sep=" ": [sep.join(lines[i:i + args.group])  # noqa: E731
                                  for i in range(0, n, args.group)]
    refs = cut(references)
    report = {"paragraphs": n // args.group,
              "bleu_one_by_one": bleu(cut(singles[:n]), refs)}
    for name, sep in (("space", " "), ("newline", "\n")):
        texts = cut(sources, sep)
        out, seconds = translate(signatures["default"], texts, args.batch // args.group)
        raw, _ = translate(signatures["raw"], texts, args.batch // args.group)
        rows = read_rows(texts)
        whole = [len(r) == args.group for r in rows]

        def only(lines, whole=whole):
            return [x for x, keep in zip(lines, whole, strict=True) if keep]

        report[name] = {
            "bleu_raw": bleu([t.replace("\n", " ") for t in raw], refs),
            "bleu_default": bleu([t.replace("\n", " ") for t in out], refs),
            "cut_into_their_sentences": sum(whole),
            "those_cut_bleu_default": bleu([t.replace("\n", " ") for t in only(out)],
                                           only(refs)),
            "those_cut_bleu_one_by_one": bleu(only(cut(singles[:n])), only(refs)),
            "seconds_per_caption": round(seconds / n, 4),
            "time_vs_clean": round(seconds / n / (clean_seconds / len(sources)), 2)}
    return report


def case_study(signatures, sources, references, normal, clean_seconds, args, change,
               in_case):
    """Case-insensitive BLEU of the changed captions through both exports."""
    texts = [change(s) for s in sources]
    out, seconds = translate(signatures["default"], texts, args.batch)
    raw, _ = translate(signatures["raw"], texts, args.batch)
    share = lambda lines: round(sum(map(in_case, lines)) / len(lines), 3)  # noqa: E731
    return {"bleu_lc_normal_input": bleu(normal, references, True),
            "bleu_lc_raw": bleu(raw, references, True),
            "bleu_lc_default": bleu(out, references, True),
            "share_in_case_raw": share(raw), "share_in_case_default": share(out),
            "seconds_per_caption": round(seconds / len(texts), 4),
            "time_vs_clean": round(seconds / (clean_seconds * len(texts) / len(sources)), 2)}


def main(argv=None):
    args = parse_args(argv)
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    stem = os.path.join(args.data, "multi30k", args.set)
    sources = read(f"{stem}.{args.src}", args.limit)
    references = read(f"{stem}.{args.tgt}", args.limit)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        model, signatures = export_both(args.model, folder)
        report = {"model": model, "set": args.set, "batch": args.batch,
                  "export_seconds": round(time.perf_counter() - start, 1)}
        for signature in signatures.values():  # warm up: the first call traces
            translate(signature, sources[:args.batch], args.batch)
        normal, report["clean"] = clean(signatures, args.set, sources, args.batch)
        clean_seconds = report["clean"]["seconds_raw"]
        report["clean_news"] = None
        if args.news_limit:
            news = read(os.path.join(args.data, "wmt14", f"newstest2014.{args.src}"),
                        args.news_limit)
            report["clean_news"] = clean(signatures, "newstest2014", news, args.batch)[1]
        print(json.dumps({"clean": report["clean"], "clean_news": report["clean_news"]},
                         ensure_ascii=False), flush=True)
        report["paragraphs"] = paragraphs(signatures, sources, references, normal,
                                          clean_seconds, args)
        print(json.dumps({"paragraphs": report["paragraphs"]}), flush=True)
        for name, change, in_case in (("all_caps", str.upper, all_caps),
                                      ("title_case", title, title_cased)):
            report[name] = case_study(signatures, sources, references, normal,
                                      clean_seconds, args, change, in_case)
            print(json.dumps({name: report[name]}), flush=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, ensure_ascii=False))


if __name__ == "__main__":
    main()
