"""The vocabulary shortlist an export decodes over, built from the training pairs.

:func:`shortlist_from_data` counts which target pieces go with which source pieces in a
corpus (:func:`tfxformer.decoding.shortlist.build_shortlist_table`); :func:`shortlist_for`
is what `scripts/export.py --shortlist K,N` asks for: the table of a run's own training
data, or of the data named.
"""

from __future__ import annotations

import os

from tfxformer import checks
from tfxformer.decoding.shortlist import build_shortlist_table

__all__ = ["shortlist_for", "shortlist_from_data"]

_ENCODE_BATCH = 10_000  # lines SentencePiece encodes per call when building a shortlist


def _id_pairs(sp, pairs, max_pairs):
    """(source ids, target ids) of the text pairs, SentencePiece-encoded in batches."""
    def encoded(batch):
        sources, targets = sp.encode([s for s, _ in batch]), sp.encode([t for _, t in batch])
        return zip(sources, targets, strict=True)

    batch = []
    for i, pair in enumerate(pairs):
        if max_pairs is not None and i >= max_pairs:
            break
        batch.append(pair)
        if len(batch) == _ENCODE_BATCH:
            yield from encoded(batch)
            batch = []
    if batch:
        yield from encoded(batch)


def shortlist_from_data(spm_bytes, vocab_size, data, src="en", tgt="de",
                        per_source=None, frequent=None, max_pairs=None, tfds_data_dir=None,
                        progress=True):
    """The shortlist table of the training pairs of `data` (:func:`build_shortlist_table`).

    `data` is a text folder with train.SRC / train.TGT (the run config's `train.data`) or
    "wmt14" (TFDS, prepared in `tfds_data_dir`); the pairs are encoded with the run's
    SentencePiece model `spm_bytes` (no BOS/EOS). `max_pairs`: only the first pairs.
    The table's info records `data`, `src`, `tgt` and `max_pairs`.

    Raises:
        FileNotFoundError: `data` is no such folder (nor "wmt14").
        ValueError: bad sizes, or a vocabulary other than the model's.
    """
    import sentencepiece

    from tfxformer.data.sources import load_corpus

    checks.integer(max_pairs, "max_pairs", 1, allow_none=True)
    sp = sentencepiece.SentencePieceProcessor(model_proto=spm_bytes)
    if sp.get_piece_size() != vocab_size:
        raise ValueError(f"The SentencePiece model has {sp.get_piece_size()} pieces, the "
                         f"model's vocabulary {vocab_size}.")
    split = load_corpus(data, src, tgt, data_dir=tfds_data_dir, download=False).train
    total = split.num_examples if max_pairs is None or split.num_examples is None \
        else min(max_pairs, split.num_examples)
    sizes = {k: v for k, v in (("per_source", per_source), ("frequent", frequent))
             if v is not None}
    table = build_shortlist_table(_id_pairs(sp, split.pairs(), max_pairs), vocab_size,
                                  progress=progress, total=total, **sizes)
    table.info.update(data=os.fspath(data), src=src, tgt=tgt, max_pairs=max_pairs)
    return table


def shortlist_for(record, spm_bytes, model, shortlist, shortlist_data, max_pairs):
    """The export's ShortlistTable for `shortlist` (K, N) or None, from the training data
    of the :class:`RunRecord` unless `shortlist_data` names other data."""
    if shortlist is None:
        if shortlist_data is not None or max_pairs is not None:
            raise ValueError("`shortlist_data` / `shortlist_max_pairs` need a `shortlist` "
                             "(K, N).")
        return None
    try:
        per_source, frequent = (int(v) for v in shortlist)
    except (TypeError, ValueError):
        raise ValueError(f"`shortlist` must be (K, N): target tokens per source token and "
                         f"most frequent target tokens, got {shortlist!r}.") from None
    data = shortlist_data or record.training_data()
    if data is None:
        raise ValueError("The config names no training data (`train.data`); give the data "
                         "the shortlist table is built from (`shortlist_data`, "
                         "--shortlist-data: a folder with train.SRC/train.TGT, or wmt14).")
    try:
        return shortlist_from_data(spm_bytes, model.model_config.vocab_size, data,
                                   record.src, record.tgt, per_source, frequent, max_pairs,
                                   record.train.get("tfds_data_dir"))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err} (the shortlist's training data, from "
                                f"{'--shortlist-data' if shortlist_data else 'the config'}; "
                                "relative paths are relative to this directory: pass "
                                "--shortlist-data)") from None
