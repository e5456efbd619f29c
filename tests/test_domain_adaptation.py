"""scripts/domain_adaptation.py: held-out Tatoeba sets that never overlap the training split."""

import importlib.util
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "domain_adaptation.py")


@pytest.fixture(scope="module")
def domain():
    spec = importlib.util.spec_from_file_location("domain_adaptation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAIRS = [("Hi.", "Hallo!"), ("Hi.", "Grüß Gott!"), ("Run!", "Lauf!"), ("Go.", "Geh!"),
         ("Go away.", "Geh!"), ("Help!", "Hilfe!"), ("Stop!", "Halt!"), ("Wait!", "Warte!"),
         ("Hello!", "Hallo!")]


def test_groups_join_pairs_that_share_either_side(domain):
    groups = domain.group_pairs(PAIRS)
    assert groups[0] == groups[1] == groups[8]  # "Hi." twice, then "Hallo!" again
    assert groups[3] == groups[4]  # "Geh!" twice
    assert len(set(groups)) == 6


def test_held_out_sets_never_overlap_training(domain):
    splits = domain.split_pairs(PAIRS, {"test": 2, "val": 1}, seed=3)
    assert len(splits["test"]) == 2 and len(splits["val"]) == 1
    train = splits["train"]
    for name in ("test", "val"):
        for en, de in splits[name]:
            assert all(en != e and de != d for e, d in train)
    held_groups = len(splits["test"]) + len(splits["val"])
    assert len(train) + held_groups <= len(PAIRS)
    assert splits == domain.split_pairs(PAIRS, {"test": 2, "val": 1}, seed=3)
    assert splits != domain.split_pairs(PAIRS, {"test": 2, "val": 1}, seed=4)


def test_a_held_out_set_larger_than_the_corpus_is_refused(domain):
    with pytest.raises(ValueError, match="6 groups"):
        domain.split_pairs(PAIRS, {"test": 5, "val": 1})


def test_missing_data_is_a_clear_error(domain, tmp_path, capsys):
    assert domain.main(["--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "tatoeba.en.gz" in capsys.readouterr().err
