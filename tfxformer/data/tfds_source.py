"""Parallel text from tensorflow-datasets (§5.1 training data): any TFDS translation dataset.

§5.1: "We trained on the standard WMT 2014 English-German dataset consisting of about 4.5
million sentence pairs" (`wmt14_translate/de-en`, `data="wmt14"`) and "For English-French,
we used the significantly larger WMT 2014 English-French dataset consisting of 36M
sentences" (`data="tfds:wmt14_translate/fr-en"`). Any TFDS dataset whose features are a
`tfds.features.Translation` is named the same way, `tfds:NAME[/CONFIG][:VERSION]` (e.g.
`tfds:ted_hrlr_translate/pt_to_en`, TensorFlow's Transformer tutorial data): its languages
are checked against `src` / `tgt`, and its validation split is found by name
(:func:`load_tfds`).
"""

from __future__ import annotations

import difflib
import glob
import logging
import os
import re
from collections.abc import Iterator

import tensorflow as tf

from tfxformer.data.corpus import Corpus, ParallelSplit, validate_langs

__all__ = ["TFDS_PREFIX", "load_tfds", "load_wmt14", "tfds_languages", "tfds_name"]

logger = logging.getLogger(__name__)

WMT14_NAME = "wmt14_translate/de-en"
TFDS_PREFIX = "tfds:"
TFDS_EXAMPLES = "tfds:wmt14_translate/fr-en, tfds:ted_hrlr_translate/pt_to_en"
# TFDS split names that hold validation pairs, in order of preference; else the one split
# whose name starts with one of the prefixes (e.g. "dev2010").
_VAL_SPLIT_NAMES = ("validation", "valid", "val", "dev", "development")
_VAL_SPLIT_PREFIXES = ("valid", "dev")


def tfds_name(data: str | os.PathLike) -> str | None:
    """The TFDS dataset that `data` names, or None when `data` is a folder path.

    "wmt14" (and "wmt14_translate/de-en") is short for TFDS `wmt14_translate/de-en`;
    "tfds:NAME[/CONFIG][:VERSION]" names any TFDS translation dataset, e.g.
    "tfds:wmt14_translate/fr-en" or "tfds:ted_hrlr_translate/pt_to_en".
    """
    data = os.fspath(data)
    if data.lower() in ("wmt14", WMT14_NAME):
        return WMT14_NAME
    if not data.startswith(TFDS_PREFIX):
        return None
    name = data[len(TFDS_PREFIX):].strip()
    if not name:
        raise ValueError(f"`data` {data!r} names no TFDS dataset; expected "
                         f"tfds:NAME[/CONFIG], e.g. {TFDS_EXAMPLES}.")
    return name


def _listing(items) -> str:
    """'a' and 'b'; 'a', 'b' and 'c'."""
    items = [repr(item) for item in items]
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"


def _config_names(base: str) -> list[str]:
    import tensorflow_datasets as tfds

    try:
        return [config.name for config in tfds.builder_cls(base).BUILDER_CONFIGS]
    except Exception:  # no such builder, or one without configs
        return []


def _tfds_builder(name: str, data_dir: str | None):
    """`tfds.builder(name)`; ValueError naming close dataset names or the configs."""
    import tensorflow_datasets as tfds

    base = name.split(":")[0].split("/")[0]
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError:
        known = tfds.list_builders(with_community_datasets=False)
        close = difflib.get_close_matches(base, known, n=5, cutoff=0.6)
        raise ValueError(
            f"No TFDS dataset {base!r} (`data` 'tfds:{name}'); close names: {close}. "
            f"Accepted: tfds:NAME[/CONFIG] of a TFDS translation dataset, e.g. "
            f"{TFDS_EXAMPLES}.") from None
    except ValueError as err:  # an unknown config or version
        first_line = str(err).strip().splitlines()[0]
        raise ValueError(f"TFDS `data` 'tfds:{name}': {first_line} Configs of {base}: "
                         f"{_config_names(base)}.") from None


def tfds_languages(builder) -> tuple[str, ...]:
    """The language codes of a TFDS translation builder (its `Translation` feature),
    sorted.

    Raises:
        ValueError: the builder's features are not a `tfds.features.Translation` (e.g.
            ted_multi_translate's variable languages, or no translation at all).
    """
    import tensorflow_datasets as tfds

    features = builder.info.features
    if isinstance(features, tfds.features.Translation):
        return tuple(sorted(features.languages))
    keys = sorted(features.keys()) if hasattr(features, "keys") else []
    raise ValueError(
        f"TFDS dataset {builder.info.full_name} is not a translation dataset of one language "
        f"pair: its features are a {type(features).__name__} {keys}. Accepted: datasets "
        f"whose features are a tfds.features.Translation, e.g. {TFDS_EXAMPLES}.")


def _check_tfds_languages(name: str, builder, src: str, tgt: str) -> None:
    languages = tfds_languages(builder)
    if src in languages and tgt in languages:
        return
    configs = _config_names(name.split(":")[0].split("/")[0])
    others = f" Configs of this dataset: {configs}." if len(configs) > 1 else ""
    raise ValueError(f"{name} has languages {_listing(languages)}; got `src` {src!r}, "
                     f"`tgt` {tgt!r}: give two of them.{others}")


def _tfds_unavailable(name: str, builder, src: str, tgt: str, reason: str) -> RuntimeError:
    return RuntimeError(
        f"TFDS dataset {name} is not available in {builder.data_dir} ({reason}). "
        "Either prepare it where there is network access and point at that TFDS data "
        "directory (data_dir=..., --tfds-data-dir), put manually downloaded source files in "
        "manual_dir (--tfds-manual-dir), or train from local text files instead: "
        f"data='/path/to/folder' (--data /path/to/folder) holding train.{src}, train.{tgt}, "
        f"val.{src}, val.{tgt} (optionally .gz), e.g. --data ../shared/data/multi30k."
    )


def _prepare_tfds(name: str, builder, src, tgt, manual_dir: str | None,
                  download: bool) -> None:
    import tensorflow_datasets as tfds

    if builder.is_prepared():
        return
    if not download:
        raise _tfds_unavailable(name, builder, src, tgt, "not prepared and download=False")
    logger.info("Preparing %s in %s (downloads the source files on first use: several GB "
                "for WMT)", name, builder.data_dir)
    config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    try:
        builder.download_and_prepare(download_config=config)
    except Exception as err:  # Network, DNS, manual-file and disk errors alike.
        raise _tfds_unavailable(
            name, builder, src, tgt, f"download_and_prepare failed: {type(err).__name__}: {err}"
        ) from err


def _find_val_split(name: str, available: list[str]) -> str:
    """The split of `available` named like a validation split (_VAL_SPLIT_NAMES, then a
    single name starting with one of _VAL_SPLIT_PREFIXES)."""
    for candidate in _VAL_SPLIT_NAMES:
        if candidate in available:
            return candidate
    prefixed = [split for split in available if split.startswith(_VAL_SPLIT_PREFIXES)]
    if len(prefixed) == 1:
        return prefixed[0]
    found = f"several: {prefixed}" if prefixed else "none"
    raise ValueError(
        f"TFDS {name} has splits {available}, and which one is for validation is not clear "
        f"(named {_listing(_VAL_SPLIT_NAMES)} or starting with {_listing(_VAL_SPLIT_PREFIXES)}: "
        f"{found}). Name it with `tfds_val_split`, e.g. 'test', or hold out part of the "
        "training split: `tfds_val_split` 'train[:2000]' with `tfds_train_split` "
        "'train[2000:]'.")


def _tfds_splits(name: str, builder, train_split: str | None,
                 val_split: str | None) -> dict[str, str]:
    """Our split names -> TFDS split expressions: "train", "val", then every other TFDS
    split under its own name (e.g. "test")."""
    available = list(builder.info.splits.keys()) if builder.info.splits else []
    train = train_split or "train"
    if not available:  # metadata without split names: only a mocked TFDS gets here
        logger.warning("TFDS %s names no splits; reading %r for training and %r for "
                       "validation", name, train, val_split or "validation")
        return {"train": train, "val": val_split or "validation"}
    val = val_split or _find_val_split(name, available)
    for setting, expression in (("tfds_train_split", train), ("tfds_val_split", val)):
        try:
            builder.info.splits[expression]
        except (KeyError, ValueError, AssertionError, TypeError) as err:
            raise ValueError(f"TFDS {name} has no split {expression!r} (`{setting}`): "
                             f"{err}. Its splits: {available}; a TFDS split expression "
                             "such as 'train[:2000]' or 'validation+test' is accepted.") \
                from None
    used = set(_split_bases(train) + _split_bases(val))
    extra = [split for split in available if split not in used | {"train", "val"}]
    return {"train": train, "val": val, **{split: split for split in extra}}


def _split_bases(expression: str) -> list[str]:
    """The TFDS split names an expression reads: 'validation+test[:10]' -> both."""
    return [part.split("[")[0].strip() for part in expression.split("+")]


def _tfds_split(builder, dataset: str, name: str, tfds_split: str, src: str,
                tgt: str) -> ParallelSplit:
    try:
        num = builder.info.splits[tfds_split].num_examples if builder.info.splits else None
    except (KeyError, ValueError, AssertionError, TypeError):
        num = None

    def make_dataset() -> tf.data.Dataset:
        examples = builder.as_dataset(split=tfds_split)
        return examples.map(lambda ex: (ex[src], ex[tgt]), num_parallel_calls=tf.data.AUTOTUNE)

    def iter_pairs() -> Iterator[tuple[str, str]]:
        for source, target in make_dataset().as_numpy_iterator():
            yield source.decode("utf-8"), target.decode("utf-8")

    origin = f"tfds {dataset} split {tfds_split}"
    # A whole split's record files, e.g. wmt14_translate-train.tfrecord-00000-of-00016, for
    # the token cache's fingerprint; none for a slice or a sum of splits ("train[:2000]"),
    # whose files do not tell which pairs it holds.
    files = () if not re.fullmatch(r"[\w-]+", tfds_split) else tuple(sorted(glob.glob(
        os.path.join(glob.escape(builder.data_dir), f"*-{tfds_split}.tfrecord*"))))
    return ParallelSplit(name, src, tgt, num, origin, make_dataset, iter_pairs, files=files)


def load_tfds(
    name: str,
    src: str,
    tgt: str,
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    train_split: str | None = None,
    val_split: str | None = None,
) -> Corpus:
    """Loads the TFDS translation dataset `name` ("NAME[/CONFIG][:VERSION]").

    Splits: "train" (TFDS `train_split`, default "train"), "val" (`val_split`, default the
    split named "validation", "valid", "val", "dev" or "development", else the one split
    whose name starts with "valid" or "dev"), and every other TFDS split under its own name
    ("test"). Split expressions are TFDS's: "train[:2000]", "validation+test".

    Args:
        name: e.g. "wmt14_translate/fr-en" (WMT14 EN-FR, the paper's second task),
            "ted_hrlr_translate/pt_to_en" (TensorFlow's text tutorial), "wmt19_translate/de-en".
        src, tgt: two of the dataset's languages, in either order.
        data_dir: TFDS data directory (default: TFDS's, i.e. `$TFDS_DATA_DIR` or
            ~/tensorflow_datasets).
        manual_dir: TFDS manual download directory, passed in the `DownloadConfig`.
        download: prepare the dataset (download and convert) if it is not prepared yet.
        train_split, val_split: TFDS split expressions of the training and validation data.

    Raises:
        ValueError: no such dataset or config (close names, or the configs, are named), not
            a translation dataset, `src`/`tgt` not among its languages (they are named), or
            no such split (the splits are named).
        RuntimeError: not prepared and `download=False`, or download/preparation failed
            (e.g. offline); the message says how to use local text files instead.
    """
    validate_langs(src, tgt)
    builder = _tfds_builder(name, data_dir)
    _check_tfds_languages(name, builder, src, tgt)
    _prepare_tfds(name, builder, src, tgt, manual_dir, download)
    splits = {ours: _tfds_split(builder, name, ours, theirs, src, tgt)
              for ours, theirs in _tfds_splits(name, builder, train_split, val_split).items()}
    for split in splits.values():
        logger.info("Data %s: %s pairs from %s", split.name,
                    "?" if split.num_examples is None else split.num_examples, split.origin)
    return Corpus(src, tgt, splits, origin=f"tfds {name} in {builder.data_dir}")


def load_wmt14(
    src: str = "en",
    tgt: str = "de",
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
) -> Corpus:
    """Loads TFDS `wmt14_translate/de-en` (§5.1): train, val (newstest2013), test (2014).

    :func:`load_tfds` with the paper's EN-DE data; `src`, `tgt` are "en" and "de" in either
    order. Raises as :func:`load_tfds` does.
    """
    return load_tfds(WMT14_NAME, src, tgt, data_dir=data_dir, manual_dir=manual_dir,
                     download=download)
