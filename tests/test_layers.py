"""The public layers (§3): contract, paper numbers, masks, equivalence with Keras."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over
from layer_contract import build_under_strategy, run_layer_test

from tfxformer import layers

B, S, T, D = 2, 5, 4, 8
RNG = np.random.default_rng(0)
X = RNG.normal(size=(B, T, D)).astype("float32")
MEMORY = RNG.normal(size=(B, S, D)).astype("float32")
SOURCE_MASK = np.array([[True] * S, [True, True, True, False, False]])


# --- the layer contract, one shared helper ----------------------------------------------

SCORES = dict(variants=[dict(return_attention_scores=True)])
CONTRACT_CASES = {
    "MultiHeadAttention": (layers.MultiHeadAttention, dict(num_heads=2), (X, MEMORY),
                           dict(padding_mask=tf.constant(SOURCE_MASK)),
                           dict(SCORES, keras_mask=(1, "padding_mask"))),
    "MultiHeadAttention-restricted": (layers.MultiHeadAttention, dict(num_heads=2, window=1),
                                      (X, X), {}, dict(SCORES, keras_mask=(1, "padding_mask"))),
    "PositionalEncoding": (layers.PositionalEncoding, {}, (X,), {}, dict(has_weights=False)),
    "PositionalEncoding-learned": (layers.PositionalEncoding,
                                   dict(kind="learned", max_positions=16), (X,), {}, {}),
    "PositionwiseFeedForward": (layers.PositionwiseFeedForward, dict(d_ff=16), (X,), {}, {}),
    "EncoderLayer": (layers.EncoderLayer, dict(d_model=D, num_heads=2, d_ff=16), (X,), {},
                     dict(SCORES, keras_mask=(0, "padding_mask"))),
    "DecoderLayer": (layers.DecoderLayer, dict(d_model=D, num_heads=2, d_ff=16), (X, MEMORY),
                     {}, dict(SCORES, keras_mask=(1, "memory_padding_mask"))),
    # The stacks: one layer each (the contract's checks trace, save and fit the whole
    # stack; two layers only double that), pre-norm (their final LayerNorm; a pre-norm
    # EncoderLayer's contract is checked inside the Encoder's).
    "Encoder-prenorm": (layers.Encoder, dict(num_layers=1, d_model=D, num_heads=2, d_ff=16,
                                             norm_first=True), (X,), {},
                        dict(SCORES, keras_mask=(0, "padding_mask"))),
    "Decoder": (layers.Decoder, dict(num_layers=1, d_model=D, num_heads=2, d_ff=16,
                                     norm_first=True), (X, MEMORY), {},
                dict(SCORES, keras_mask=(1, "memory_padding_mask"))),
}


@pytest.mark.parametrize("name", sorted(CONTRACT_CASES))
def test_layer_contract(name):
    cls, kwargs, inputs, call_kwargs, options = CONTRACT_CASES[name]
    run_layer_test(cls, kwargs, inputs, expected_shape=(B, T, D), call_kwargs=call_kwargs,
                   **options)


def test_shared_embedding_contract():
    ids = RNG.integers(1, 20, size=(B, T)).astype("int32")
    layer, out = run_layer_test(layers.SharedEmbedding, dict(vocab_size=20, d_model=D), (ids,),
                                expected_shape=(B, T, D))
    logits = layer.logits(out)
    assert logits.shape == (B, T, 20) and logits.dtype == tf.float32
    # §3.4: embeddings are the weights times sqrt(d_model), and the same matrix projects back.
    np.testing.assert_allclose(out.numpy(), layer.embeddings.numpy()[ids] * np.sqrt(D), rtol=1e-6)
    np.testing.assert_allclose(logits.numpy(), out.numpy() @ layer.embeddings.numpy().T,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["MultiHeadAttention", "DecoderLayer", "Encoder-prenorm"])
def test_built_inside_mirrored_strategy(name):
    cls, kwargs, inputs, call_kwargs, _ = CONTRACT_CASES[name]
    out = build_under_strategy(lambda: cls(**kwargs), inputs, strategy_over(2), call_kwargs)
    assert out.shape == (B, T, D)


# --- §3.5 positional encoding -------------------------------------------------------------

def test_positional_encoding_known_values():
    pe = layers.PositionalEncoding()(tf.zeros((1, 3, 4)))[0].numpy()
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1], atol=1e-7)
    np.testing.assert_allclose(pe[1], [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)],
                               rtol=1e-6)


def test_positional_encoding_adds_only_the_encoding_and_honours_the_offset():
    x = tf.constant(RNG.normal(size=(2, 6, 16)).astype("float32"))
    layer = layers.PositionalEncoding()
    full = layer(x).numpy()
    table = layers.sinusoidal_encoding(tf.range(6), 16).numpy()
    np.testing.assert_allclose(full, x.numpy() + table[None], rtol=1e-6)  # no scaling
    np.testing.assert_allclose(layer(x[:, 4:], start_index=4).numpy(), full[:, 4:], rtol=1e-6)
    # Interleaved: even dims are sines, odd dims cosines of the same angle.
    angle = 3 / 10000 ** (2 * 2 / 16)
    np.testing.assert_allclose(table[3, 4:6], [np.sin(angle), np.cos(angle)], rtol=1e-5)


def test_positional_encoding_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sinusoidal.*learned"):
        layers.PositionalEncoding(kind="rotary")
    with pytest.raises(ValueError, match="even d_model"):
        layers.PositionalEncoding()(tf.zeros((1, 2, 5)))


# --- §3.2 attention --------------------------------------------------------------------

def _keras_mha_with_our_weights(ours, num_heads, d_model):
    """A keras.layers.MultiHeadAttention holding `ours`' weights (reshaped per head)."""
    k = d_model // num_heads
    theirs = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=k)
    theirs(X, MEMORY)
    weights = []
    for name in ("query", "key", "value"):
        weights += [getattr(ours, f"{name}_kernel").numpy().reshape(d_model, num_heads, k),
                    getattr(ours, f"{name}_bias").numpy().reshape(num_heads, k)]
    weights += [ours.output_kernel.numpy().reshape(num_heads, k, d_model),
                ours.output_bias.numpy()]
    theirs.set_weights(weights)
    return theirs


def test_attention_equals_keras_multi_head_attention():
    ours = layers.MultiHeadAttention(num_heads=2)
    mask = np.tril(np.ones((T, S), bool))[None] & SOURCE_MASK[:, None, :]  # (B, T, S)
    out, weights = ours(X, MEMORY, attention_mask=tf.constant(mask),
                        return_attention_scores=True)
    theirs = _keras_mha_with_our_weights(ours, 2, D)
    ref, ref_weights = theirs(X, MEMORY, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights.numpy(), ref_weights.numpy(), rtol=1e-5, atol=1e-6)
    # Padding mask and attention mask are one convention: combining them is the same.
    both = ours(X, MEMORY, padding_mask=tf.constant(SOURCE_MASK),
                attention_mask=tf.constant(np.tril(np.ones((T, S), bool))[None]))
    np.testing.assert_allclose(both.numpy(), out.numpy(), rtol=1e-6, atol=1e-6)


def test_keras_masks_act_as_in_keras_multi_head_attention():
    """Keras masks on query and value (Masking in front): the real query rows equal
    keras.layers.MultiHeadAttention's, and the query's mask is the output's."""
    ours = layers.MultiHeadAttention(num_heads=2)
    query = X * np.array([[1] * T, [1, 1, 0, 0]], "float32")[..., None]
    value = MEMORY * SOURCE_MASK[..., None].astype("float32")
    masking = keras.layers.Masking()
    out = ours(masking(query), masking(value))
    theirs = _keras_mha_with_our_weights(ours, 2, D)
    ref = theirs(masking(query), masking(value))
    np.testing.assert_allclose(out.numpy()[0], ref.numpy()[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.numpy()[1, :2], ref.numpy()[1, :2], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out._keras_mask, [[True] * T, [True, True, False, False]])


def test_attention_weights_respect_literal_mask():
    ours = layers.MultiHeadAttention(num_heads=2)
    _, weights = ours(X, MEMORY, padding_mask=tf.constant(SOURCE_MASK),
                      return_attention_scores=True)
    assert weights.dtype == tf.float32
    np.testing.assert_array_equal(weights.numpy()[1, :, :, 3:], 0.0)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_masked_attention_stays_finite_in_half_precision(policy):
    keras.mixed_precision.set_global_policy(policy)
    ours = layers.MultiHeadAttention(num_heads=2)
    all_masked = np.zeros((B, S), bool)  # a fully masked row must not give NaN
    out, weights = ours(X * 1e3, MEMORY * 1e3, padding_mask=tf.constant(all_masked),
                        return_attention_scores=True)
    assert out.dtype == keras.mixed_precision.global_policy().compute_dtype
    assert weights.dtype == tf.float32  # softmax in float32
    assert np.isfinite(out.numpy().astype("float32")).all()
    assert np.isfinite(weights.numpy()).all()


def test_attention_validates_masks():
    ours = layers.MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        ours(X, MEMORY, padding_mask=tf.ones((B, T, S), bool))
    with pytest.raises(ValueError, match="bool"):
        ours(X, MEMORY, attention_mask=tf.ones((B, T, S)))
    with pytest.raises(ValueError, match="divisible"):
        layers.MultiHeadAttention(num_heads=3)(X, X)


def test_attention_cache_equals_full_self_attention():
    ours = layers.MultiHeadAttention(num_heads=2)
    causal = layers.causal_mask(T)[None]
    full = ours(X, X, attention_mask=causal).numpy()
    cache = {"key": tf.zeros((B, 2, T, D // 2)), "value": tf.zeros((B, 2, T, D // 2))}
    rows = []
    for t in range(T):
        visible = (tf.range(T) <= t)[None, None, :]
        row, cache = ours.call_cached(X[:, t:t + 1], cache, t, attention_mask=visible)
        rows.append(row.numpy())
    np.testing.assert_allclose(np.concatenate(rows, 1), full, rtol=1e-5, atol=1e-6)


def test_growing_attention_cache_equals_full_self_attention():
    ours = layers.MultiHeadAttention(num_heads=2)
    full = ours(X, X, attention_mask=layers.causal_mask(T)[None]).numpy()
    cache = {"key": tf.zeros((B, 2, 0, D // 2)), "value": tf.zeros((B, 2, 0, D // 2))}
    rows = []
    for t in range(T):
        row, cache = ours.call_cached(X[:, t:t + 1], cache, t, static_cache=False)
        assert cache["key"].shape[2] == t + 1
        rows.append(row.numpy())
    np.testing.assert_allclose(np.concatenate(rows, 1), full, rtol=1e-5, atol=1e-6)


def test_cross_attention_cache_serves_several_query_rows_per_memory_row():
    """Beams share their sentence's memory: R query rows per cache row equal a tiled cache."""
    ours = layers.MultiHeadAttention(num_heads=2)
    memory = tf.random.stateless_normal((B, 5, D), seed=[1, 2])
    mask = tf.constant([[True] * 5, [True, True, True, False, False]])[:B]
    repeats = 3
    queries = tf.random.stateless_normal((B * repeats, 2, D), seed=[3, 4])
    ours(queries[:B], memory)  # build
    shared = ours.project_key_value(memory)
    tiled = tf.nest.map_structure(lambda t: tf.repeat(t, repeats, axis=0), shared)
    got, same = ours.call_cached(queries, shared, padding_mask=mask, beams=repeats)
    want, _ = ours.call_cached(queries, tiled, padding_mask=tf.repeat(mask, repeats, axis=0))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert same is shared  # a fixed cache comes back unchanged
    # The beams are explicit: rows that are not cache rows * beams are refused, not folded.
    with pytest.raises(ValueError, match="beams"):
        ours.call_cached(queries, shared, padding_mask=mask)
    with pytest.raises(ValueError, match="beams"):
        ours.call_cached(queries, shared, cache_index=0, beams=repeats)


def test_matmul_last_is_one_2d_gemm_equal_to_broadcast_matmul():
    from tfxformer.layers.ops import matmul_last

    x = tf.random.stateless_normal((3, 4, 6), seed=[5, 6])
    w = tf.random.stateless_normal((6, 7), seed=[7, 8])
    np.testing.assert_allclose(matmul_last(x, w), tf.matmul(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(matmul_last(x, tf.transpose(w), transpose_b=True),
                               tf.matmul(x, w), rtol=1e-5, atol=1e-5)
    graph = tf.function(lambda a: matmul_last(a, w)).get_concrete_function(
        tf.TensorSpec((None, None, 6))).graph
    ops = {op.type for op in graph.get_operations()}
    assert "MatMul" in ops and not ops & {"BatchMatMulV2", "BatchMatMulV3"}
    assert matmul_last(x, w).shape == (3, 4, 7)
    step = x[:, :1]  # one decoding step per row: the batched form, same numbers
    np.testing.assert_allclose(matmul_last(step, tf.transpose(w), transpose_b=True),
                               tf.matmul(step, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, r", [(7, 2), (8, 4), (5, 9)])
def test_restricted_attention_blocked_equals_band_masked_full_attention(n, r):
    """window=r in O(r n d) equals full attention masked to |i - j| <= r (§4, Table 1)."""
    restricted = layers.MultiHeadAttention(num_heads=2, window=r)
    x = tf.random.stateless_normal((2, n, D), seed=[n, r])
    padding = tf.sequence_mask([n, n - 2], n)
    got = restricted(x, x, padding_mask=padding)
    full = layers.MultiHeadAttention.from_config(
        {**restricted.get_config(), "window": None})
    full(x, x)
    full.set_weights(restricted.get_weights())
    band = (tf.abs(tf.range(n)[:, None] - tf.range(n)[None, :]) <= r)[None]
    want = full(x, x, padding_mask=padding, attention_mask=band)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The dense band path (taken when weights are asked for) agrees, and masks the far keys.
    dense, weights = restricted(x, x, padding_mask=padding, return_attention_scores=True)
    np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-5)
    assert np.all(weights.numpy()[:, :, ~band.numpy()[0]] < 1e-6)
    assert restricted.get_config()["window"] == r


def test_restricted_attention_rejects_bad_window():
    with pytest.raises(ValueError, match="window.*>= 1.*0"):
        layers.MultiHeadAttention(num_heads=2, window=0)


def test_causal_mask_literal():
    np.testing.assert_array_equal(layers.causal_mask(3).numpy(),
                                  [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(layers.causal_mask(2, offset=1).numpy(),
                                  [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(layers.padding_mask(tf.constant([[4, 0, 2, 0]])).numpy(),
                                  [[True, False, True, False]])


def test_feed_forward_is_relu_mlp_applied_per_position():
    ffn = layers.PositionwiseFeedForward(d_ff=16)
    out = ffn(X).numpy()
    w1, b1, w2, b2 = [w.numpy() for w in ffn.weights]
    np.testing.assert_allclose(out, np.maximum(0, X @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-5)


def test_post_norm_and_pre_norm_differ_as_the_paper_says():
    post = layers.EncoderLayer(d_model=D, num_heads=2, d_ff=16, dropout=0.0)
    out = post(X).numpy()
    # Post-norm ends with LayerNorm: every position has mean 0, variance 1 (gamma=1, beta=0).
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-3)
    pre = layers.EncoderLayer(d_model=D, num_heads=2, d_ff=16, dropout=0.0, norm_first=True)
    assert not np.allclose(pre(X).numpy().var(-1), 1, atol=1e-3)


# --- Keras workflows: masks, functional API, declared dtypes ------------------------

def test_embedding_mask_zero_then_encoder_layer_equals_the_explicitly_masked_call():
    ids = np.array([[5, 6, 7, 8, 9], [4, 3, 2, 0, 0]], "int32")
    embedding = keras.layers.Embedding(20, D, mask_zero=True)
    encoder = layers.EncoderLayer(d_model=D, num_heads=2, d_ff=16)
    source = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(source, encoder(embedding(source)))
    want = encoder(embedding(ids), padding_mask=tf.constant(ids != 0))
    np.testing.assert_allclose(model(ids).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    unmasked = encoder(tf.convert_to_tensor(embedding.embeddings.numpy()[ids]))
    assert not np.allclose(unmasked.numpy()[1, :3], want.numpy()[1, :3], atol=1e-3)


def test_functional_model_with_attention_scores():
    x = keras.Input(shape=(T, D))
    memory = keras.Input(shape=(S, D))
    out, weights = layers.MultiHeadAttention(num_heads=2)(x, memory, return_attention_scores=True)
    decoded, decoder_weights = layers.Decoder(2, d_model=D, num_heads=2, d_ff=16)(
        out, memory, return_attention_scores=True)
    model = keras.Model([x, memory], [decoded, weights, decoder_weights[1]["cross"]])
    got = model([X, MEMORY])
    assert [tuple(t.shape) for t in got] == [(B, T, D), (B, 2, T, S), (B, 2, T, S)]
    assert [t.dtype for t in model.outputs] == ["float32"] * 3


def test_configs_hold_constructor_arguments_only():
    mha, ffn = layers.MultiHeadAttention(num_heads=2), layers.PositionwiseFeedForward(d_ff=16)
    before = mha.get_config(), ffn.get_config()
    mha(X, X), ffn(X)
    assert (mha.get_config(), ffn.get_config()) == before
    assert before[0]["d_model"] is None and before[1]["d_model"] is None
    # The old key of the position table size still loads.
    old = {**layers.PositionalEncoding(kind="learned").get_config(), "max_length": 7}
    del old["max_positions"]
    assert layers.PositionalEncoding.from_config(old).max_positions == 7


def test_encoder_and_decoder_share_one_stack_base_and_its_defaults():
    enc = layers.Encoder(1, d_model=D, num_heads=2, d_ff=16)
    dec = layers.Decoder(1, d_model=D, num_heads=2, d_ff=16, dropout=0.2)
    assert isinstance(enc, layers.LayerStack) and isinstance(dec, layers.LayerStack)
    assert enc.get_config()["dropout"] == 0.1 and dec.get_config()["dropout"] == 0.2
    assert dec.layer_0.get_config()["dropout"] == 0.2
    with pytest.raises(ValueError, match="num_layers.*0"):
        layers.Encoder(0, d_model=D, num_heads=2, d_ff=16)


@pytest.mark.parametrize("cls, kwargs", [
    (layers.DecoderLayer, dict(d_model=D, num_heads=2, d_ff=16)),
    (layers.Decoder, dict(num_layers=2, d_model=D, num_heads=2, d_ff=16, norm_first=True))])
def test_multi_input_layers_build_by_input_names(cls, kwargs):
    """Keras 3 (and keras-hub's layer harness) build a multi-input layer by the names of
    its call arguments, `build(x_shape=..., memory_shape=...)`; the positional form stays."""
    by_name = cls(**kwargs)
    by_name.build(x_shape=(B, T, D), memory_shape=(B, S, D))
    positional = cls(**kwargs)
    positional.build((B, T, D))
    assert by_name.built and positional.built
    def paths(layer):  # below the layer's own (auto-numbered) name
        return [w.path.split("/", 1)[1] for w in layer.weights]

    assert paths(by_name) == paths(positional)
    assert [w.shape for w in by_name.weights] == [w.shape for w in positional.weights]
    assert by_name(X, MEMORY).shape == (B, T, D)
    with pytest.raises(ValueError, match=r"`memory_shape` must be \(B, S, 8\).*got \(2, 5, 9\)"):
        cls(**kwargs).build(x_shape=(B, T, D), memory_shape=(B, S, D + 1))
