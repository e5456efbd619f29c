"""bench/translate_real.py without CTranslate2: its batching and flags (the conversion it
runs is the package's, tests/test_ctranslate2.py)."""

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")


def _bench():
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module("translate_real")
    finally:
        sys.path.remove(BENCH)


def test_calls_are_length_sorted_chunks_and_outputs_come_back_in_input_order():
    bench = _bench()
    lengths = [5, 1, 4, 2, 3]
    chunks = bench.length_chunks(lengths, 2)
    assert chunks == [[1, 3], [4, 2], [0]]
    texts = [f"s{i}" for i in range(len(lengths))]
    for workers in (1, 2):
        out = bench.run_calls(lambda rows: [texts[i].upper() for i in rows], chunks, workers)
        assert out == ["S0", "S1", "S2", "S3", "S4"]


def test_modes_and_batch_sizes_are_checked():
    bench = _bench()
    args = bench.parse_args(["--systems", "tfxformer-fp32", "--modes", "concurrent",
                             "--batch-sizes", "16", "64"])
    assert args.modes == ["concurrent"] and args.batch_sizes == [16, 64]
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--systems", "tfxformer-fp32", "--batch-sizes", "0"])
    assert exit_.value.code == 2
