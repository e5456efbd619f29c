#!/usr/bin/env python
"""Paragraphs and ALL CAPS / Title Case input through a translator export, as they are and
through tfxformer.serving.segment and tfxformer.serving.casing (the export untouched).

Paragraphs: --group consecutive sources joined by a space; (a) translated as they are,
(b) split with segment.split, all sentences in one pass of batches, joined with
segment.join, (c) the sources translated one by one and their translations joined by a
space. Cased sacreBLEU against the --group references joined by a space, also on the
paragraphs that segment.split cut into their --group sentences ("those_cut").

Case: the sources ALL CAPS (str.upper) or Title Case (each space-separated word's first
letter upper-cased, the rest lower-cased); (a) as they are, (b) casing.classify, then
to_model_case, translate, to_source_case. Case-insensitive sacreBLEU (lowercase=True),
beside the normal sources' translations (those of (c)), and the share of outputs in the
source's case; "sharp_s_as_SS": (b) with "ẞ" written "SS" (ICU's upper-casing of "ß").
Last, on the clean sources: how many segment.split does not keep as one sentence and how
many casing.classify does not call as_is (each listed).

  PYTHONPATH=$PWD python bench/robust_input.py --model saved_models/multi30k_en_de

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import benchlib  # noqa: F401  (quiet TensorFlow logs)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data", "multi30k")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "saved_models", "multi30k_en_de"),
                    help="SavedModel version dir or export dir (its highest version)")
    ap.add_argument("--data", default=DATA, help="folder of SET.SRC / SET.TGT files")
    ap.add_argument("--set", default="test_2016_flickr", help="which set (default: test_2016)")
    ap.add_argument("--src", default="en", help="source language: file suffix and the "
                    "segment.rules language (default: en)")
    ap.add_argument("--tgt", default="de", help="target file suffix (default: de)")
    ap.add_argument("--group", type=int, default=4, help="sentences a paragraph (default: 4)")
    ap.add_argument("--batch", type=int, default=64, help="texts a call (default: 64)")
    ap.add_argument("--limit", type=int, help="first N sentences only (default: all)")
    return ap.parse_args(argv)


def read(path, limit):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def translate(signature, texts, batch):
    import tensorflow as tf

    out = []
    for i in range(0, len(texts), batch):
        result = signature(text=tf.constant(texts[i:i + batch]))["translation"]
        out += [t.decode("utf-8") for t in result.numpy()]
    return out


def bleu(hypotheses, references, lowercase=False):
    import sacrebleu

    return round(sacrebleu.metrics.BLEU(lowercase=lowercase).corpus_score(
        hypotheses, [references]).score, 2)


def title(text):
    return " ".join(w[:1].upper() + w[1:].lower() for w in text.split(" "))


def paragraphs(signature, sources, references, args, rules):
    """BLEU of (a) paragraphs as they are, (b) split and joined, (c) sentence by sentence."""
    import tensorflow as tf

    from tfxformer.serving import segment

    n = len(sources) // args.group * args.group
    cut = lambda lines: [" ".join(lines[i:i + args.group])  # noqa: E731
                         for i in range(0, n, args.group)]
    texts, refs = cut(sources), cut(references)
    parts = segment.split(tf.constant(texts), **rules)
    start = time.perf_counter()  # a second call: the first one compiles the patterns
    segment.join(*segment.split(tf.constant(texts), **rules))
    split_join_ms = 1000 * (time.perf_counter() - start)
    sentences = [s.decode("utf-8") for s in parts.sentences.flat_values.numpy()]
    out = tf.constant(translate(signature, sentences, args.batch))
    joined = [t.decode("utf-8") for t in segment.join(
        parts.sentences.with_flat_values(out), parts.separators).numpy()]
    singles = translate(signature, sources[:n], args.batch)
    whole = parts.sentences.row_lengths().numpy() == args.group  # every boundary found
    only = lambda lines: [line for line, keep in zip(lines, whole, strict=True) if keep]  # noqa: E731
    return singles, {
        "paragraphs": len(texts), "sentences_found": len(sentences),
        "paragraphs_cut_into_their_sentences": int(whole.sum()),
        "split_and_join_ms": round(split_join_ms, 1),
        "bleu_as_is": bleu(translate(signature, texts, args.batch), refs),
        "bleu_split_join": bleu(joined, refs), "bleu_one_by_one": bleu(cut(singles), refs),
        "those_cut_bleu_split_join": bleu(only(joined), only(refs)),
        "those_cut_bleu_one_by_one": bleu(only(cut(singles)), only(refs))}


def case_study(signature, sources, references, normal, args, change, in_case):
    """Case-insensitive BLEU of the changed sources as they are and through casing."""
    import tensorflow as tf

    from tfxformer.serving import casing

    texts = [change(s) for s in sources]
    kinds = casing.classify(tf.constant(texts))
    fed = [s.decode("utf-8") for s in casing.to_model_case(texts, kinds).numpy()]
    out = casing.to_source_case(tf.constant(translate(signature, fed, args.batch)), kinds)
    robust = [t.decode("utf-8") for t in out.numpy()]
    plain = translate(signature, texts, args.batch)
    share = lambda lines: round(sum(map(in_case, lines)) / len(lines), 3)  # noqa: E731
    counts = {name: int((kinds.numpy() == code).sum()) for code, name in enumerate(casing.KINDS)}
    return {"kinds": counts, "bleu_lc_normal_input": bleu(normal, references, True),
            "bleu_lc_as_is": bleu(plain, references, True),
            "bleu_lc_casing": bleu(robust, references, True),
            "bleu_lc_casing_sharp_s_as_SS": bleu([t.replace("ẞ", "SS") for t in robust],
                                                 references, True),
            "share_in_case_as_is": share(plain), "share_in_case_casing": share(robust)}


def all_caps(text):
    return any(c.isupper() for c in text) and not any(c.islower() for c in text)


def title_cased(text):
    return all(title(w) == w for w in text.split(" ") if sum(c.isalpha() for c in w) > 1)


def clean_sources(sources, rules):
    """The clean sources that split does not keep whole or classify calls not as_is."""
    import tensorflow as tf

    from tfxformer.serving import casing, segment

    parts = segment.split(tf.constant(sources), **rules).sentences
    kinds = casing.classify(tf.constant(sources)).numpy()
    split = [[s.decode("utf-8") for s in row] for row, n in zip(
        parts.to_list(), parts.row_lengths().numpy(), strict=True) if n != 1]
    return {"sentences": len(sources), "not_one_sentence": split,
            "not_as_is": [[casing.KINDS[k], s] for s, k in zip(sources, kinds, strict=True)
                          if k != casing.AS_IS]}


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from tfxformer.locate import resolve_model_dir
    from tfxformer.serving import segment

    _, path = resolve_model_dir(args.model)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    stem = os.path.join(args.data, args.set)
    sources = read(f"{stem}.{args.src}", args.limit)
    references = read(f"{stem}.{args.tgt}", args.limit)
    rules = segment.rules(args.src)
    start = time.perf_counter()
    report = {"model": os.path.relpath(path, REPO), "set": args.set, "batch": args.batch,
              "clean": clean_sources(sources, rules)}
    print(json.dumps({"clean": report["clean"]}, ensure_ascii=False), flush=True)
    normal, report["paragraphs"] = paragraphs(signature, sources, references, args, rules)
    print(json.dumps({"paragraphs": report["paragraphs"]}), flush=True)
    n = len(normal)
    for name, change, in_case in (("all_caps", str.upper, all_caps),
                                  ("title_case", title, title_cased)):
        report[name] = case_study(signature, sources[:n], references[:n], normal, args,
                                  change, in_case)
        print(json.dumps({name: report[name]}), flush=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, ensure_ascii=False))


if __name__ == "__main__":
    main()
