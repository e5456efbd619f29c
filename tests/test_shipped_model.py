"""The shipped Multi30k EN→DE translator (saved_models/multi30k_en_de): size, signatures,
and that it still translates real test sentences well through `serving_default`."""

import json
import os

import pytest
import tensorflow as tf

from tfxformer.bleu import sacrebleu_scores
from tfxformer.serving import resolve_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "saved_models", "multi30k_en_de")
DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k")
MAX_BYTES = 30_000_000  # the limit for the one binary the repository carries


@pytest.fixture(scope="module")
def model_dir():
    kind, path = resolve_model_dir(SHIPPED)
    assert kind == "saved_model", (kind, path)
    return path


@pytest.fixture(scope="module")
def translator(model_dir):
    return tf.saved_model.load(model_dir)


def _lines(name, count):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(count), strict=False)]


def test_shipped_model_is_small_enough_and_states_how_it_was_made(model_dir):
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(model_dir) for f in files)
    assert size <= MAX_BYTES, f"{model_dir} is {size:,} bytes > {MAX_BYTES:,}"
    with open(os.path.join(model_dir, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["src"] == "en" and config["tgt"] == "de"
    assert config["preset"].startswith("multi30k")


def test_shipped_model_translates_test_2016_through_serving_default(translator):
    sources = _lines("test_2016_flickr.en", 100)
    references = _lines("test_2016_flickr.de", 100)
    out = translator.signatures["serving_default"](text=tf.constant(sources))
    hypotheses = [t.decode("utf-8") for t in out["translation"].numpy()]
    assert len(hypotheses) == 100 and all(hypotheses)
    # The full 1,000-sentence set scores in the README table; the first 100 sentences
    # of a working model score far above an untrained or broken one (< 5).
    assert sacrebleu_scores(hypotheses, references)["bleu"] > 30
