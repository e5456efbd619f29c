"""The shipped Multi30k translators (saved_models/multi30k_en_de, multi30k_en_fr, multi30k_de_en):
size, config, warm-up records, and that each still translates real test sentences well
through `serving_default`."""

import json
import os

import pytest
import tensorflow as tf
from conftest import SHARED_DATA

from tfxformer.bleu import sacrebleu_scores
from tfxformer.sentencepiece_ops import load_sentencepiece_ops
from tfxformer.serving import resolve_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(SHARED_DATA, "multi30k")
MAX_BYTES = 30_000_000  # the limit for each binary the repository carries
# export dir: (source and target language, sacreBLEU floor on the first 100 test_2016
# sentences: the full sets score in the cards; a broken or untrained model scores below 5)
SHIPPED = {"multi30k_en_de": ("en", "de", 30), "multi30k_en_fr": ("en", "fr", 45),
           "multi30k_de_en": ("de", "en", 35)}


@pytest.fixture(scope="module", params=sorted(SHIPPED))
def shipped(request):
    kind, path = resolve_model_dir(os.path.join(ROOT, "saved_models", request.param))
    assert kind == "saved_model", (kind, path)
    return (path, *SHIPPED[request.param])


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


@pytest.mark.slow
def test_shipped_model_translates_test_2016_through_serving_default(shipped):
    path, src, tgt, floor = shipped
    load_sentencepiece_ops()  # the graph holds SentencePiece ops; alone, no other test loads them
    translator = tf.saved_model.load(path)
    sources = _lines(f"test_2016_flickr.{src}", 100)
    references = _lines(f"test_2016_flickr.{tgt}", 100)
    out = translator.signatures["serving_default"](text=tf.constant(sources))
    hypotheses = [t.decode("utf-8") for t in out["translation"].numpy()]
    assert len(hypotheses) == 100 and all(hypotheses)
    assert sacrebleu_scores(hypotheses, references)["bleu"] > floor
