"""Parallel EN-DE text sources (§5.1 training data): local text folders and TFDS WMT14.

§5.1: "We trained on the standard WMT 2014 English-German dataset consisting of about 4.5
million sentence pairs." That is TFDS `wmt14_translate/de-en` (`data="wmt14"`); any
aligned text folder works too (e.g. a folder such as multi30k/).

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

import dataclasses
import glob
import gzip
import logging
import os
import re
import zlib
from collections.abc import Callable, Iterator

import tensorflow as tf

__all__ = [
    "Corpus", "ParallelSplit", "check_aligned", "iter_lines", "load_corpus", "load_text_folder",
    "load_wmt14",
]

logger = logging.getLogger(__name__)

_REQUIRED_SPLITS = ("train", "val")
_WMT14_NAME = "wmt14_translate/de-en"
_WMT14_SPLITS = {"train": "train", "val": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class ParallelSplit:
    """One split of a parallel corpus: `(source, target)` sentence pairs.

    Attributes:
        name: split name ("train", "val", "test_2016_flickr", ...).
        src, tgt: language codes of the source and target side.
        num_examples: number of pairs, or None when unknown.
        origin: where the pairs come from (file paths or TFDS split), for logs and errors.
        files: the files the pairs are read from (source then target file, or TFDS's
            record files); the token cache fingerprints them. Empty when unknown.
    """

    name: str
    src: str
    tgt: str
    num_examples: int | None
    origin: str
    _make_dataset: Callable[[], tf.data.Dataset] = dataclasses.field(repr=False)
    _iter_pairs: Callable[[], Iterator[tuple[str, str]]] = dataclasses.field(repr=False)
    files: tuple[str, ...] = ()

    def dataset(self) -> tf.data.Dataset:
        """`tf.data.Dataset` of `(src, tgt)` scalar tf.string pairs, in corpus order."""
        return self._make_dataset()

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Iterates `(src, tgt)` Python strings, in corpus order."""
        return self._iter_pairs()

    def lists(self) -> tuple[list[str], list[str]]:
        """Returns `(sources, targets)` as two Python lists (small splits only)."""
        sources, targets = [], []
        for source, target in self.pairs():
            sources.append(source)
            targets.append(target)
        return sources, targets


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The splits of a parallel corpus in one direction (`src` -> `tgt`)."""

    src: str
    tgt: str
    splits: dict[str, ParallelSplit]
    origin: str

    def __getitem__(self, name: str) -> ParallelSplit:
        if name not in self.splits:
            raise KeyError(f"No split {name!r} in {self.origin}; available: {sorted(self.splits)}")
        return self.splits[name]

    @property
    def train(self) -> ParallelSplit:
        return self["train"]

    @property
    def val(self) -> ParallelSplit:
        return self["val"]

    @property
    def test_names(self) -> list[str]:
        """Names of the splits other than train and val (sorted)."""
        return sorted(set(self.splits) - set(_REQUIRED_SPLITS))

    def training_text(self) -> Iterator[str]:
        """Yields every training line of both languages (source, target, source, ...).

        This is the text for the shared vocabulary (§5.1): pass it to
        `tfxformer.data.train_tokenizer`.
        """
        for source, target in self.train.pairs():
            yield source
            yield target


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


def _validate_langs(src: str, tgt: str) -> None:
    for code in (src, tgt):
        if not isinstance(code, str) or not re.fullmatch(r"[A-Za-z][A-Za-z_-]*", code):
            raise ValueError(f"Language code {code!r} is not valid; expected e.g. 'en' or 'de'.")
    if src == tgt:
        raise ValueError(f"src and tgt are both {src!r}; they must be two different languages.")


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
    _validate_langs(src, tgt)
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"Data folder {folder!r} does not exist; expected a folder with train.{src}, "
            f"train.{tgt}, val.{src}, val.{tgt} (optionally .gz)."
        )
    found = _scan_folder(folder, (src, tgt))
    for name in _REQUIRED_SPLITS:
        for lang in (src, tgt):
            if lang not in found.get(name, {}):
                raise FileNotFoundError(
                    f"Missing {os.path.join(folder, f'{name}.{lang}')} (or .gz): a data folder "
                    f"needs train.{src}, train.{tgt}, val.{src}, val.{tgt}."
                )
    splits = {}
    for name in sorted(found, key=lambda n: (n not in _REQUIRED_SPLITS, n)):
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


def _wmt14_unavailable(builder, src: str, tgt: str, reason: str) -> RuntimeError:
    return RuntimeError(
        f"TFDS dataset {_WMT14_NAME} is not available in {builder.data_dir} ({reason}). "
        "Either prepare it where there is network access and point at that TFDS data "
        "directory (data_dir=..., --tfds-data-dir), put manually downloaded source files in "
        "manual_dir (--tfds-manual-dir), or train from local text files instead: "
        f"data='/path/to/folder' (--data /path/to/folder) holding train.{src}, train.{tgt}, "
        f"val.{src}, val.{tgt} (optionally .gz), e.g. --data ../shared/data/multi30k."
    )


def _prepare_wmt14(builder, src, tgt, manual_dir: str | None, download: bool) -> None:
    import tensorflow_datasets as tfds

    if builder.is_prepared():
        return
    if not download:
        raise _wmt14_unavailable(builder, src, tgt, "not prepared and download=False")
    logger.info("Preparing %s in %s (downloads several GB on first use)", _WMT14_NAME,
                builder.data_dir)
    config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    try:
        builder.download_and_prepare(download_config=config)
    except Exception as err:  # Network, DNS, manual-file and disk errors alike.
        raise _wmt14_unavailable(
            builder, src, tgt, f"download_and_prepare failed: {type(err).__name__}: {err}"
        ) from err


def _tfds_split(builder, name: str, tfds_split: str, src: str, tgt: str) -> ParallelSplit:
    info = builder.info.splits.get(tfds_split) if builder.info.splits else None
    num = info.num_examples if info is not None else None

    def make_dataset() -> tf.data.Dataset:
        examples = builder.as_dataset(split=tfds_split)
        return examples.map(lambda ex: (ex[src], ex[tgt]), num_parallel_calls=tf.data.AUTOTUNE)

    def iter_pairs() -> Iterator[tuple[str, str]]:
        for source, target in make_dataset().as_numpy_iterator():
            yield source.decode("utf-8"), target.decode("utf-8")

    origin = f"tfds {_WMT14_NAME} split {tfds_split}"
    # The prepared split's record files, e.g. wmt14_translate-train.tfrecord-00000-of-00016.
    files = tuple(sorted(glob.glob(os.path.join(builder.data_dir, f"*-{tfds_split}.tfrecord*"))))
    return ParallelSplit(name, src, tgt, num, origin, make_dataset, iter_pairs, files=files)


def load_wmt14(
    src: str = "en",
    tgt: str = "de",
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
) -> Corpus:
    """Loads TFDS `wmt14_translate/de-en` (§5.1): train, val (newstest2013), test (2014).

    Args:
        src, tgt: "en" and "de" in either order (the TFDS pairs serve both directions).
        data_dir: TFDS data directory (default: TFDS's, i.e. `$TFDS_DATA_DIR` or
            ~/tensorflow_datasets).
        manual_dir: TFDS manual download directory, passed in the `DownloadConfig`.
        download: prepare the dataset (download, several GB) if it is not prepared yet.

    Raises:
        RuntimeError: not prepared and `download=False`, or download/preparation failed
            (e.g. offline); the message says how to use local text files instead.
    """
    import tensorflow_datasets as tfds

    _validate_langs(src, tgt)
    if {src, tgt} != {"de", "en"}:
        raise ValueError(f"{_WMT14_NAME} has languages 'de' and 'en'; got src={src!r}, "
                         f"tgt={tgt!r}.")
    builder = tfds.builder(_WMT14_NAME, data_dir=data_dir)
    _prepare_wmt14(builder, src, tgt, manual_dir, download)
    splits = {ours: _tfds_split(builder, ours, theirs, src, tgt)
              for ours, theirs in _WMT14_SPLITS.items()}
    return Corpus(src, tgt, splits, origin=f"tfds {_WMT14_NAME} in {builder.data_dir}")


def load_corpus(
    data: str | os.PathLike,
    src: str = "en",
    tgt: str = "de",
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
) -> Corpus:
    """Loads `data`: "wmt14" (TFDS, see :func:`load_wmt14`) or a text folder path.

    `data_dir`, `manual_dir` and `download` only apply to "wmt14" (ignored, with a warning,
    for a folder).

    Raises:
        FileNotFoundError: `data` is neither "wmt14" nor an existing folder.
    """
    data = os.fspath(data)
    if data.lower() in ("wmt14", _WMT14_NAME):
        return load_wmt14(src, tgt, data_dir=data_dir, manual_dir=manual_dir, download=download)
    if data_dir is not None or manual_dir is not None:
        logger.warning("data_dir/manual_dir apply to data='wmt14' only; ignored for %s", data)
    if not os.path.isdir(data):
        raise FileNotFoundError(
            f"data={data!r} is neither 'wmt14' nor an existing folder; accepted: 'wmt14' "
            f"(TFDS {_WMT14_NAME}) or a folder with train.{src}, train.{tgt}, val.{src}, "
            f"val.{tgt} (optionally .gz)."
        )
    return load_text_folder(data, src, tgt)
