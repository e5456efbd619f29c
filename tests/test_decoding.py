"""tfxformer.decoding: greedy and beam search (§6.1) on the key/value cache."""

import itertools
import math

import decoding_reference as reference
import keras
import numpy as np
import pytest
import tensorflow as tf
from support.decoding import PENALTY_TABLE, VOCAB, A, B, BigramStub, hypothesis_ids

from tfxformer import Transformer
from tfxformer.decoding import (
    BOS_ID,
    EOS_ID,
    beam_search,
    greedy_decode,
    greedy_search,
    length_penalty,
    sequence_beam_search,
)
from tfxformer.decoding.common import next_token_log_probs

SOURCE = tf.constant([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 3, 0, 0, 0, 0]])


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(7)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    model.build()
    return model


def test_beam_one_with_alpha_zero_equals_greedy(model):
    greedy = greedy_decode(model, SOURCE, extra_length=6)
    beam = beam_search(model, SOURCE, beam_size=1, alpha=0.0, extra_length=6)
    assert hypothesis_ids(beam.ids[:, 0], beam.lengths[:, 0]) == hypothesis_ids(greedy.ids,
                                                                         greedy.lengths)
    np.testing.assert_allclose(beam.scores[:, 0], greedy.scores, rtol=1e-5)


def test_cached_greedy_equals_uncached_decoding(model):
    """The cache loop gives what re-running decode on the growing prefix gives."""
    cached = greedy_decode(model, SOURCE, extra_length=6)
    memory, mask = model.encode(SOURCE)
    prefix = tf.fill([SOURCE.shape[0], 1], BOS_ID)
    scores = np.zeros(SOURCE.shape[0])
    done = np.zeros(SOURCE.shape[0], bool)
    limits = np.sum(SOURCE.numpy() != 0, axis=1) + 6
    for step in range(cached.ids.shape[1]):
        log_probs = next_token_log_probs(model.decode(prefix, memory, mask)[:, -1]).numpy()
        token = log_probs.argmax(axis=-1)
        scores += np.where(done, 0.0, log_probs[np.arange(len(token)), token])
        token = np.where(done, 0, token)
        done |= (token == EOS_ID) | (step + 1 >= limits)
        prefix = tf.concat([prefix, tf.constant(token[:, None], tf.int32)], axis=1)
    np.testing.assert_array_equal(cached.ids, prefix[:, 1:])
    np.testing.assert_allclose(cached.scores, scores, rtol=1e-4)


def _teacher_forced_score(model, source, hypothesis, alpha):
    """log P(hypothesis | source) / lp, by one teacher-forced decode (no cache)."""
    memory, mask = model.encode(tf.constant([source]))
    inputs = tf.constant([[BOS_ID] + hypothesis[:-1]])
    log_probs = tf.nn.log_softmax(model.decode(inputs, memory, mask)[0]).numpy()
    total = sum(log_probs[t, token] for t, token in enumerate(hypothesis))
    return total / length_penalty(len(hypothesis), alpha).numpy()


def test_beam_scores_equal_teacher_forced_rescoring(model):
    """Each n-best score is the model's own: the self-attention caches followed their
    hypotheses through the reorders, and each sentence saw its own tiled memory."""
    out = beam_search(model, SOURCE, beam_size=3, alpha=0.6, extra_length=5)
    assert out.ids.shape[:2] == (3, 3)
    for b, source in enumerate(SOURCE.numpy()):
        source = source[source != 0].tolist()
        hypotheses = hypothesis_ids(out.ids[b], out.lengths[b])
        assert len({tuple(h) for h in hypotheses}) == 3
        scores = out.scores[b].numpy()
        assert np.all(np.diff(scores) <= 0), scores  # best first
        for hypothesis, score in zip(hypotheses, scores, strict=True):
            assert len(hypothesis) <= len(source) + 5
            expected = _teacher_forced_score(model, source, hypothesis, 0.6)
            np.testing.assert_allclose(score, expected, rtol=1e-4)


def test_forced_logits_yield_the_known_sequence():
    stub = BigramStub({BOS_ID: {4: 0.9, 3: 0.1}, 4: {5: 0.9, 3: 0.1}, 5: {6: 0.9, 3: 0.1},
                       6: {7: 0.9, 3: 0.1}, 7: {EOS_ID: 1.0}})
    source = tf.constant([[4, 4, 3]])
    greedy = greedy_search(stub.start(source))
    assert hypothesis_ids(greedy.ids, greedy.lengths) == [[4, 5, 6, 7, EOS_ID]]
    # the exact rule: "finished" would stop once 3 short hypotheses had ended
    beam = sequence_beam_search(stub.start(source, beams=3), beam_size=3, alpha=0.6,
                                stopping="bound")
    assert hypothesis_ids(beam.ids[:, 0], beam.lengths[:, 0]) == [[4, 5, 6, 7, EOS_ID]]
    expected = 4 * math.log(0.9) / ((5 + 5) / 6) ** 0.6
    np.testing.assert_allclose(beam.scores[0, 0], expected, rtol=1e-5)


def _exhaustive_best(table, alpha, limit):
    """argmax over every hypothesis of log P / ((5 + |Y|) / 6)^α, by enumeration."""
    best = (-math.inf, None)
    for length in range(1, limit + 1):
        for tokens in itertools.product([EOS_ID, A, B], repeat=length):
            if EOS_ID in tokens[:-1] or (length < limit and tokens[-1] != EOS_ID):
                continue
            prev, log_p = BOS_ID, 0.0
            for token in tokens:
                log_p += math.log(table.get(prev, {}).get(token, 1e-12))
                prev = token
            best = max(best, (log_p / ((5 + length) / 6) ** alpha, list(tokens)))
    return best


@pytest.mark.parametrize("alpha, expected", [(0.0, [EOS_ID]), (1.0, [A, EOS_ID])])
def test_length_penalty_changes_the_choice_as_the_formula_says(alpha, expected):
    """α = 0: [EOS] (log 0.3) beats [a, EOS] (log 0.27). α = 1: lp(1) = 1, lp(2) = 7/6, so
    [a, EOS] scores log(0.27) * 6/7 = -1.122 > log(0.3) = -1.204 and wins."""
    limit = 5
    score, best = _exhaustive_best(PENALTY_TABLE, alpha, limit)
    assert best == expected
    stub = BigramStub(PENALTY_TABLE)
    out = sequence_beam_search(stub.start([[A, EOS_ID]], beams=4, extra_length=limit - 2),
                               beam_size=4, alpha=alpha)
    assert hypothesis_ids(out.ids[:, 0], out.lengths[:, 0]) == [expected]
    np.testing.assert_allclose(out.scores[0, 0], score, rtol=1e-5)


def test_beam_search_stops_early_when_no_alive_hypothesis_can_win():
    """BOS -> EOS 0.6 | a 0.4; a -> EOS 0.5 | a 0.5. With beam 2 and α = 0, after step 3
    the best alive (0.4 · 0.5²) is below the worst finished ([a, EOS], 0.2): stop."""
    stub = BigramStub({BOS_ID: {EOS_ID: 0.6, A: 0.4}, A: {EOS_ID: 0.5, A: 0.5}})
    out = sequence_beam_search(stub.start([[A] * 10 + [EOS_ID]], beams=2), beam_size=2,
                               alpha=0.0, stopping="bound")
    assert hypothesis_ids(out.ids[0], out.lengths[0]) == [[EOS_ID], [A, EOS_ID]]
    assert stub.steps == 3  # the limit is 11 + 50 tokens


def test_lengths_are_limited_by_source_plus_extra_and_by_positions(model):
    out = beam_search(model, SOURCE, beam_size=2, extra_length=2)
    limits = np.sum(SOURCE.numpy() != 0, axis=1) + 2
    assert np.all(out.lengths.numpy() <= limits[:, None])
    capped = greedy_decode(model, SOURCE, extra_length=100)  # model max_length = 32
    assert capped.ids.shape[1] == 32 and np.all(capped.lengths <= 32)


def test_empty_batch(model):
    empty = tf.zeros([0, 3], tf.int32)
    assert beam_search(model, empty, beam_size=2).ids.shape[:2] == (0, 2)
    assert greedy_decode(model, empty).ids.shape[0] == 0


def test_graph_mode_with_tensor_options_equals_eager(model):
    search = tf.function(lambda s, k, a, e: beam_search(model, s, k, a, e))
    graph = search(SOURCE, tf.constant(2), tf.constant(0.6), tf.constant(3))
    eager = beam_search(model, SOURCE, beam_size=2, alpha=0.6, extra_length=3)
    np.testing.assert_array_equal(graph.ids, eager.ids)
    np.testing.assert_allclose(graph.scores, eager.scores, rtol=1e-5)


def test_decoders_compile_with_xla():
    """No Python loop per token and static loop shapes: the decoders jit-compile."""
    stub = BigramStub(PENALTY_TABLE)
    source = tf.constant([[A, A, EOS_ID], [A, EOS_ID, 0]])
    compiled = tf.function(
        lambda s: sequence_beam_search(stub.start(s, beams=3, static_cache=True), 3, 1.0,
                                       static_cache=True),
        jit_compile=True)(source)
    eager = sequence_beam_search(stub.start(source, beams=3), beam_size=3, alpha=1.0)
    np.testing.assert_array_equal(compiled.ids, eager.ids)
    greedy = tf.function(lambda s: greedy_search(stub.start(s), static_cache=True),
                         jit_compile=True)(source)
    np.testing.assert_array_equal(greedy.ids, greedy_search(stub.start(source)).ids)


def test_transformer_cache_compiles_with_xla(model):
    compiled = tf.function(lambda s: greedy_decode(model, s, extra_length=2, static_cache=True),
                           jit_compile=True)(SOURCE)
    np.testing.assert_array_equal(compiled.ids, greedy_decode(model, SOURCE, extra_length=2).ids)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_growing_and_static_caches_decode_alike(model, beam_size):
    """The default growing cache and the fixed-size one (XLA's) give the same search."""
    grow = beam_search(model, SOURCE, beam_size=beam_size, extra_length=4)
    static = beam_search(model, SOURCE, beam_size=beam_size, extra_length=4, static_cache=True)
    np.testing.assert_array_equal(grow.ids, static.ids)
    np.testing.assert_allclose(grow.scores, static.scores, rtol=1e-5, atol=1e-5)
    if beam_size > 1:
        return  # greedy does not depend on the beam size: checked once
    greedy = greedy_decode(model, SOURCE, extra_length=4)
    np.testing.assert_array_equal(
        greedy.ids, greedy_decode(model, SOURCE, extra_length=4, static_cache=True).ids)


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_size=0), "beam_size.*>= 1.*0"), (dict(beam_size=2.5), "beam_size"),
    (dict(alpha=-0.5), "alpha.*>= 0.*-0.5"), (dict(extra_length=-1), "extra_length.*-1"),
    (dict(max_output_length=0), "max_output_length.*0"),
    (dict(eos_id=-2), "eos_id.*-2"), (dict(eos_id=0), "eos_id.*pad_id")])
def test_bad_options_are_named(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        beam_search(model, tf.constant([[A, EOS_ID]]), **kwargs)


def _mixed_lengths(lengths=(2, 9, 3, 12, 5, 1, 7, 4), seed=0):
    """Sources of the given lengths (EOS included), padded: sentences end apart."""
    rng = np.random.default_rng(seed)
    source = np.zeros((len(lengths), max(lengths)), np.int32)
    for b, n in enumerate(lengths):
        source[b, :n - 1] = rng.integers(4, VOCAB, n - 1)
        source[b, n - 1] = EOS_ID
    return tf.constant(source)


@pytest.fixture(scope="module")
def mixed_model():
    """Seeded through Keras (its initializers ignore tf.random.set_seed): the same weights
    whatever ran before, with EOS +1.5 (:class:`EOSBiased`)."""
    keras.utils.set_random_seed(10)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    model.build()
    return EOSBiased(model, 1.5)


class EOSBiased:
    """The Transformer with `bias` added to its EOS logit: random weights then end some
    sentences by EOS, others at their limits (the same model for both decoders)."""

    def __init__(self, model, bias):
        self.model, self.model_config = model, model.model_config
        self.bias = tf.one_hot(EOS_ID, model.model_config.vocab_size) * bias

    def encode(self, source_ids):
        return self.model.encode(source_ids)

    def init_cache(self, *args, **kwargs):
        return self.model.init_cache(*args, **kwargs)

    def decode_step(self, *args, **kwargs):
        logits, cache = self.model.decode_step(*args, **kwargs)
        return logits + self.bias, cache


@pytest.mark.parametrize("static_cache", [False, True])
@pytest.mark.parametrize("decoder, stopping", [("greedy", None), (1, "bound"), (4, "bound"),
                                               (4, "finished")])
def test_decoders_equal_the_reference_on_mixed_lengths(mixed_model, decoder, stopping,
                                                       static_cache):
    """Finished sentences leaving the batch change no output: the decoders equal the
    algorithm before that change (tests/decoding_reference.py: every sentence runs until
    the last is done), for greedy and beams 1 and 4 under both stopping rules, growing
    and static caches, on sentences that end by EOS or at their limits at different
    steps. The model's weights (seed 10) are ones where the two rules keep different
    n-best lists, so each rule is held to its own reference."""
    source, model = _mixed_lengths(), mixed_model
    if decoder == "greedy":
        out = greedy_decode(model, source, extra_length=6, static_cache=static_cache)
        expected = reference.greedy_decode(model, source, 6, static_cache)
    else:
        out = beam_search(model, source, beam_size=decoder, alpha=0.6, extra_length=6,
                          static_cache=static_cache, stopping=stopping)
        expected = reference.beam_search(model, source, decoder, 0.6, 6, static_cache,
                                         stopping)
    np.testing.assert_allclose(out.scores, expected[2], rtol=1e-5, atol=1e-5)
    # The same n-best lists; two hypotheses whose scores tie to float rounding (the
    # reference takes a log-softmax over the whole vocabulary, the search a log-sum-exp)
    # may come in either order, so each sentence's list is compared as a set.
    ids, lengths = np.asarray(out.ids), np.asarray(out.lengths)
    expected_ids, expected_lengths = np.asarray(expected[0]), np.asarray(expected[1])
    if ids.ndim == 2:  # greedy: one output per sentence
        ids, lengths = ids[:, None], lengths[:, None]
        expected_ids, expected_lengths = expected_ids[:, None], expected_lengths[:, None]
    for b in range(len(ids)):
        assert sorted(map(tuple, ids[b])) == sorted(map(tuple, expected_ids[b])), b
        assert sorted(lengths[b]) == sorted(expected_lengths[b]), b


# A repeats until position `stop` (the source's first id), where EOS takes over.
STOPPING = {BOS_ID: {A: 0.9, EOS_ID: 0.1}, A: {A: 0.9, EOS_ID: 0.1}}
STOPS = [[1, EOS_ID], [4, EOS_ID], [2, EOS_ID]]


@pytest.mark.parametrize("static_cache, rows", [(False, [3, 3, 2, 1, 1]), (True, [3] * 5)])
def test_finished_sentences_leave_the_batch(static_cache, rows):
    """Greedy: sentences end after 2, 5 and 3 tokens; with the growing cache the step
    function then sees only the rows still running, and each result is at its place."""
    stub = BigramStub(STOPPING, stop_bonus=20.0)
    out = greedy_search(stub.start(STOPS), static_cache=static_cache)
    assert hypothesis_ids(out.ids, out.lengths) == [[A, EOS_ID], [A] * 4 + [EOS_ID],
                                                 [A, A, EOS_ID]]
    assert stub.rows == rows


def test_beam_rows_follow_the_sentences_still_running():
    stub, static = BigramStub(STOPPING, stop_bonus=20.0), BigramStub(STOPPING, stop_bonus=20.0)
    out = sequence_beam_search(stub.start(STOPS, beams=2), beam_size=2, alpha=0.6,
                               stopping="bound")
    full = sequence_beam_search(static.start(STOPS, beams=2, static_cache=True), beam_size=2,
                                alpha=0.6, static_cache=True, stopping="bound")
    np.testing.assert_array_equal(out.ids, full.ids)
    np.testing.assert_allclose(out.scores, full.scores, rtol=1e-6)
    assert hypothesis_ids(out.ids[:, 0], out.lengths[:, 0]) == [
        [A, EOS_ID], [A] * 4 + [EOS_ID], [A, A, EOS_ID]]
    assert stub.steps == static.steps and stub.rows[0] == 6 and stub.rows[-1] == 2
    assert all(a >= b for a, b in zip(stub.rows, stub.rows[1:], strict=False))
    assert sum(stub.rows) < sum(static.rows)


def test_no_eos_id_runs_every_sentence_to_its_limit():
    """eos_id=None (benchmarks): EOS is an ordinary token, each sentence runs to its limit."""
    stub = BigramStub(STOPPING, stop_bonus=20.0)
    out = greedy_search(stub.start(STOPS, extra_length=4), eos_id=None)
    np.testing.assert_array_equal(out.lengths, [6, 6, 6])
    beam = sequence_beam_search(stub.start(STOPS, beams=2, extra_length=4), 2, 0.6, eos_id=None)
    np.testing.assert_array_equal(beam.lengths, [[6, 6]] * 3)


def test_decoding_options_own_the_defaults_and_name_bad_values():
    from tfxformer.config import DecodingOptions

    options = DecodingOptions()
    assert (options.beam_size, options.alpha, options.extra_length, options.batch_size) == \
        (4, 0.6, 50, 64)  # §6.1; the batch every entry point translates with
    assert DecodingOptions.from_dict(options.to_dict()) == options
    assert DecodingOptions.from_dict({"max_batch_size": 8}).batch_size == 8  # an old name
    for bad, message in ((dict(beam_size=0), "`beam_size` must be an integer >= 1, got 0"),
                         (dict(alpha=-1.0), "`alpha` must be a number >= 0.0, got -1.0"),
                         (dict(extra_length=2.5), "`extra_length` must be an integer >= 0"),
                         (dict(batch_size=True), "`batch_size` must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            options.replace(**bad)
    with pytest.raises(ValueError, match="Unknown DecodingOptions setting.*'beam'"):
        options.replace(beam=2)
