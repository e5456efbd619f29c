"""tfxformer.serving.reranking: n-best reranking inside the translator's graph."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer, rerank
from tfxformer.rundir import RunRecord
from tfxformer.serving import Translator
from tfxformer.serving.reranking import (
    OWN_WEIGHTS,
    RerankingTranslator,
    Rescorer,
    check_weights,
    choose,
    role_of,
)
from tfxformer.serving.scoring import PairScore

TEXTS = ["A dog runs.", "", "Two men sit on a bench in the park."]
OPTIONS = dict(beam_size=3, extra_length=5, max_batch_size=2)


def _tiny(seed):
    tf.random.set_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=48)
    model.build()
    return model


@pytest.fixture(scope="module")
def models():
    return _tiny(11), _tiny(12)


@pytest.mark.slow  # traces three beam searches (a minute or more on 2 busy cores)
def test_the_graph_picks_what_the_python_reranker_picks(models, spm_model):
    forward, backward = models
    channel = Translator(backward, spm_model, max_batch_size=2)
    weights = dict(forward=1.0, channel=0.3, length=-0.2)
    translator = RerankingTranslator(
        forward, spm_model, [Rescorer(channel, "channel", False, weights["channel"])],
        forward_weight=weights["forward"], length_weight=weights["length"], **OPTIONS)
    got = translator(tf.constant(TEXTS))
    lists = tf.function(lambda text: translator.nbest(text, 3, translator.alpha, 5, 48, 3),
                        autograph=False)(tf.constant(TEXTS))
    rows = zip(lists["translations"].numpy(), lists["scores"].numpy(), strict=True)
    candidates = [[rerank.Candidate(t.decode(), float(s))
                   for t, s in zip(row_t, row_s, strict=True) if np.isfinite(s)]
                  for row_t, row_s in rows]

    def channel_fn(sources, targets):
        out = channel.score(tf.constant(sources), tf.constant(targets))
        return [PairScore(float(v), 0.0, [], False) for v in out["log_prob"].numpy()]

    want = rerank.rerank(candidates, TEXTS, {
        "forward": rerank.forward_score(), "length": rerank.length_score(),
        "channel": rerank.model_score(channel_fn, "channel")}, weights)
    assert [t.decode() for t in got["translation"].numpy()] == want.best
    assert got["translation"].numpy()[1] == b""
    # Forward alone is the plain translator's output.
    plain = Translator(forward, spm_model, **OPTIONS)(tf.constant(TEXTS))
    alone = RerankingTranslator(forward, spm_model, [], **OPTIONS)(tf.constant(TEXTS))
    np.testing.assert_array_equal(alone["translation"].numpy(), plain["translation"].numpy())
    np.testing.assert_allclose(alone["score"].numpy(), plain["score"].numpy(), rtol=1e-5)


def test_roles_and_weights_are_checked(models):
    record = RunRecord(models[0].model_config, "en", "de")
    assert role_of(record, RunRecord(models[0].model_config, "de", "en")) == "channel"
    assert role_of(record, RunRecord(models[0].model_config, "en", "de",
                                     train={"reverse_target": True})) == "right_to_left"
    assert role_of(record, RunRecord(models[0].model_config, "en", "de")) == "forward_model"
    with pytest.raises(ValueError, match="translates en->fr"):
        role_of(record, RunRecord(models[0].model_config, "en", "fr"))
    check_weights({"forward": 1, "channel_mean": 0.5}, ["channel"])
    with pytest.raises(ValueError, match="right_to_left.*name no score"):
        check_weights({"right_to_left": 1}, ["channel"])
    with pytest.raises(ValueError, match="channel model has no weight"):
        check_weights({"forward": 1}, ["channel"])


def test_the_graph_and_python_rerankers_share_one_formula():
    """The same features and weights give the same combined scores and the same choice
    in the graph (choose, on tensors) and in Python (rerank.combine), non-finite scores
    included: NaN, +inf and -inf never win; a list with none finite gives its first."""
    inf, nan = float("inf"), float("nan")
    forward = [[-0.5, -0.2, -0.9], [nan, -1.0, -2.0], [-inf, -0.1, -0.3],
               [-1.0, -1.0, -3.0], [nan, -inf, inf], [-0.4, -0.4, -0.4]]
    channel = [[-3.0, -9.0, -1.0], [-1.0, -inf, -2.0], [-1.0, -2.0, -3.0],
               [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0], [-inf, inf, -2.0]]
    length = [[3.0, 4.0, 2.0], [2.0, 2.0, 5.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0],
              [2.0, 2.0, 2.0], [1.0, 2.0, 3.0]]
    features = {"forward": forward, "channel": channel, "length": length}
    for weights in ({"forward": 1.0}, {"forward": 1.0, "channel": 0.5, "length": -0.1},
                    {"forward": 0.0, "channel": 1.0}, {"channel": -1.0, "length": 0.2}):
        index, scores = rerank.combine(features, weights)
        combined, best = tf.function(lambda f, w=weights: choose(f, w), autograph=False)(
            {name: tf.constant(values, tf.float32) for name, values in features.items()})
        assert best.numpy().tolist() == index, weights
        np.testing.assert_allclose(combined.numpy(), np.array(scores, np.float32),
                                   rtol=1e-6)
    # The rule, spelled out for one weighting.
    assert rerank.combine(features, {"forward": 1.0})[0] == [1, 1, 1, 0, 0, 0]
    # A slot with no candidate never wins over one that is there, even a NaN one.
    exists = tf.constant([[True, True, False]])
    _, best = choose({"forward": tf.constant([[nan, -5.0, 0.0]])}, {"forward": 1.0},
                     exists)
    assert best.numpy().tolist() == [1]
    _, best = choose({"forward": tf.constant([[nan, nan, 0.0]])}, {"forward": 1.0}, exists)
    assert best.numpy().tolist() == [0]


def test_the_weight_names_are_one_table():
    assert OWN_WEIGHTS == ("forward", "length")
    assert set(rerank.GRAPH_WEIGHTS) == set(OWN_WEIGHTS) | {
        name for role in ("channel", "right_to_left", "forward_model")
        for name in rerank.role_weights(role)}
    assert rerank.role_weights("channel") == ("channel", "channel_mean")
