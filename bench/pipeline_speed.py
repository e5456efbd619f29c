"""Input pipeline at WMT14 size: time to the first batch, peak RSS, tokens/s.

A WMT14-sized corpus (default 4.5 M pairs, §5.1) is made at run time in a temporary
folder from the text in ../shared/data (never committed): each pair is, with probability
0.6, a newstest2013/2014 pair (WMT news text), otherwise 2-3 short Tatoeba/Multi30k pairs
joined, drawn with replacement and shuffled, so the sentence lengths come close to WMT14
news text. Then, each in a fresh child process (its own peak RSS), the real path of
scripts/train_wmt.py (`tfxformer.training`) with the token cache on or off (`--cache`):

1. cold start, from an empty run dir: corpus checks (`sources.load_corpus`), vocabulary
   training (`training.prepare_vocabulary`, 37k pieces, SentencePiece sampling at most
   3 M lines), then with the cache its build (`training.prepare_token_cache`: every pair
   tokenized once, the length check's counts from the same pass), without it the length
   check (`training.check_training_pairs`: every pair tokenized), then the training
   pipeline (`training.training_dataset`, 25,000 tokens per batch) to its first batch;
2. warm start, the run dir of 1 (spm.model, and the cache if on), as a resumed run:
   corpus checks, vocabulary read, cache read (on) or no length check (off: a resumed run
   skips it), first batch;
3. steady-state target tokens/s of the pipeline after a warm-up, in a child pinned to
   one core (`--core`), and in one with every core this process may use (under
   `taskset -c 1` that is one core too: `cores` says how many).

On a loaded machine wall times mostly measure the other load; each stage's CPU seconds
(`stages_cpu_s`; on one core, about the time a free core would take) and the one-core
child's target tokens per CPU-second (`target_tokens_per_cpu_second`) say more there.

`--corpus multi30k` takes the first `--pairs` Multi30k training pairs instead (val: its
`val`); `--subword-sampling ALPHA` is train_wmt.py's (BPE-dropout, no token cache). Sampled
segmentations are longer, so compare pipelines by pairs per second (`pairs_per_second_*`).

    PYTHONPATH=$PWD nice -n 10 python bench/pipeline_speed.py --pairs 4500000 --cache on
    PYTHONPATH=$PWD python bench/pipeline_speed.py --corpus multi30k --pairs 29000 \
        --vocab-size 8000 --batch-tokens 4096 --seconds 30 --subword-sampling 0.1

Progress (stage lines, the cache's parts) goes to stderr. Last line: JSON with pairs,
cache, seconds_to_first_batch (cold), seconds_to_first_batch_warm, peak_rss_mib (the
largest of the children's), target_tokens_per_second_per_core,
target_tokens_per_second_all_cores, cores; also the by-stage wall and CPU seconds of both
starts and the load average before and after.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
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
    """Writes train.en/.de (`pairs` lines) and val.en/.de (newstest2014)."""
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


def make_multi30k(folder: str, pairs: int, shared: str) -> dict:
    """Writes the first `pairs` Multi30k training pairs as train.en/.de, and its val."""
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "de"):
        lines = _lines(f"{shared}/multi30k/train.{lang}")[:pairs]
        with open(f"{folder}/train.{lang}", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        shutil.copy(f"{shared}/multi30k/val.{lang}", f"{folder}/val.{lang}")
    words = sum(line.count(" ") + 1 for line in lines)  # the last language's: the target
    return {"pairs": len(lines), "mean_target_words": round(words / len(lines), 1)}


def _config(args):
    from tfxformer import training

    return training.TrainConfig(model_dir=args.run_dir, data=args.folder,
                                vocab_size=args.vocab_size, batch_tokens=args.batch_tokens,
                                eval_every=0, token_cache=args.cache == "on",
                                subword_sampling=args.subword_sampling)


def _rss_mib() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def start(args, warm: bool) -> dict:
    """train_wmt.py's start-up up to its first training batch, timed by stage."""
    from tfxformer import training
    from tfxformer.data import sources
    from tfxformer.distribute import make_strategy

    config = _config(args)
    os.makedirs(config.model_dir, exist_ok=True)  # as train_and_evaluate does
    stages, cpu, began, cpu_began = {}, {}, time.perf_counter(), time.process_time()

    def stage(name):  # wall seconds, and CPU seconds of this process (less load-sensitive)
        stages[name] = round(time.perf_counter() - began - sum(stages.values()), 1)
        cpu[name] = round(time.process_time() - cpu_began - sum(cpu.values()), 1)
        logging.info("pipeline_speed: %s %s: %.1f s (%.1f CPU s)", "warm" if warm else "cold",
                     name, stages[name], cpu[name])

    strategy = make_strategy(1)
    corpus = sources.load_corpus(config.data, config.src, config.tgt)
    training.check_splits(config, corpus)
    stage("corpus_checks")
    tokenizer = training.prepare_vocabulary(config, corpus, strategy, chief=True)
    stage("vocabulary")
    cache = training.prepare_token_cache(config, corpus, tokenizer, strategy, chief=True)
    if cache is not None:
        training.check_training_pairs(config, corpus, tokenizer, cache.stats)
        stage("token_cache")
    elif not warm:  # a resumed run (warm) skips the length check
        training.check_training_pairs(config, corpus, tokenizer)
        stage("length_check")
    next(iter(training.training_dataset(config, corpus, tokenizer, 1, cache)))
    stage("first_batch")
    return {"seconds_to_first_batch": round(time.perf_counter() - began, 1),
            "stages_s": stages, "stages_cpu_s": cpu, "peak_rss_mib": _rss_mib()}


def steady(args) -> dict:
    """Target tokens/s of the training pipeline after a warm-up (this process's cores)."""
    import tensorflow as tf

    from tfxformer import training
    from tfxformer.data import sources
    from tfxformer.data.tokenizer import load_vocabulary
    from tfxformer.distribute import make_strategy

    config = _config(args)
    corpus = sources.load_corpus(config.data, config.src, config.tgt)
    tokenizer = load_vocabulary(os.path.join(config.model_dir, "spm.model"))
    cache = training.prepare_token_cache(config, corpus, tokenizer, make_strategy(1), True)
    iterator = iter(training.training_dataset(config, corpus, tokenizer, 1, cache))
    warm_until = time.perf_counter() + min(20.0, args.seconds)
    while time.perf_counter() < warm_until:  # fills the shuffle buffer, starts the threads
        next(iterator)
    tokens, batches, pairs = 0, 0, 0
    began, cpu_began = time.perf_counter(), time.process_time()
    while time.perf_counter() - began < args.seconds:
        _, labels = next(iterator)
        tokens += int(tf.math.count_nonzero(labels))
        batches, pairs = batches + 1, pairs + int(labels.shape[0])
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    return {"target_tokens_per_second": round(tokens / elapsed),
            "pairs_per_second": round(pairs / elapsed),
            "pairs_per_cpu_second": round(pairs / max(cpu, 1e-9)),
            "target_tokens_per_cpu_second": round(tokens / max(cpu, 1e-9)),
            "batches": batches, "cores_used": len(os.sched_getaffinity(0)),
            "peak_rss_mib": _rss_mib()}


def _child(args, phase: str, core: int | None = None) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--phase", phase,
               "--folder", args.folder, "--run-dir", args.run_dir, "--cache", args.cache,
               "--seconds", str(args.seconds), "--batch-tokens", str(args.batch_tokens),
               "--vocab-size", str(args.vocab_size),
               "--subword-sampling", str(args.subword_sampling)]
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(json.dumps({"phase": phase, "core": core, **result}), file=sys.stderr, flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--cache", choices=("on", "off"), default="on",
                        help="train_wmt.py's --token-cache / --no-token-cache")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--batch-tokens", type=int, default=25_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="steady-state window")
    parser.add_argument("--core", type=int, default=1, help="core of the one-core run")
    parser.add_argument("--shared", default=SHARED, help="the shared data folder")
    parser.add_argument("--corpus", choices=("wmt14-like", "multi30k"), default="wmt14-like",
                        help="a WMT14-like corpus made from the shared text, or the first "
                             "--pairs Multi30k training pairs")
    parser.add_argument("--subword-sampling", type=float, default=0.0,
                        help="train_wmt.py's --subword-sampling (BPE-dropout; 0 = off)")
    parser.add_argument("--phase", choices=("cold", "warm", "steady"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        result = steady(args) if args.phase == "steady" else start(args, args.phase == "warm")
        print(json.dumps(result))
        return 0
    work = tempfile.mkdtemp(prefix="tfxformer-pipeline-")
    try:
        args.folder, args.run_dir = os.path.join(work, "corpus"), os.path.join(work, "run")
        load_before = round(os.getloadavg()[0], 2)
        began = time.perf_counter()
        corpus = make_corpus(args.folder, args.pairs, args.shared) \
            if args.corpus == "wmt14-like" else make_multi30k(args.folder, args.pairs,
                                                             args.shared)
        corpus["seconds_to_make"] = round(time.perf_counter() - began, 1)
        print(json.dumps({"phase": "corpus", **corpus}), file=sys.stderr, flush=True)
        cold, warm = _child(args, "cold"), _child(args, "warm")
        one, every = _child(args, "steady", args.core), _child(args, "steady")
        print(json.dumps({
            "bench": "pipeline_speed", "pairs": args.pairs, "cache": args.cache,
            "corpus_kind": args.corpus, "subword_sampling": args.subword_sampling,
            "corpus": corpus, "vocab_size": args.vocab_size, "batch_tokens": args.batch_tokens,
            "seconds_to_first_batch": cold["seconds_to_first_batch"],
            "stages_s": cold["stages_s"], "stages_cpu_s": cold["stages_cpu_s"],
            "seconds_to_first_batch_warm": warm["seconds_to_first_batch"],
            "stages_warm_s": warm["stages_s"], "stages_warm_cpu_s": warm["stages_cpu_s"],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in (cold, warm, one, every)),
            "peak_rss_mib_by_phase": {"cold": cold["peak_rss_mib"], "warm": warm["peak_rss_mib"],
                                      "steady": one["peak_rss_mib"]},
            "steady_window_s": args.seconds,
            "target_tokens_per_second_per_core": one["target_tokens_per_second"],
            "target_tokens_per_second_all_cores": every["target_tokens_per_second"],
            "target_tokens_per_cpu_second": one["target_tokens_per_cpu_second"],
            "pairs_per_second_per_core": one["pairs_per_second"],
            "pairs_per_second_all_cores": every["pairs_per_second"],
            "pairs_per_cpu_second": one["pairs_per_cpu_second"],
            "cores": every["cores_used"],
            "loadavg_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)}}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
