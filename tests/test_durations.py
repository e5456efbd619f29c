"""support/durations.py: the files' order from tests/durations.json, and what it records."""

import json
import types

import pytest
from support import durations


def _items(*files):
    """Stand-ins for pytest items: (file name, marked slow) -> path.name, a slow marker."""
    def item(name, slow):
        marker = pytest.mark.slow.mark if slow else None
        return types.SimpleNamespace(path=types.SimpleNamespace(name=name), slow=slow,
                                     get_closest_marker=lambda _: marker)
    return [item(name, slow) for name, slow in files]


def test_recorded_files_run_longest_first_and_new_ones_by_their_marks():
    items = _items(("test_a.py", False), ("test_new_fast.py", False), ("test_b.py", True),
                   ("test_b.py", False), ("test_new_slow.py", False),
                   ("test_new_slow.py", True), ("test_c.py", False))
    durations.order_items(items, {"test_a.py": 3.0, "test_b.py": 40.0, "test_c.py": 12.5})
    assert [(i.path.name, i.slow) for i in items] == [
        ("test_new_slow.py", False), ("test_new_slow.py", True), ("test_b.py", True),
        ("test_b.py", False), ("test_c.py", False), ("test_a.py", False),
        ("test_new_fast.py", False)]


def test_a_record_of_seconds_or_of_an_order(tmp_path):
    path = tmp_path / "durations.json"
    assert durations.load(str(path)) == {}
    path.write_text(json.dumps({"how": "measured", "seconds": {"test_a.py": 3, "b.py": 9.5}}))
    assert durations.load(str(path)) == {"test_a.py": 3.0, "b.py": 9.5}
    path.write_text(json.dumps({"how": "seeded", "order": ["test_b.py", "test_a.py"]}))
    assert durations.load(str(path)) == {"test_b.py": 2.0, "test_a.py": 1.0}


def test_the_committed_record_says_how_it_was_made():
    with open(durations.DURATIONS, encoding="utf-8") as f:
        record = json.load(f)
    assert record["how"] and ("seconds" in record) != ("order" in record)
    assert durations.load()


def test_a_run_is_recorded_as_each_files_wall_seconds(tmp_path):
    recorder = durations.Recorder(str(tmp_path / "durations.json"))
    for nodeid, when, seconds in (("tests/test_a.py::x", "setup", 2.0),
                                  ("tests/test_a.py::x", "call", 1.5),
                                  ("tests/test_a.py::y", "call", 0.5),
                                  ("tests/test_b.py::z[1]", "call", 7.25),
                                  ("tests/test_a.py::y", "teardown", 1.0)):
        recorder.pytest_runtest_logreport(
            types.SimpleNamespace(nodeid=nodeid, when=when, duration=seconds))
    session = types.SimpleNamespace(config=types.SimpleNamespace(
        option=types.SimpleNamespace(numprocesses=3)))
    recorder.pytest_sessionfinish(session, pytest.ExitCode.INTERRUPTED)
    assert not (tmp_path / "durations.json").exists()
    recorder.pytest_sessionfinish(session, pytest.ExitCode.TESTS_FAILED)
    record = json.loads((tmp_path / "durations.json").read_text())
    assert record["seconds"] == {"test_b.py": 7.2, "test_a.py": 5.0}
    assert "3 tests on 3 workers" in record["how"]


def test_a_selection_is_not_recorded(tmp_path):
    def config(args, markexpr="", keyword=""):
        option = types.SimpleNamespace(markexpr=markexpr, keyword=keyword, lf=False,
                                       deselect=[], collectonly=False)
        return types.SimpleNamespace(option=option, args=args)

    tests = str(tmp_path)
    durations.check_recordable(config([tests]), tests)
    for partial in (config([tests], markexpr="not slow"), config([tests], keyword="serving"),
                    config([tests + "/test_a.py"]), config([tests + "/test_a.py::test_x"])):
        with pytest.raises(pytest.UsageError, match="whole suite"):
            durations.check_recordable(partial, tests)
