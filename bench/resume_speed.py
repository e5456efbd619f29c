"""A killed training run back at work: seconds from restart to the first resumed update.

scripts/train_wmt.py (a tiny model, op determinism, the token cache on) on a WMT14-sized
corpus made at run time (`make_corpus`, never committed) runs until `ckpt-<checkpoint_every>`
is named in the state file and `--after` more updates are logged, then gets SIGKILL; the same
command resumes from that checkpoint (model, optimizer, input position and shuffle state).
Reported: `seconds_to_resume` (process start -> the first resumed update's log line),
`checkpoint_mib`, `resume_phases` (the resumed run's log lines and their seconds), and
`batch_sequence_continues` (the resumed run logs the killed run's losses for those updates).

    PYTHONPATH=$PWD taskset -c 0 python bench/resume_speed.py --pairs 4500000
    PYTHONPATH=$PWD python bench/resume_speed.py --pairs 3000 \\
        --vocab-size 500 --batch-tokens 1024 --shuffle-buffer 1000     # a quick check

Progress goes to stderr; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
TRAIN_WMT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                         "train_wmt.py")
STEP_LINE = re.compile(r" step (\d+) loss (\S+) ")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (.*)$", re.M)
POLL_S = 0.05


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


def _command(args, folder: str, run_dir: str) -> list[str]:
    every = args.checkpoint_every
    flags = {"data": folder, "model_dir": run_dir, "preset": "tiny",
             "vocab_size": args.vocab_size, "batch_tokens": args.batch_tokens,
             "shuffle_buffer": args.shuffle_buffer, "train_steps": every + args.after,
             "checkpoint_every": every, "log_every": 1, "eval_every": 0,
             "eval_sentences": 0, "average_last": 0, "warmup_steps": 100}
    command = [sys.executable, TRAIN_WMT, "--deterministic", "--token-cache"]
    for name, value in flags.items():
        command += ["--" + name.replace("_", "-"), str(value)]
    return command


def _losses(path: str) -> dict[int, str]:
    """{update: loss as logged} of the log file at `path` so far."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return {int(m.group(1)): m.group(2) for m in STEP_LINE.finditer(f.read())}


def _phases(path: str, started: float, until_step: int) -> list:
    """[seconds after `started` (a time.time()), message] of each log line of the file at
    `path` up to the log line of update `until_step`: where the way back spends its time."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    phases = []
    for stamp, message in LOG_LINE.findall(text):
        when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        phases.append([round(when - started, 1), message[:120]])
        if STEP_LINE.search(" " + message + " ") and f"step {until_step} " in message + " ":
            break
    return phases


def _named_checkpoint(run_dir: str) -> str | None:
    """The checkpoint the state file names, if any."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "checkpoint"), encoding="utf-8") as f:
            found = re.search(r'^model_checkpoint_path: "(.+)"', f.read(), re.M)
    except OSError:
        return None
    return os.path.basename(found.group(1)) if found else None


def _wait(process, until, output: str, timeout: float, what: str):
    """Polls `until()` every POLL_S; fails naming `what` if `process` ends or time runs out."""
    deadline = time.time() + timeout
    while not until():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            with open(output, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"train_wmt.py did not reach {what} (status "
                               f"{process.poll()}):\n{tail}")
        time.sleep(POLL_S)


def _start(command, output: str):
    with open(output, "w") as out:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def measure(args, work: str) -> dict:
    folder, run_dir = os.path.join(work, "corpus"), os.path.join(work, "run")
    began = time.perf_counter()
    corpus = make_corpus(folder, args.pairs, args.shared)
    corpus["seconds_to_make"] = round(time.perf_counter() - began, 1)
    print(json.dumps({"phase": "corpus", **corpus}), file=sys.stderr, flush=True)
    command, every = _command(args, folder, run_dir), args.checkpoint_every
    last = every + args.after
    killed_log, resumed_log = os.path.join(work, "killed.log"), os.path.join(work, "resumed.log")

    began = time.perf_counter()
    killed = _start(command, killed_log)
    _wait(killed, lambda: _named_checkpoint(run_dir) == f"ckpt-{every}", killed_log,
          args.timeout, f"ckpt-{every}")
    to_checkpoint = time.perf_counter() - began
    _wait(killed, lambda: last in _losses(killed_log), killed_log, args.timeout,
          f"update {last}")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    reference = _losses(killed_log)
    print(json.dumps({"phase": "killed", "seconds_to_checkpoint": round(to_checkpoint, 1),
                      "logged_to": max(reference)}), file=sys.stderr, flush=True)
    size = sum(os.path.getsize(p) for p in glob.glob(
        os.path.join(run_dir, "checkpoints", f"ckpt-{every}.*")))

    began, started = time.perf_counter(), time.time()
    resumed = _start(command, resumed_log)
    _wait(resumed, lambda: every + 1 in _losses(resumed_log), resumed_log, args.timeout,
          f"update {every + 1}")
    to_resume = time.perf_counter() - began
    status = resumed.wait(args.timeout)
    with open(resumed_log, encoding="utf-8", errors="replace") as f:
        text = f.read()  # the input position restored too, not started afresh
    restored = re.search(rf"Resumed from \S*ckpt-{every} at step {every}\b", text) is not None \
        and "the data pipeline starts afresh" not in text
    again = _losses(resumed_log)
    steps = range(every + 1, last + 1)
    return {"bench": "resume_speed", "pairs": args.pairs, "corpus": corpus,
            "vocab_size": args.vocab_size, "batch_tokens": args.batch_tokens,
            "shuffle_buffer": args.shuffle_buffer, "checkpoint_step": every,
            "seconds_to_checkpoint_first_run": round(to_checkpoint, 1),
            "seconds_to_resume": round(to_resume, 1),
            "checkpoint_mib": round(size / 2 ** 20, 2),
            "resume_phases": _phases(resumed_log, started, every + 1),
            "resumed_from_checkpoint": restored, "resumed_exit_status": status,
            "batch_sequence_continues": restored and all(
                again.get(s) == reference.get(s) for s in steps),
            "losses_killed_run": [reference.get(s) for s in steps],
            "losses_resumed_run": [again.get(s) for s in steps]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000, help="pairs made")
    parser.add_argument("--vocab-size", type=int, default=37_000, help="subword vocabulary")
    parser.add_argument("--batch-tokens", type=int, default=25_000, help="tokens a batch")
    parser.add_argument("--shuffle-buffer", type=int, default=100_000,
                        help="train_wmt.py's --shuffle-buffer (its state is in the checkpoint)")
    parser.add_argument("--checkpoint-every", type=int, default=20,
                        help="the killed run's checkpoint step")
    parser.add_argument("--after", type=int, default=3,
                        help="updates past the checkpoint compared between the two runs")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per wait")
    parser.add_argument("--shared", default=SHARED, help="the shared data folder")
    args = parser.parse_args(argv)
    if args.checkpoint_every < 1 or args.after < 1:
        parser.error(f"--checkpoint-every and --after must be >= 1, got "
                     f"{args.checkpoint_every} and {args.after}")
    load_before = round(os.getloadavg()[0], 2)
    work = tempfile.mkdtemp(prefix="tfxformer-resume-")
    try:
        result = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_1min"] = {"before": load_before, "after": round(os.getloadavg()[0], 2)}
    print(json.dumps(result))
    return 0 if result["batch_sequence_continues"] else 1


if __name__ == "__main__":
    sys.exit(main())
