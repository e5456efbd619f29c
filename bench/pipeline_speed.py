"""Input pipeline at WMT14 size (issue 16): time to the first batch, peak RSS, tokens/s.

A WMT14-sized corpus (default 4.5 M pairs, §5.1) is made at run time in a temporary
folder from the text in ../shared/data (never committed): each pair is, with probability
0.6, a newstest2013/2014 pair (WMT news text), otherwise 2-3 short Tatoeba/Multi30k pairs
joined, drawn with replacement and shuffled, so the sentence lengths come close to WMT14
news text. Then the real path of scripts/train_wmt.py from a cold run dir: corpus checks
(`sources.load_corpus`), vocabulary training (`training.prepare_vocabulary`, 37k pieces,
SentencePiece sampling at most 3 M lines), the length check
(`training.check_training_pairs`), `pipeline.train_dataset` at 25,000 tokens per batch,
first batch. Then the steady-state target tokens/s of the pipeline, in a child process
pinned to one core (`--core`) and in one with all cores.

    PYTHONPATH=$PWD nice -n 10 python bench/pipeline_speed.py --pairs 4500000

Last line: JSON with pairs, seconds_to_first_batch, peak_rss_mib,
target_tokens_per_second_per_core, target_tokens_per_second_all_cores, cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def _lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def make_corpus(folder: str, pairs: int, shared: str, seed: int = 0) -> dict:
    """Writes train.en/.de (`pairs` lines) and val.en/.de (newstest2014's first 500)."""
    news = [(e, d) for year in (2013, 2014) for e, d in zip(
        _lines(f"{shared}/wmt14/newstest{year}.en"), _lines(f"{shared}/wmt14/newstest{year}.de"),
        strict=True)]
    short = list(zip(_lines(f"{shared}/tatoeba/tatoeba.en.gz"),
                     _lines(f"{shared}/tatoeba/tatoeba.de.gz"), strict=True)) + \
        list(zip(_lines(f"{shared}/multi30k/train.en"), _lines(f"{shared}/multi30k/train.de"),
                 strict=True))
    rng = np.random.default_rng(seed)
    is_news = rng.random(pairs) < 0.6
    news_ids = rng.integers(0, len(news), pairs)
    joins = rng.integers(2, 4, pairs)
    short_ids = rng.integers(0, len(short), (pairs, 3))
    words = 0
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/train.en", "w", encoding="utf-8") as fe, \
            open(f"{folder}/train.de", "w", encoding="utf-8") as fd:
        for i in range(pairs):
            if is_news[i]:
                en, de = news[news_ids[i]]
            else:
                chosen = [short[j] for j in short_ids[i, :joins[i]]]
                en, de = " ".join(c[0] for c in chosen), " ".join(c[1] for c in chosen)
            words += de.count(" ") + 1
            fe.write(en + "\n")
            fd.write(de + "\n")
    for lang in ("en", "de"):
        shutil.copy(f"{shared}/wmt14/newstest2014.{lang}", f"{folder}/val.{lang}")
    news_words = np.mean([d.count(" ") + 1 for _, d in news])
    return {"mean_target_words": round(words / pairs, 1),
            "newstest_mean_target_words": round(float(news_words), 1)}


def first_batch(folder: str, run_dir: str, vocab_size: int, batch_tokens: int) -> dict:
    """The start-up of train_wmt.py up to its first training batch, timed by stage."""
    from tfxformer import training
    from tfxformer.data import pipeline, sources
    from tfxformer.distribute import make_strategy

    config = training.TrainConfig(model_dir=run_dir, data=folder, vocab_size=vocab_size,
                                  batch_tokens=batch_tokens, eval_every=0)
    os.makedirs(run_dir, exist_ok=True)  # as train_and_evaluate does
    stages, began = {}, time.perf_counter()
    strategy = make_strategy(1)
    corpus = sources.load_corpus(config.data, config.src, config.tgt)
    training.check_splits(config, corpus)
    stages["corpus_checks"] = time.perf_counter() - began
    tokenizer = training.prepare_vocabulary(config, corpus, strategy, chief=True)
    stages["vocabulary"] = time.perf_counter() - began - sum(stages.values())
    training.check_training_pairs(config, corpus, tokenizer)
    stages["length_check"] = time.perf_counter() - began - sum(stages.values())
    data = pipeline.train_dataset(corpus.train.dataset(), tokenizer,
                                  batch_tokens=config.batch_tokens,
                                  max_length=config.max_length,
                                  shuffle_buffer=config.shuffle_buffer, seed=config.seed)
    next(iter(data))
    stages["first_batch"] = time.perf_counter() - began - sum(stages.values())
    return {"seconds_to_first_batch": round(time.perf_counter() - began, 1),
            "stages_s": {k: round(v, 1) for k, v in stages.items()},
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def steady(folder: str, run_dir: str, batch_tokens: int, seconds: float) -> dict:
    """Target tokens/s of `train_dataset` after a warm-up (this process's cores)."""
    import tensorflow as tf

    from tfxformer import checkpoints
    from tfxformer.data import pipeline, sources

    tokenizer = checkpoints.load_vocabulary(os.path.join(run_dir, "spm.model"))
    corpus = sources.load_corpus(folder, "en", "de")
    data = pipeline.train_dataset(corpus.train.dataset(), tokenizer, batch_tokens=batch_tokens,
                                  seed=0)
    iterator = iter(data)
    warm_until = time.perf_counter() + min(20.0, seconds)
    while time.perf_counter() < warm_until:  # fills the shuffle buffer, starts the threads
        next(iterator)
    tokens, batches, began = 0, 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        _, labels = next(iterator)
        tokens += int(tf.math.count_nonzero(labels))
        batches += 1
    elapsed = time.perf_counter() - began
    return {"target_tokens_per_second": round(tokens / elapsed), "batches": batches,
            "cores_used": len(os.sched_getaffinity(0))}


def _child(args, core):
    command = [sys.executable, os.path.abspath(__file__), "--steady", args.folder,
               "--run-dir", args.run_dir, "--seconds", str(args.seconds),
               "--batch-tokens", str(args.batch_tokens)]
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--batch-tokens", type=int, default=25_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="steady-state window")
    parser.add_argument("--core", type=int, default=1, help="core of the one-core run")
    parser.add_argument("--shared", default=SHARED, help="the shared data folder")
    parser.add_argument("--steady", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steady:
        print(json.dumps(steady(args.steady, args.run_dir, args.batch_tokens, args.seconds)))
        return 0
    work = tempfile.mkdtemp(prefix="tfxformer-pipeline-")
    try:
        args.folder, args.run_dir = os.path.join(work, "corpus"), os.path.join(work, "run")
        began = time.perf_counter()
        corpus = make_corpus(args.folder, args.pairs, args.shared)
        corpus["seconds_to_make"] = round(time.perf_counter() - began, 1)
        start = first_batch(args.folder, args.run_dir, args.vocab_size, args.batch_tokens)
        one, every = _child(args, args.core), _child(args, None)
        print(json.dumps({"bench": "pipeline_speed", "pairs": args.pairs, "corpus": corpus,
                          "vocab_size": args.vocab_size, "batch_tokens": args.batch_tokens,
                          **start, "loadavg_1min": round(os.getloadavg()[0], 2),
                          "steady_window_s": args.seconds,
                          "target_tokens_per_second_per_core": one["target_tokens_per_second"],
                          "target_tokens_per_second_all_cores": every["target_tokens_per_second"],
                          "cores": every["cores_used"]}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
