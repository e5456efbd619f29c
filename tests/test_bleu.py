"""BLEU both ways (scripts/bleu.py): sacreBLEU and the paper's compound-split tokenized BLEU."""

import json
import os

import pytest
import sacrebleu
from conftest import SHARED_DATA
from support.serving import load_script

from tfxformer.bleu import (
    compound_split_bleu,
    multi30k_bleu,
    multi30k_tokenize,
    sacrebleu_scores,
    split_compounds,
    tokenized_bleu,
)

NEWSTEST = os.path.join(SHARED_DATA, "wmt14", "newstest2014.de")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_split_compounds_as_get_ende_bleu_sh():
    # Output of: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert split_compounds("die Ost-West-Achse , E-Mail") == \
        "die Ost ##AT##-##AT## West ##AT##-##AT## Achse , E ##AT##-##AT## Mail"
    assert split_compounds("5 - 3") == "5 - 3"  # a free-standing dash is not a compound


def test_compound_split_bleu_tokenizes_and_splits():
    ref = ["Die Ost-West-Verbindung wurde 2014 eröffnet."]
    hyp = ["Die Ost-Verbindung wurde 2014 eröffnet."]
    tokenized = ["Die Ost ##AT##-##AT## West ##AT##-##AT## Verbindung wurde 2014 eröffnet ."]
    expected = sacrebleu.corpus_bleu(["Die Ost ##AT##-##AT## Verbindung wurde 2014 eröffnet ."],
                                     [tokenized], tokenize="none").score
    assert compound_split_bleu(hyp, ref) == pytest.approx(expected)
    assert compound_split_bleu(hyp, ref) > sacrebleu.corpus_bleu(hyp, [ref]).score


def test_scores_on_newstest2014():
    with open(NEWSTEST, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    assert len(refs) == 3003
    identity = sacrebleu_scores(refs, refs)
    assert identity["bleu"] == pytest.approx(100) and identity["chrf"] == pytest.approx(100)
    assert "case:mixed" in identity["signature"] and "tok:13a" in identity["signature"]
    # Lower-casing the hypotheses costs cased BLEU but not lowercased BLEU.
    lowered = sacrebleu_scores([r.lower() for r in refs[:500]], refs[:500])
    assert lowered["bleu"] < 60 and lowered["bleu_lowercase"] == pytest.approx(100)
    # Dropping every hyphen hurts the compound-split score more than sacreBLEU's.
    dehyphenated = [r.replace("-", "") for r in refs[:500]]
    split = compound_split_bleu(dehyphenated, refs[:500])
    assert split < 100 and sacrebleu_scores(dehyphenated, refs[:500])["bleu"] < 100
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        sacrebleu_scores(["a", "b"], ["a", "b", "c"])


@pytest.mark.slow
def test_bleu_script(tmp_path, capsys):
    hyp = tmp_path / "hyp.de"
    with open(NEWSTEST, encoding="utf-8") as f:
        hyp.write_text("".join(line for _, line in zip(range(3003), f, strict=False)),
                       encoding="utf-8")
    capsys.readouterr()
    assert load_script("bleu").main(["--hyp", str(hyp), "--ref", NEWSTEST]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["bleu"] == pytest.approx(100) and scores["bleu_compound_split"] == \
        pytest.approx(100)


MULTI30K = os.path.join(SHARED_DATA, "multi30k")


def test_multi30k_tokenize_hand_checked():
    # By hand, as lowercase | normalize-punctuation.perl | tokenizer.perl (escaping) would.
    assert multi30k_tokenize(["Un homme sur l'herbe, près d'une clôture."], "fr") == \
        ["un homme sur l&apos; herbe , près d&apos; une clôture ."]
    assert multi30k_tokenize(["Ein Mann mit einem „Hut“."], "de") == \
        ['ein mann mit einem " hut " .'.replace('"', "&quot;")]


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_multi30k_tokenize_reproduces_the_datasets_references(lang):
    raw = open(os.path.join(MULTI30K, f"test_2016_flickr.{lang}"), encoding="utf-8")
    tok = open(os.path.join(MULTI30K, "tok", f"test_2016_flickr.lc.norm.tok.{lang}"),
               encoding="utf-8")
    raw, tok = raw.read().splitlines(), tok.read().splitlines()
    same = sum(a == b for a, b in zip(multi30k_tokenize(raw, lang), tok, strict=True))
    assert same >= 999
    assert multi30k_bleu(raw, tok, lang) > 99.9


def test_multi30k_bleu_scores_a_hypothesis_like_multi_bleu():
    refs = ["ein mann mit einem hut .", "zwei hunde spielen im schnee ."]
    hyps = ["Ein Mann mit einem Hut.", "Zwei Hunde laufen im Schnee."]
    expected = sacrebleu.corpus_bleu(
        ["ein mann mit einem hut .", "zwei hunde laufen im schnee ."], [refs],
        tokenize="none").score
    assert multi30k_bleu(hyps, refs, "de") == pytest.approx(expected)
    with pytest.raises(ValueError, match="aligned"):
        multi30k_bleu(hyps[:1], refs, "de")


def test_tokenized_bleu_scores_the_text_as_it_is():
    refs = ["ein mann mit einem hut .", "zwei hunde spielen im schnee ."]
    hyps = ["ein mann mit einem hut .", "zwei hunde laufen im schnee ."]
    assert tokenized_bleu(hyps, refs) == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)
    # no tokenisation of its own: "hut." is one token, unlike "hut ."
    assert tokenized_bleu(["ein mann mit einem hut."], refs[:1]) < 100
    with pytest.raises(ValueError, match="aligned"):
        tokenized_bleu(hyps[:1], refs)


@pytest.mark.slow
def test_literature_setup_writes_the_datasets_tokenized_text(tmp_path, capsys):
    """scripts/literature_setup.py: references copied from tok/, training text tokenised
    the same way (lowercased, normalised, escaped)."""
    out = tmp_path / "lc_tok"
    script = load_script("literature_setup")
    assert script.main(["--data", MULTI30K, "--out", str(out), "--langs", "en", "de",
                        "--splits", "val", "test_2016_flickr"]) == 0
    shipped = os.path.join(MULTI30K, "tok", "test_2016_flickr.lc.norm.tok.de")
    assert (out / "test_2016_flickr.de").read_text(encoding="utf-8") == \
        open(shipped, encoding="utf-8").read()
    english = (out / "val.en").read_text(encoding="utf-8").splitlines()
    assert len(english) == 1014 and all(line == line.lower() for line in english)
    capsys.readouterr()
    assert script.main(["--data", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "is not a folder" in capsys.readouterr().err
