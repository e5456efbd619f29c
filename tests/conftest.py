"""Shared test setup: quiet TensorFlow, 8 logical CPU devices for MirroredStrategy tests,
the shared data folder, the `slow` tier, and the order of the files.

Tests marked `slow` (`pytest.ini`) train, compile C++, run an export script end to end or
start processes that do; `pytest -m "not slow"` runs the rest, the inner loop of a change;
CI runs everything (`bash scripts/test.sh`).

The test processes run with switches that make them cheaper (support/environment.py's
TEST_ENV: oneDNN off; Grappler off and the garbage collector run less
often, below). Tests marked `user_env` start their processes as a user does, with none of
them (support.environment.user_env): the documented commands (tests/test_docs_run.py:
new interpreters when the slow tier runs, DOCS_TEST_FORK=0/1 to choose), the export
loaded without the package and through TF Serving's session and C++ loaders;
in the fast tier, test_serving.py's tiny export in such a process.

The files run longest first, by tests/durations.json (support/durations.py);
`--record-durations` rewrites it from a run of the whole suite. Helpers the files share
are in support/ (a test file never imports another); the fixtures several files use are
in support/fixtures.py, registered here.

What several files need is built once per session and shared, also by the pytest-xdist
workers (`shared_build`): the tiny SentencePiece model (`spm_model`), an untrained tiny
model's export (`tiny_export`), a small trained run dir with its export
(`one_replica_reference`) and the one-worker reference of the two-worker tests. A test that
changes one of them works on a copy.
"""

import contextlib
import json
import os
import resource
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The test processes' switches (support/environment.py says why), set before TensorFlow is
# imported; the processes that check what users run get user_env() instead.
from support.environment import MISSING_DATA, SHARED_DATA, set_test_env  # noqa: E402

set_test_env()
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from docs_fork import collect_less_often, grappler_off  # noqa: E402
from filelock import FileLock  # noqa: E402
from support import durations  # noqa: E402

# The fixtures several files use (a test names them; support/fixtures.py).
pytest_plugins = ("support.fixtures",)

# The paper trained on 8 GPUs; tests split the CPU into 8 logical devices instead. This must
# happen before TensorFlow initialises its devices, i.e. before any op runs.
NUM_LOGICAL_CPUS = 8
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)

# Grappler, TensorFlow's graph optimizer, is off in the test processes: it spends seconds on
# each new function graph (a search's while loop, a train step) that a test runs a few
# times, and changes what a graph computes only within float rounding. The processes the
# tests start (the documented commands, the fresh-process and C++-loader checks) run with
# it, as users do; a test that compares a training in this process with one in a started
# process trains here under `grappler_on()`. TFXFORMER_TEST_GRAPPLER=1 keeps it on
# everywhere (bench/README.md, "Test suite").
grappler_off()
collect_less_often()  # tests/docs_fork.py says why


@contextlib.contextmanager
def grappler_on():
    """Grappler on for the functions called inside (as in a process the tests start, so
    that a training here computes what the same training there does, bit for bit)."""
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    try:
        yield
    finally:
        grappler_off()


def shared_data(*parts):
    """The path of `parts` under SHARED_DATA; FileNotFoundError saying how to point the tests
    at the data when it is missing."""
    path = os.path.join(SHARED_DATA, *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{MISSING_DATA}; missing: {path!r}")
    return path


def pytest_report_header(config):
    found = "found" if os.path.isdir(SHARED_DATA) else f"MISSING ({MISSING_DATA})"
    return f"tfxformer shared data: {SHARED_DATA} ({found})"


@pytest.fixture
def tiny_config():
    """The ModelConfig of a tiny Transformer (the "tiny" preset, vocabulary of 64)."""
    from tfxformer.config import get_preset

    return get_preset("tiny", vocab_size=64)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Every test starts from the same seed and the float32 policy."""
    import keras

    keras.utils.set_random_seed(1234)
    yield
    keras.mixed_precision.set_global_policy("float32")


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture(autouse=True, scope="module")
def _release_memory(request):
    """After each file: Keras' global state cleared, the cyclic garbage collected (the
    collector runs rarely here, above) and the freed heap given back to the system. A
    worker runs a third of the suite's files; without this its heap grew past 9 GiB and
    three such workers past the 24 GiB of CI's machine. TFXFORMER_TEST_MEMORY_LOG=FILE
    appends each file's resident MiB before and after."""
    yield
    import ctypes
    import gc

    import keras

    before = _rss_mib()
    keras.backend.clear_session()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    log = os.environ.get("TFXFORMER_TEST_MEMORY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} "
                    f"{request.node.nodeid} {before:.0f} {_rss_mib():.0f}\n")


def strategy_over(num_replicas):
    """The MirroredStrategy over the first `num_replicas` logical CPU devices."""
    from tfxformer.distribute import mirrored_strategy

    names = [d.name for d in tf.config.list_logical_devices("CPU")][:num_replicas]
    return mirrored_strategy(tuple(names))


# --- builds shared by the test files (and by the pytest-xdist workers) of one session ------

def shared_build(tmp_path_factory, name, build):
    """The folder `name`, filled by `build(folder)` once per test session and shared by every
    test file and xdist worker (pytest-xdist's "Making session-scoped fixtures execute only
    once": a file lock in the folder the workers' base temp dirs share). A build that raised
    is retried by the next caller. Tests that change what they get copy it first."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above popen-gw0, popen-gw1, ...
    folder = base / "shared" / name
    with FileLock(str(base / f"shared-{name}.lock")):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory):
    """support.serving.train_sentencepiece()'s tiny BPE model (vocabulary 320), trained
    once."""
    def build(folder):
        from support.serving import train_sentencepiece

        (folder / "spm.model").write_bytes(train_sentencepiece())

    return (shared_build(tmp_path_factory, "spm_model", build) / "spm.model").read_bytes()


TINY_EXPORT_OPTIONS = dict(beam_size=3, extra_length=4, max_batch_size=3)
TINY_EXPORT_POSITIONS = 48


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, spm_model):
    """The version dir (<base>/1) of an untrained tiny model's translator (vocabulary 320 of
    `spm_model`, TINY_EXPORT_POSITIONS positions; TINY_EXPORT_OPTIONS; config src en, tgt
    de), exported once per session. Read-only: a test that adds versions copies <base>."""
    def build(folder):
        from tfxformer import Transformer
        from tfxformer.serving import Translator, export_translator

        tf.random.set_seed(3)
        model = Transformer.from_preset("tiny", vocab_size=320,
                                        max_positions=TINY_EXPORT_POSITIONS)
        version = export_translator(Translator(model, spm_model, **TINY_EXPORT_OPTIONS),
                                    str(folder / "tiny"), config={"src": "en", "tgt": "de"})
        (folder / "version.txt").write_text(os.path.relpath(version, folder))

    folder = shared_build(tmp_path_factory, "tiny_export", build)
    return str(folder / (folder / "version.txt").read_text())


def tiny_export_translator(version, spm_model):
    """The in-process Translator of `tiny_export`: its weights, its options."""
    from tfxformer import Transformer
    from tfxformer.serving import Translator

    return Translator(Transformer.from_preset(version), spm_model, **TINY_EXPORT_OPTIONS)


def _reference_run(folder, steps, export=False, **flags):
    """Trains scripts/train_wmt.py's tiny deterministic run of `steps` updates (a log line
    and loss scalar every update) on support.reliability.tiny_corpus in `folder` (and exports
    it to folder/export with `export`); writes reference.json: {"final": the script's last
    JSON line, "losses": [loss of update 1..]}."""
    import importlib.util
    import io

    from support.reliability import ROOT, script_args, tiny_corpus, train_wmt

    corpus = tiny_corpus(folder / "data")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), grappler_on():  # compared with started processes
        if export:
            flags["export_dir"] = str(folder / "export")
        assert train_wmt.main(script_args(corpus, str(folder / "run"), steps,
                                          deterministic=True, **flags)) == 0
    spec = importlib.util.spec_from_file_location(
        "plot_training", os.path.join(ROOT, "scripts", "plot_training.py"))
    plot_training = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_training)
    losses = plot_training.read_scalars(str(folder / "run" / "logs"))["loss"]
    assert [step for step, _ in losses] == list(range(1, steps + 1))
    (folder / "reference.json").write_text(json.dumps({
        "final": json.loads(out.getvalue().strip().splitlines()[-1]),
        "losses": [loss for _, loss in losses]}))


def _reference(tmp_path_factory, name, steps, **flags):
    folder = shared_build(tmp_path_factory, name,
                          lambda folder: _reference_run(folder, steps, **flags))
    return {"corpus": str(folder / "data"), "run": str(folder / "run"),
            "export": str(folder / "export"),
            **json.loads((folder / "reference.json").read_text())}


@pytest.fixture(scope="session")
def one_replica_reference(tmp_path_factory):
    """One small trained run dir and its export, trained once: the tiny run of
    support.reliability.script_args, deterministic, 30 updates on one replica, every
    checkpoint (ckpt-2 ... ckpt-30) kept, the last 2 averaged (averaged/ckpt-30), exported
    by the script. The uninterrupted run of the kill and token-cache tests, the source of
    test_pretrained.py. Read-only: copy the run dir to change it. {"corpus", "run",
    "export", "final": the last JSON line (the loss of update 30), "losses": [loss of
    update 1..30] (float32)}."""
    return _reference(tmp_path_factory, "one_replica_reference", 30, keep_checkpoints=15,
                      average_last=2, export=True)


@pytest.fixture(scope="session")
def one_worker_reference(tmp_path_factory):
    """The run the two-worker tests (test_multiworker*.py) must equal, trained once: as
    `one_replica_reference` but 8 updates on one worker with 2 replicas, one update per
    call."""
    return _reference(tmp_path_factory, "one_worker_reference", 8, cpu_devices=2,
                      steps_per_loop=1)


# TFXFORMER_TEST_CPU_LOG=FILE: each test's CPU seconds (this process and the processes it
# started and waited for; a module's fixtures count for its first test) appended to FILE as
# "seconds<TAB>test id<TAB>start<TAB>end<TAB>worker" lines (start and end: Unix times; the
# pytest-xdist worker, or "-"): where the suite's CPU and time go (bench/README.md, "Test
# suite").
CPU_LOG = os.environ.get("TFXFORMER_TEST_CPU_LOG")


def _cpu_seconds():
    return sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, start = (_cpu_seconds(), time.time()) if CPU_LOG else (0.0, 0.0)
    yield
    if CPU_LOG:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        with open(CPU_LOG, "a", encoding="utf-8") as f:
            f.write(f"{_cpu_seconds() - before:.2f}\t{item.nodeid}\t{start:.1f}\t"
                    f"{time.time():.1f}\t{worker}\n")


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each test file's wall seconds in this run (the whole suite) "
                          "to tests/durations.json, the order of the next runs' files")


def pytest_configure(config):
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        durations.check_recordable(config, os.path.dirname(os.path.abspath(__file__)))
        config.pluginmanager.register(durations.Recorder(), "tfxformer-durations")


def pytest_collection_modifyitems(config, items):
    # The longest files first, by tests/durations.json (support/durations.py says how).
    durations.order_items(items, durations.load())
