"""Tests of tfxformer.data.sources: aligned text folders (§5.1 data)."""

import gzip
import logging
import os

import pytest
from conftest import shared_data

from tfxformer.data import check_aligned, iter_lines, load_corpus, load_text_folder


def _write(folder, name: str, lines: list[str]) -> str:
    path = os.path.join(folder, name)
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    with (gzip.open(path, "wb") if name.endswith(".gz") else open(path, "wb")) as f:
        f.write(data)
    return path


def _folder(tmp_path, **files: list[str]) -> str:
    for name, lines in files.items():
        _write(tmp_path, name.replace("_", "."), lines)
    return str(tmp_path)


def _dataset_pairs(split) -> list[tuple[str, str]]:
    return [(s.decode(), t.decode()) for s, t in split.dataset().as_numpy_iterator()]


def test_multi30k_folder_splits_counts_and_direction():
    corpus = load_corpus(shared_data("multi30k"), src="en", tgt="de")
    assert corpus.train.num_examples == 29_000 and corpus.val.num_examples == 1_014
    assert corpus.test_names == ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco",
                                 "test_2018_flickr"]
    en, de = corpus["test_2017_mscoco"].lists()
    assert len(en) == len(de) == 461
    assert _dataset_pairs(corpus["test_2017_mscoco"]) == list(zip(en, de, strict=True))
    reverse = load_text_folder(shared_data("multi30k"), src="de", tgt="en")
    assert reverse["test_2017_mscoco"].lists() == (de, en)
    with pytest.raises(KeyError, match="available: .*'test_2016_flickr'"):
        corpus["test"]


def test_training_text_interleaves_both_languages(tmp_path):
    folder = _folder(tmp_path, train_en=["a", "b"], train_de=["A", "B"], val_en=["c"],
                     val_de=["C"])
    assert list(load_corpus(folder).training_text()) == ["a", "A", "b", "B"]


def test_gz_files_are_read(tmp_path):
    folder = _folder(tmp_path, train_en_gz=["One dog.", "Two cats."],
                     train_de_gz=["Ein Hund.", "Zwei Katzen, süß."], val_en=["x"], val_de=["y"])
    corpus = load_corpus(folder)
    assert corpus.train.origin.endswith("train.de.gz")
    expected = [("One dog.", "Ein Hund."), ("Two cats.", "Zwei Katzen, süß.")]
    assert list(corpus.train.pairs()) == expected
    assert _dataset_pairs(corpus.train) == expected


def test_crlf_line_ends_are_removed_like_textlinedataset(tmp_path):
    (tmp_path / "train.en").write_bytes(b"a\r\nb\r\n")
    (tmp_path / "train.de").write_bytes(b"A\nB")  # no final newline: still 2 lines
    _folder(tmp_path, val_en=["c"], val_de=["C"])
    corpus = load_corpus(str(tmp_path))
    assert list(corpus.train.pairs()) == _dataset_pairs(corpus.train) == [("a", "A"), ("b", "B")]


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    folder = _folder(tmp_path, train_en=["a", "b", "c"], train_de=["A", "B"], val_en=["x"],
                     val_de=["y"])
    src, tgt = os.path.join(folder, "train.en"), os.path.join(folder, "train.de")
    with pytest.raises(ValueError) as err:
        load_corpus(folder)
    assert f"{src} has 3 lines but {tgt} has 2 lines" in str(err.value)
    assert check_aligned(src, src) == 3


def test_missing_files_and_folders_are_clear_errors(tmp_path):
    folder = _folder(tmp_path, train_en=["a"], train_de=["A"], val_en=["x"])
    with pytest.raises(FileNotFoundError, match=f"Missing {folder}/val.de .*needs train.en"):
        load_corpus(folder)
    with pytest.raises(FileNotFoundError, match="neither a TFDS dataset nor an existing folder"):
        load_corpus(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_text_folder(str(tmp_path / "nope"))


def test_non_utf8_names_file_and_line(tmp_path):
    folder = _folder(tmp_path, train_en=["ok", "ok"], val_en=["x"], val_de=["y"])
    path = os.path.join(folder, "train.de")
    with open(path, "wb") as f:
        f.write(b"gut\n" + "Gr\xfc\xdfe\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{path}:2: not valid UTF-8 .*iconv"):
        load_corpus(folder)


def test_plain_and_gz_copies_are_ambiguous(tmp_path):
    folder = _folder(tmp_path, train_en=["a"], train_en_gz=["a"], train_de=["A"])
    with pytest.raises(ValueError, match="keep only one"):
        load_corpus(folder)


def test_extra_splits_and_lone_files(tmp_path, caplog):
    folder = _folder(tmp_path, train_en=["a"], train_de=["A"], val_en=["b"], val_de=["B"],
                     newstest2014_en=["c"], newstest2014_de=["C"], mono_en=["m"],
                     train_fr=["f"])
    with caplog.at_level(logging.WARNING, logger="tfxformer.data.sources"):
        corpus = load_corpus(folder)
    assert sorted(corpus.splits) == ["newstest2014", "train", "val"]
    assert "mono.en: no mono.de" in caplog.text


def test_absurdly_long_line_is_read(tmp_path):
    folder = _folder(tmp_path, train_en=["short", "w" * 3_000_000], train_de=["kurz", "lang"],
                     val_en=["x"], val_de=["y"])
    corpus = load_corpus(folder)
    assert corpus.train.num_examples == 2
    assert [len(s) for s in iter_lines(os.path.join(folder, "train.en"))] == [5, 3_000_000]


def test_bad_language_codes(tmp_path):
    with pytest.raises(ValueError, match="both 'en'"):
        load_text_folder(shared_data("multi30k"), src="en", tgt="en")
    with pytest.raises(ValueError, match=r"Language code 'e\.n'"):
        load_text_folder(shared_data("multi30k"), src="e.n", tgt="de")
