"""Incremental decoding: greedy (the reference) and beam search (§6.1) on a step function.

`common` holds what both searches share (:class:`DecodeStart`, the step-function
contract, finished sentences leaving the batch); `adapter.transformer_decoder` turns a
Transformer and a source batch into a :class:`DecodeStart`; `greedy_decode` and
`beam_search` are the two together, on one model or an ensemble (a list of models,
`ensemble.ensemble_decoder`: their probabilities averaged); `shortlist` restricts both
to a per-batch vocabulary shortlist (`shortlist=`). The default beam size, α and extra
length, and beam search's stopping rule and length normalization (`stopping`,
`length_normalization`), are those of :class:`tfxformer.config.DecodingOptions`.
`greedy_decode` samples instead with `sampling_topk` (`sampling`: temperature, top-k,
top-p, stateless seeds); `score_targets` scores given targets by teacher forcing (`scoring`).
"""

from tfxformer.decoding.adapter import transformer_decoder
from tfxformer.decoding.beam_search import (
    BeamSearchOutput,
    beam_search,
    length_normalizer,
    length_penalty,
    sequence_beam_search,
    top_extensions,
)
from tfxformer.decoding.common import DecodeStart
from tfxformer.decoding.ensemble import ensemble_decoder
from tfxformer.decoding.greedy import DecodeOutput, greedy_decode, greedy_search
from tfxformer.decoding.sampling import Sampler, make_sampler
from tfxformer.decoding.scoring import ScoreOutput, score_targets
from tfxformer.decoding.shortlist import ShortlistTable, build_shortlist_table, shortlist_ids
from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "BeamSearchOutput", "DecodeOutput", "DecodeStart",
    "Sampler", "ScoreOutput", "ShortlistTable", "beam_search", "build_shortlist_table",
    "ensemble_decoder", "greedy_decode", "greedy_search", "length_normalizer",
    "length_penalty", "make_sampler", "score_targets", "sequence_beam_search",
    "shortlist_ids", "top_extensions", "transformer_decoder",
]
