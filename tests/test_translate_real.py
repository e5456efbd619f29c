"""bench/translate_real.py without CTranslate2: the position table and the weight mapping."""

import importlib
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")


def _bench():
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module("translate_real")
    finally:
        sys.path.remove(BENCH)


def test_sinusoid_table_is_ours_interleaved():
    from tfxformer.layers.position import sinusoidal_encoding

    table = _bench().sinusoid_table(50, 16)
    np.testing.assert_allclose(table, sinusoidal_encoding(np.arange(50), 16).numpy(),
                               atol=1e-5)
    # interleaved, not CT2's built-in [sin | cos] halves: column 1 is cos(pos)
    np.testing.assert_allclose(table[:, 1], np.cos(np.arange(50)), atol=1e-5)


class _Seen(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.seen = set()

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)


def _spec_layer(decoder):
    def attention(n):
        return SimpleNamespace(linear=[SimpleNamespace() for _ in range(n)],
                               layer_norm=SimpleNamespace())

    layer = SimpleNamespace(self_attention=attention(2), ffn=SimpleNamespace(
        linear_0=SimpleNamespace(), linear_1=SimpleNamespace(), layer_norm=SimpleNamespace()))
    if decoder:
        layer.attention = attention(3)
    return layer


def test_every_weight_maps_to_the_ct2_spec(tiny_config):
    from tfxformer import Transformer

    # Keras paths start with the model's name; an unnamed one becomes "transformer_<n>"
    # once other tests have made models, so name it as the SavedModel's model is named.
    model = Transformer(tiny_config, name="transformer")
    model.build()
    weights = _Seen({w.path: w.numpy() for w in model.weights})
    d, layers = tiny_config.d_model, tiny_config.num_layers
    bench = _bench()
    specs = {}
    for kind, norm in (("encoder", "attention_block"), ("decoder", "self_attention_block")):
        for i in range(layers):
            specs[kind, i] = spec = _spec_layer(kind == "decoder")
            bench.set_ct2_layer(spec, weights, f"transformer/{kind}/layer_{i}", norm, kind)
    assert set(weights) - weights.seen == {"transformer/shared_embedding/embeddings"}
    qkv = specs["encoder", 0].self_attention.linear[0].weight
    assert qkv.shape == (3 * d, d)
    np.testing.assert_array_equal(
        qkv[d: 2 * d], weights["transformer/encoder/layer_0/self_attention/key_kernel"].T)
    kv = specs["decoder", 1].attention.linear[1]
    assert kv.weight.shape == (2 * d, d) and kv.bias.shape == (2 * d,)
    assert specs["decoder", 0].ffn.linear_0.weight.shape == (tiny_config.d_ff, d)


def test_calls_are_length_sorted_chunks_and_outputs_come_back_in_input_order():
    bench = _bench()
    lengths = [5, 1, 4, 2, 3]
    chunks = bench.length_chunks(lengths, 2)
    assert chunks == [[1, 3], [4, 2], [0]]
    texts = [f"s{i}" for i in range(len(lengths))]
    for workers in (1, 2):
        out = bench.run_calls(lambda rows: [texts[i].upper() for i in rows], chunks, workers)
        assert out == ["S0", "S1", "S2", "S3", "S4"]


def test_modes_and_batch_sizes_are_checked():
    bench = _bench()
    args = bench.parse_args(["--systems", "tfxformer-fp32", "--modes", "concurrent",
                             "--batch-sizes", "16", "64"])
    assert args.modes == ["concurrent"] and args.batch_sizes == [16, 64]
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--systems", "tfxformer-fp32", "--batch-sizes", "0"])
    assert exit_.value.code == 2
