"""Terminology constraints (docs/steering.md): the speed of `translate_nbest` with 0, 1, 2
and 4 phrases per sentence, and a terminology test built from Multi30k test_2016.

    python scripts/export.py --model saved_models/multi30k_en_de --export-dir runs/constraints/en_de
    PYTHONPATH=$PWD python bench/constraints.py --model runs/constraints/en_de \\
        --before runs/constraints/en_de_before --limit 200 --repeats 7 \\
        > bench/results/constraints.log 2>&1

`--before`: an export of the same model made by the code before `translate_nbest` took
constraints (its signature lacks the input), timed with the same requests, so the
no-constraint path can be compared with what it was:

    mkdir -p runs/constraints/src_before
    git archive 5b2bebf tfxformer scripts | tar -x -C runs/constraints/src_before
    (cd runs/constraints/src_before && PYTHONPATH=$PWD python scripts/export.py \
        --model ../../../saved_models/multi30k_en_de --export-dir ../en_de_before)

Speed: sentences/s of `translate_nbest` (one hypothesis, the export's beam, α and extra
length, batches of `--batch-size` in file order; each setting warmed up by a whole pass,
then the settings timed in turn, `--repeats` rounds, every other one in reverse order,
the median pass), with no
constraints, then with the first 1, 2 and 4 of each sentence's reference words (4+
letters, in reference order; fewer where the reference has fewer).

Terminology test (the reference gives the terms, as Post & Vilar, 2018, did): "missed",
per sentence up to two reference words (4+ letters, not a stop word) that the
unconstrained translation lacks, drawn at random (seed 0; sentences with none get no
constraint); "random", one random pair of consecutive reference words per sentence (a
two-word phrase, each 2+ letters). Term accuracy: the fraction of phrases present in the
output as whole words (`inside_a_longer_word` counts the others found as a part of a
word); BLEU: sacrebleu's corpus BLEU of the 200 outputs against the references,
constrained and not.

`--compare`: an export of the same model with the input, made by other code (e.g. a former
commit's: `git archive COMMIT tfxformer scripts`, as above); each setting of it is timed in
the same rounds, next to this export's, and the log gives this export's time over its,
round by round, and whether their translations are the same.

With `--before`, the ratio of the no-constraint pass's time to the older export's, round by
round (the two passes of a round run next to each other), and whether their translations
are the same. Log lines on stderr; the result JSON (with the load average of each figure)
on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data", "multi30k")
# German function words a "missed" term is never drawn from
STOP = set("eine einer einem einen eines sich sind wird werden nicht noch auch oder"
           " aber dass diese dieser diesem diesen dieses seine seiner seinem seinen ihre"
           " ihrer ihrem ihren während neben hinter unter über durch gegen beim".split())


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_avg():
    return round(os.getloadavg()[0], 2)


def words(text):
    return re.findall(r"\w+", text)


def holds(output, phrase):
    """The phrase's words appear one after the other among the output's words."""
    out, want = words(output), words(phrase)
    return any(out[i:i + len(want)] == want for i in range(len(out) - len(want) + 1))


def read(path, limit):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


class Signature:
    """A SavedModel's translate_nbest, one best translation per text."""

    def __init__(self, path):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (the SentencePiece ops)

        from tfxformer.locate import resolve

        self.tf, self.path = tf, resolve(path).path
        self.loaded = tf.saved_model.load(self.path)
        self.function = self.loaded.signatures["translate_nbest"]
        self.takes = "constraints" in self.function.structured_input_signature[1]
        with open(self.loaded.config_asset.asset_path.numpy().decode(), encoding="utf-8") as f:
            self.decoding = json.load(f)["decoding"]

    def __call__(self, texts, constraints=None):
        tf, d, size = self.tf, self.decoding, len(texts)
        given = {}
        if constraints is not None:
            given["constraints"] = tf.constant(constraints, tf.string)
        out = self.function(
            text=tf.constant(texts), beam_size=tf.fill([size], d["beam_size"]),
            alpha=tf.fill([size], float(d["alpha"])),
            extra_length=tf.fill([size], d["extra_length"]),
            max_input_tokens=tf.fill([size], d["max_input_tokens"]),
            num_hypotheses=tf.fill([size], 1), no_repeat_ngram_size=tf.fill([size], 0),
            repetition_penalty=tf.fill([size], 1.0), target_prefix=tf.fill([size], ""),
            **given)
        return [t.decode("utf-8") for t in out["translations"].numpy()[:, 0]]

    def translate(self, texts, constraints, batch_size):
        out = []
        for start in range(0, len(texts), batch_size):
            part = None if constraints is None else constraints[start:start + batch_size]
            out += self(texts[start:start + batch_size], part)
        return out


def speeds(configs, texts, batch_size, repeats):
    """{name: (outputs, sentences/s (the median pass), load averages)} of configs
    [(name, signature, constraints)]: each warmed up by a whole pass, then the configs
    timed in turn, `repeats` rounds (every other one in reverse order), so the machine's
    load falls on all alike."""
    outputs, seconds, loads = {}, {name: [] for name, _, _ in configs}, {}
    for name, signature, constraints in configs:
        outputs[name] = signature.translate(texts, constraints, batch_size)
    for round_ in range(repeats):  # the order reversed every other round
        for name, signature, constraints in configs[::-1 if round_ % 2 else 1]:
            start = time.perf_counter()
            signature.translate(texts, constraints, batch_size)
            seconds[name].append(time.perf_counter() - start)
            loads.setdefault(name, []).append(load_avg())
    return {name: (outputs[name], round(len(texts) / statistics.median(seconds[name]), 2),
                   loads[name], seconds[name]) for name in outputs}


def first_words(reference, count):
    chosen = [w for w in words(reference) if len(w) >= 4 and w.isalpha()]
    return "\t".join(chosen[:count])


def missed_terms(reference, output, rng):
    seen = set(words(output))
    candidates = sorted({w for w in words(reference) if len(w) >= 4 and w.isalpha()
                         and w.lower() not in STOP and w not in seen})
    rng.shuffle(candidates)
    return candidates[:2]


def random_pair(reference, rng):
    ws = words(reference)
    pairs = [f"{a} {b}" for a, b in zip(ws, ws[1:], strict=False)
             if len(a) >= 2 and len(b) >= 2 and a.isalpha() and b.isalpha()]
    return [pairs[rng.randrange(len(pairs))]] if pairs else []


def score(outputs, phrases, references):
    import sacrebleu

    wanted = [(o, p) for o, ps in zip(outputs, phrases, strict=True) for p in ps]
    present = sum(holds(o, p) for o, p in wanted)
    return {"phrases": len(wanted), "present": present,
            "inside_a_longer_word": sum(p in o and not holds(o, p) for o, p in wanted),
            "term_accuracy": round(present / max(len(wanted), 1), 4),
            "bleu": round(sacrebleu.corpus_bleu(outputs, [references]).score, 2)}


def main(argv=None):
    import random

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an export with the constraints input")
    ap.add_argument("--before", help="an export of the same model without that input")
    ap.add_argument("--compare", help="an export with the input made by other code, "
                    "timed beside --model in every setting")
    ap.add_argument("--source", default=os.path.join(DATA, "test_2016_flickr.en"))
    ap.add_argument("--reference", default=os.path.join(DATA, "test_2016_flickr.de"))
    ap.add_argument("--limit", type=int, default=200, help="first N sentences (200)")
    ap.add_argument("--batch-size", type=int, default=64, help="texts per request (64)")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds (7)")
    args = ap.parse_args(argv)
    texts, references = read(args.source, args.limit), read(args.reference, args.limit)
    result = {"sentences": len(texts), "batch_size": args.batch_size, "speed": {},
              "cpu": os.popen("lscpu | grep 'Model name'").read().split(":")[-1].strip()}
    model = Signature(args.model)
    result["decoding"] = model.decoding
    configs = []
    if args.before:
        before = Signature(args.before)
        assert not before.takes, f"{args.before} already takes constraints"
        configs.append(("before, no constraints input", before, None))
    other = Signature(args.compare) if args.compare else None
    assert other is None or other.takes, f"{args.compare} takes no constraints"
    wanted = {}
    for count in (0, 1, 2, 4):
        constraints = [first_words(r, count) for r in references]
        if count:
            wanted[f"{count} phrases"] = [c.split("\t") if c else [] for c in constraints]
        configs.append((f"{count} phrases", model, constraints))
        if other is not None:
            configs.append((f"{count} phrases, compared", other, constraints))
    timings = speeds(configs, texts, args.batch_size, args.repeats)
    if other is not None:
        result["time_ratio_to_compared"] = {}
        for count in (0, 1, 2, 4):
            now, then = timings[f"{count} phrases"], timings[f"{count} phrases, compared"]
            ratios = [round(a / b, 3) for a, b in zip(now[3], then[3], strict=True)]
            result["time_ratio_to_compared"][f"{count} phrases"] = {
                "per_round": ratios, "median": statistics.median(ratios),
                "same_translations": now[0] == then[0]}
        log(f"time / compared: {result['time_ratio_to_compared']}")
    if args.before:  # a batch without constraints: the translations of before, as fast?
        now, then = timings["0 phrases"], timings["before, no constraints input"]
        result["no_constraints_same_as_before"] = now[0] == then[0]
        result["no_constraints_time_ratio_to_before"] = {
            "per_round": [round(a / b, 3) for a, b in zip(now[3], then[3], strict=True)],
            "median": round(statistics.median(a / b for a, b in zip(now[3], then[3],
                                                                    strict=True)), 3)}
        log(f"no constraints / before, time per round: "
            f"{result['no_constraints_time_ratio_to_before']}")
    for name, (out, speed, loads, seconds) in timings.items():
        row = result["speed"][name] = {"sent_per_s": speed, "load": loads,
                                       "seconds": [round(x, 3) for x in seconds]}
        key = name.split(",")[0]
        if key in wanted:
            row.update(phrases=sum(map(len, wanted[key])),
                       term_accuracy=score(out, wanted[key], references)["term_accuracy"])
        log(f"{name}: {json.dumps(row)}")
    plain = model.translate(texts, [""] * len(texts), args.batch_size)

    rng = random.Random(0)
    tests = {"missed": [missed_terms(r, o, rng) for r, o in zip(references, plain,
                                                                strict=True)],
             "random": [random_pair(r, rng) for r in references]}
    result["terminology"] = {}
    for name, phrases in tests.items():
        out = model.translate(texts, ["\t".join(p) for p in phrases], args.batch_size)
        result["terminology"][name] = {
            "sentences_with_terms": sum(bool(p) for p in phrases),
            "unconstrained": score(plain, phrases, references),
            "constrained": score(out, phrases, references), "load": load_avg(),
            "examples": [{"source": t, "terms": p, "unconstrained": u, "constrained": c}
                         for t, p, u, c in list(zip(texts, phrases, plain, out,
                                                    strict=True))[:5] if p]}
        summary = {k: v for k, v in result["terminology"][name].items() if k != "examples"}
        log(f"{name}: {json.dumps(summary)}")
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
