"""Tests of tfxformer.data.token_cache: the tokenize-once cache of the training pairs."""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED_DATA, grappler_on
from sentencepiece import sentencepiece_model_pb2

from tfxformer.data import pipeline, sources, token_cache, train_tokenizer
from tfxformer.data.tokenizer import Tokenizer

MAX_LENGTH, SHARD = 40, 400
OPTIONS = dict(batch_tokens=800, max_length=MAX_LENGTH, shuffle_buffer=300, seed=3)


def _corpus(folder, lines=1000):
    """Multi30k's first `lines` pairs and pairs the filter removes, as a text folder."""
    os.makedirs(folder, exist_ok=True)
    hostile = [("", "Hallo."), ("A dog.", "Ein Hund läuft " * 20), ("w" * 5000, "x")]
    for lang, column in (("en", 0), ("de", 1)):
        with open(os.path.join(SHARED_DATA, "multi30k", f"train.{lang}"), encoding="utf-8") as f:
            text = [next(f).rstrip("\n") for _ in range(lines)]
        for index, pair in zip((7, 300, 650), hostile, strict=True):
            text.insert(index, pair[column])
        for split, rows in (("train", text), ("val", text[:20])):
            with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write("\n".join(rows) + "\n")
    return sources.load_text_folder(folder)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus.training_text(), vocab_size=400)


def _build(corpus, tokenizer, run_dir, **overrides):
    options = {"max_length": MAX_LENGTH, "shard_pairs": SHARD, **overrides}
    return token_cache.build(corpus.train, tokenizer, str(run_dir), **options)


@pytest.fixture(scope="module")
def built(corpus, tokenizer, tmp_path_factory):
    """(run dir, cache) of one build, shared by the tests that only read it."""
    run = tmp_path_factory.mktemp("built") / "run"
    return run, _build(corpus, tokenizer, run)


def _open(corpus, tokenizer, run_dir, **overrides):
    options = {"max_length": MAX_LENGTH, "shard_pairs": SHARD, **overrides}
    return token_cache.open_cache(corpus.train, tokenizer, str(run_dir), **options)


def _cached(cache, **options):
    """The training batches from `cache`'s ids (`pipeline.train_dataset`'s token cache)."""
    return pipeline.train_dataset(None, None, token_cache=cache, **options)


def _batches(dataset, count):
    iterator = iter(dataset)
    return [tf.nest.map_structure(lambda t: t.numpy(), next(iterator)) for _ in range(count)]


def _assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_the_cache_gives_the_batches_of_tokenizing_on_the_fly(corpus, tokenizer, built,
                                                              num_replicas):
    cache = built[1]
    assert [p["pairs"] for p in cache.record["parts"]] == [400, 400, 203]
    assert cache.stats == pipeline.count_filtered(corpus.train.dataset(), tokenizer,
                                                  max_length=MAX_LENGTH)
    assert cache.stats.empty == 1 and cache.stats.too_long >= 2
    options = dict(OPTIONS, num_replicas=num_replicas)
    # ~3 epochs: the reshuffle of every epoch and the batches across its end are compared.
    count = 3 * cache.stats.kept * 12 // options["batch_tokens"]
    want = _batches(pipeline.train_dataset(corpus.train.dataset(), tokenizer, **options), count)
    got = _batches(_cached(cache, **options), count)
    _assert_same(got, want)
    assert len({b[1].shape for b in got}) > 1  # several buckets
    one_epoch = dict(options, repeat=False)
    _assert_same(list(_cached(cache, **one_epoch).as_numpy_iterator()),
                 list(pipeline.train_dataset(corpus.train.dataset(), tokenizer,
                                             **one_epoch).as_numpy_iterator()))


def test_right_to_left_batches_are_the_batches_with_each_target_reversed(built):
    forward = _batches(_cached(built[1], **OPTIONS), 2)
    reverse = _batches(_cached(built[1], reverse_target=True, **OPTIONS), 2)
    for ((source, _), labels), ((r_source, r_input), r_labels) in zip(forward, reverse,
                                                                       strict=True):
        np.testing.assert_array_equal(r_source, source)
        for row, r_row, r_in in zip(labels, r_labels, r_input, strict=True):
            n = int((row != 0).sum()) - 1  # the pieces, without EOS
            np.testing.assert_array_equal(r_row[:n], row[:n][::-1])
            np.testing.assert_array_equal(r_row[n:], row[n:])  # EOS, then padding
            np.testing.assert_array_equal(r_in[1:n + 1], r_row[:n])


def test_resume_mid_epoch_gives_the_next_batches_of_an_unbroken_run(corpus, tokenizer,
                                                                    built, tmp_path):
    run = built[0]
    straight = iter(_cached(_open(corpus, tokenizer, run), **OPTIONS))
    for _ in range(5):
        next(straight)
    saved = tf.train.Checkpoint(data=straight).write(str(tmp_path / "ckpt" / "data"))
    want = [next(straight) for _ in range(12)]  # into the next epoch
    resumed = iter(_cached(_open(corpus, tokenizer, run), **OPTIONS))
    tf.train.Checkpoint(data=resumed).read(saved).assert_consumed()
    _assert_same([next(resumed) for _ in range(12)], want)


def _other_vocabulary(tokenizer):
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.spm_bytes)
    proto.pieces[300].score -= 1.0
    return Tokenizer(proto.SerializeToString())


def test_a_change_of_vocabulary_corpus_or_max_length_rebuilds_the_cache(corpus, tokenizer,
                                                                        tmp_path):
    run = tmp_path / "run"
    first = _build(corpus, tokenizer, run)
    assert _open(corpus, tokenizer, run).key == first.key
    assert _open(corpus, _other_vocabulary(tokenizer), run) is None
    assert _open(corpus, tokenizer, run, max_length=MAX_LENGTH + 8) is None
    assert _open(corpus, tokenizer, run, max_line_bytes=100) is None
    folder = str(tmp_path / "corpus")
    copy = _corpus(folder)
    assert _open(copy, tokenizer, run) is None  # other paths
    assert token_cache.build(copy.train, tokenizer, str(run), max_length=MAX_LENGTH,
                             shard_pairs=SHARD).key != first.key
    assert os.listdir(run / "token_cache") == [_open(copy, tokenizer, run).key]  # stale gone
    path = os.path.join(folder, "train.de")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1000))
    assert _open(copy, tokenizer, run) is None  # same size, other mtime
    rebuilt = token_cache.build(copy.train, tokenizer, str(run), max_length=MAX_LENGTH,
                                shard_pairs=SHARD)
    # The same ids under new keys: a checkpoint's data position still holds.
    assert rebuilt.key != first.key and rebuilt.content_key == first.content_key
    assert _build(corpus, tokenizer, tmp_path / "short", max_length=20).content_key \
        != first.content_key
    with pytest.raises(ValueError, match="max_length=32, but the token cache"):
        _cached(first, **dict(OPTIONS, max_length=32))
    with pytest.raises(ValueError, match="without a token cache"):
        _cached(first, sampler=object(), **OPTIONS)


class _Killed(Exception):
    pass


def test_a_half_written_cache_is_not_used_and_a_rebuild_resumes(corpus, tokenizer, built,
                                                                 tmp_path, caplog):
    run = tmp_path / "run"

    def kill_after_the_second_part(path):
        if path.endswith("part-00001.npz"):
            raise _Killed(path)

    with pytest.raises(_Killed):
        _build(corpus, tokenizer, run, on_part=kill_after_the_second_part)
    key = os.listdir(run / "token_cache")[0]
    folder = run / "token_cache" / key
    assert sorted(os.listdir(folder)) == ["part-00000.npz", "part-00001.npz"]
    assert _open(corpus, tokenizer, run) is None  # no cache.json: never used
    (folder / "part-00002.npz.tmp-123").write_bytes(b"half a part")  # a write cut short
    with caplog.at_level(logging.INFO, logger="tfxformer.data.token_cache"):
        cache = _build(corpus, tokenizer, run)
    assert caplog.text.count("reusing") == 2 and "wrote" in caplog.text
    assert sorted(os.listdir(folder)) == ["cache.json", "part-00000.npz", "part-00001.npz",
                                          "part-00002.npz"]
    fresh = built[1]  # a build never cut short
    for got, want in ((cache.src, fresh.src), (cache.tgt, fresh.tgt)):
        assert got.to_list() == want.to_list()
    assert cache.record["stats"] == fresh.record["stats"]


@pytest.mark.parametrize("damage", ["truncated part", "missing part", "garbage record"])
def test_a_damaged_cache_is_not_used(corpus, tokenizer, tmp_path, damage):
    run = tmp_path / "run"
    cache = _build(corpus, tokenizer, run)
    folder = cache.directory
    if damage == "truncated part":
        with open(os.path.join(folder, "part-00001.npz"), "r+b") as f:
            f.truncate(1000)
    elif damage == "missing part":
        os.remove(os.path.join(folder, "part-00002.npz"))
    else:
        with open(os.path.join(folder, "cache.json"), "w") as f:
            f.write('{"key": ')
    assert _open(corpus, tokenizer, run) is None
    rebuilt = token_cache.open_or_build(corpus.train, tokenizer, str(run),
                                        max_length=MAX_LENGTH, shard_pairs=SHARD)
    assert rebuilt.src.to_list() == cache.src.to_list()
    with open(os.path.join(folder, "cache.json")) as f:
        assert json.load(f)["key"] == cache.key


def test_ids_are_uint16_while_the_vocabulary_fits(corpus, tokenizer, built):
    cache = built[1]
    assert cache.src.dtype == cache.tgt.dtype == tf.uint16
    rows = cache.src.row_lengths().numpy()
    assert (rows[[7, 300, 650]] == 0).all() and (rows > 0).sum() == cache.stats.kept
    sources_, targets = corpus.train.lists()
    for index in np.flatnonzero(rows)[:20]:
        np.testing.assert_array_equal(cache.src[index].numpy(),
                                      tokenizer.tokenize(sources_[index]).numpy())
        np.testing.assert_array_equal(cache.tgt[index].numpy(),
                                      tokenizer.tokenize(targets[index]).numpy())


@pytest.mark.slow
def test_train_wmt_with_and_without_the_cache_trains_alike(tmp_path, capsys,
                                                          one_replica_reference):
    """The real path: the same weights and loss with --token-cache (the default: conftest's
    `one_replica_reference`, the same flags) and --no-token-cache; the cache's counts are
    logged as the length check's; a rerun reuses the cache, and one with another
    --max-length rebuilds it."""
    from support.reliability import model_tensors, script_args, train_wmt

    data, reference = one_replica_reference["corpus"], one_replica_reference["run"]
    capsys.readouterr()
    args = script_args(data, str(tmp_path / "on_the_fly"), 6, deterministic=True)
    with grappler_on():  # as the reference was trained
        assert train_wmt.main(args + ["--no-token-cache"]) == 0
    plain_final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain_final["step"] == 6  # the reference's loss of update 6 is a float32 scalar
    assert np.float32(plain_final["loss"]) == np.float32(one_replica_reference["losses"][5])
    cached, plain = (model_tensors(run, "ckpt-6") for run in (reference,
                                                              str(tmp_path / "on_the_fly")))
    for key, value in plain.items():
        np.testing.assert_array_equal(cached[key], value, err_msg=key)
    assert not os.path.exists(tmp_path / "on_the_fly" / "token_cache")
    with open(os.path.join(reference, "train.log"), encoding="utf-8") as f:
        log = f.read()
    with open(tmp_path / "on_the_fly" / "train.log", encoding="utf-8") as f:
        plain_log = f.read()
    filter_line = [line.split(" INFO ")[1] for line in plain_log.splitlines()
                   if "Data filter:" in line]
    assert len(filter_line) == 1 and filter_line[0] in log and "Token cache: wrote" in log
    run = str(tmp_path / "cached")
    shutil.copytree(reference, run)
    assert train_wmt.main(script_args(data, run, 32)) == 0  # resumes, reads the cache
    assert train_wmt.main(script_args(data, run, 34, max_length=40)) == 0
    with open(tmp_path / "cached" / "train.log", encoding="utf-8") as f:
        log = f.read()
    assert log.count("Token cache: using") == 1 and log.count("Token cache: wrote") == 2
    assert "token_cache: " in log  # the new cache's pipeline does not resume the old one's
    assert len(os.listdir(tmp_path / "cached" / "token_cache")) == 1
    copied = str(tmp_path / "copied")  # the corpus copied afresh: another path, the same text
    shutil.copytree(data, copied)
    assert train_wmt.main(script_args(copied, run, 36, max_length=40)) == 0
    with open(tmp_path / "cached" / "train.log", encoding="utf-8") as f:
        log = f.read()
    assert log.count("Token cache: wrote") == 3  # rebuilt for the new path, and
    assert log.count("settings differ") == 1  # the data pipeline resumed where it stopped
