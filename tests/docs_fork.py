"""Starts documented `python scripts/NAME.py ...` commands as forks of one process that has
imported TensorFlow and the package, instead of as new interpreters (tests/docs_blocks.py's
runner; the docs test's docstring says when).

A new interpreter spends about 4.5 s of CPU importing TensorFlow, Keras and the package
before a script's first line runs; the docs test runs some forty such commands. Here a
server process imports them once, without running a TensorFlow op (no runtime, no thread
pool exists yet, so a fork is safe), and listens on a Unix socket. A `python` on the
commands' PATH (the client: this file run with `python -S`, a few milliseconds) sends the
server its arguments, working directory and environment, and its standard input, output
and error as file descriptors; the server forks, and the child runs the script as
`python SCRIPT ARGS` would (`__main__`, `sys.argv`, `sys.path[0]` the script's folder, the
same cwd, environment and streams) and sends back its exit status. Anything else (`python
-m`, `-c`, a missing file) and a command whose environment changes what TensorFlow reads at
import (TF_*, XLA_*, ... differing from the server's) run in a new interpreter, as without
this file.

    python tests/docs_fork.py serve SOCKET     # prints "ready" once it listens
    python -S tests/docs_fork.py run ARGS...   # what the `python` on PATH runs
"""

import json
import os
import socket
import sys

# Environment variables read when TensorFlow or Python starts: a command that sets one of
# them differently from the server runs in a new interpreter.
IMPORT_TIME = ("TF_", "XLA_", "OMP_", "KMP_", "CUDA_", "ONEDNN", "DNNL", "PYTHON", "MKL")
PRELOADED = ("tensorflow", "tensorflow_text", "keras", "numpy", "sentencepiece", "sacrebleu",
             "tqdm", "tfxformer", "tfxformer.data", "tfxformer.serving",
             "tfxformer.decoding", "tfxformer.training")


def _import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


def _send(conn, payload):
    data = json.dumps(payload).encode()
    conn.sendall(len(data).to_bytes(8, "big") + data)


def _receive(conn, fds=0):
    head, received, _, _ = socket.recv_fds(conn, 8, fds)
    if len(head) < 8:
        head += _exactly(conn, 8 - len(head))
    return json.loads(_exactly(conn, int.from_bytes(head, "big"))), received


def _exactly(conn, size):
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def _run_child(conn, request, fds):
    """In the forked child: becomes `python SCRIPT ARGS`; never returns."""
    import atexit
    import runpy
    import traceback

    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        encoding = sys.stdout.encoding
        sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1,  # noqa: SIM115
                          encoding=encoding, closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding=encoding,  # noqa: SIM115
                          errors="backslashreplace", closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as error:
            if error.code is None or isinstance(error.code, int):
                code = error.code or 0
            else:
                print(error.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - as the interpreter: print it, exit 1
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - before the script ran: say why on its stderr
        os.write(2, traceback.format_exc().encode())
    finally:
        _log_cpu()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            _send(conn, {"code": code})
        finally:
            os._exit(code & 0xFF)


def _log_cpu():
    """Appends this child's CPU seconds to DOCS_FORK_CPU_LOG: the runner counts a forked
    command's CPU there (it is no child of the runner's)."""
    import resource

    log = os.environ.get("DOCS_FORK_CPU_LOG")
    usage = resource.getrusage(resource.RUSAGE_SELF)  # a fork's counts start at 0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime}\n")


def grappler_off():
    """Grappler (TensorFlow's graph optimizer) off in this process and its forks, as in the
    test processes (tests/conftest.py; TFXFORMER_TEST_GRAPPLER=1 keeps it on): it spends
    about a second on a loaded model's first call and more on a training step, and changes
    what a documented command computes only within float rounding. Sets an option; runs
    no op (the fork stays safe)."""
    if os.environ.get("TFXFORMER_TEST_GRAPPLER") != "1":
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


def collect_less_often():
    """The cyclic garbage collector of this process (and its forks) frozen on what is
    imported and run less often, as in the test processes (tests/conftest.py): tracing a
    graph or exporting one makes millions of short-lived objects, and at Python's default
    thresholds (700, 10, 10) each young collection walks them again. About a tenth less CPU
    for an export of the tiny preset, within the machine's noise for a training."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)


def serve(path):
    import importlib
    import signal

    for name in PRELOADED:
        importlib.import_module(name)
    grappler_off()
    collect_less_often()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    own = _import_time_env(os.environ)
    while True:
        conn, _ = server.accept()
        try:
            request, fds = _receive(conn, 3)
            if len(fds) != 3 or _import_time_env(request["env"]) != own:
                for fd in fds:  # the caller's streams: held open, its pipes never end
                    os.close(fd)
                _send(conn, {"fallback": True})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                server.close()
                _run_child(conn, request, fds)
            for fd in fds:
                os.close(fd)
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            conn.close()


def run(argv):
    """The client: `python ARGS` through the server, or a new interpreter."""
    real = os.environ["DOCS_FORK_PYTHON"]
    script = argv[0] if argv else ""
    if script.endswith(".py") and not script.startswith("-") and os.path.isfile(script):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(os.environ["DOCS_FORK_SOCKET"])
        except OSError:
            conn = None  # no server: a new interpreter
        if conn is not None:
            data = json.dumps({"argv": argv, "cwd": os.getcwd(),
                               "env": dict(os.environ)}).encode()
            try:
                socket.send_fds(conn, [len(data).to_bytes(8, "big") + data], [0, 1, 2])
                reply, _ = _receive(conn)
            except (OSError, ConnectionError, ValueError) as error:
                sys.exit(f"docs_fork: {script} ended without an exit status ({error})")
            if "code" in reply:
                sys.exit(reply["code"])
    os.execv(real, [real, *argv])


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        run(sys.argv[2:])
