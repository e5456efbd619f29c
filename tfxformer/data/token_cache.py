"""Tokenize-once cache: the training pairs' token ids, saved in the run dir.

:func:`tfxformer.data.pipeline.train_dataset` tokenizes the corpus with SentencePiece on
every epoch, and the length check (`count_filtered`) tokenizes it once more at start-up.
The token cache tokenizes it once, with the same op and the same length filter
(:func:`pipeline.tokenize_and_classify`), in parallel over the cores (a tf.data map),
and saves the ids; the length check reads its counts (:class:`FilterStats`) from the
same pass, and training epochs gather ids instead of tokenizing.

The same batches as without the cache: `pipeline.train_dataset(..., token_cache=cache)`
shuffles the pair *indices* `range(N)` with the shuffle it gives the pairs (same buffer,
seed, reshuffle each epoch: tf.data's shuffle order depends on its seed, not on the
elements), gathers their ids (:meth:`TokenCache.pairs_at`, the filtered pairs dropped)
and batches them exactly as it does the tokenized pairs, so for a seed both give the
same batches in the same order (tests/test_token_cache.py).

Layout, in `run_dir/token_cache/<key>/`::

    part-00000.npz ...   pairs [i*S, (i+1)*S) of the corpus, S = `shard_pairs`
    cache.json           what the cache holds; written last: the commit point

A part holds, in corpus order, `src_lengths` and `tgt_lengths` (int32, 0 for a pair the
length filter removes) and `src_ids`, `tgt_ids` (the kept pairs' ids, concatenated,
without BOS/EOS; uint16 when the vocabulary has at most 65,536 ids, else int32), and its
filter counts. Training holds every id in memory (2 bytes a token with uint16).

Why numpy parts read into memory (and not `tf.data.Dataset.save` or TFRecords): an epoch
then shuffles 8-byte indices instead of tensors and gathers a batch of 1024 rows in one op,
with no per-element reading or decoding; of the three it read the fastest when compared,
and the bucketing after the gather is then most of the cost.

Crash safety: every file is written to a temporary name and renamed into place, and a
cache without its `cache.json` is never used for training. A build cut short keeps its
finished parts (each names its key and first pair), and the next build reuses them:
the build resumes at the first missing part.

Invalidation: `<key>` is a SHA-256 over everything the ids depend on: the vocabulary
(SHA-256 of the `spm.model` bytes), the corpus (language codes and, for each file of the
training split, its real path, size and modification time in ns), `max_length`, the line
byte limit, `shard_pairs` and the format version. Size and mtime, not a content hash:
the corpus check already reads every line at each start, and a content hash would read
the whole corpus once more; any write to a file changes its mtime. A file
replaced by another of the same size with its mtime kept (`cp -p`, `rsync -t`) is not
noticed: delete `token_cache/` then. When a new cache is committed, the other entries of
`token_cache/` (older keys, temporary files) are removed.

Resume: a checkpoint records the cache's `content_key` (a SHA-256 of its ids and lengths),
not its `key`. A corpus copied afresh before each start (from a bucket, by a job script)
has new mtimes, so the cache is rebuilt; the ids are the same, and so is the content key:
the run resumes its data pipeline where it stopped.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfxformer.data import pipeline
from tfxformer.data.pipeline import FilterStats
from tfxformer.data.tokenizer import Tokenizer

__all__ = [
    "build", "open_cache", "open_or_build",
]

logger = logging.getLogger(__name__)

CACHE_DIRNAME = "token_cache"
_RECORD_FILENAME = "cache.json"
_FORMAT_VERSION = 1
_DEFAULT_SHARD_PAIRS = 1_000_000
_BATCH = 1024  # pairs tokenized per call when building
_ARRAYS = ("src_lengths", "tgt_lengths", "src_ids", "tgt_ids")
_BAD_PART = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def _corpus_fingerprint(split) -> list[dict]:
    """Real path, size and mtime (ns) of each file of `split` (`ParallelSplit.files`)."""
    files = []
    for path in split.files:
        status = os.stat(path)
        files.append({"path": os.path.realpath(path), "size": status.st_size,
                      "mtime_ns": status.st_mtime_ns})
    return files


def cache_key(split, spm_bytes: bytes, *, max_length: int, max_line_bytes: int | None = None,
              shard_pairs: int = _DEFAULT_SHARD_PAIRS) -> tuple[str, dict]:
    """`(key, description)`: the cache's name and the inputs it is made of (module doc).

    Raises:
        ValueError: `split` names no files (its pairs cannot be fingerprinted).
    """
    if not split.files:
        raise ValueError(f"The split {split.origin} names no files, so a token cache of it "
                         "could not tell when it changes; train without `token_cache`.")
    description = {
        "format": _FORMAT_VERSION, "vocabulary_sha256": hashlib.sha256(spm_bytes).hexdigest(),
        "src": split.src, "tgt": split.tgt, "files": _corpus_fingerprint(split),
        "max_length": max_length,
        "max_line_bytes": pipeline.line_byte_limit(max_length, max_line_bytes),
        "shard_pairs": shard_pairs,
    }
    text = json.dumps(description, sort_keys=True).encode("utf-8")
    return hashlib.sha256(text).hexdigest()[:20], description


@dataclasses.dataclass(frozen=True)
class TokenCache:
    """A committed cache, its ids loaded: `src` and `tgt` are `(N, None)` RaggedTensors
    (uint16 or int32) of all N pairs in corpus order, empty rows for filtered pairs."""

    directory: str
    record: dict
    src: tf.RaggedTensor = dataclasses.field(repr=False)
    tgt: tf.RaggedTensor = dataclasses.field(repr=False)

    @property
    def key(self) -> str:
        return self.record["key"]

    @property
    def content_key(self) -> str:
        """What a checkpointed position in this cache's pairs depends on: the SHA-256 of
        its arrays, the same for any build of the same ids; the `key` for a cache written
        before the digest was recorded."""
        return self.record.get("ids_sha256", self.key)

    @property
    def num_pairs(self) -> int:
        return self.record["pairs"]

    @property
    def max_length(self) -> int:
        return self.record["description"]["max_length"]

    @property
    def stats(self) -> FilterStats:
        """What the length filter removed, counted when the cache was built."""
        counts = self.record["stats"]
        return FilterStats(counts["total"], counts["empty"], counts["too_long"],
                           self.max_length)

    def pairs_at(self, indices):
        """`(src_ids, tgt_ids)`, ragged: the ids of the pairs at `indices` ((n,) int64
        positions in the corpus) that the length filter kept, in order."""
        src_ids, tgt_ids = tf.gather(self.src, indices), tf.gather(self.tgt, indices)
        keep = src_ids.row_lengths() > 0
        return tf.ragged.boolean_mask(src_ids, keep), tf.ragged.boolean_mask(tgt_ids, keep)


def _write_atomically(path: str, write: Callable) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _part_name(index: int) -> str:
    return f"part-{index:05d}.npz"


def _ids_dtype(tokenizer: Tokenizer):
    return tf.uint16 if tokenizer.vocab_size <= 1 << 16 else tf.int32


def _tokenize_part(split, tokenizer: Tokenizer, start: int, count: int, description: dict):
    """The arrays and filter counts of pairs [start, start + count) of `split`."""
    max_length, max_bytes = description["max_length"], description["max_line_bytes"]
    dtype = _ids_dtype(tokenizer)

    def classify(src, tgt):
        src_ids, tgt_ids, empty, too_long = pipeline.tokenize_and_classify(
            tokenizer, src, tgt, max_length, max_bytes)
        keep = tf.logical_not(tf.logical_or(empty, too_long))
        arrays = []
        for ids in (src_ids, tgt_ids):
            arrays.append(tf.where(keep, tf.cast(ids.row_lengths(), tf.int32), 0))
        for ids in (src_ids, tgt_ids):
            arrays.append(tf.cast(tf.ragged.boolean_mask(ids, keep).flat_values, dtype))
        flags = tf.cast(tf.stack([tf.ones_like(empty), empty, too_long]), tf.int64)
        return (*arrays, tf.reduce_sum(flags, axis=1))

    pairs = split.dataset().skip(start).take(count).batch(_BATCH)
    batches = pairs.map(classify, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
    pieces, counts = [[] for _ in _ARRAYS], np.zeros(3, np.int64)
    for *arrays, batch_counts in batches.as_numpy_iterator():
        for piece, array in zip(pieces, arrays, strict=True):
            piece.append(array)
        counts += batch_counts
    dtypes = {"src_lengths": np.int32, "tgt_lengths": np.int32,
              "src_ids": dtype.as_numpy_dtype, "tgt_ids": dtype.as_numpy_dtype}
    arrays = {name: np.concatenate(piece) if piece else np.zeros(0, dtypes[name])
              for name, piece in zip(_ARRAYS, pieces, strict=True)}  # no pair: empty arrays
    return arrays, counts


def _write_part(path: str, split, tokenizer: Tokenizer, start: int, description: dict,
                key: str) -> dict:
    """Tokenizes the part of `split` that starts at pair `start` into `path`."""
    began = time.time()
    arrays, counts = _tokenize_part(split, tokenizer, start, description["shard_pairs"],
                                    description)
    arrays.update(counts=counts, key=np.array(key), start=np.int64(start))
    _write_atomically(path, lambda f: np.savez(f, **arrays))
    logger.info("Token cache: wrote %s (%d pairs, %d + %d tokens) in %.1f s", path,
                len(arrays["src_lengths"]), len(arrays["src_ids"]), len(arrays["tgt_ids"]),
                time.time() - began)
    return arrays


def _read_part(path: str, key: str, start: int, sides=("src", "tgt")) -> dict | None:
    """The arrays (of `sides`) and counts of a finished part of cache `key` that starts
    at pair `start`, or None when the file is missing, damaged or of another cache."""
    names = [f"{side}_{array}" for side in sides for array in ("lengths", "ids")]
    try:
        with np.load(path) as part:
            arrays = {name: part[name] for name in (*names, "counts", "key", "start")}
    except _BAD_PART:
        return None
    if str(arrays["key"]) != key or int(arrays["start"]) != start:
        return None
    for side in sides:
        if int(arrays[f"{side}_lengths"].sum()) != len(arrays[f"{side}_ids"]):
            return None
    if len(sides) == 2 and len(arrays["src_lengths"]) != len(arrays["tgt_lengths"]):
        return None
    return arrays


def _commit(root: str, directory: str, record: dict) -> None:
    """Writes `cache.json`, then removes what else is in `root` (older caches, builds
    given up, temporary files of killed writes)."""
    _write_atomically(os.path.join(directory, _RECORD_FILENAME),
                      lambda f: f.write(json.dumps(record, indent=2).encode("utf-8")))
    keep = {_RECORD_FILENAME, *(part["file"] for part in record["parts"])}
    stale = [os.path.join(root, e) for e in os.listdir(root) if e != record["key"]] + \
        [os.path.join(directory, e) for e in os.listdir(directory) if e not in keep]
    for path in stale:
        logger.info("Token cache: removing the stale %s", path)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def build(split, tokenizer: Tokenizer, run_dir: str, *, max_length: int,
          max_line_bytes: int | None = None, shard_pairs: int = _DEFAULT_SHARD_PAIRS,
          on_part: Callable[[str], None] | None = None) -> TokenCache:
    """Tokenizes `split` once into `run_dir/token_cache/<key>/` and returns the cache.

    Finished parts of an earlier build of the same key are reused. `on_part` is called
    with the path of each part written (for progress, and for tests to cut a build short).
    """
    key, description = cache_key(split, tokenizer.spm_bytes, max_length=max_length,
                                 max_line_bytes=max_line_bytes, shard_pairs=shard_pairs)
    root = os.path.join(run_dir, CACHE_DIRNAME)
    directory = os.path.join(root, key)
    os.makedirs(directory, exist_ok=True)
    began, parts, totals = time.time(), [], np.zeros(3, np.int64)
    digest = hashlib.sha256()
    total = split.num_examples
    logger.info("Token cache: tokenizing %s pairs of %s once into %s",
                "all" if total is None else f"{total:,}", split.origin, directory)
    for index in itertools.count():
        start = index * shard_pairs
        if total is not None and start >= total and index > 0:
            break
        path = os.path.join(directory, _part_name(index))
        arrays = _read_part(path, key, start) if os.path.exists(path) else None
        if arrays is not None:
            logger.info("Token cache: reusing %s (%d pairs) of an earlier build", path,
                        len(arrays["src_lengths"]))
        else:
            arrays = _write_part(path, split, tokenizer, start, description, key)
            if on_part is not None:
                on_part(path)
        pairs = len(arrays["src_lengths"])
        totals += arrays["counts"]
        for name in _ARRAYS:
            array = np.ascontiguousarray(arrays[name])
            digest.update(f"{name} {array.dtype.str} {array.size};".encode())
            digest.update(array.data)
        parts.append({"file": _part_name(index), "pairs": pairs,
                      "src_tokens": len(arrays["src_ids"]), "tgt_tokens": len(arrays["tgt_ids"])})
        if pairs < shard_pairs:
            break
    record = {"key": key, "pairs": sum(p["pairs"] for p in parts), "parts": parts,
              "ids_dtype": _ids_dtype(tokenizer).name, "ids_sha256": digest.hexdigest()[:20],
              "description": description,
              "stats": dict(zip(("total", "empty", "too_long"), map(int, totals), strict=True)),
              "build_seconds": round(time.time() - began, 1)}
    if total is not None and record["pairs"] != total:
        raise ValueError(f"Token cache: read {record['pairs']} pairs from {split.origin}, "
                         f"which has {total}; did the corpus change during the build?")
    _commit(root, directory, record)
    logger.info("Token cache: %d pairs in %d part(s), built in %.1f s", record["pairs"],
                len(parts), record["build_seconds"])
    cache = _load(directory, record)
    if cache is None:
        raise OSError(f"Token cache: {directory} cannot be read back right after it was "
                      "written; check the disk.")
    return cache


def _load_side(directory: str, record: dict, side: str) -> tf.RaggedTensor | None:
    """One side's ids of every part as one `(N, None)` RaggedTensor; None if a part is bad.

    Each part's ids become a tensor, then one `tf.concat`: the peak memory is this side's
    ids twice (`tf.constant` of a whole side would copy it twice more).
    """
    pieces, splits = [], np.zeros(record["pairs"] + 1, np.int64)
    pair, token = 0, 0
    for part in record["parts"]:
        path = os.path.join(directory, part["file"])
        read = _read_part(path, record["key"], pair, sides=(side,))
        if read is None or len(read[f"{side}_lengths"]) != part["pairs"] or \
                len(read[f"{side}_ids"]) != part[f"{side}_tokens"]:
            logger.warning("Token cache: %s is missing or damaged; the cache is rebuilt", path)
            return None
        pieces.append(tf.constant(read[f"{side}_ids"]))
        rows = splits[pair + 1:pair + 1 + part["pairs"]]
        np.cumsum(read[f"{side}_lengths"], dtype=np.int64, out=rows)
        rows += token
        pair, token = pair + part["pairs"], token + part[f"{side}_tokens"]
    ids = tf.concat(pieces, axis=0) if len(pieces) > 1 else pieces[0]
    return tf.RaggedTensor.from_row_splits(ids, tf.constant(splits), validate=False)


def _return_freed_memory() -> None:
    """Gives memory freed by the loading back to the OS (glibc keeps it otherwise)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _load(directory: str, record: dict) -> TokenCache | None:
    """The cache of a committed `record`, its parts read into memory; None if one is bad."""
    src = _load_side(directory, record, "src")
    tgt = _load_side(directory, record, "tgt") if src is not None else None
    _return_freed_memory()
    return None if tgt is None else TokenCache(directory, record, src, tgt)


def open_cache(split, tokenizer: Tokenizer, run_dir: str, *, max_length: int,
               max_line_bytes: int | None = None,
               shard_pairs: int = _DEFAULT_SHARD_PAIRS) -> TokenCache | None:
    """The committed cache of these inputs in `run_dir`, loaded; None if there is none
    (never built, cut short, made from other inputs, or a part is damaged)."""
    key, _ = cache_key(split, tokenizer.spm_bytes, max_length=max_length,
                       max_line_bytes=max_line_bytes, shard_pairs=shard_pairs)
    directory = os.path.join(run_dir, CACHE_DIRNAME, key)
    try:
        with open(os.path.join(directory, _RECORD_FILENAME), encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        logger.warning("Token cache: cannot read %s (%s); the cache is rebuilt", directory, error)
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        logger.warning("Token cache: %s does not describe cache %s; it is rebuilt", directory, key)
        return None
    cache = _load(directory, record)
    if cache is not None:
        logger.info("Token cache: using %s (%d pairs)", directory, cache.num_pairs)
    return cache


def open_or_build(split, tokenizer: Tokenizer, run_dir: str, *, max_length: int,
                  max_line_bytes: int | None = None,
                  shard_pairs: int = _DEFAULT_SHARD_PAIRS) -> TokenCache:
    """The cache of `split` in `run_dir`: opened if committed and whole, else built."""
    options = dict(max_length=max_length, max_line_bytes=max_line_bytes,
                   shard_pairs=shard_pairs)
    cache = open_cache(split, tokenizer, run_dir, **options)
    return cache if cache is not None else build(split, tokenizer, run_dir, **options)
