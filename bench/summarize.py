#!/usr/bin/env python
"""Markdown tables from the JSON lines that end the logs in bench/results/ (run_all.sh).

  python bench/summarize.py [results_dir]
"""

from __future__ import annotations

import glob
import json
import os
import sys


def load(directory):
    runs = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.log"))):
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("{")]
        try:  # a log another tool wrote (quality_levers.log) need not end in JSON
            runs[os.path.basename(path)[:-4]] = json.loads(lines[-1])
        except (IndexError, ValueError):
            continue
    return runs


def train_rows(runs):
    print("| run | config | tgt tok/s median (min–max) | best step | step s | MFU* | peak RSS "
          "GiB | same-run keras-hub tok/s | tfx ÷ keras-hub (medians / best / per pair) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        if r.get("bench") != "train" or r.get("mode") != "fixed":
            continue
        config = f"{r['precision']}{' XLA' if r['xla'] else ''}" + (
            f", patch {r['patch']}" if r.get("patch") else "")
        lo, hi = r["target_tokens_per_second_min_max"]
        peer = r.get("peer")
        peer_cell = ratio = "—"
        if peer:
            peer_cell = (f"{peer['target_tokens_per_second']} (best "
                         f"{peer.get('target_tokens_per_second_best_step', '—')})")
            ratio = (f"{r['ratio_vs_peer']} / {r.get('ratio_vs_peer_best_step', '—')} / "
                     f"{r['ratio_vs_peer_per_step_pairs']['median']}")
        print(f"| {name} | {config} | {r['target_tokens_per_second']} ({lo}–{hi}) | "
              f"{r.get('target_tokens_per_second_best_step', '—')} | {r['step_s']['median']} | "
              f"{r['mfu']} | {r['peak_rss_mib'] / 1024:.1f} | {peer_cell} | {ratio} |")


def decode_rows(runs):
    print("\n| run | config | sent/s median (min–max) | tgt tok/s | call s (min–max) | first "
          "call s | MFU* | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        if r.get("bench") != "translate" or r.get("mode", "fixed") != "fixed":
            continue
        search = "greedy" if r["beams"] == 1 else f"beam {r['beams']}"
        if "precision" in r:  # tfxformer
            config = f"{search}, {r['precision']}{' XLA' if r['xla'] else ''}"
        else:  # ct2_peer.py
            config = f"CTranslate2 {search}, {r['compute_type_resolved']} ({r['cpu_isa_env']})"
        c = r["call_s"]
        lo, hi = round(r["batch_size"] / c["max"], 2), round(r["batch_size"] / c["min"], 2)
        print(f"| {name} | {config} | {r['sentences_per_second']} ({lo}–{hi}) | "
              f"{r['target_tokens_per_second']} | {c['median']} ({c['min']}–{c['max']}) | "
              f"{r['first_call_s']} | {r.get('mfu', '—')} | {r['peak_rss_mib'] / 1024:.2f} |")


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results")
    runs = load(directory)
    train_rows(runs)
    decode_rows(runs)
    print("\n*MFU = model FLOP/s / 221.5 GFLOP/s (the peers' denominator; see README).")


if __name__ == "__main__":
    main()
