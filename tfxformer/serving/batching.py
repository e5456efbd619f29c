"""Translating a list of lines in batches of similar length, outputs in input order."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def translate_in_length_order(translate: Callable[[list], list], lines: Sequence,
                              batch_size: int) -> list:
    """Calls `translate` on batches of `lines` sorted by length; returns outputs in order.

    Sorting first keeps padding (and so wasted decoding) small; `translate` maps a list of
    inputs to a list of outputs of the same length.
    """
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    outputs = [None] * len(lines)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        for i, text in zip(chunk, translate([lines[i] for i in chunk]), strict=True):
            outputs[i] = text
    return outputs
