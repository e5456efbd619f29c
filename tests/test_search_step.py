"""The search step (tfxformer.models.search_step) gives the layers' logits, with a growing
and with a static cache, and the same searches, in fewer ops, for every decoder the layers
build."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import beam_search, greedy_decode
from tfxformer.decoding.adapter import transformer_decoder
from tfxformer.decoding.beam_search import sequence_beam_search
from tfxformer.models.search_step import SearchStep, derived_weights

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


def _steps(model, source, beams, steps=5, static_cache=False):
    """Logits of `steps` greedy-fed steps from the layers' `decode_step` and the search
    step, (steps, N, V) each; a static cache holds `steps` + 2 positions."""
    memory, mask = model.encode(source)
    columns = steps + 2 if static_cache else None
    cache = model.init_cache(memory, columns, batch_size=source.shape[0] * beams)
    step = SearchStep(model, steps + 2, static_cache=static_cache)
    ids = tf.fill([source.shape[0] * beams, 1], 2)
    layer_cache, lean_cache = cache, [c["self"] for c in cache]
    memory = [c["cross"] for c in cache]
    out = []
    for i in range(steps):
        a, layer_cache = model.decode_step(ids, mask, layer_cache, i,
                                           static_cache=static_cache, beams=beams)
        b, lean_cache = step(ids, i, lean_cache, memory, mask[:, None, None, :], beams)
        out.append((a.numpy(), b.numpy()))
        ids = tf.cast(tf.argmax(a[:, -1], -1)[:, None], tf.int32)
    return out


@pytest.mark.parametrize("static_cache", [False, True])
@pytest.mark.parametrize("settings", [{}, {"norm_first": True},
                                      {"position_embedding": "learned"}])
def test_logits_are_the_layers(settings, static_cache):
    for layers, lean_logits in _steps(_model(**settings), _source(), beams=2,
                                      static_cache=static_cache):
        assert lean_logits.shape == layers.shape
        # the sinusoidal rows are computed once per search, not per step: float32 rounding
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=1e-5)


def test_learned_positions_are_the_layers_to_float32_rounding():
    # Everything but the joined query/key/value and the 2-D output projection is the
    # layers' arithmetic op for op; those MatMuls sum the same products in another order.
    for layers, lean_logits in _steps(_model(position_embedding="learned"), _source(), 1):
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=2e-6)


def test_mixed_bfloat16_is_the_layers_to_bfloat16_rounding(bf16):
    model = _model(position_embedding="learned")
    assert model.compute_dtype == "bfloat16"
    for layers, lean_logits in _steps(model, _source(), beams=2):
        scale = np.abs(layers).max()
        np.testing.assert_allclose(lean_logits, layers, rtol=0, atol=2 ** -7 * scale)


def _search(model, source, search_step=True, beams=3, static_cache=False):
    """Beam search on the search step, or (search_step=False) on the layers' decode_step."""
    if not search_step:
        model.search_step = lambda *args, **kwargs: None  # the adapter's fallback
    try:
        # 10 tokens past the source, not 50: an eager search runs every step it may take
        start = transformer_decoder(model, source, beams, extra_length=10,
                                    static_cache=static_cache)
        return sequence_beam_search(start, beams, 0.6, static_cache=static_cache)
    finally:
        model.__dict__.pop("search_step", None)


@pytest.mark.parametrize("static_cache", [False, True])
@pytest.mark.parametrize("settings", [{}, {"norm_first": True}])
def test_beam_search_finds_the_same_hypotheses(settings, static_cache):
    model, source = _model(**settings), _source()
    a = _search(model, source, True, static_cache=static_cache)
    b = _search(model, source, False, static_cache=static_cache)
    np.testing.assert_array_equal(a.ids.numpy(), b.ids.numpy())
    np.testing.assert_allclose(a.scores.numpy(), b.scores.numpy(), atol=1e-5)


def test_greedy_and_shortlist_searches_run_on_it():
    model, source = _model(), _source()
    shortlist = np.arange(40)
    greedy = greedy_decode(model, source, extra_length=10, shortlist=shortlist)
    beam = beam_search(model, source, beam_size=2, extra_length=10, shortlist=shortlist)
    assert greedy.ids.numpy().max() < 40 and beam.ids.numpy().max() < 40


def test_the_loop_runs_about_half_the_ops():
    model, source = _model(), _source()

    def body_ops(search_step):
        function = tf.function(lambda s: _search(model, s, search_step).ids)
        graph = function.get_concrete_function(source).graph.as_graph_def()
        bodies = {n.attr["body"].func.name for n in graph.node if n.op == "While"}
        return sum(n.op not in ("Const", "NoOp") for f in graph.library.function
                   if f.signature.name in bodies for n in f.node_def)

    step_ops, layer_ops = body_ops(True), body_ops(False)
    assert step_ops < 0.6 * layer_ops, (step_ops, layer_ops)


def _windowed():
    model = _model()
    for layer in model.decoder.stack:
        layer.self_attention.window = 2  # §4: restricted self-attention, r = 2
    return model


def _without_biases():
    model = _model()
    for layer in model.decoder.stack:
        for attention in (layer.self_attention, layer.cross_attention):
            attention.use_bias = False  # the biases' values are then never read
    return model


def _quantized():
    model = _model()
    model.quantize("int8")  # the feed-forward Dense layers (tfxformer.quantize)
    return model


@pytest.mark.parametrize("static_cache", [False, True])
@pytest.mark.parametrize("build", [_windowed, _without_biases, _quantized])
def test_every_decoder_the_layers_build(build, static_cache):
    model = build()
    for layers, step_logits in _steps(model, _source(), beams=1, steps=4,
                                      static_cache=static_cache):
        np.testing.assert_allclose(step_logits, layers, rtol=0, atol=2e-5)


def test_a_subclass_with_its_own_step_keeps_it():
    class Custom(Transformer):
        def decode_step(self, *args, **kwargs):
            return super().decode_step(*args, **kwargs)

    tf.random.set_seed(3)
    model = Custom.from_preset("tiny", vocab_size=VOCAB)
    assert model.search_step(4) is None
    assert model.search_step_weights() is None
    start = transformer_decoder(model, _source(), 1)  # the subclass' decode_step
    assert "source_mask" in start.context


@pytest.mark.parametrize("static_cache", [False, True])
def test_weights_derived_beforehand_give_the_same_logits(static_cache):
    # An export keeps the derived weights as variables; the step is the same computation.
    model, source = _model(), _source()
    memory, mask = model.encode(source)
    cache = model.init_cache(memory, 6 if static_cache else None, batch_size=6)
    derived = tf.nest.map_structure(
        lambda t: None if t is None else tf.Variable(t), model.search_step_weights())
    assert derived["output_kernel"].shape == (model.model_config.d_model, VOCAB)
    ids, memory = tf.fill([6, 1], 2), [c["cross"] for c in cache]
    self_cache = [c["self"] for c in cache]
    logits = [SearchStep(model, 6, static_cache=static_cache, derived=d)(
        ids, 0, self_cache, memory, mask[:, None, None, :], 2)[0] for d in (None, derived)]
    np.testing.assert_array_equal(logits[0], logits[1])
    tf.nest.map_structure(lambda a, b: np.testing.assert_array_equal(a, b),
                          derived_weights(model), derived)
