"""tfxformer.beam: bulk translation on Apache Beam (docs/beam.md), on the DirectRunner."""

import gzip
import json
import os
import subprocess
import sys

import pytest

beam = pytest.importorskip("apache_beam")

from support.serving import load_script  # noqa: E402

from tfxformer.beam import TranslateHandler, merge_shards, translate_files  # noqa: E402
from tfxformer.beam.handler import KILL_ONCE_ENV  # noqa: E402
from tfxformer.serving import load_translate_fn  # noqa: E402

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
    assert handler.batch_elements_kwargs() == {"min_batch_size": 2, "max_batch_size": 32}
    assert TranslateHandler("unused", 8, 4).batch_elements_kwargs()["max_batch_size"] == 4
    results = handler.run_inference([b"a", b"b c"], lambda lines: ["x\ry", "one\ntwo"])
    assert [(r.example, r.inference) for r in results] == [(b"a", "x y"), (b"b c", "one two")]


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
