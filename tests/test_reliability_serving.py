"""Property test of the exported translator: any Unicode text or raw bytes in, one valid UTF-8
string out per input, in input order, and never an exception.

A tiny random model is exported once (tfxformer.serving.export_translator) and loaded with
tf.saved_model.load, as a server would; hypothesis then feeds its serving signature.
"""

import pytest
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Chunks of 3 sentences: a batch of up to 7 inputs is padded, sorted and cut into several
# chunks, and every output must still come back to its input's place.
MAX_BATCH_SIZE = 3
PROPERTY = settings(max_examples=30, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def serve(tiny_export):
    """The loaded SavedModel's serving_default (conftest's tiny export: an untrained tiny
    model, chunks of MAX_BATCH_SIZE): list of str/bytes -> list of bytes."""
    assert TINY_EXPORT_OPTIONS["max_batch_size"] == MAX_BATCH_SIZE
    signature = tf.saved_model.load(tiny_export).signatures["serving_default"]

    def translate(texts):
        out = signature(text=tf.constant(texts, tf.string))
        assert set(out) == {"translation", "score", "truncated"}
        return out["translation"].numpy().tolist()
    return translate


def _check(serve, texts):
    outputs = serve(texts)
    assert len(outputs) == len(texts)
    for output in outputs:
        output.decode("utf-8")  # strict: raises on invalid UTF-8
    # In order: each output is what that input gives on its own.
    assert outputs == [serve([text])[0] for text in texts]


@PROPERTY
@given(st.lists(st.text(max_size=60), max_size=7))
def test_any_unicode_strings(serve, texts):
    _check(serve, [t.encode("utf-8") for t in texts])


@PROPERTY
@given(st.lists(st.binary(max_size=80), max_size=7))
def test_any_bytes(serve, texts):
    _check(serve, texts)


@PROPERTY
@given(st.lists(st.one_of(st.text(alphabet=st.characters(codec="utf-8"), min_size=200,
                                  max_size=2000).map(str.encode),
                          st.binary(min_size=1000, max_size=5000)), min_size=1, max_size=3))
def test_long_inputs(serve, texts):
    _check(serve, texts)
