"""Terminology constraints appear exactly as often as they are given
(tfxformer.decoding.constraints, tfxformer.decoding.phrases, docs/steering.md): on a toy
step function that likes a known token sequence, so every output is known."""

import numpy as np
import tensorflow as tf

from tfxformer.decoding import EOS_ID, DecodeStart
from tfxformer.decoding.beam_search import sequence_beam_search
from tfxformer.decoding.greedy import greedy_search
from tfxformer.decoding.sampling import make_sampler
from tfxformer.decoding.steering import flatten_constraints, make_steering

VOCAB = 16
BEAMS = 3
COLUMNS = 14  # output columns, EOS included
NOISE = np.random.default_rng(0).normal(size=(COLUMNS + 1, VOCAB)).astype(np.float32) * 0.1


def liked_start(liked, beams=BEAMS):
    """A step function that gives the token liked[b, i] a logit of 8 at step i (about
    0.995 of the probability) and every other token a small fixed one: the best output
    of sentence b is its row of `liked` (EOS included); a banned liked token gives way to
    the next-best one."""
    batch = tf.shape(liked)[0]
    noise = tf.constant(NOISE)

    def step_fn(ids, index, cache, context):
        wanted = tf.gather(cache["liked"], tf.minimum(index, COLUMNS - 1), axis=1)
        return tf.one_hot(wanted, VOCAB) * 8.0 + noise[index][None], cache

    return DecodeStart(step_fn, {"liked": tf.repeat(liked, beams, axis=0)}, {},
                       tf.fill([batch], COLUMNS), tf.constant(COLUMNS))


SIGNATURE = [tf.TensorSpec([None, COLUMNS], tf.int32)] + [
    tf.TensorSpec([None, None], dtype) for dtype in (tf.int32, tf.bool, tf.int32, tf.int32,
                                                     tf.bool)]


@tf.function(input_signature=SIGNATURE, autograph=False)
def _search(liked, tokens, continues, prefix, avoid, avoid_continues):
    """One trace for every test: the phrases and prefix are tensors of any width."""
    steering = make_steering(tf.shape(liked)[0], prefix=prefix, constraints=(tokens, continues),
                             avoid=(avoid, avoid_continues))
    out = sequence_beam_search(liked_start(liked), BEAMS, 0.6, steering=steering,
                               prefill_prefix=False)
    return out.ids, out.scores, out.scores > -1e8  # an impossible hypothesis left out


@tf.function(input_signature=SIGNATURE, autograph=False)
def _greedy_and_sampling(liked, tokens, continues, prefix, avoid, avoid_continues):
    """Greedy decoding's and sampling's outputs (B, 2, L) (no constraints)."""
    steering = make_steering(tf.shape(liked)[0], prefix=prefix,
                             avoid=(avoid, avoid_continues))
    sampler = make_sampler(0, 1.0, 1.0, 7)
    outs = [greedy_search(liked_start(liked, 1), sampler=chosen, steering=steering)
            for chosen in (None, sampler)]
    scores = tf.stack([out.scores for out in outs], axis=1)
    return tf.stack([out.ids for out in outs], axis=1), scores, tf.ones_like(scores, tf.bool)


def _ragged(per_sentence):
    return flatten_constraints(tf.ragged.constant([sentence or [[]] for sentence in
                                                   per_sentence], ragged_rank=2,
                                                  dtype=tf.int32))


def search(liked, phrases, prefix=None, avoid=None, run=_search):
    """Per sentence its outputs ((tokens without EOS, ended by EOS), best first) and
    their scores: `liked` per sentence the liked tokens (EOS added), `phrases` per
    sentence its constraint phrases (lists of token ids), `prefix` its forced prefix,
    `avoid` its phrases to avoid; `run` the search."""
    liked = [row + [EOS_ID] for row in liked]
    liked = tf.constant([row + [0] * (COLUMNS - len(row)) for row in liked], tf.int32)
    prefix = tf.ragged.constant(prefix or [[]] * len(phrases), dtype=tf.int32).to_tensor()
    ids, scores, keep = run(liked, *_ragged(phrases), prefix,
                            *_ragged(avoid or [[]] * len(phrases)))
    found = []
    for rows, kept in zip(ids.numpy().tolist(), keep.numpy(), strict=True):
        found.append([])
        for row in (row for row, real in zip(rows, kept, strict=True) if real):
            ended = EOS_ID in row
            found[-1].append((row[:row.index(EOS_ID)] if ended else [t for t in row if t],
                              ended))
    return found, scores.numpy()


def occurrences(tokens, phrase):
    return sum(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens)))


def check_counts(found, phrases):
    """Every output holds each phrase as often as it is given, never more; the best one
    ends (EOS)."""
    for outputs, wanted in zip(found, phrases, strict=True):
        assert outputs[0][1], outputs
        for tokens, ended in outputs:
            for phrase in wanted:
                count = occurrences(tokens, phrase)
                given = wanted.count(phrase)
                assert count == given if ended else count <= given, (tokens, phrase)


# Sentence 0 likes [5, 6] three times; 1 likes [5, 5, 6] twice, first inside 5 5 5 6,
# where DBA's contiguous tracking restarts and misses it; 2 likes [7, 8] and [8, 9]
# overlapping in 7 8 9, then [8, 9] again; 3 likes the one-token phrase [10] thrice.
LIKED = [[5, 6, 5, 6, 5, 6, 7], [5, 5, 5, 6, 9, 5, 5, 6, 8], [7, 8, 9, 4, 8, 9, 11],
         [10, 4, 10, 4, 10, 12]]


def test_each_phrase_is_written_exactly_once():
    """The liked phrases' other occurrences give way: each output holds each phrase
    once, an occurrence DBA's tracking missed (5 5 5 6, 7 8 9) included."""
    phrases = [[[5, 6]], [[5, 5, 6]], [[7, 8], [8, 9]], [[10]]]
    found, _ = search(LIKED, phrases)
    check_counts(found, phrases)
    # the first occurrence is the one kept: the best output follows the liked tokens
    # up to the second one
    assert found[0][0][0][:3] == [5, 6, 5] and found[0][0][0][3] != 6
    assert found[1][0][0][:7] == [5, 5, 5, 6, 9, 5, 5] and found[1][0][0][7] != 6
    assert found[2][0][0][:5] == [7, 8, 9, 4, 8] and found[2][0][0][5] != 9
    assert found[3][0][0][:2] == [10, 4] and found[3][0][0][2] != 10


def test_a_phrase_given_twice_is_written_twice():
    phrases = [[[5, 6], [5, 6]], [[5, 5, 6], [5, 5, 6]], [[8, 9], [7, 8], [8, 9]],
               [[10], [12], [10]]]
    found, _ = search(LIKED, phrases)
    check_counts(found, phrases)


def test_a_phrase_in_the_forced_prefix_counts_as_written():
    """The prefix is written as given (twice 5 6 here); a phrase in it is met there and
    not written again after it."""
    phrases = [[[5, 6]], [[5, 5, 6]], [[8, 9]], [[10]]]
    prefix = [[5, 6, 5, 6], [5, 5, 6], [7, 8, 9], [10]]
    found, _ = search(LIKED, phrases, prefix)
    for outputs, start, wanted in zip(found, prefix, phrases, strict=True):
        assert outputs[0][1]
        for tokens, _ in outputs:
            assert tokens[:len(start)] == start
            assert occurrences(tokens, wanted[0]) == occurrences(start, wanted[0]), tokens
    assert found[0][0][0][:5] == [5, 6, 5, 6, 5] and found[0][0][0][5] != 6


def test_without_constraints_the_output_is_the_plain_one():
    """No phrase: the liked tokens, by every search; in a batch where other sentences
    have phrases (the constrained step runs), a sentence without them gets the same ids
    and scores, bit for bit."""
    plain, plain_scores = search(LIKED, [[], [], [], []])
    assert [outputs[0] for outputs in plain] == [(row, True) for row in LIKED]
    others, _ = search(LIKED, [[]] * 4, run=_greedy_and_sampling)
    assert [outputs[0] for outputs in others] == [(row, True) for row in LIKED]
    mixed, mixed_scores = search(LIKED, [[[5, 6]], [], [[7, 8]], []])
    for row in (1, 3):
        assert mixed[row] == plain[row]
        np.testing.assert_array_equal(mixed_scores[row], plain_scores[row])


AVOID = [[[5, 6]], [[5, 5, 6], [9]], [[8, 9], [4, 8]], [[10]]]


def test_avoided_phrases_never_appear():
    """Beam search (with constraints beside them), greedy decoding and sampling: no
    output holds a phrase to avoid, and the liked tokens are kept up to it."""
    phrases = [[[6]], [[5, 5]], [[7]], []]
    beams, _ = search(LIKED, phrases, avoid=AVOID)
    check_counts(beams, phrases)
    others, _ = search(LIKED, [[]] * 4, avoid=AVOID, run=_greedy_and_sampling)
    for found in (beams, others):
        for outputs, avoided in zip(found, AVOID, strict=True):
            assert outputs[0][1], outputs
            for tokens, _ in outputs:
                assert not any(occurrences(tokens, phrase) for phrase in avoided), tokens
    greedy = [outputs[0][0] for outputs in others]
    assert greedy[0][:1] == [5] and greedy[0][1] != 6
    assert greedy[1][:3] == [5, 5, 5] and greedy[1][3] not in (6, 9)
    assert greedy[2][:2] == [7, 8] and greedy[2][2] != 9
    assert greedy[3][0] != 10


def test_a_forced_prefix_is_written_even_where_it_holds_an_avoided_phrase():
    found, _ = search(LIKED, [[]] * 4, prefix=[[5, 6], [], [], []], avoid=AVOID,
                      run=_greedy_and_sampling)
    for tokens, _ in found[0]:
        assert tokens[:2] == [5, 6] and occurrences(tokens, [5, 6]) == 1, tokens
