"""Incremental decoding on the key/value cache: greedy (the reference) and beam search (§6.1)."""

from tfxformer.decoding.beam_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    BeamSearchOutput,
    beam_search,
    length_penalty,
)
from tfxformer.decoding.greedy import (
    BOS_ID,
    DEFAULT_EXTRA_LENGTH,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    DecodeOutput,
    greedy_decode,
)

__all__ = [
    "BOS_ID", "DEFAULT_ALPHA", "DEFAULT_BEAM_SIZE", "DEFAULT_EXTRA_LENGTH", "EOS_ID", "PAD_ID",
    "UNK_ID", "BeamSearchOutput", "DecodeOutput", "beam_search", "greedy_decode",
    "length_penalty",
]
