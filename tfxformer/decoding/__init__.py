"""Incremental decoding: greedy (the reference) and beam search (§6.1) on a step function.

`common` holds what both searches share (:class:`DecodeStart`, the step-function
contract, finished sentences leaving the batch); `adapter.transformer_decoder` turns a
Transformer and a source batch into a :class:`DecodeStart`; `greedy_decode` and
`beam_search` are the two together; `shortlist` restricts both to a per-batch
vocabulary shortlist (`shortlist=`).
"""

from tfxformer.decoding.adapter import position_cap, transformer_decoder
from tfxformer.decoding.beam_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    BeamSearchOutput,
    BeamState,
    beam_search,
    length_penalty,
    sequence_beam_search,
    top_extensions,
)
from tfxformer.decoding.common import DEFAULT_EXTRA_LENGTH, DecodeStart
from tfxformer.decoding.greedy import DecodeOutput, GreedyState, greedy_decode, greedy_search
from tfxformer.decoding.shortlist import (
    ShortlistTable,
    build_shortlist_table,
    shortlist_ids,
    to_vocabulary,
)
from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "BOS_ID", "DEFAULT_ALPHA", "DEFAULT_BEAM_SIZE", "DEFAULT_EXTRA_LENGTH", "EOS_ID", "PAD_ID",
    "UNK_ID", "BeamSearchOutput", "BeamState", "DecodeOutput", "DecodeStart", "GreedyState",
    "ShortlistTable", "beam_search", "build_shortlist_table", "greedy_decode", "greedy_search",
    "length_penalty", "position_cap", "sequence_beam_search", "shortlist_ids",
    "to_vocabulary", "top_extensions", "transformer_decoder",
]
