#!/usr/bin/env python
"""Inline markup through a translator export (tfxformer.serving.markup): --limit sources of
--set with the second word wrapped in <b>…</b> and a <br/> before the last word.

Reports: the share of outputs holding exactly the source's tags, in order and well-formed;
cased sacreBLEU of the outputs with the tags stripped beside that of the untagged sources'
translations; the time of both (the same batches, after one warm-up call each); and the
placement of each tag: the share where the <b> span starts with, and the word after <br/>
is, a word of the source word's translation alone (the first 4 letters, case-insensitive,
German articles left out; an automatic check for lack of gold alignments). With --layers,
the placement is measured for each decoder layer's alignments too (the export's weights in
an in-process Translator).

  PYTHONPATH=$PWD python bench/markup.py --model /tmp/en_de_export --layers 0 1 2 3

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import benchlib  # noqa: F401  (quiet TensorFlow logs)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data", "multi30k")
TAG = re.compile(r"<[^<>]*>")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a SavedModel export made with markup "
                    "(version dir or export dir: its highest version)")
    ap.add_argument("--data", default=DATA, help="folder of SET.en / SET.de files")
    ap.add_argument("--set", default="test_2016_flickr", help="which set (default: test_2016)")
    ap.add_argument("--limit", type=int, default=200, help="first N sources (default: 200)")
    ap.add_argument("--batch", type=int, default=64, help="texts a call (default: 64)")
    ap.add_argument("--layers", type=int, nargs="*", default=[],
                    help="decoder layers whose alignments' placement to measure as well")
    return ap.parse_args(argv)


def tagged(line):
    words = line.split()
    words[1] = f"<b>{words[1]}</b>"
    words[-1] = f"<br/>{words[-1]}"
    return " ".join(words)


def translate(function, texts, batch):
    import tensorflow as tf

    out = []
    for i in range(0, len(texts), batch):
        result = function(tf.constant(texts[i:i + batch]))["translation"].numpy()
        out += [t.decode("utf-8") for t in result]
    return out


def well_formed(text):
    stack = []
    for tag in TAG.findall(text):
        if tag.endswith("/>"):
            continue
        if tag.startswith("</"):
            if not stack or stack.pop() != tag[2:-1]:
                return False
        else:
            stack.append(tag[1:-1].split()[0])
    return not stack


ARTICLES = re.compile(r"(ein|eine|einer|eines|einem|einen|der|die|das|dem|den|des)$")


def stem(word):
    return re.sub(r"\W", "", word).lower()[:4]


def stems(translation):
    """The stems of a word's translation alone, articles left out."""
    return {stem(w) for w in translation.split()
            if not ARTICLES.match(re.sub(r"\W", "", w).lower())}


def placed(outputs, sources, lexicon):
    """Shares of <b> spans starting with, and words after <br/> being, the source word's
    translation alone."""
    bold = br = 0
    for out, source in zip(outputs, sources, strict=True):
        words = source.split()
        inside = re.search(r"<b>(\S*)", out)
        after = re.search(r"<br/>(\S*)", out)
        bold += bool(inside) and stem(TAG.sub("", inside.group(1))) in lexicon[words[1]]
        br += bool(after) and stem(TAG.sub("", after.group(1))) in lexicon[words[-1]]
    return {"b": round(bold / len(sources), 3), "br": round(br / len(sources), 3)}


def layer_placement(path, texts, sources, lexicon, layers, batch):
    from tfxformer import Transformer
    from tfxformer.serving import Translator

    with open(os.path.join(path, "assets", "spm.model"), "rb") as f:
        spm = f.read()
    weights = Transformer.from_preset(path)
    return {layer: placed(translate(Translator(weights, spm, alignment_layer=layer), texts,
                                    batch), sources, lexicon) for layer in layers}


def main(argv=None):
    import sacrebleu

    from tfxformer.serving.signatures import open_signature

    args = parse_args(argv)
    read = lambda lang: open(os.path.join(args.data, f"{args.set}.{lang}"),  # noqa: E731
                             encoding="utf-8").read().splitlines()[:args.limit]
    sources, references = read("en"), read("de")
    texts = [tagged(s) for s in sources]
    opened = open_signature(args.model, "serving_default")
    function = lambda t: opened.function(text=t)  # noqa: E731
    translate(function, texts[:args.batch], args.batch)  # warm-up: every graph path
    translate(function, sources[:args.batch], args.batch)
    start = time.perf_counter()
    clean = translate(function, sources, args.batch)
    clean_s = time.perf_counter() - start
    start = time.perf_counter()
    outputs = translate(function, texts, args.batch)
    tagged_s = time.perf_counter() - start
    kept = [TAG.findall(o) == TAG.findall(t) and well_formed(o)
            for o, t in zip(outputs, texts, strict=True)]
    stripped = [" ".join(TAG.sub("", o).split()) for o in outputs]
    words = [w for s in sources for w in (s.split()[1], s.split()[-1])]
    alone = translate(function, [re.sub(r"\W", "", w) for w in words], args.batch)
    lexicon = {w: stems(t) for w, t in zip(words, alone, strict=True)}
    bleu = lambda hyp: round(sacrebleu.metrics.BLEU().corpus_score(  # noqa: E731
        hyp, [references]).score, 2)
    report = {"sources": len(texts), "tags_kept_share": round(sum(kept) / len(kept), 4),
              "bleu_tags_stripped": bleu(stripped), "bleu_untagged": bleu(clean),
              "identical_after_stripping": sum(a == b for a, b in zip(stripped, clean,
                                                                      strict=True)),
              "seconds_untagged": round(clean_s, 2), "seconds_tagged": round(tagged_s, 2),
              "placement_export": placed(outputs, sources, lexicon),
              "placement_by_layer": layer_placement(opened.path, texts, sources, lexicon,
                                                    args.layers, args.batch),
              "examples": outputs[:3]}
    print(json.dumps(report, ensure_ascii=False))


if __name__ == "__main__":
    main()
