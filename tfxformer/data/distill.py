"""Training data made by teachers: sequence-level distillation and data diversification.

Kim & Rush (2016), "Sequence-Level Knowledge Distillation", §3: the student trains on the
teacher's beam-search translations of the training sources instead of the references
(+1.7 BLEU for the same student with beam search). Nguyen et al. (2020), "Data
Diversification": several models of the student's size translate the training set in both
directions, forward models the sources and backward models the targets, and the student
trains on the union of their pairs with the original ones.

:func:`distill_folder` writes such a text folder (what `scripts/train_wmt.py --data` reads,
:mod:`tfxformer.data.sources`) from another one. Each :class:`Teacher` is handed in with a
function that loads its translate function (`list[str] -> list[str]`), so this module knows
no model; `scripts/distill.py` loads SavedModels and run dirs with
:func:`tfxformer.serving.load_translate_fn`.

    OUT/train.SRC, OUT/train.TGT   the pairs: for each chunk n, the original pairs (if kept),
                                   then each teacher's chunk n, in the order given
    OUT/val.*, OUT/<test>.*        copied unchanged (validation and tests are never distilled)
    OUT/distill.json               the record: data, teachers, settings, counts
    OUT/.chunks/<key>/<n>.{src,tgt}  a teacher's pairs, `chunk_lines` per chunk

A forward teacher (SRC -> TGT) gives the pairs (source, teacher(source)); a reverse teacher
(TGT -> SRC) gives (teacher(target), target). Chunk files are written under a temporary
name and renamed when complete; a rerun keeps every complete chunk and translates the rest,
so a killed run loses at most the chunk it was translating. A teacher's key holds a hash
of its name, its settings, the input file (path and size) and `chunk_lines`: other
settings write other chunks, never mixed with old ones. Chunk-by-chunk interleaving keeps
the sources mixed for a shuffle buffer smaller than the corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator

from tfxformer import checks
from tfxformer.data.sources import iter_lines, load_text_folder

__all__ = ["RECORD_FILENAME", "Teacher", "check_direction", "distill_folder"]

RECORD_FILENAME = "distill.json"
CHUNKS = ".chunks"
TranslateFunction = Callable[[list[str]], list[str]]


@dataclasses.dataclass(frozen=True)
class Teacher:
    """One teacher: the model that translates one side of the training split.

    Attributes:
        name: the model's path or name (the record and the chunk folder's name).
        load: returns its translate function, `list[str] -> list[str]` (one output per
            line, in order); called once, only if a chunk is left to translate.
        reverse: False for a forward teacher (SRC -> TGT, translates the sources); True for
            a reverse one (TGT -> SRC, translates the targets back).
        settings: what else decides its output (resolved model path, checkpoint, beam,
            alpha, ...): recorded, and hashed into its chunk folder's name.
    """

    name: str
    load: Callable[[], TranslateFunction] = dataclasses.field(repr=False)
    reverse: bool = False
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def direction(self) -> str:
        return "reverse" if self.reverse else "forward"


def check_direction(teacher: str, model_src: str, model_tgt: str,
                    target_languages: tuple[str, ...], src: str, tgt: str,
                    reverse: bool) -> str | None:
    """Checks that a model translating `model_src` -> `model_tgt` (a multilingual model:
    into each of `target_languages`) fits a forward (`src` -> `tgt`) or reverse (`tgt` ->
    `src`) teacher. Returns the `target_language` to ask a multilingual model for, else None.

    Raises:
        ValueError: naming the teacher, its direction and the one needed.
    """
    want_src, want_tgt = (tgt, src) if reverse else (src, tgt)
    targets = target_languages or (model_tgt,)
    if model_src == want_src and want_tgt in targets:
        return want_tgt if target_languages else None
    role = "a reverse teacher translates the targets back" if reverse else \
        "a forward teacher translates the sources"
    into = ", ".join(targets)
    raise ValueError(f"Teacher {teacher!r} translates {model_src} -> {into} (its config.json); "
                     f"{role}, so for data {src} -> {tgt} it must translate {want_src} -> "
                     f"{want_tgt}.")


def distill_folder(data, out, teachers, src: str = "en", tgt: str = "de",
                   keep_original: bool = False, chunk_lines: int = 2000,
                   limit: int | None = None, progress: bool = True) -> dict:
    """Writes the text folder `out` from the text folder `data` and `teachers` (see the
    module docstring); rerunning the same call resumes. Returns the record it writes to
    `out/distill.json`.

    Args:
        data, out: the text folders read and written (`out` is created; not `data`).
        teachers: a sequence of :class:`Teacher`, at least one, no two alike.
        src, tgt: the language codes (file suffixes) of `data`.
        keep_original: also write the original training pairs.
        chunk_lines: training pairs per chunk (a teacher's unit of work and of resumption).
        limit: use only the first `limit` training pairs (None: all).
        progress: show a tqdm progress bar.

    Raises:
        FileNotFoundError, ValueError: `data` is no text folder (:func:`load_text_folder`),
            bad arguments, a teacher returning the wrong number of lines.
    """
    chunk_lines = checks.integer(chunk_lines, "chunk_lines", 1)
    limit = checks.integer(limit, "limit", 1, allow_none=True)
    teachers = list(teachers)
    if not teachers:
        raise ValueError("No teacher given: distillation needs at least one forward or reverse "
                         "teacher.")
    corpus = load_text_folder(data, src, tgt)
    out = os.fspath(out)
    if os.path.isdir(out) and os.path.samefile(out, data):
        raise ValueError(f"`out` {out!r} is the data folder itself; write to another folder.")
    train = corpus.train
    total = min(train.num_examples, limit or train.num_examples)
    folders = _chunk_folders(out, teachers, train.files, chunk_lines)
    stats = _translate_all(teachers, folders, train, total, chunk_lines, progress)
    empty = _write_train(out, src, tgt, train, total, chunk_lines, teachers, folders,
                         keep_original)
    copied = _copy_other_splits(corpus, out)
    record = {
        "data": os.path.abspath(os.fspath(data)), "src": src, "tgt": tgt,
        "limit": limit, "chunk_lines": chunk_lines, "keep_original": keep_original,
        "original_pairs": total if keep_original else 0,
        "train_pairs": total * (len(teachers) + keep_original),
        "teachers": [dict(name=t.name, direction=t.direction, key=os.path.basename(folder),
                          translates=os.path.basename(train.files[int(t.reverse)]),
                          settings=t.settings, pairs=total, empty_translations=e, **s)
                     for t, folder, s, e in zip(teachers, folders, stats, empty, strict=True)],
        "copied": copied,
    }
    _write_atomic(os.path.join(out, RECORD_FILENAME),
                  json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _chunk_folders(out, teachers, files, chunk_lines) -> list[str]:
    """OUT/.chunks/<key> of each teacher, key = direction, name and a hash of what decides
    its output; ValueError for two teachers alike."""
    folders = []
    for teacher in teachers:
        source = files[int(teacher.reverse)]
        identity = dict(name=teacher.name, direction=teacher.direction, settings=teacher.settings,
                        input=os.path.abspath(source), input_bytes=os.path.getsize(source),
                        chunk_lines=chunk_lines)
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(
            os.path.normpath(teacher.name)))[:40] or "model"
        folder = os.path.join(out, CHUNKS, f"{teacher.direction}-{slug}-{digest.hexdigest()[:10]}")
        if folder in folders:
            raise ValueError(f"Teacher {teacher.name!r} is given twice as a {teacher.direction} "
                             "teacher with the same settings; give each teacher once.")
        folders.append(folder)
    return folders


def _chunks(split, total: int, chunk_lines: int) -> Iterator[list[tuple[str, str]]]:
    """The first `total` pairs of `split`, `chunk_lines` at a time."""
    pairs = itertools.islice(split.pairs(), total)
    while chunk := list(itertools.islice(pairs, chunk_lines)):
        yield chunk


def _translate_all(teachers, folders, train, total, chunk_lines, progress) -> list[dict]:
    """Translates every chunk not done yet; per teacher, the lines and seconds of this
    call's translation. The bar starts at the lines done before, so its rate is this run's."""
    from tqdm import tqdm

    sizes = [min(chunk_lines, total - start) for start in range(0, total, chunk_lines)]
    done = [[all(_count_lines(p) == size for p in _chunk_paths(folder, n))
             for n, size in enumerate(sizes)] for folder in folders]
    initial = sum(size for flags in done for size, flag in zip(sizes, flags, strict=True)
                  if flag)
    stats = []
    with tqdm(total=total * len(teachers), initial=initial, unit=" sent", desc="distilling",
              smoothing=0.1, dynamic_ncols=True, disable=not progress) as bar:
        for teacher, folder, flags in zip(teachers, folders, done, strict=True):
            bar.set_postfix_str(os.path.basename(folder), refresh=False)
            stats.append(_translate_teacher(teacher, folder, _chunks(train, total, chunk_lines),
                                            flags, bar))
    return stats


def _translate_teacher(teacher, folder, chunks, done, bar) -> dict:
    """Translates the chunks of `chunks` not `done` (one flag per chunk) into `folder`."""
    os.makedirs(folder, exist_ok=True)
    _write_atomic(os.path.join(folder, "teacher.json"), json.dumps(
        dict(name=teacher.name, direction=teacher.direction, settings=teacher.settings),
        indent=2, sort_keys=True, default=str) + "\n")
    translate, lines, seconds = None, 0, 0.0
    for n, (pairs, finished) in enumerate(zip(chunks, done, strict=True)):
        if finished:  # by an earlier run
            continue
        if translate is None:
            translate = teacher.load()
        given = [target if teacher.reverse else source for source, target in pairs]
        start = time.perf_counter()
        outputs = list(translate(given))
        seconds += time.perf_counter() - start
        if len(outputs) != len(given):
            raise ValueError(f"Teacher {teacher.name!r} returned {len(outputs)} translations "
                             f"for {len(given)} lines (chunk {n}).")
        outputs = [_one_line(text) for text in outputs]
        sides = (outputs, given) if teacher.reverse else (given, outputs)  # (SRC, TGT)
        for path, side in zip(_chunk_paths(folder, n)[::-1], sides[::-1], strict=True):
            _write_atomic(path, "".join(line + "\n" for line in side))  # .tgt, then .src
        lines += len(pairs)
        bar.update(len(pairs))
    return dict(translated_now=lines, seconds_now=round(seconds, 2))


def _write_train(out, src, tgt, train, total, chunk_lines, teachers, folders,
                 keep_original) -> list[int]:
    """Writes OUT/train.SRC and OUT/train.TGT chunk by chunk (originals first); returns each
    teacher's count of empty translations."""
    paths = [os.path.join(out, f"train.{lang}") for lang in (src, tgt)]
    empty = [0] * len(folders)
    with open(paths[0] + ".part", "w", encoding="utf-8") as sources, \
            open(paths[1] + ".part", "w", encoding="utf-8") as targets:
        for n, pairs in enumerate(_chunks(train, total, chunk_lines)):
            if keep_original:
                sources.writelines(source + "\n" for source, _ in pairs)
                targets.writelines(target + "\n" for _, target in pairs)
            for i, (teacher, folder) in enumerate(zip(teachers, folders, strict=True)):
                written = []
                for path, f in zip(_chunk_paths(folder, n), (sources, targets), strict=True):
                    lines = list(iter_lines(path))
                    if len(lines) != len(pairs):
                        raise ValueError(f"{path} has {len(lines)} lines, expected "
                                         f"{len(pairs)}: it changed while distilling; rerun.")
                    f.writelines(line + "\n" for line in lines)
                    written.append(lines)
                empty[i] += sum(not line.strip() for line in written[1 - teacher.reverse])
    for path in paths:
        os.replace(path + ".part", path)
    return empty


def _copy_other_splits(corpus, out) -> list[str]:
    """Copies the files of every split but train into `out`, names unchanged."""
    copied = []
    for name, split in corpus.splits.items():
        if name == "train":
            continue
        for path in split.files:
            target = os.path.join(out, os.path.basename(path))
            shutil.copyfile(path, target + ".part")
            os.replace(target + ".part", target)
            copied.append(os.path.basename(path))
    return copied


def _chunk_paths(folder, n) -> tuple[str, str]:
    return tuple(os.path.join(folder, f"{n:06d}.{side}") for side in ("src", "tgt"))


def _count_lines(path) -> int:
    """Lines of `path`, -1 when it does not exist."""
    if not os.path.isfile(path):
        return -1
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def _write_atomic(path, text: str) -> None:
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".part", path)
