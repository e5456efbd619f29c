"""Tests of tfxformer.data.tfds_source: any TFDS translation dataset (§5.1 data).

TFDS datasets are served by `tfds.testing.mock_data` (random strings, no network); the
installed tensorflow-datasets ships no metadata for its translation builders, so
`tfds_metadata` (support/data_tfds_source.py) writes the split names and sizes a prepared
dataset would record.
"""


import pytest
import tensorflow_datasets as tfds
from support.data_tfds_source import tfds_metadata

from tfxformer.data import load_corpus, load_tfds, load_wmt14
from tfxformer.data.tfds_source import tfds_name


def _dataset_pairs(split) -> list[tuple[str, str]]:
    return [(s.decode(), t.decode()) for s, t in split.dataset().as_numpy_iterator()]


def test_wmt14_from_tfds_mock_data(tmp_path):
    metadata = tfds_metadata(tmp_path, "wmt14_translate/de-en",
                             {"train": 6, "validation": 6, "test": 6})
    with tfds.testing.mock_data(num_examples=6, data_dir=metadata):
        en_de = load_corpus("wmt14", src="en", tgt="de", data_dir=str(tmp_path))
        de_en = load_wmt14(src="de", tgt="en", data_dir=str(tmp_path))
        assert sorted(en_de.splits) == ["test", "train", "val"]
        assert en_de.val.origin.endswith("split validation") and en_de.val.num_examples == 6
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


def test_data_names_a_tfds_dataset_or_a_folder():
    assert tfds_name("wmt14") == tfds_name("WMT14") == "wmt14_translate/de-en"
    assert tfds_name("tfds:ted_hrlr_translate/pt_to_en") == "ted_hrlr_translate/pt_to_en"
    assert tfds_name("../shared/data/multi30k") is None
    with pytest.raises(ValueError, match="names no TFDS dataset; expected tfds:NAME"):
        tfds_name("tfds:")


@pytest.mark.parametrize("data, src, tgt", [
    ("tfds:wmt14_translate/fr-en", "en", "fr"),          # the paper's EN->FR task
    ("tfds:ted_hrlr_translate/pt_to_en", "pt", "en"),    # TensorFlow's text tutorial
])
def test_any_tfds_translation_dataset_from_mock_data(tmp_path, data, src, tgt):
    name = data.removeprefix("tfds:")
    metadata = tfds_metadata(tmp_path, name, {"train": 5, "validation": 3, "test": 4})
    with tfds.testing.mock_data(num_examples=5, data_dir=metadata):
        corpus = load_corpus(data, src=src, tgt=tgt)
        reverse = load_tfds(name, src=tgt, tgt=src)
        assert sorted(corpus.splits) == ["test", "train", "val"]
        assert [corpus[n].num_examples for n in ("train", "val", "test")] == [5, 3, 4]
        assert corpus.val.origin == f"tfds {name} split validation"
        pairs = _dataset_pairs(corpus.train)
        assert len(pairs) == 5 and all(s and t and s != t for s, t in pairs)
        assert _dataset_pairs(reverse.train) == [(t, s) for s, t in pairs]


def _splits_of(tmp_path, name, splits, **options):
    """The {our split: TFDS split} of TFDS `name` whose metadata holds `splits`."""
    metadata = tfds_metadata(tmp_path, name, dict.fromkeys(splits, 4))
    with tfds.testing.mock_data(num_examples=4, data_dir=metadata):
        corpus = load_tfds(name, "en", "fr", **options)
    return {ours: split.origin.rsplit(" split ", 1)[1] for ours, split in corpus.splits.items()}


def test_the_validation_split_is_found_by_name_or_named(tmp_path):
    name = "wmt14_translate/fr-en"
    assert _splits_of(tmp_path / "a", name, ["train", "dev", "test"]) == \
        {"train": "train", "val": "dev", "test": "test"}
    assert _splits_of(tmp_path / "b", name, ["train", "dev2010", "tst2010"]) == \
        {"train": "train", "val": "dev2010", "tst2010": "tst2010"}
    assert _splits_of(tmp_path / "c", name, ["train", "validation", "test"],
                      val_split="test") == {"train": "train", "val": "test",
                                            "validation": "validation"}
    held_out = _splits_of(tmp_path / "d", name, ["train"], train_split="train[2:]",
                          val_split="train[:2]")
    assert held_out == {"train": "train[2:]", "val": "train[:2]"}
    with pytest.raises(ValueError, match=r"splits \['train'\], and which one is for "
                                         r"validation is not clear .*`tfds_val_split`"):
        _splits_of(tmp_path / "e", name, ["train"])
    with pytest.raises(ValueError, match=r"several: \['dev2010', 'dev2012'\]"):
        _splits_of(tmp_path / "f", name, ["train", "dev2010", "dev2012"])
    with pytest.raises(ValueError, match=r"no split 'valid' \(`tfds_val_split`\).*Its splits: "
                                         r"\['train', 'validation'\]"):
        _splits_of(tmp_path / "g", name, ["train", "validation"], val_split="valid")


def test_tfds_names_languages_and_features_are_checked(tmp_path):
    with tfds.testing.mock_data(num_examples=2, data_dir=str(tmp_path)):
        with pytest.raises(ValueError) as err:
            load_corpus("tfds:wmt14_translate/fr-en", src="en", tgt="de")
        assert "wmt14_translate/fr-en has languages 'en' and 'fr'; got `src` 'en', `tgt` " \
            "'de'" in str(err.value) and "'de-en'" in str(err.value)
        with pytest.raises(ValueError, match="languages 'de' and 'en'; got `src` 'fr'"):
            load_wmt14(src="fr", tgt="en")
        with pytest.raises(ValueError, match=r"No TFDS dataset 'wmt14_translat'.*close names: "
                                             r"\[.*'wmt14_translate'"):
            load_corpus("tfds:wmt14_translat/fr-en", "en", "fr")
        with pytest.raises(ValueError, match=r"Configs of ted_hrlr_translate: .*'pt_to_en'"):
            load_corpus("tfds:ted_hrlr_translate/pt_en", "pt", "en")
        with pytest.raises(ValueError, match="not a translation dataset of one language pair: "
                                             r"its features are a FeaturesDict \['talk_name'"):
            load_corpus("tfds:ted_multi_translate", "en", "fr")
