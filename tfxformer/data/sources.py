"""Parallel text sources (§5.1 training data): local text folders and TFDS translation data.

:func:`load_corpus` loads either: "wmt14" (TFDS `wmt14_translate/de-en`, the paper's EN-DE
data) or "tfds:NAME[/CONFIG]" (any TFDS translation dataset, e.g.
"tfds:wmt14_translate/fr-en"; :mod:`tfxformer.data.tfds_source`), or a folder of aligned
text files (e.g. multi30k/), read here.

A text folder holds one file per split and language, line i of `NAME.{src}` being the
translation of line i of `NAME.{tgt}`:

    train.{src} train.{tgt}       required
    val.{src}   val.{tgt}         required
    NAME.{src}  NAME.{tgt}        optional extra (test) splits, e.g. test_2016_flickr.en/.de

Any file may be gzipped (`train.en.gz`). Files are checked when the corpus is loaded:
every file must be UTF-8 (otherwise ValueError naming `file:line`), both files of a pair
must have the same number of lines (otherwise ValueError naming both files and counts).
A trailing "\\n" (and "\\r") is removed from each line, as `tf.data.TextLineDataset` does.

Every split yields `(src_string, tgt_string)` pairs, as a `tf.data.Dataset` of scalar
tf.string tensors (:meth:`ParallelSplit.dataset`) or as Python strings
(:meth:`ParallelSplit.pairs`). The direction is chosen by `src` / `tgt` language codes.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import zlib
from collections.abc import Iterator

import tensorflow as tf

from tfxformer.data.corpus import REQUIRED_SPLITS, Corpus, ParallelSplit, validate_langs
from tfxformer.data.tfds_source import (
    TFDS_EXAMPLES,
    WMT14_NAME,
    load_tfds,
    load_wmt14,
    tfds_languages,
    tfds_name,
)

__all__ = [
    "Corpus", "ParallelSplit", "check_aligned", "iter_lines", "load_corpus", "load_text_folder",
    "load_tfds", "load_wmt14", "tfds_languages", "tfds_name",
]

logger = logging.getLogger(__name__)


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def iter_lines(path: str) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file (`.gz` accepted), without "\\n" / "\\r".

    Raises:
        ValueError: a line is not valid UTF-8 (names `path:line`), or a `.gz` file is
            corrupt.
    """
    lineno = 0
    try:
        with _open_binary(path) as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    bad = raw[err.start:err.start + 4]
                    raise ValueError(
                        f"{path}:{lineno}: not valid UTF-8 (bytes {bad!r} at byte "
                        f"{err.start + 1} of the line). Text files must be UTF-8; convert "
                        "it, e.g. `iconv -f latin1 -t utf-8`."
                    ) from None
                yield line.rstrip("\n").rstrip("\r")
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{path}: cannot read gzip data after line {lineno}: {err}") from None


def _count_lines(path: str) -> int:
    """Counts the lines of `path`, checking that all are UTF-8 (see :func:`iter_lines`)."""
    return sum(1 for _ in iter_lines(path))


def check_aligned(src_path: str, tgt_path: str) -> int:
    """Returns the common line count of two aligned files.

    Raises:
        ValueError: the counts differ (both files and both counts are named), or a file
            is not UTF-8.
    """
    num_src, num_tgt = _count_lines(src_path), _count_lines(tgt_path)
    if num_src != num_tgt:
        raise ValueError(
            f"Misaligned parallel files: {src_path} has {num_src} lines but {tgt_path} has "
            f"{num_tgt} lines; line i of one must translate line i of the other."
        )
    return num_src


def _scan_folder(folder: str, langs: tuple[str, str]) -> dict[str, dict[str, str]]:
    """Maps split name -> {lang: path} for the files `NAME.{lang}[.gz]` in `folder`."""
    found: dict[str, dict[str, str]] = {}
    pattern = re.compile(r"(?P<name>.+?)\.(?P<lang>[^.]+)(\.gz)?")
    for file in sorted(os.listdir(folder)):
        match = pattern.fullmatch(file)
        path = os.path.join(folder, file)
        if not match or match["lang"] not in langs or not os.path.isfile(path):
            continue
        by_lang = found.setdefault(match["name"], {})
        if match["lang"] in by_lang:
            raise ValueError(
                f"Both {by_lang[match['lang']]} and {path} exist; keep only one of them."
            )
        by_lang[match["lang"]] = path
    return found


def _text_split(name: str, src: str, tgt: str, src_path: str, tgt_path: str) -> ParallelSplit:
    num = check_aligned(src_path, tgt_path)

    def make_dataset() -> tf.data.Dataset:
        sides = tuple(
            tf.data.TextLineDataset(p, compression_type="GZIP" if p.endswith(".gz") else "")
            for p in (src_path, tgt_path)
        )
        pairs = tf.data.Dataset.zip(sides)
        return pairs.apply(tf.data.experimental.assert_cardinality(num))

    def iter_pairs() -> Iterator[tuple[str, str]]:
        return zip(iter_lines(src_path), iter_lines(tgt_path), strict=True)

    origin = f"{src_path} + {tgt_path}"
    return ParallelSplit(name, src, tgt, num, origin, make_dataset, iter_pairs,
                         files=(src_path, tgt_path))


def load_text_folder(folder: str | os.PathLike, src: str = "en", tgt: str = "de") -> Corpus:
    """Loads and checks the aligned text files of `folder` (see the module docstring).

    Raises:
        FileNotFoundError: `folder` or a required file (train/val, both languages) is
            missing; the message names the expected path.
        ValueError: misaligned files, non-UTF-8 text, or bad language codes.
    """
    validate_langs(src, tgt)
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"Data folder {folder!r} does not exist; expected a folder with train.{src}, "
            f"train.{tgt}, val.{src}, val.{tgt} (optionally .gz)."
        )
    found = _scan_folder(folder, (src, tgt))
    for name in REQUIRED_SPLITS:
        for lang in (src, tgt):
            if lang not in found.get(name, {}):
                raise FileNotFoundError(
                    f"Missing {os.path.join(folder, f'{name}.{lang}')} (or .gz): a data folder "
                    f"needs train.{src}, train.{tgt}, val.{src}, val.{tgt}."
                )
    splits = {}
    for name in sorted(found, key=lambda n: (n not in REQUIRED_SPLITS, n)):
        paths = found[name]
        if len(paths) < 2:
            ((lang, path),) = paths.items()
            other = tgt if lang == src else src
            logger.warning("Ignoring %s: no %s.%s beside it", path, name, other)
            continue
        splits[name] = _text_split(name, src, tgt, paths[src], paths[tgt])
        logger.info("Data %s: %d pairs from %s", name, splits[name].num_examples,
                    splits[name].origin)
    return Corpus(src, tgt, splits, origin=folder)


def load_corpus(
    data: str | os.PathLike,
    src: str = "en",
    tgt: str = "de",
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    train_split: str | None = None,
    val_split: str | None = None,
) -> Corpus:
    """Loads `data`: a TFDS dataset ("wmt14" or "tfds:NAME[/CONFIG]", see
    :func:`tfds_name` and :func:`load_tfds`) or a text folder path.

    `data_dir`, `manual_dir`, `download`, `train_split` and `val_split` only apply to TFDS
    data (ignored, with a warning, for a folder).

    Raises:
        FileNotFoundError: `data` is neither a TFDS name nor an existing folder.
    """
    name = tfds_name(data)
    if name is not None:
        return load_tfds(name, src, tgt, data_dir=data_dir, manual_dir=manual_dir,
                         download=download, train_split=train_split, val_split=val_split)
    data = os.fspath(data)
    tfds_only = dict(data_dir=data_dir, manual_dir=manual_dir, train_split=train_split,
                     val_split=val_split)
    given = [setting for setting, value in tfds_only.items() if value is not None]
    if given:
        logger.warning("%s apply to TFDS data only; ignored for %s", "/".join(given), data)
    if not os.path.isdir(data):
        raise FileNotFoundError(
            f"data={data!r} is neither a TFDS dataset nor an existing folder; accepted: "
            f"'wmt14' (TFDS {WMT14_NAME}), 'tfds:NAME[/CONFIG]' (a TFDS translation "
            f"dataset, e.g. {TFDS_EXAMPLES}) or a folder with train.{src}, train.{tgt}, "
            f"val.{src}, val.{tgt} (optionally .gz)."
        )
    return load_text_folder(data, src, tgt)
