"""The lean decoding step (tfxformer.models.lean_step) gives the layers' logits and the same
searches, in fewer ops, and steps aside for what it does not cover."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import beam_search, greedy_decode
from tfxformer.decoding.adapter import transformer_decoder
from tfxformer.decoding.beam_search import sequence_beam_search
from tfxformer.models import lean_step as lean

VOCAB = 60


def _model(**settings):
    tf.random.set_seed(3)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, **settings)
    ids = tf.constant([[5, 6, 3]])
    model((ids, ids))
    return model


def _source():
    rng = np.random.RandomState(0)
    ids = rng.randint(4, VOCAB, (3, 7)).astype("int32")
    ids[1, 4:] = 0  # a shorter sentence: padding the cross-attention must mask
    ids[1, 3] = ids[0, 6] = ids[2, 6] = 3
    return tf.constant(ids)


@pytest.fixture
def bf16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _steps(model, source, beams, steps=5):
    """Logits of `steps` greedy-fed steps from both step functions, (steps, N, V) each."""
    memory, mask = model.encode(source)
    cache = model.init_cache(memory, None, batch_size=source.shape[0] * beams)
    step = lean.LeanStep(model, steps)
    ids = tf.fill([source.shape[0] * beams, 1], 2)
    layer_cache, lean_cache = cache, [c["self"] for c in cache]
    memory = [c["cross"] for c in cache]
    out = []
    for i in range(steps):
        a, layer_cache = model.decode_step(ids, mask, layer_cache, i, static_cache=False,
                                           beams=beams)
        b, lean_cache = step(ids, i, lean_cache, memory, mask[:, None, None, :], beams)
        out.append((a.numpy(), b.numpy()))
        ids = tf.cast(tf.argmax(a[:, -1], -1)[:, None], tf.int32)
    return out


@pytest.mark.parametrize("settings", [{}, {"norm_first": True},
                                      {"position_embedding": "learned"}])
def test_logits_are_the_layers(settings):
    for layers, lean_logits in _steps(_model(**settings), _source(), beams=2):
        assert lean_logits.shape == layers.shape
        # the sinusoidal rows are computed once per search, not per step: float32 rounding
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=1e-5)


def test_learned_positions_are_the_layers_to_float32_rounding():
    # Everything but the 2-D output projection is the layers' arithmetic op for op; the
    # projection's MatMul sums the same products in another order.
    for layers, lean_logits in _steps(_model(position_embedding="learned"), _source(), 1):
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=2e-6)


def test_mixed_bfloat16_is_the_layers_to_bfloat16_rounding(bf16):
    model = _model(position_embedding="learned")
    assert model.compute_dtype == "bfloat16"
    for layers, lean_logits in _steps(model, _source(), beams=2):
        scale = np.abs(layers).max()
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=2 ** -7 * scale)


def _search(model, source, lean_step, beams=3):
    # 10 tokens past the source, not 50: an eager search runs every step it may take
    start = transformer_decoder(model, source, beams, extra_length=10, lean=lean_step)
    return sequence_beam_search(start, beams, 0.6)


@pytest.mark.parametrize("settings", [{}, {"norm_first": True}])
def test_beam_search_finds_the_same_hypotheses(settings):
    model, source = _model(**settings), _source()
    a, b = _search(model, source, True), _search(model, source, False)
    np.testing.assert_array_equal(a.ids.numpy(), b.ids.numpy())
    np.testing.assert_allclose(a.scores.numpy(), b.scores.numpy(), atol=1e-5)


def test_greedy_and_shortlist_searches_run_on_it():
    model, source = _model(), _source()
    shortlist = np.arange(40)
    assert lean.unsupported(model) is None
    greedy = greedy_decode(model, source, extra_length=10, shortlist=shortlist)
    beam = beam_search(model, source, beam_size=2, extra_length=10, shortlist=shortlist)
    assert greedy.ids.numpy().max() < 40 and beam.ids.numpy().max() < 40


def test_the_loop_runs_about_half_the_ops():
    model, source = _model(), _source()

    def body_ops(lean_step):
        function = tf.function(lambda s: _search(model, s, lean_step).ids)
        graph = function.get_concrete_function(source).graph.as_graph_def()
        bodies = {n.attr["body"].func.name for n in graph.node if n.op == "While"}
        return sum(n.op not in ("Const", "NoOp") for f in graph.library.function
                   if f.signature.name in bodies for n in f.node_def)

    lean_ops, layer_ops = body_ops(True), body_ops(False)
    assert lean_ops < 0.6 * layer_ops, (lean_ops, layer_ops)


def test_unsupported_models_take_the_layers():
    model = _model()
    model.decoder.layer_0.self_attention.window = 2
    assert "window" in lean.unsupported(model)
    assert model.lean_step(4) is None
    with pytest.raises(ValueError, match="does not cover restricted self-attention"):
        lean.LeanStep(model, 4)
    source = _source()
    start = transformer_decoder(model, source, 1)  # the layers' step, without an error
    assert "source_mask" in start.context
