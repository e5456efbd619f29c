"""tfxformer.Transformer (§3, Figure 1): presets, causality, padding, cache, saving, fit."""

import json
import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

import tfxformer
from tfxformer import Transformer

VOCAB = 64
SOURCE = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], "int32")
TARGET = np.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]], "int32")


def _tiny(**overrides):
    return Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, **overrides)


@pytest.mark.parametrize("preset, paper_millions", [("base", 65), ("big", 213)])
def test_preset_parameter_counts_match_table_3(preset, paper_millions):
    model = Transformer.from_preset(preset, vocab_size=37000)
    model.build()
    count = model.count_params()
    assert abs(count / (paper_millions * 1e6) - 1) < 0.05, count


def test_presets_are_table_3():
    base, big = tfxformer.get_preset("base"), tfxformer.get_preset("big")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads,
            base.dropout) == (6, 512, 2048, 8, 0.1)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads,
            big.dropout) == (6, 1024, 4096, 16, 0.3)
    assert base.norm_first is False and base.position_embedding == "sinusoidal"
    assert base == tfxformer.ModelConfig()  # the defaults are the base model
    defaults = Transformer(vocab_size=10).get_config()
    assert {k: defaults[k] for k in base.to_dict()} == base.replace(vocab_size=10).to_dict()


def test_model_config_round_trips_and_names_bad_settings():
    config = tfxformer.get_preset("tiny", vocab_size=VOCAB, norm_first=True)
    assert tfxformer.ModelConfig.from_dict(config.to_dict()) == config
    model = Transformer(config)
    assert model.model_config == config
    assert Transformer.from_config(model.get_config()).model_config == config
    assert Transformer(config, d_model=64).model_config == config.replace(d_model=64)
    with pytest.raises(ValueError, match="`num_layers` must be an integer >= 1, got 0"):
        config.replace(num_layers=0)
    with pytest.raises(ValueError, match="`dropout` must be a number in \\[0.0, 1.0\\]"):
        tfxformer.ModelConfig(dropout=1.5)
    with pytest.raises(ValueError, match="position_embedding.*'rotary'.*accepted"):
        tfxformer.ModelConfig(position_embedding="rotary")


def test_unknown_preset_and_argument_are_named():
    with pytest.raises(ValueError, match="'huge'.*accepted presets.*base"):
        Transformer.from_preset("huge", vocab_size=10)
    with pytest.raises(ValueError, match="d_modle"):
        Transformer.from_preset("tiny", vocab_size=10, d_modle=8)


def test_call_returns_float32_logits():
    logits = _tiny()((SOURCE, TARGET))
    assert logits.shape == (2, 5, VOCAB) and logits.dtype == tf.float32


def test_causality_future_targets_never_change_past_logits():
    model = _tiny()
    logits = model((SOURCE, TARGET)).numpy()
    for t in range(TARGET.shape[1] - 1):
        changed = TARGET.copy()
        changed[:, t + 1:] = np.random.default_rng(t).integers(4, VOCAB, changed[:, t + 1:].shape)
        other = model((SOURCE, changed)).numpy()
        np.testing.assert_allclose(other[:, :t + 1], logits[:, :t + 1], rtol=1e-5, atol=1e-5)
        assert not np.allclose(other[:, t + 1:], logits[:, t + 1:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_appending_source_padding_changes_nothing(norm_first):
    model = _tiny(norm_first=norm_first)
    logits = model((SOURCE, TARGET)).numpy()
    padded = np.pad(SOURCE, [(0, 0), (0, 7)])
    np.testing.assert_allclose(model((padded, TARGET)).numpy(), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position_embedding", ["sinusoidal", "learned"])
def test_cached_step_by_step_logits_equal_teacher_forced(position_embedding):
    model = _tiny(position_embedding=position_embedding, max_positions=32)
    memory, source_mask = model.encode(SOURCE)
    teacher_forced = model.decode(TARGET, memory, source_mask).numpy()

    @tf.function  # the step runs as a graph, as the decoders use it
    def step(ids, cache, index):
        return model.decode_step(ids, source_mask, cache, index)

    cache = model.init_cache(memory, cache_length=8)
    steps = []
    for t in range(TARGET.shape[1]):
        logits, cache = step(TARGET[:, t:t + 1], cache, tf.constant(t))
        steps.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), teacher_forced, rtol=1e-4, atol=1e-4)


def test_shared_embedding_is_the_output_projection():
    model = _tiny()
    model.build()
    embeddings = [w for w in model.weights if "embeddings" in w.path]
    assert len(embeddings) == 1  # one matrix: source, target and pre-softmax (§3.4)


def test_config_round_trip_and_keras_file(tmp_path):
    model = _tiny(norm_first=True, position_embedding="learned", max_positions=16)
    logits = model((SOURCE, TARGET)).numpy()
    config = model.get_config()
    assert Transformer.from_config(config).get_config() == config
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is Transformer
    np.testing.assert_allclose(loaded((SOURCE, TARGET)).numpy(), logits, rtol=1e-6)


@pytest.mark.slow
def test_fit_lowers_the_loss_and_works_in_tf_function():
    model = Transformer.from_preset("tiny", vocab_size=VOCAB)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    labels = np.concatenate([TARGET[:, 1:], np.full((2, 1), 3, "int32")], 1)
    data = tf.data.Dataset.from_tensors(((SOURCE, TARGET), labels)).repeat(30)
    history = model.fit(data, epochs=1, verbose=0)
    # What model.evaluate returns on the batch, without compiling an evaluation step.
    after = float(model.loss(labels, model((SOURCE, TARGET), training=False)))
    assert np.isfinite(history.history["loss"][0]) and after < 3.0  # ln(64) = 4.16 untrained
    graph_logits = tf.function(lambda s, t: model((s, t)))(SOURCE, TARGET)
    np.testing.assert_allclose(graph_logits.numpy(), model((SOURCE, TARGET)).numpy(), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.slow
def test_built_and_trained_inside_mirrored_strategy():
    strategy = strategy_over(2)
    with strategy.scope():
        model = _tiny()
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensors(((SOURCE, TARGET), TARGET)).repeat(2)
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(isinstance(w.value, tf.distribute.DistributedValues) for w in model.weights)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_logits_float32(policy):
    keras.mixed_precision.set_global_policy(policy)
    model = _tiny()
    logits = model((SOURCE, TARGET))
    assert logits.dtype == tf.float32
    assert np.isfinite(logits.numpy()).all()
    memory, _ = model.encode(SOURCE)
    assert memory.dtype == keras.mixed_precision.global_policy().compute_dtype
    assert all(w.dtype == "float32" for w in model.weights)  # float32 master weights


def test_decode_step_always_returns_logits_and_cache_and_beams_share_the_memory():
    model = _tiny()
    memory, source_mask = model.encode(SOURCE)
    beams = 3
    ids = np.array([[2], [11], [12], [2], [15], [16]], "int32")  # (B * beams, 1)
    shared = model.init_cache(memory, cache_length=4, batch_size=2 * beams)
    out = model.decode_step(ids, source_mask, shared, 0, beams=beams)
    assert isinstance(out, tuple) and len(out) == 2
    logits, cache = out
    assert logits.shape == (2 * beams, 1, VOCAB) and logits.dtype == tf.float32
    tiled_memory = tf.repeat(memory, beams, axis=0)
    tiled = model.init_cache(tiled_memory, cache_length=4)
    want, _ = model.decode_step(ids, tf.repeat(source_mask, beams, axis=0), tiled, 0)
    np.testing.assert_allclose(logits.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert cache[0]["cross"]["key"].shape[0] == 2  # the memory stays one row per sentence
    with pytest.raises(ValueError, match="beams"):  # no silent folding of the beams
        model.decode_step(ids, source_mask, shared, 0)


def test_mixed_precision_functional_model_declares_the_real_dtype():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = _tiny()
    source = keras.Input(shape=(None,), dtype="int32")
    target = keras.Input(shape=(None,), dtype="int32")
    logits = model((source, target))
    assert logits.dtype == "float32" and tuple(logits.shape) == (None, None, VOCAB)
    functional = keras.Model([source, target], keras.layers.Softmax()(logits))
    assert functional((SOURCE, TARGET)).dtype == functional.outputs[0].dtype


def test_old_name_max_length_is_upgraded_when_a_config_is_read():
    config = _tiny(max_positions=40).get_config()
    assert config["max_positions"] == 40 and "max_length" not in config
    old = {**config, "max_length": 40}
    del old["max_positions"]
    assert Transformer.from_config(old).model_config.max_positions == 40
    assert Transformer.from_config({**config, "max_length": 40}).model_config.max_positions == 40
    with pytest.raises(ValueError, match="max_positions.*40.*max_length.*41.*give one"):
        Transformer.from_config({**config, "max_length": 41})
    with pytest.raises(ValueError, match="Unknown ModelConfig setting.*max_length"):
        Transformer.from_preset("tiny", vocab_size=VOCAB, max_length=48)


def test_checkpoint_written_by_the_old_layer_layout_restores():
    """tests/data/old_checkpoint was written with tf.train.Checkpoint(model=model) by the
    layers before the fixed-return calls and the one stack base; same variables, same logits."""
    folder = os.path.join(os.path.dirname(__file__), "data", "old_checkpoint")
    with open(os.path.join(folder, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    model = Transformer.from_config(expected["model"])  # holds the old key max_length
    model.build()
    checkpoint = tf.train.Checkpoint(model=model)
    path = os.path.join(folder, "ckpt")
    checkpoint.read(path).expect_partial().assert_existing_objects_matched()
    logits = model((np.array(expected["source"], "int32"), np.array(expected["target"], "int32")))
    np.testing.assert_allclose(logits.numpy(), expected["logits"], atol=1e-5)
    with tempfile.TemporaryDirectory() as tmp:
        written = checkpoint.write(os.path.join(tmp, "ckpt"))
        keys = sorted(name for name, _ in tf.train.list_variables(written))
    assert keys == expected["checkpoint_keys"]
