"""A parallel corpus: its splits of `(source, target)` sentence pairs, in one direction.

:mod:`tfxformer.data.sources` (text folders) and :mod:`tfxformer.data.tfds_source`
(tensorflow-datasets) both load into these.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

__all__ = ["REQUIRED_SPLITS", "Corpus", "ParallelSplit", "validate_langs"]

REQUIRED_SPLITS = ("train", "val")


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
        return sorted(set(self.splits) - set(REQUIRED_SPLITS))

    def training_text(self) -> Iterator[str]:
        """Yields every training line of both languages (source, target, source, ...).

        This is the text for the shared vocabulary (§5.1): pass it to
        `tfxformer.data.train_tokenizer`.
        """
        for source, target in self.train.pairs():
            yield source
            yield target


def validate_langs(src: str, tgt: str) -> None:
    for code in (src, tgt):
        if not isinstance(code, str) or not re.fullmatch(r"[A-Za-z][A-Za-z_-]*", code):
            raise ValueError(f"Language code {code!r} is not valid; expected e.g. 'en' or 'de'.")
    if src == tgt:
        raise ValueError(f"src and tgt are both {src!r}; they must be two different languages.")
