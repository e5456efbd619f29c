"""tests/docs_fork.py: a `python SCRIPT ARGS` through the fork server behaves as a new
interpreter would (arguments, directory, environment, streams, exit status), and what it
cannot run as a fork runs in a new interpreter."""

import os
import signal
import subprocess

import pytest
from docs_blocks import start_fork_server

SCRIPT = """
import os, sys
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "pid", os.getpid())
print("stdin", sys.stdin.read().strip(), "env", os.environ.get("DOCS_FORK_PROBE"))
print("path0", os.path.basename(sys.path[0]), "main", __name__)
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fork")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server, variables = start_fork_server(str(folder / "server"), env)
    (folder / "work").mkdir()
    (folder / "work" / "probe.py").write_text(SCRIPT)
    yield folder, dict(env, **variables, DOCS_FORK_CPU_LOG=str(folder / "cpu.log"),
                       PATH=variables["DOCS_FORK_BIN"] + os.pathsep + env["PATH"]), server
    os.killpg(server.pid, signal.SIGKILL)


def _run(command, folder, env, stdin=""):
    return subprocess.run(["bash", "-c", command], cwd=folder / "work", env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def _forks(folder):
    """Commands run as forks so far (each appends its CPU seconds to the log)."""
    log = folder / "cpu.log"
    return len(log.read_text().split()) if log.exists() else 0


def test_a_script_runs_as_a_fork_with_its_arguments_streams_and_exit_status(fork):
    folder, env, _ = fork
    before = _forks(folder)
    done = _run("python probe.py 3 x", folder, dict(env, DOCS_FORK_PROBE="set"), "hello\n")
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("argv ['3', 'x'] cwd work pid ")
    assert lines[1:] == ["stdin hello env set", "path0 work main __main__"]
    assert "to stderr" in done.stderr
    assert _forks(folder) == before + 1


def test_pipes_and_a_failing_script(fork):
    folder, env, _ = fork
    before = _forks(folder)
    done = _run("echo piped | python probe.py 0 | grep stdin", folder, env)
    assert done.returncode == 0 and done.stdout == "stdin piped env None\n", done.stderr
    (folder / "work" / "broken.py").write_text("raise ValueError('broken on purpose')\n")
    done = _run("python broken.py", folder, env)
    assert done.returncode == 1 and "ValueError: broken on purpose" in done.stderr
    assert _forks(folder) == before + 2


def test_what_is_no_script_or_changes_import_time_variables_gets_a_new_interpreter(fork):
    folder, env, _ = fork
    before = _forks(folder)
    done = _run("python -c 'print(6 * 7)'", folder, env)
    assert done.returncode == 0 and done.stdout == "42\n"
    other = dict(env, TF_ENABLE_ONEDNN_OPTS="1" if env.get("TF_ENABLE_ONEDNN_OPTS") == "0"
                 else "0")
    done = _run("python probe.py 0", folder, other, "new\n")
    assert done.returncode == 0 and "stdin new env None" in done.stdout, done.stderr
    assert _forks(folder) == before
