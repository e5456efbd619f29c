"""tfxformer.data.distill and scripts/distill.py: teachers' training data, chunked and
resumable (Kim & Rush, 2016; Nguyen et al., 2020)."""

import gzip
import importlib.util
import json
import os
import shutil

import pytest

from tfxformer.data.distill import RECORD_FILENAME, Teacher, check_direction, distill_folder
from tfxformer.data.sources import iter_lines, load_text_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [f"source {i}" for i in range(7)]
TARGETS = [f"ziel {i}" for i in range(7)]


@pytest.fixture
def corpus(tmp_path):
    """7 training pairs, a gzipped validation split, a test split and an unrelated file."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.en").write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    (folder / "train.de").write_text("".join(t + "\n" for t in TARGETS), encoding="utf-8")
    with gzip.open(folder / "val.en.gz", "wt", encoding="utf-8") as f:
        f.write("a val source\n")
    (folder / "val.de").write_text("ein Val-Ziel\n", encoding="utf-8")
    (folder / "test_x.en").write_text("test\n", encoding="utf-8")
    (folder / "test_x.de").write_text("Test\n", encoding="utf-8")
    (folder / "train.fr").write_text("".join("fr\n" for _ in SOURCES), encoding="utf-8")
    return str(folder)


def _teacher(tag, reverse=False, calls=None, fail_after=None):
    """A teacher whose translation of `line` is `tag:line` reversed; records each call's
    lines in `calls` and raises on call number `fail_after` (a kill mid-way)."""
    def translate(lines):
        if calls is not None:
            if fail_after is not None and len(calls) == fail_after:
                raise KeyboardInterrupt("killed")
            calls.append(list(lines))
        return [f"{tag}:{line[::-1]}" for line in lines]
    return Teacher(tag, load=lambda: translate, reverse=reverse, settings={"beam_size": 4})


def _lines(path):
    return list(iter_lines(str(path)))


def test_forward_reverse_and_original_pairs_interleaved_by_chunk(corpus, tmp_path):
    out = tmp_path / "out"
    record = distill_folder(corpus, out, [_teacher("f"), _teacher("r", reverse=True)],
                            keep_original=True, chunk_lines=3, progress=False)
    expected_src, expected_tgt = [], []
    for start in range(0, 7, 3):  # per chunk: originals, forward pairs, reverse pairs
        src, tgt = SOURCES[start:start + 3], TARGETS[start:start + 3]
        expected_src += src + src + [f"r:{t[::-1]}" for t in tgt]
        expected_tgt += tgt + [f"f:{s[::-1]}" for s in src] + tgt
    assert _lines(out / "train.en") == expected_src
    assert _lines(out / "train.de") == expected_tgt
    # Validation and tests unchanged (the gzipped one stays gzipped), other languages left out.
    assert (out / "val.en.gz").read_bytes() == (tmp_path / "data" / "val.en.gz").read_bytes()
    assert sorted(os.listdir(out)) == [".chunks", RECORD_FILENAME, "test_x.de", "test_x.en",
                                       "train.de", "train.en", "val.de", "val.en.gz"]
    assert load_text_folder(out, "en", "de").train.num_examples == 21
    with open(out / RECORD_FILENAME, encoding="utf-8") as f:
        assert json.load(f) == record
    assert record["train_pairs"] == 21 and record["original_pairs"] == 7
    assert [(t["direction"], t["translates"], t["pairs"], t["translated_now"])
            for t in record["teachers"]] == [("forward", "train.en", 7, 7),
                                             ("reverse", "train.de", 7, 7)]


def test_a_killed_run_resumes_from_its_finished_chunks(corpus, tmp_path):
    out, calls = tmp_path / "out", []
    with pytest.raises(KeyboardInterrupt):
        distill_folder(corpus, out, [_teacher("f", calls=calls, fail_after=2)],
                       chunk_lines=2, progress=False)
    assert calls == [SOURCES[0:2], SOURCES[2:4]] and not (out / "train.en").exists()
    # A chunk cut short (its .tgt renamed, its .src not yet) is translated again.
    (folder,) = (out / ".chunks").iterdir()
    os.remove(folder / "000001.src")
    calls.clear()
    record = distill_folder(corpus, out, [_teacher("f", calls=calls)], chunk_lines=2,
                            progress=False)
    assert calls == [SOURCES[2:4], SOURCES[4:6], SOURCES[6:7]]
    assert record["teachers"][0]["translated_now"] == 5
    straight = distill_folder(corpus, tmp_path / "straight", [_teacher("f")], chunk_lines=2,
                              progress=False)
    assert _lines(out / "train.de") == _lines(tmp_path / "straight" / "train.de")
    assert straight["teachers"][0]["key"] == record["teachers"][0]["key"]
    # Everything done: the model is not even loaded.
    done = Teacher("f", load=lambda: pytest.fail("loaded"), settings={"beam_size": 4})
    distill_folder(corpus, out, [done], chunk_lines=2, progress=False)


def test_other_settings_write_other_chunks_and_a_limit_run_is_reused(corpus, tmp_path):
    out, calls = tmp_path / "out", []
    first = distill_folder(corpus, out, [_teacher("f", calls=calls)], chunk_lines=2, limit=3,
                           progress=False)
    assert calls == [SOURCES[0:2], SOURCES[2:3]] and len(_lines(out / "train.de")) == 3
    calls.clear()
    distill_folder(corpus, out, [_teacher("f", calls=calls)], chunk_lines=2, progress=False)
    assert calls == [SOURCES[2:4], SOURCES[4:6], SOURCES[6:7]]  # chunk 1 had 1 line, now 2
    other = Teacher("f", load=_teacher("f").load, settings={"beam_size": 1})
    second = distill_folder(corpus, out, [other], chunk_lines=2, progress=False)
    assert second["teachers"][0]["key"] != first["teachers"][0]["key"]
    assert second["teachers"][0]["translated_now"] == 7


def test_translations_stay_one_line_and_empty_ones_are_counted(corpus, tmp_path):
    teacher = Teacher("odd", load=lambda: lambda lines: ["two\nlines", ""] * 3 + ["x"])
    record = distill_folder(corpus, tmp_path / "out", [teacher], progress=False)
    assert _lines(tmp_path / "out" / "train.de")[:2] == ["two lines", ""]
    assert record["teachers"][0]["empty_translations"] == 3


def test_bad_calls_name_the_problem(corpus, tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        distill_folder(corpus, tmp_path / "out", [], progress=False)
    with pytest.raises(ValueError, match="given twice"):
        distill_folder(corpus, tmp_path / "out", [_teacher("f"), _teacher("f")],
                       progress=False)
    with pytest.raises(ValueError, match="data folder itself"):
        distill_folder(corpus, corpus, [_teacher("f")], progress=False)
    with pytest.raises(ValueError, match="`chunk_lines` must be an integer >= 1, got 0"):
        distill_folder(corpus, tmp_path / "out", [_teacher("f")], chunk_lines=0)
    short = Teacher("short", load=lambda: lambda lines: lines[1:])
    with pytest.raises(ValueError, match="'short' returned 6 translations for 7 lines"):
        distill_folder(corpus, tmp_path / "out", [short], progress=False)
    with pytest.raises(FileNotFoundError, match="train.de"):
        distill_folder(tmp_path / "out", tmp_path / "o2", [_teacher("f")], progress=False)


def test_teacher_direction_is_checked():
    assert check_direction("m", "en", "de", (), "en", "de", reverse=False) is None
    assert check_direction("m", "de", "en", (), "en", "de", reverse=True) is None
    assert check_direction("m", "de", "mul", ("en", "fr"), "en", "de", reverse=True) == "en"
    with pytest.raises(ValueError, match=r"'m' translates en -> de .*reverse teacher.*"
                                         r"de -> en"):
        check_direction("m", "en", "de", (), "en", "de", reverse=True)
    with pytest.raises(ValueError, match=r"translates en -> de, fr .*forward.* en -> es"):
        check_direction("m", "en", "mul", ("de", "fr"), "en", "es", reverse=False)


@pytest.fixture(scope="module")
def teachers(tiny_export, tmp_path_factory):
    """conftest's shared `tiny_export` (EN->DE, untrained) and a copy recorded as DE->EN."""
    reverse = tmp_path_factory.mktemp("teachers") / "de_en" / "1"
    shutil.copytree(tiny_export, reverse)
    config = reverse / "assets" / "config.json"
    record = json.loads(config.read_text())
    config.write_text(json.dumps({**record, "src": "de", "tgt": "en"}))
    return tiny_export, str(reverse.parent)


def _script_main(*args):
    """scripts/distill.py's main(args), in this process."""
    spec = importlib.util.spec_from_file_location(
        "distill_script", os.path.join(ROOT, "scripts", "distill.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(args))


def test_script_refuses_a_teacher_of_the_wrong_direction_before_loading_it(
        corpus, tiny_config, tmp_path, capsys):
    forward = tmp_path / "en_de"  # a run dir's record only: nothing is loaded
    forward.mkdir()
    (forward / "config.json").write_text(json.dumps(
        {"model": tiny_config.to_dict(), "src": "en", "tgt": "de"}))
    forward, out = str(forward), str(tmp_path / "out")
    assert _script_main("--data", corpus, "--out", out, "--reverse-teacher", forward) == 2
    error = capsys.readouterr().err
    assert f"Teacher {forward!r} translates en -> de" in error
    assert "a reverse teacher translates the targets back" in error
    assert _script_main("--data", corpus, "--out", out, "--teacher", out + "x") == 2
    assert "does not exist" in capsys.readouterr().err
    assert not os.path.exists(out)


@pytest.mark.slow
def test_script_distills_with_forward_and_reverse_exports(corpus, teachers, tmp_path, capsys):
    forward, reverse = teachers
    out = str(tmp_path / "out")
    assert _script_main("--data", corpus, "--out", out, "--teacher", forward,
                        "--reverse-teacher", reverse, "--keep-original", "--beam-size", "2",
                        "--chunk-lines", "4") == 0
    assert "wrote 21 training pairs" in capsys.readouterr().out
    assert load_text_folder(out, "en", "de").train.num_examples == 21
    # Chunk 0: the originals, the forward teacher's pairs, the reverse teacher's pairs.
    assert _lines(os.path.join(out, "train.en"))[:8] == SOURCES[:4] * 2
    assert _lines(os.path.join(out, "train.de"))[8:12] == TARGETS[:4]
    with open(os.path.join(out, RECORD_FILENAME), encoding="utf-8") as f:
        record = json.load(f)["teachers"]
    assert [(t["direction"], os.path.basename(t["settings"]["model"]), t["settings"]["kind"],
             t["settings"]["beam_size"], t["translated_now"]) for t in record] == [
        ("forward", "1", "saved_model", 2, 7), ("reverse", "1", "saved_model", 2, 7)]
