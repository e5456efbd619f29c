"""The decoders as they were before finished sentences left the batch (tfxformer at
3aec258, docstrings cut): every sentence runs until the last is done. The reference that
tests/test_decoding.py holds the compacting decoders to; calls the Transformer directly.
`stopping="finished"` (added since): a sentence is done once beam_size hypotheses have
finished; it then keeps running with the others, its finished list frozen.
"""

import tensorflow as tf

from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9


def _limits(model, source_ids, source_mask, extra_length):
    cap = model.model_config.max_positions
    source_lengths = tf.reduce_sum(tf.cast(source_mask, tf.int32), axis=1)
    limits = tf.clip_by_value(source_lengths + extra_length, 1, cap)
    return limits, tf.clip_by_value(tf.shape(source_ids)[1] + extra_length, 1, cap)


def _log_probs(logits):
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    forbidden = tf.reduce_any(tf.range(tf.shape(log_probs)[-1])[:, None] == [[PAD_ID, BOS_ID]],
                              axis=-1)
    return tf.where(forbidden[None, :], NEG_INF, log_probs)


def _write_column(ids, column, values):
    return tf.where(tf.range(tf.shape(ids)[-1]) == column, values[..., None], ids)


def _invariants(cache, static_cache):
    def invariant(t):
        if static_cache or t.shape.rank != 4:
            return t.shape
        return tf.TensorShape([t.shape[0], t.shape[1], None, t.shape[3]])
    return tf.nest.map_structure(invariant, cache)


def greedy_decode(model, source_ids, extra_length=50, static_cache=False):
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_mask = model.encode(source_ids)
    limits, length = _limits(model, source_ids, source_mask, extra_length)
    batch = tf.shape(source_ids)[0]

    def body(i, tokens, finished, scores, ids, cache):
        logits, cache = model.decode_step(tokens[:, None], source_mask, cache, i,
                                          static_cache=static_cache)
        log_probs = _log_probs(logits[:, -1])
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        token_log_prob = tf.gather(log_probs, token, batch_dims=1)
        token = tf.where(finished, PAD_ID, token)
        scores = scores + tf.where(finished, 0.0, token_log_prob)
        ids = _write_column(ids, i, token)
        finished = finished | tf.equal(token, EOS_ID) | (i + 1 >= limits)
        return i + 1, token, finished, scores, ids, cache

    def cond(i, tokens, finished, scores, ids, cache):
        return (i < length) & ~tf.reduce_all(finished)

    state = (tf.constant(0), tf.fill([batch], BOS_ID), tf.zeros([batch], tf.bool),
             tf.zeros([batch], tf.float32), tf.zeros([batch, length], tf.int32),
             model.init_cache(memory, length if static_cache else None))
    invariants = tuple(t.shape for t in state[:-1]) + (_invariants(state[-1], static_cache),)
    _, _, _, scores, ids, _ = tf.while_loop(cond, body, state, shape_invariants=invariants)
    return ids, tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1), scores


def _penalty(length, alpha):
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _gather(x, index):
    return tf.gather(x, index, batch_dims=1)


def beam_search(model, source_ids, beam_size, alpha, extra_length=50, static_cache=False,
                stopping="bound"):
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_mask = model.encode(source_ids)
    limits, length = _limits(model, source_ids, source_mask, extra_length)
    batch, k = tf.shape(source_ids)[0], beam_size
    cache = model.init_cache(memory, length if static_cache else None, batch_size=batch * k)
    cross = [c["cross"] for c in cache]

    def done(s):
        met = tf.reduce_all(s["finished_flags"], axis=1)
        if stopping == "bound":
            best_alive = s["alive_log_probs"][:, 0] / _penalty(limits, alpha)
            met &= tf.reduce_min(s["finished_scores"], axis=1) > best_alive
        return met | (s["i"] >= limits)

    def not_done(s):
        return (s["i"] < length) & ~tf.reduce_all(done(s))

    def step(s):
        new = _step(s)
        if stopping == "bound":  # what is done stays so: the bound proves it
            return new
        frozen = done(s)
        for name in ("finished_seq", "finished_scores", "finished_flags"):
            where = tf.reshape(frozen, [-1] + [1] * (new[name].shape.rank - 1))
            new[name] = tf.where(where, s[name], new[name])
        return new

    def _step(s):
        i, alive_seq = s["i"], s["alive_seq"]
        layers = [{"self": a, "cross": c} for a, c in zip(s["cache"], cross, strict=True)]
        logits, layers = model.decode_step(tf.reshape(alive_seq[:, :, i], [-1, 1]), source_mask,
                                           layers, i, static_cache=static_cache, beams=k)
        log_probs = _log_probs(logits[:, -1])
        vocab = tf.shape(log_probs)[-1]
        log_probs = tf.reshape(log_probs, [batch, k, vocab]) + s["alive_log_probs"][:, :, None]
        log_probs, index = tf.math.top_k(tf.reshape(log_probs, [batch, k * vocab]), k=2 * k)
        beams, tokens = index // vocab, index % vocab
        seq = _write_column(_gather(alive_seq, beams), i + 1, tokens)
        ended = tf.equal(tokens, EOS_ID) | (i + 1 >= limits[:, None])
        ended_real = ended & (tf.range(2 * k) < k)[None, :] & (log_probs > NEG_INF / 2)
        alive_log_probs, alive = tf.math.top_k(tf.where(ended, NEG_INF, log_probs), k=k)
        rows = tf.reshape(_gather(beams, alive) + tf.range(batch)[:, None] * k, [-1])
        scores = tf.where(ended_real, log_probs / _penalty(i + 1, alpha), NEG_INF)
        scores, best = tf.math.top_k(tf.concat([s["finished_scores"], scores], axis=1), k=k)
        return {
            "i": i + 1, "alive_seq": _gather(seq, alive), "alive_log_probs": alive_log_probs,
            "finished_seq": _gather(tf.concat([s["finished_seq"], seq], axis=1), best),
            "finished_scores": scores,
            "finished_flags": _gather(tf.concat([s["finished_flags"], ended_real], 1), best),
            "cache": [tf.nest.map_structure(lambda t: tf.gather(t, rows), c["self"])
                      for c in layers],
        }

    first = tf.concat([tf.zeros([1]), tf.fill([k - 1], NEG_INF)], axis=0)
    seq = _write_column(tf.zeros([batch, k, length + 1], tf.int32), 0, tf.fill([batch, k], BOS_ID))
    state = {"i": tf.constant(0), "alive_seq": seq,
             "alive_log_probs": tf.tile(first[None], [batch, 1]), "finished_seq": seq,
             "finished_scores": tf.fill([batch, k], NEG_INF),
             "finished_flags": tf.zeros([batch, k], tf.bool),
             "cache": [c["self"] for c in cache]}
    invariants = {name: (_invariants(t, static_cache) if name == "cache" else t.shape)
                  for name, t in state.items()}
    s = tf.while_loop(not_done, lambda s: [step(s)], [state], shape_invariants=[invariants])[0]
    any_finished = tf.reduce_any(s["finished_flags"], axis=1)
    seq = tf.where(any_finished[:, None, None], s["finished_seq"], s["alive_seq"])
    scores = tf.where(any_finished[:, None], s["finished_scores"],
                      s["alive_log_probs"] / _penalty(s["i"], alpha))
    ids = seq[:, :, 1:]
    return ids, tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1), scores
