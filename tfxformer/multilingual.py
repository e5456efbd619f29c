"""One model for several target languages: a target tag on each source (Johnson et al., 2017).

Google's multilingual NMT trains one model on the pairs of several directions, each source
sentence starting with a tag that names the language to translate into. Here the tag of
language ``de`` is the text ``<2de>``, a single piece of the vocabulary (a SentencePiece
user-defined symbol), followed by a space:

    <2de> A man is riding a bike.     ->  Ein Mann fährt Fahrrad.
    <2fr> A man is riding a bike.     ->  Un homme fait du vélo.

A multilingual data folder holds ``SPLIT.<src>`` (tagged sources) and ``SPLIT.mul`` (the
targets, ``mul`` being ISO 639-2's code for several languages), written from a folder of
parallel files by :func:`write_folder` (``scripts/prepare_multilingual.py``). Training with
``target_languages`` reserves the tags in the vocabulary; the export's signatures then take
a ``target_language`` input and add the tag in the graph
(:class:`tfxformer.serving.Translator`), the same string that training saw. The module
itself uses no TensorFlow (importing it still runs the package's `__init__`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

__all__ = ["MULTI_TARGET", "check_tagged", "parse_languages", "tag_pieces", "tag_source",
           "target_tag", "write_folder"]

MULTI_TARGET = "mul"  # the target-side file suffix of a multilingual data folder
_CODE = re.compile(r"[A-Za-z][A-Za-z_-]*")


def target_tag(language: str) -> str:
    """The tag that asks for `language`: ``<2de>`` for ``de``."""
    return f"<2{language}>"


def tag_source(language: str, text: str) -> str:
    """`text` as a multilingual model reads it when asked for `language`."""
    return f"{target_tag(language)} {text}"


def parse_languages(languages: str | Sequence[str] | None) -> tuple[str, ...]:
    """The target languages of a setting: ``"de,fr"``, ``["de", "fr"]`` or None (one target,
    no tags: ``()``). Raises ValueError naming a bad or repeated code."""
    if languages is None:
        return ()
    items = languages.split(",") if isinstance(languages, str) else list(languages)
    codes = tuple(str(item).strip() for item in items)
    for code in codes:
        if not _CODE.fullmatch(code) or code == MULTI_TARGET:
            raise ValueError(f"`target_languages` {languages!r}: {code!r} is not a language "
                             "code; expected codes such as 'de,fr' (letters, '_' or '-').")
    if len(codes) < 2 or len(set(codes)) != len(codes):
        raise ValueError(f"`target_languages` {languages!r} must name two or more different "
                         "languages, e.g. 'de,fr'.")
    return codes


def tag_pieces(spm_bytes: bytes, language: str) -> int:
    """The pieces of :func:`tag_source` (`language`, "") in the SentencePiece model
    `spm_bytes`: the tag and the word boundary before it. Raises ValueError if the
    vocabulary does not hold the tag as one piece (it was trained without the tag)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=spm_bytes)
    tag = target_tag(language)
    pieces = processor.encode(tag_source(language, ""), out_type=str)
    if tag not in pieces:
        raise ValueError(f"The vocabulary does not hold the target tag {tag!r} as one piece "
                         f"(it spells it {pieces!r}): it was not trained for a multilingual "
                         "model with this language (`target_languages`).")
    return len(pieces)


def check_tagged(sources: Iterable[str], languages: Sequence[str], where: str,
                 lines: int = 1000) -> None:
    """Raises ValueError if one of the first `lines` of `sources` does not start with the
    tag of one of `languages` and a space (:func:`tag_source`)."""
    tags = tuple(target_tag(language) + " " for language in languages)
    for number, line in enumerate(sources, 1):
        if number > lines:
            return
        if not line.startswith(tags):
            raise ValueError(
                f"Line {number} of {where} does not start with a target tag ("
                f"{', '.join(repr(t) for t in tags)}): {line[:60]!r}. A multilingual run "
                "(`target_languages`) trains on tagged sources; write them with "
                "scripts/prepare_multilingual.py.")


def write_folder(data: str, out: str, src: str, targets: Sequence[str],
                 splits: Sequence[str] = ("train", "val")) -> dict[str, int]:
    """Writes OUT/SPLIT.SRC (tagged) and OUT/SPLIT.mul from DATA/SPLIT.{SRC,TGT} for each
    target of `targets`, one target after the other; returns the lines of each split.

    Each file is written through a temporary name and renamed when complete.
    Raises FileNotFoundError for a missing file, ValueError for misaligned ones."""
    from tfxformer.data.sources import check_aligned, iter_lines  # TensorFlow, on use

    targets = parse_languages(targets)
    os.makedirs(out, exist_ok=True)
    counts = {}
    for split in splits:
        paths = {lang: os.path.join(data, f"{split}.{lang}") for lang in (src, *targets)}
        for path in paths.values():
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Missing {path}: every target needs {split}.{src} "
                                        f"and {split}.<target> in {data}.")
        for target in targets:
            check_aligned(paths[src], paths[target])
        source_out = os.path.join(out, f"{split}.{src}")
        target_out = os.path.join(out, f"{split}.{MULTI_TARGET}")
        with open(source_out + ".part", "w", encoding="utf-8") as sources, \
                open(target_out + ".part", "w", encoding="utf-8") as translations:
            lines = 0
            for target in targets:
                for source, translation in zip(iter_lines(paths[src]),
                                               iter_lines(paths[target]), strict=True):
                    sources.write(tag_source(target, source) + "\n")
                    translations.write(translation + "\n")
                    lines += 1
        os.replace(source_out + ".part", source_out)
        os.replace(target_out + ".part", target_out)
        counts[split] = lines
    return counts
