"""tfxformer.beam: bulk translation on Apache Beam (docs/beam.md), on the DirectRunner.

The pipeline tests run Beam's FnApiRunner in this process (what the DirectRunner runs),
one per mode; the slow ones start the script's processes."""

import gzip
import json
import os
import subprocess
import sys

import pytest

beam = pytest.importorskip("apache_beam")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from support.serving import load_script  # noqa: E402

from tfxformer.beam import (  # noqa: E402
    NBest,
    Sample,
    Score,
    Translate,
    TranslateHandler,
    merge_shards,
    translate_files,
)
from tfxformer.beam.handler import KILL_ONCE_ENV  # noqa: E402
from tfxformer.beam.pipeline import build, direct_runner  # noqa: E402
from tfxformer.beam.records import file_format, read_lines  # noqa: E402
from tfxformer.serving import (  # noqa: E402
    Hypothesis,
    PairScore,
    load_nbest_fn,
    load_sample_fn,
    load_score_fn,
    load_translate_fn,
)
from tfxformer.serving.nbest import Line, moses_lines  # noqa: E402
from tfxformer.serving.scoring import format_score  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = [b"A dog runs in the park.", b"", b"\xff\xfe not UTF-8", b"x" * 10_000,
         b"Two men play football.", b"A woman reads.\r"] + \
        [f"Line {i} of a longer file.".encode() for i in range(30)]


def write_inputs(folder):
    """Two inputs, one compressed, the last line of each without its line end; returns
    their lines in the order the pipeline sorts them (by name)."""
    first, second = LINES[:20], LINES[20:]
    (folder / "a.en").write_bytes(b"\n".join(first))
    (folder / "b.en.gz").write_bytes(gzip.compress(b"\n".join(second)))
    return [line.rstrip(b"\r") for line in first + second]


def reference(tiny_export, lines):
    """What scripts/translate.py writes for `lines`, one sentence per call (no padding)."""
    translate = load_translate_fn(tiny_export, batch_size=1)
    return [text.replace("\r", " ").replace("\n", " ") for text in translate(lines)]


@pytest.mark.slow
def test_directrunner_translates_every_line_once_in_order(tiny_export, tmp_path):
    lines = write_inputs(tmp_path)
    output = tmp_path / "out.de"
    count = translate_files(tiny_export, [str(tmp_path / "*.en*")], str(output),
                            batch_size=1, max_batch_lines=4)
    assert count == len(lines)
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == reference(tiny_export, lines)
    assert not (tmp_path / "out.de.shards").exists()


def test_merge_keeps_one_line_per_key_and_refuses_lost_ones(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "counts-a").write_text("0\t3\n")
    (shards / "part-a").write_text("0\t2\tc\n0\t0\ta\n")
    (shards / ".tmp-part-b").write_text("0\t1\tcut short")  # a killed worker's
    with pytest.raises(RuntimeError, match=r"first missing of 1 lines .*\(0, 1\)"):
        merge_shards(str(shards), 1, str(tmp_path / "out"))
    (shards / "part-b").write_text("0\t1\tb\n0\t2\tc\n")  # a bundle run twice
    assert merge_shards(str(shards), 1, str(tmp_path / "out")) == 3
    assert (tmp_path / "out").read_text() == "a\nb\nc\n"
    with pytest.raises(RuntimeError, match=r"files not read: \[1\]"):
        merge_shards(str(shards), 2, str(tmp_path / "out2"))
    assert not (tmp_path / "out2").exists()


def test_handler_batches_as_translate_py_reads_ahead_and_keeps_one_line_each():
    handler = TranslateHandler("unused", batch_size=2)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 32, "max_batch_size": 32}
    assert TranslateHandler("unused", 8, 4).batch_elements_kwargs()["max_batch_size"] == 4
    results = handler.run_inference([(b"a",), (b"b c",)], lambda lines: ["x\ry", "one\ntwo"])
    assert [(r.example, r.inference) for r in results] == [((b"a",), "x y"),
                                                           ((b"b c",), "one two")]


def test_no_match_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        translate_files("unused", [str(tmp_path / "nothing-here*")], str(tmp_path / "o"))


def test_without_beam_the_import_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    for name in [n for n in sys.modules if n.startswith("tfxformer.beam")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install tfxformer\[beam\]"):
        import tfxformer.beam  # noqa: F401


@pytest.mark.slow
def test_a_killed_worker_loses_and_duplicates_nothing(tiny_export, tmp_path):
    """Two worker processes; the first inference call kills its own process mid-bundle
    (os._exit): the runner runs the bundle again and the output is still every line once,
    in order."""
    lines = write_inputs(tmp_path)
    marker, output = tmp_path / "killed", tmp_path / "out.de"
    env = dict(os.environ, PYTHONPATH=ROOT, **{KILL_ONCE_ENV: str(marker)})
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "translate_beam.py"),
                    "--model", tiny_export, "--input", str(tmp_path / "*.en*"),
                    "--output", str(output), "--batch-size", "1", "--max-batch-lines", "4",
                    "--runner", "DirectRunner", "--direct_num_workers", "2",
                    "--direct_running_mode", "multi_processing"],
                   env=env, check=True, timeout=600)
    assert marker.exists()  # a worker did die
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == reference(tiny_export, lines)


@pytest.mark.slow
def test_evaluate_translates_through_the_pipeline(tiny_export, tmp_path, capsys):
    """scripts/evaluate.py --beam-pipeline: the same translations as in its own process."""
    data = tmp_path / "data"
    data.mkdir()
    sources = [line.decode() for line in LINES[:2] + LINES[4:5] + LINES[6:10]]
    (data / "few.en").write_text("\n".join(sources) + "\n")
    (data / "few.de").write_text("\n".join(["Ein Satz."] * len(sources)) + "\n")
    evaluate, rows = load_script("evaluate"), []
    for extra in ([], ["--beam-pipeline", "--runner DirectRunner"]):
        hyps = tmp_path / f"hyps{len(extra)}"
        assert evaluate.main(["--model", tiny_export, "--data", str(data), "--sets", "few",
                              "--batch-size", "1", "--hyp-dir", str(hyps), *extra]) == 0
        rows.append(json.loads(capsys.readouterr().out.splitlines()[0]))
        rows[-1]["hyps"] = (hyps / "few.beam.de").read_text()
    assert rows[0]["hyps"] == rows[1]["hyps"] and rows[1]["sentences"] == len(sources)
    assert rows[0]["beam_size"] == rows[1]["beam_size"] and rows[0]["bleu"] == rows[1]["bleu"]


def write_tfrecords(path, values, feature="source"):
    """A TFRecord file of tf.train.Examples, each with the bytes feature `feature` holding
    one value of `values` (a list of byte strings for several)."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for value in values:
            example = tf.train.Example(features=tf.train.Features(feature={feature: (
                tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=value if isinstance(value, list) else [value])))}))
            writer.write(example.SerializeToString())


def test_input_format_by_extension():
    assert file_format("data/part-0.tfrecord") == "tfrecord"
    assert file_format("gs://bucket/part-1.TFRecords.gz") == "tfrecord"
    assert file_format("mono.en.gz") == file_format("records.tfrecord.txt") == "text"
    assert file_format("mono.en", "tfrecord") == "tfrecord"
    with pytest.raises(ValueError, match="'csv': expected one of auto, text, tfrecord"):
        file_format("a.csv", "csv")


def test_tfrecord_lines_are_one_feature_each_and_bad_records_are_named(tmp_path):
    path, values = tmp_path / "in.tfrecord", [b"A dog.", b"", "Ünï\ncode".encode()]
    write_tfrecords(path, values)
    with open(path, "rb") as f:
        assert list(read_lines(f, str(path), "tfrecord")) == values
    with open(path, "rb") as f, pytest.raises(ValueError, match=(
            r"in.tfrecord record 0: no feature 'text'; it has source \(--tfrecord-feature\)")):
        list(read_lines(f, str(path), "tfrecord", "text"))
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(path.read_bytes()[:-3])
    with open(cut, "rb") as f, pytest.raises(ValueError, match="record 2 is cut short"):
        list(read_lines(f, str(cut), "tfrecord"))
    write_tfrecords(tmp_path / "two.tfrecord", [[b"a", b"b"]])
    with open(tmp_path / "two.tfrecord", "rb") as f, pytest.raises(
            ValueError, match="record 0: feature 'source' holds 2 byte strings"):
        list(read_lines(f, "two.tfrecord", "tfrecord"))
    (tmp_path / "in.txt").write_bytes(b"a\r\n\nb")
    with open(tmp_path / "in.txt", "rb") as f:
        assert list(read_lines(f, "in.txt", "text")) == [b"a", b"", b"b"]


def test_modes_read_their_columns_and_refuse_a_pair_without_tab():
    assert Translate().columns(b"a\tb") == (b"a\tb",)
    assert NBest().columns(b"A dog.") == (b"A dog.", b"", b"")
    assert NBest().columns(b"A dog.\tEin\tHund\tbellt") == (b"A dog.", b"Ein", b"Hund\tbellt")
    assert Score().columns(b"A dog.\tEin Hund.") == (b"A dog.", b"Ein Hund.")
    with pytest.raises(ValueError, match=r"'source<TAB>target' lines; this one has no TAB"):
        Score().columns(b"A dog.")


def test_nbest_and_score_values_are_one_line_and_give_their_scripts_lines():
    lists = [[Hypothesis("Ein\nHund", -0.5, ("▁Ein", "</s>"), (-0.25, -0.75)),
              Hypothesis("Hund", -1.0, ("▁Hund", "</s>"), (-1.5, -0.5))], []]
    seen, mode = [], NBest(2, token_scores=True)
    values = mode.run(lambda lines: seen.extend(lines) or lists,
                      [(b"a", b"", b""), (b"b", b"Ein", b"x\ty")])
    assert [(line.text, line.prefix, line.constraints) for line in seen] == [
        (b"a", b"", b""), (b"b", b"Ein", b"x\ty")]
    assert all("\n" not in value for value in values)
    assert mode.output(7, values[0].encode()).decode() == "".join(
        line + "\n" for line in moses_lines(7, lists[0], token_scores=True))
    assert mode.output(8, values[1].encode()) == b""
    score = PairScore(-3.25, -1.625, [-1.0, -2.25], False)
    assert Score(tokens=True).run(lambda sources, targets: [score], [(b"a", b"b")]) == [
        format_score(score, tokens=True)]


def test_script_refuses_flags_of_another_signature(capsys):
    script = load_script("translate_beam")
    for flags, message in (
            (["--n-best", "2"], "--n-best: only with --signature translate_nbest (given: "
                                "serving_default)"),
            (["--signature", "translate_sampled"], "translate_sampled needs --sampling-topk"),
            (["--signature", "score", "--beam-size", "2"], "--beam-size is a beam search"),
            (["--signature", "translate_nbest", "--n-best", "3", "--beam-size", "2"],
             "--n-best 3 needs --beam-size >= 3")):
        with pytest.raises(SystemExit):
            script.parse_args(["--model", "m", "--input", "i", "--output", "o", *flags])
        assert message in capsys.readouterr().err


def run_pipeline(model, files, output, mode, **read_options):
    """The pipeline of `files` on Beam's FnApiRunner in this process (what the DirectRunner
    runs), one sentence a model call, merged into `output`; returns its lines."""
    options = PipelineOptions([])
    shards = str(output) + ".shards"
    with beam.Pipeline(runner=direct_runner(options), options=options) as pipeline:
        build(pipeline, [(i, str(path), []) for i, path in enumerate(files)], shards,
              TranslateHandler(model, 1, 4, mode), **read_options)
    merge_shards(shards, len(files), str(output), mode)
    return output.read_text(encoding="utf-8").split("\n")[:-1]


def test_pipeline_translates_text_and_tfrecord_files_in_order(tiny_export, tmp_path):
    (tmp_path / "a.en").write_bytes(b"\n".join(LINES[:3]) + b"\n")
    write_tfrecords(tmp_path / "b.tfrecord", LINES[4:7], feature="text")
    output = run_pipeline(tiny_export, [tmp_path / "a.en", tmp_path / "b.tfrecord"],
                          tmp_path / "out", Translate(), feature="text")
    assert output == reference(tiny_export, LINES[:3] + LINES[4:7])


def test_pipeline_nbest_takes_prefixes_and_constraints_from_columns(tiny_export, tmp_path):
    rows = [(b"A dog runs.", b"", b""), (b"Two men.", b"Ein", b""), (b"A cat.", b"", b"Katze")]
    (tmp_path / "a.tsv").write_bytes(b"".join(b"\t".join(row).rstrip(b"\t") + b"\n"
                                              for row in rows))
    output = run_pipeline(tiny_export, [tmp_path / "a.tsv"], tmp_path / "out", NBest(2))
    lists = load_nbest_fn(tiny_export, 2, batch_size=1)([Line(*row) for row in rows])
    assert output == [line for i, hypotheses in enumerate(lists)
                      for line in moses_lines(i, hypotheses)]


def test_pipeline_samples_and_scores(tiny_export, tmp_path):
    sources = [b"A dog runs.", b"Two men play.", b""]
    (tmp_path / "a.en").write_bytes(b"".join(source + b"\n" for source in sources))
    greedy = load_sample_fn(tiny_export, 1, seed=0, batch_size=1)(sources)
    assert run_pipeline(tiny_export, [tmp_path / "a.en"], tmp_path / "sampled",
                        Sample(sampling_topk=1, seed=5)) == greedy
    targets = [b"Ein Hund.", b"", b"Zwei."]
    (tmp_path / "a.tsv").write_bytes(b"".join(s + b"\t" + t + b"\n"
                                              for s, t in zip(sources, targets, strict=True)))
    scores = load_score_fn(tiny_export, batch_size=1)(sources, targets)
    assert run_pipeline(tiny_export, [tmp_path / "a.tsv"], tmp_path / "scores",
                        Score(tokens=True)) == [format_score(s, tokens=True) for s in scores]
