"""Tests of tfxformer.data.sources: aligned text folders and TFDS WMT14 (§5.1 data)."""

import gzip
import logging
import os

import pytest
import tensorflow_datasets as tfds
from conftest import shared_data

from tfxformer.data import check_aligned, iter_lines, load_corpus, load_text_folder, load_wmt14


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
    with pytest.raises(FileNotFoundError, match="neither 'wmt14' nor an existing folder"):
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
    with pytest.raises(ValueError, match="languages 'de' and 'en'; got src='fr'"):
        load_wmt14(src="fr", tgt="en")


def test_wmt14_from_tfds_mock_data(tmp_path):
    with tfds.testing.mock_data(num_examples=6):
        en_de = load_corpus("wmt14", src="en", tgt="de", data_dir=str(tmp_path))
        de_en = load_wmt14(src="de", tgt="en", data_dir=str(tmp_path))
        assert sorted(en_de.splits) == ["test", "train", "val"]
        pairs = _dataset_pairs(en_de.train)
        assert len(pairs) == 6 and all(s and t for s, t in pairs)
        assert list(en_de.train.pairs()) == pairs
        assert _dataset_pairs(de_en.val) == [(t, s) for s, t in _dataset_pairs(en_de.val)]
        assert len(list(en_de.training_text())) == 12


def test_wmt14_not_prepared_without_download(tmp_path):
    with pytest.raises(RuntimeError) as err:
        load_wmt14(data_dir=str(tmp_path), download=False)
    message = str(err.value)
    assert str(tmp_path) in message and "download=False" in message
    assert "--data /path/to/folder" in message and "train.en, train.de" in message


def test_wmt14_offline_download_is_a_clear_error(tmp_path, monkeypatch):
    calls = []

    def offline(self, download_config=None, **kwargs):
        calls.append(download_config)
        raise ConnectionError("Name or service not known: www.statmt.org")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    with pytest.raises(RuntimeError) as err:
        load_wmt14(src="de", tgt="en", data_dir=str(tmp_path), manual_dir=str(tmp_path / "m"))
    message = str(err.value)
    assert "ConnectionError: Name or service not known" in message
    assert "--tfds-data-dir" in message and "train.de, train.en" in message
    assert calls[0].manual_dir == str(tmp_path / "m")
