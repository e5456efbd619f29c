"""BLEU both ways: sacreBLEU on detokenized text, and the paper's tokenized compound-split BLEU.

§6.1 / paper-recipe: the paper's newstest2014 figures are BLEU on Moses-tokenized text with
hyphenated compounds split, as tensor2tensor's `get_ende_bleu.sh` computed it:

    tokenizer.perl -l de < hyp > hyp.tok              (Moses tokenizer, here: sacremoses)
    perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'   (on hypothesis and reference)
    multi-bleu.perl ref.tok.atat < hyp.tok.atat       (here: sacreBLEU, tokenize="none")

sacreBLEU on detokenized text (cased, 13a) is the number to report; it is about 0.7-1.5
lower for the same output.

Papers on Multi30k report a third BLEU (:func:`multi30k_bleu`): the hypothesis lowercased,
punctuation-normalised and Moses-tokenised, scored with multi-bleu against the dataset's
own `tok/<split>.lc.norm.tok.<lang>` references.
"""

from __future__ import annotations

import re

import sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer

_COMPOUND = re.compile(r"(\S)-(\S)")


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> dict:
    """Cased sacreBLEU (13a) with its signature, lowercased sacreBLEU, and chrF."""
    _check(hypotheses, references)
    bleu = sacrebleu.metrics.BLEU()
    cased = bleu.corpus_score(hypotheses, [references])
    lower = sacrebleu.metrics.BLEU(lowercase=True)
    lowered = lower.corpus_score(hypotheses, [references])
    chrf = sacrebleu.metrics.CHRF()
    return {
        "bleu": cased.score, "signature": str(bleu.get_signature()),
        "bleu_lowercase": lowered.score, "signature_lowercase": str(lower.get_signature()),
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
    }


def split_compounds(tokenized: str) -> str:
    """"a-b" -> "a ##AT##-##AT## b", as tensor2tensor's get_ende_bleu.sh (one pass, like perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def compound_split_bleu(hypotheses: list[str], references: list[str], lang: str = "de") -> float:
    """BLEU on Moses-tokenized text with hyphenated compounds split (the paper's convention)."""
    _check(hypotheses, references)
    tokenizer = MosesTokenizer(lang=lang)

    def prepare(lines):
        return [split_compounds(tokenizer.tokenize(line, return_str=True)) for line in lines]
    score = sacrebleu.corpus_bleu(prepare(hypotheses), [prepare(references)], tokenize="none",
                                  force=True)
    return score.score


def multi30k_tokenize(lines: list[str], lang: str) -> list[str]:
    """The Multi30k `lc.norm.tok` preprocessing: lowercase, Moses punctuation normalisation,
    Moses tokenisation with XML escaping (`'` -> `&apos;`, as in the dataset's files).

    Applied to the raw references this reproduces the dataset's tokenized files exactly on
    test_2016_flickr (1,000 of 1,000 lines in German and English, 999 in French; tested).
    Without escaping, French references score 90 BLEU against themselves (`l'` is
    `l&apos;` in the reference files), so escaping is not optional.
    """
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True,
                               escape=True) for line in lines]


def multi30k_bleu(hypotheses: list[str], references: list[str], lang: str) -> float:
    """BLEU as Multi30k papers report it: :func:`multi30k_tokenize` on the hypotheses,
    then corpus BLEU (multi-bleu.perl; sacreBLEU with no further tokenisation) against
    `references`, the lines of the dataset's `tok/<split>.lc.norm.tok.<lang>`."""
    _check(hypotheses, references)
    return sacrebleu.corpus_bleu(multi30k_tokenize(hypotheses, lang), [references],
                                 tokenize="none", force=True).score


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU of already tokenized text as it is (multi-bleu.perl: no further
    tokenisation, case kept), e.g. the output of a model trained on `lc.norm.tok` text
    against the `lc.norm.tok` references."""
    _check(hypotheses, references)
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score


def _check(hypotheses, references):
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; "
                         "they must be aligned line by line.")
