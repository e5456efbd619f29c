"""The shipped Multi30k translators (saved_models/multi30k_*):
size, config, warm-up records, and that each card names the shipped version and states
the scores a fresh evaluation of test_2016_flickr through `serving_default` gives."""

import json
import os
import re

import pytest
from conftest import SHARED_DATA

from tfxformer.bleu import multi30k_bleu, sacrebleu_scores
from tfxformer.serving import load_translate_fn, resolve_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(SHARED_DATA, "multi30k")
MAX_BYTES = 30_000_000  # the limit for each binary the repository carries
# export dir: (source and target language, sacreBLEU floor on test_2016: a broken or
# untrained model scores below 5)
SHIPPED = {"multi30k_en_de": ("en", "de", 30), "multi30k_en_fr": ("en", "fr", 45),
           "multi30k_fr_en": ("fr", "en", 40), "multi30k_en_de_r2l": ("en", "de", 30),
           "multi30k_de_en": ("de", "en", 35)}
# The card's score table: | set | sentences | sacreBLEU | Multi30k BLEU |
SCORE_ROW = re.compile(r"^\| (?P<set>test_\w+) \| (?P<sentences>[\d,]+) \| (?P<bleu>\d+\.\d\d) "
                       r"\| (?P<multi30k>\d+\.\d\d) \|$", re.M)


@pytest.fixture(scope="module", params=sorted(SHIPPED))
def shipped(request):
    kind, path = resolve_model_dir(os.path.join(ROOT, "saved_models", request.param))
    assert kind == "saved_model", (kind, path)
    return (path, *SHIPPED[request.param])


def _card(version_dir):
    """(the card's text, the model's name, the shipped version) of a shipped version dir."""
    export_dir, version = os.path.split(version_dir)
    with open(os.path.join(export_dir, "README.md"), encoding="utf-8") as f:
        return f.read(), os.path.basename(export_dir), version


def _card_scores(text):
    """{set: (sentences, sacreBLEU, Multi30k BLEU)} of the card's score table."""
    return {m["set"]: (int(m["sentences"].replace(",", "")), float(m["bleu"]),
                       float(m["multi30k"])) for m in SCORE_ROW.finditer(text)}


def _lines(name, count):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(count), strict=False)]


def test_shipped_model_is_small_enough_and_states_how_it_was_made(shipped):
    model_dir, src, tgt, _ = shipped
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(model_dir) for f in files)
    assert size <= MAX_BYTES, f"{model_dir} is {size:,} bytes > {MAX_BYTES:,}"
    with open(os.path.join(model_dir, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["src"] == src and config["tgt"] == tgt
    assert config["preset"].startswith("multi30k")
    assert os.path.getsize(os.path.join(model_dir, "assets.extra",
                                        "tf_serving_warmup_requests")) > 0


def _signatures(version_dir):
    """{signature: (inputs, outputs)}, each {name: (dtype, shape)}, read from the
    SavedModel's protocol buffer (nothing is loaded)."""
    from tensorflow.python.saved_model import loader_impl

    graph = loader_impl.parse_saved_model(version_dir).meta_graphs[0]

    def specs(tensors):
        return {name: (info.dtype, tuple(d.size for d in info.tensor_shape.dim))
                for name, info in tensors.items()}

    return {name: (specs(sig.inputs), specs(sig.outputs))
            for name, sig in graph.signature_def.items() if not name.startswith("__")}


def test_shipped_models_have_every_signature_of_a_fresh_export(shipped, tiny_export):
    """TF Serving users of a shipped model get what docs/serving.md and docs/steering.md
    list: the signatures of a default export made with today's code, inputs and outputs."""
    want, got = _signatures(tiny_export), _signatures(shipped[0])
    assert sorted(got) == sorted(want)
    for name, (inputs, outputs) in want.items():
        assert got[name] == (inputs, outputs), name


def test_card_names_the_shipped_version_and_has_a_score_table(shipped):
    text, name, version = _card(shipped[0])
    assert f"| version | **{version}** (`saved_models/{name}/{version}/`) |" in text
    scores = _card_scores(text)
    assert {"test_2016_flickr", "test_2017_flickr"} <= set(scores), scores


@pytest.mark.slow
def test_card_scores_are_those_of_a_fresh_evaluation_of_test_2016(shipped):
    """The card's test_2016 row, as `scripts/evaluate.py --metric multi30k` computes it
    (through `serving_default`, the export's decoding, batches of 64 in length order)."""
    path, src, tgt, floor = shipped
    sources = _lines(f"test_2016_flickr.{src}", 10_000)
    references = _lines(f"test_2016_flickr.{tgt}", 10_000)
    tokenized = _lines(os.path.join("tok", f"test_2016_flickr.lc.norm.tok.{tgt}"), 10_000)
    hypotheses = load_translate_fn(path)(sources)
    assert len(hypotheses) == len(sources) and all(hypotheses)
    bleu = sacrebleu_scores(hypotheses, references)["bleu"]
    assert bleu > floor
    measured = (len(sources), round(bleu, 2), round(multi30k_bleu(hypotheses, tokenized, tgt), 2))
    stated = _card_scores(_card(path)[0])["test_2016_flickr"]
    assert measured == stated, f"{path}: card {stated}, measured {measured} (sentences, " \
                               "sacreBLEU, Multi30k BLEU): update the card's score table"
