"""The order the test files run in, derived from tests/durations.json, and its recording.

`pytest -n 3 --dist loadfile --no-loadscope-reorder` (scripts/test.sh) hands the files to
the workers in collection order, so a long file collected last runs alone while the other
workers idle: the files run longest first, by the wall seconds the last recorded run took
for each (its tests' setup, call and teardown in its worker). A file the record does not
know yet (a new one) runs first when it has a test marked slow (it may train or export;
started early it cannot hold up the end of the run), last when it has none. Files of equal
rank keep pytest's order.

`bash scripts/test.sh --record-durations` rewrites tests/durations.json from a run of the
whole suite (no -m, -k, --lf, --deselect, --collect-only or test ids: the figures of one
run are compared with each other, and the load of the machine changes from run to run).
"""

import datetime
import json
import os
import platform
from collections import defaultdict

import pytest

DURATIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "durations.json")


def load(path=DURATIONS):
    """{file name: sort weight, larger runs earlier}: the recorded wall seconds, or, from a
    record that holds an ordered list of names instead ("order", longest first), their
    ranks. {} without a record."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if "seconds" in record:
        return {name: float(seconds) for name, seconds in record["seconds"].items()}
    order = record["order"]
    return {name: float(len(order) - i) for i, name in enumerate(order)}


def order_items(items, weights):
    """Sorts pytest's `items` in place, files whole: unknown files with a slow test, the
    known files by weight (longest first), unknown files without a slow test."""
    slow = {item.path.name for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        if name in weights:
            return (1, -weights[name])
        return (0, 0.0) if name in slow else (2, 0.0)

    items.sort(key=rank)  # stable: a file's tests keep their order and stay together


def check_recordable(config, tests_dir):
    """pytest.UsageError unless this run runs the whole suite."""
    option = config.option
    partial = [flag for flag, value in (("-m", option.markexpr), ("-k", option.keyword),
                                        ("--lf", option.lf), ("--deselect", option.deselect),
                                        ("--collect-only", option.collectonly))
               if value]
    partial += [arg for arg in config.args if "::" in arg]
    if partial or os.path.realpath(tests_dir) not in {os.path.realpath(a) for a in config.args}:
        raise pytest.UsageError(
            "--record-durations records a run of the whole suite (`pytest tests`), not "
            f"a selection ({', '.join(partial) or ' '.join(config.args)}): every file's "
            "figure must come from the same run")


class Recorder:
    """Sums each file's test phases (setup, call, teardown: under pytest-xdist the reports
    reach the controller) and writes DURATIONS at the end of the session."""

    def __init__(self, path=DURATIONS):
        self.path, self.seconds, self.tests = path, defaultdict(float), 0

    def pytest_runtest_logreport(self, report):
        self.seconds[os.path.basename(report.nodeid.split("::")[0])] += report.duration
        self.tests += report.when == "call"

    def pytest_sessionfinish(self, session, exitstatus):
        if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return  # interrupted: not the whole suite
        workers = getattr(session.config.option, "numprocesses", None) or 1
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        record = {
            "how": (f"recorded by --record-durations, {when}: each file's wall seconds (its "
                    f"tests' setup, call and teardown in its worker), {self.tests} tests on "
                    f"{workers} workers, {os.cpu_count()} CPUs ({platform.machine()}), load "
                    f"{os.getloadavg()[0]:.1f} at the end"),
            "seconds": {name: round(seconds, 1) for name, seconds in
                        sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0]))}}
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
