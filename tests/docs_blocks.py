"""The fenced code blocks of the documentation pages, what tests/test_docs_run.py does with
each, and the runner that executes one page's blocks in a process of its own.

Imported by tests/test_docs_run.py (parsing, classification, flag rewriting; no TensorFlow)
and run as a script by it: `python tests/docs_blocks.py PLAN.json RESULT.json` executes the
steps of PLAN.json in order from the current directory (a scratch copy of the repository
root) and writes each step's outcome to RESULT.json. The rules are in the docstring of
tests/test_docs_run.py.
"""

import json
import os
import re
import shlex
import sys
import textwrap

# ```python -> "python"; ```bash / ```sh / ```console -> "shell"; anything else (text, json,
# yaml, untagged, ...) is not executed.
PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"bash", "sh", "shell", "console", "shell-session", "zsh"}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
ANY_MARKER = re.compile(r"<!--\s*docs-test")

# Programs a test never runs; a shell line using one must be in a block marked skip.
SERVER_PROGRAMS = {"docker", "tensorflow_model_server", "curl"}
# `bash scripts/NAME` lines that are checked (the file exists and is executable), not run:
# quickstart.sh is the minutes-long main job, test.sh the test suite itself.
CHECK_ONLY_SCRIPTS = {"scripts/quickstart.sh", "scripts/test.sh"}
PYTHONS = {"python", "python3"}
OPERATORS = {"|", "||", "&&", ";", "&", "<", ">", ">>", "2>", "2>&1", "|&"}

# Flag rewrites (see tests/test_docs_run.py).
TRAIN_STEPS = 2
TRAIN_VOCAB = 400
TRAIN_BATCH_TOKENS = 512
TRAIN_MAX_LENGTH = 32
TRAIN_AVERAGE_LAST = 2
TRAIN_SHUFFLE_BUFFER = 300
DISTILL_LIMIT = 40
TINY_VAL = 20  # validation pairs of a corpus the scripts split off (the tiny Multi30k's too)
TINY_TEST = 8  # test pairs alike
MULTI30K = "../shared/data/multi30k"


class Block:
    """One fenced block: `lang` (the info string's first word, lowercase), `kind`
    ("python", "shell" or None: not executed), `line` (1-based line of the opening fence),
    `code` (dedented), `marker` (None, "slow" or "skip"), `reason` (of a skip), `errors`
    (what is wrong with its marker or fence)."""

    def __init__(self, page, line, lang, code, marker=None, reason=None, errors=()):
        self.page, self.line, self.lang, self.code = page, line, lang, code
        self.marker, self.reason, self.errors = marker, reason, list(errors)
        self.kind = ("python" if lang in PYTHON_LANGS else
                     "shell" if lang in SHELL_LANGS else None)

    @property
    def where(self):
        return f"{self.page}:{self.line}"

    def __repr__(self):
        return f"Block({self.where} {self.lang or 'untagged'} {self.marker or ''})"


def parse_marker(text):
    """(marker, reason, error) of the body of a `<!-- docs-test: ... -->` comment."""
    body = text.strip()
    if body == "slow":
        return "slow", None, None
    if body == "skip" or body.startswith("skip:") or body.startswith("skip "):
        reason = body[4:].lstrip(": ").strip()
        if not reason:
            return "skip", None, ("`docs-test: skip` needs a reason: `<!-- docs-test: skip: "
                                  "WHAT IT NEEDS THAT CI LACKS; WHICH TEST CHECKS IT -->`")
        return "skip", reason, None
    return None, None, (f"unknown docs-test directive {body!r}: accepted are `slow` and "
                        "`skip: REASON`")


def parse_blocks(page, text):
    """(blocks, errors) of a Markdown page: its fenced blocks in order, and the problems
    that belong to no block (a docs-test comment not directly above a fence, an unclosed
    fence)."""
    lines = text.splitlines()
    blocks, errors, used_markers = [], [], set()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        lang = match["info"].lower().strip("{}.")
        start = i
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        if i >= len(lines):
            errors.append(f"{page}:{start + 1}: fence never closed")
        i += 1
        marker = reason = None
        block_errors = []
        if start > 0 and MARKER.match(lines[start - 1]):
            used_markers.add(start - 1)
            marker, reason, error = parse_marker(MARKER.match(lines[start - 1])["body"])
            if error:
                block_errors.append(error)
        blocks.append(Block(page, start + 1, lang, textwrap.dedent("\n".join(body) + "\n"),
                            marker, reason, block_errors))
    for number, line in enumerate(lines):
        if ANY_MARKER.search(line) and number not in used_markers:
            errors.append(f"{page}:{number + 1}: docs-test comment not on the line directly "
                          f"above a fence: {line.strip()!r}")
    return blocks, errors


# --- shell lines ---------------------------------------------------------------------------

def shell_lines(code, first_line):
    """(line number, text) of a shell block's commands: `\\` continuations joined, comment
    lines and blank lines dropped, a `$ ` prompt removed (console blocks; in a block that
    uses prompts, lines without one are output)."""
    raw = code.splitlines()
    prompts = any(line.startswith("$ ") for line in raw)
    out, pending, pending_line = [], "", None
    for offset, line in enumerate(raw):
        number = first_line + 1 + offset
        if not pending:
            if prompts:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            pending_line = number
        if line.rstrip().endswith("\\"):
            pending += line.strip()[:-1].rstrip() + " "
            continue
        out.append((pending_line, (pending + line.strip()).strip()))
        pending = ""
    if pending:
        out.append((pending_line, pending.strip()))
    return out


def tokenize(command):
    """The shell words and operators of `command`, a trailing `# comment` dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def segments(tokens):
    """The simple commands of a token list: lists of words (env assignments first), split at
    | || && ; &, redirection targets dropped."""
    out, current, skip_next = [], [], False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in ("|", "||", "&&", ";", "&", "|&"):
            out.append(current)
            current = []
        elif token in ("<", ">", ">>"):
            skip_next = True
        elif re.fullmatch(r"\d?>&?\d?", token):
            continue
        else:
            current.append(token)
    out.append(current)
    return [s for s in out if s]


def program(words):
    """(env assignments, words from the program on) of a simple command."""
    env = []
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        env.append(words[0])
        words = words[1:]
    return env, words


def classify(command):
    """What the test does with one shell line: ("run", None), ("check", script path),
    ("server", program) (never run; the block must be marked skip), ("network", why) (needs
    downloads or a cluster; the block must be marked skip) or ("not run", why)."""
    try:
        tokens = tokenize(command)
    except ValueError as error:
        return "not run", f"not a shell line ({error})"
    runs = False
    for words in segments(tokens):
        env, words = program(words)
        if not words:
            continue
        name = os.path.basename(words[0])
        if name in SERVER_PROGRAMS:
            return "server", name
        if any(e.startswith("TF_CONFIG=") for e in env):
            return "network", "a multi-worker training (TF_CONFIG names a cluster)"
        if name in PYTHONS and len(words) > 1:
            if words[1] == "scripts/train_wmt.py":
                why = network_data(words[2:])
                if why:
                    return "network", why
            runs = True
        elif name == "bash" and len(words) > 1 and words[1].startswith("scripts/"):
            if words[1] in CHECK_ONLY_SCRIPTS:
                return "check", words[1]
            runs = True
    if runs:
        return "run", None
    return "not run", "runs no `python ...` or `bash scripts/...` command"


def flag_value(args, flag):
    """The value of `--flag V` or `--flag=V` in args, or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def network_data(args):
    """Why a train_wmt.py command needs the network (its --data is tensorflow-datasets),
    or None."""
    data = flag_value(args, "--data")
    if data is None or data == "wmt14" or data.startswith("tfds:"):
        return (f"--data {data or 'wmt14 (the default)'} downloads through "
                "tensorflow-datasets")
    return None


# --- flag rewrites -------------------------------------------------------------------------

def set_flag(args, flag, value, only_if_present=False, cap=None):
    """args with `flag` set to `value` (appended when absent, unless only_if_present); with
    `cap`, an integer value is lowered to at most `cap` (kept when smaller)."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            old = args[i + 1]
            args[i + 1] = str(min(int(old), cap)) if cap is not None and old.isdigit() else value
            return args
        if arg.startswith(flag + "="):
            old = arg.split("=", 1)[1]
            new = str(min(int(old), cap)) if cap is not None and old.isdigit() else value
            args[i] = f"{flag}={new}"
            return args
    if only_if_present:
        return args
    return args + [flag, value]


def rewrite_args(script, args, tiny_corpus, scratch):
    """The cheap form of `python SCRIPT ARGS` (the rules of tests/test_docs_run.py)."""
    if script == "scripts/train_wmt.py":
        if flag_value(args, "--init-from") is None:
            args = set_flag(args, "--preset", "tiny")
            args = set_flag(args, "--vocab-size", str(TRAIN_VOCAB), cap=TRAIN_VOCAB)
        args = set_flag(args, "--train-steps", str(TRAIN_STEPS), cap=TRAIN_STEPS)
        args = set_flag(args, "--batch-tokens", str(TRAIN_BATCH_TOKENS), cap=TRAIN_BATCH_TOKENS)
        args = set_flag(args, "--max-length", str(TRAIN_MAX_LENGTH), cap=TRAIN_MAX_LENGTH)
        args = set_flag(args, "--checkpoint-every", "1")
        args = set_flag(args, "--average-last", str(TRAIN_AVERAGE_LAST), only_if_present=True,
                        cap=TRAIN_AVERAGE_LAST)
        args = set_flag(args, "--eval-every", "0")
        args = set_flag(args, "--eval-sentences", "0")
        if flag_value(args, "--shuffle-buffer") is None:
            args = set_flag(args, "--shuffle-buffer", str(TRAIN_SHUFFLE_BUFFER))
    elif script == "scripts/distill.py":
        args = set_flag(args, "--limit", str(DISTILL_LIMIT), cap=DISTILL_LIMIT)
    elif script == "scripts/domain_adaptation.py":
        args = set_flag(args, "--val", str(TINY_VAL), cap=TINY_VAL)
        args = set_flag(args, "--test", str(TINY_TEST), cap=TINY_TEST)
    return args




def tiny(word, tiny_corpus):
    """`word` with ../shared/data/multi30k (the folder or a file in it) replaced by the tiny
    corpus."""
    if word.rstrip("/") == MULTI30K or word.startswith(MULTI30K + "/"):
        return tiny_corpus + word.rstrip("/")[len(MULTI30K):]
    return word


def rewrite(command, tiny_corpus, scratch):
    """The shell text run for one documented line: every `python scripts/NAME.py ...` of it
    rewritten by rewrite_args, the rest unchanged."""
    # /tmp/ first: the tiny corpus may well be in /tmp.
    tokens = [tiny(os.path.join(scratch, "tmp", token[len("/tmp/"):])
                   if token.startswith("/tmp/") else token, tiny_corpus)
              for token in tokenize(command)]
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        if token in PYTHONS and i + 1 < len(tokens) and tokens[i + 1].startswith("scripts/"):
            j = i + 2
            while j < len(tokens) and not (tokens[j] in OPERATORS or
                                           re.fullmatch(r"[;&|<>]+|\d?>&?\d?", tokens[j])):
                j += 1
            script = tokens[i + 1]
            out += [token, script, *rewrite_args(script, tokens[i + 2:j], tiny_corpus,
                                                 scratch)]
            i = j
            continue
        out.append(token)
        i += 1
    return join(out)


def join(tokens):
    """Shell text of tokens: operators as they are, words quoted (an env assignment's value
    only)."""
    out = []
    for token in tokens:
        if re.fullmatch(r"[;&|<>]+|\d?>&?\d?", token):
            out.append(token)
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            name, value = token.split("=", 1)
            out.append(f"{name}={shlex.quote(value)}")
        else:
            out.append(shlex.quote(token))
    return " ".join(out)


# --- the runner ------------------------------------------------------------------------------

def run_python(step, namespace):
    """Executes a python step in `namespace`; (ok, error text)."""
    import traceback

    # Blank lines before the code so that tracebacks name the page's own line numbers.
    code = "\n" * step["line"] + step["code"]
    try:
        exec(compile(code, step["page"], "exec"), namespace)
    except BaseException as error:  # noqa: BLE001 - a block may raise anything, even exit
        if isinstance(error, KeyboardInterrupt):
            raise
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        # Drop the runner's own frame.
        return False, "".join(line for line in lines if __file__ not in line)
    return True, None


def run_shell(step, timeout):
    """Runs a shell step with bash from the current directory (a "fresh" one with `python`
    a new interpreter, not tests/docs_fork.py's client); (ok, error text, output)."""
    import subprocess

    env = None
    if step.get("fresh") and os.environ.get("DOCS_FORK_BIN"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCS_FORK_")}
        env["PATH"] = os.pathsep.join(entry for entry in env["PATH"].split(os.pathsep)
                                      if entry != os.environ["DOCS_FORK_BIN"])
    try:
        done = subprocess.run(["bash", "-o", "pipefail", "-c", step["command"]],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        return False, f"timed out after {timeout} s", (error.stdout or "")[-2000:]
    output = done.stdout[-2000:]
    if done.returncode:
        err = "\n".join(line for line in done.stderr.splitlines()
                        if not NOISE.search(line))
        return False, f"exit status {done.returncode}\n{err[-4000:]}", output
    return True, None, output


NOISE = re.compile(r"oneDNN custom operations|cudart_stub|absl::InitializeLog|"
                   r"cuda drivers|TF_ENABLE_ONEDNN_OPTS")


# Flags whose value is a path a script writes.
OUTPUT_FLAGS = {"--model-dir", "--export-dir", "--out", "--hyp-dir", "-o", "--output"}
# Paths a command may read and still be shared between pages: what every scratch root
# holds unchanged (the shipped models, the shared data, the tiny corpus, the scripts).
PRISTINE = ("saved_models/multi30k_", "../shared/", "scripts/", "bench/")


def shareable(command, tiny_corpus):
    """The paths `command` writes (relative to the scratch root) when its outcome depends only
    on what every scratch root holds unchanged (it can run once for all pages), else None:
    python scripts/... commands, maybe fed by echo, that read only PRISTINE paths or the
    tiny corpus and write no redirection."""
    try:
        tokens = tokenize(command)
    except ValueError:
        return None
    outputs = []
    for i, token in enumerate(tokens):
        if token in ("<", ">", ">>") and i + 1 < len(tokens):
            path = tokens[i + 1]
            if token != "<":
                outputs.append(os.path.normpath(path))
            elif not (path.startswith(PRISTINE) or path.startswith(tiny_corpus)):
                return None
        elif re.fullmatch(r"[;&|<>]+|\d?>&?\d?", token) and token not in ("|", "<", ">", ">>"):
            return None
    for words in segments(tokens):
        env, words = program(words)
        if env or not words:
            return None
        if words[0] == "echo":
            continue
        if words[0] not in PYTHONS or len(words) < 2 or not words[1].startswith("scripts/"):
            return None
        args = words[2:]
        for i, arg in enumerate(args):
            if arg in OUTPUT_FLAGS and i + 1 < len(args):
                outputs.append(os.path.normpath(args[i + 1]))
            elif arg.startswith("-") or (i and args[i - 1] in OUTPUT_FLAGS):
                continue
            elif (("/" in arg or re.search(r"\.[A-Za-z]{1,5}$", arg))
                  and not (arg.startswith(PRISTINE) or arg.startswith(tiny_corpus))):
                return None  # a file an earlier block may have written
    if any(os.path.isabs(o) or o.startswith("..") for o in outputs):
        return None
    return outputs


def run_shared(step, timeout, cache):
    """run_shell, or the outcome of the same command in another page: its output paths
    copied from the cache (made by the first page that ran it; the others wait)."""
    import hashlib
    import shutil

    from filelock import FileLock

    outputs = step["outputs"]
    if any(os.path.exists(o) for o in outputs):  # resumes an earlier run: not the same
        return run_shell(step, timeout) + (False,)
    key = hashlib.sha256(step["command"].encode()).hexdigest()[:16]
    folder = os.path.join(cache, key)
    with FileLock(folder + ".lock"):
        done = os.path.join(folder, "result.json")
        if os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                ok, error, output = json.load(f)
            for i, path in enumerate(outputs):
                saved = os.path.join(folder, str(i))
                if os.path.isdir(saved):
                    shutil.copytree(saved, path, symlinks=True)
                elif os.path.exists(saved):
                    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                    shutil.copy2(saved, path)
            return ok, error, output, True
        ok, error, output = run_shell(step, timeout)
        os.makedirs(folder, exist_ok=True)
        for i, path in enumerate(outputs):
            if os.path.isdir(path):
                shutil.copytree(path, os.path.join(folder, str(i)), symlinks=True)
            elif os.path.exists(path):
                shutil.copy2(path, os.path.join(folder, str(i)))
        with open(done, "w", encoding="utf-8") as f:
            json.dump([ok, error, output], f)
        return ok, error, output, False


def run_check(step):
    path = step["path"]
    if not os.path.isfile(path):
        return False, f"{path} does not exist"
    if not os.access(path, os.X_OK):
        return False, f"{path} is not executable"
    return True, None


def cpu_seconds():
    """CPU seconds (user + system) of this process and its finished children: a cost that,
    unlike wall time, does not grow with the machine's load."""
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def forked_cpu():
    """CPU seconds of the commands run as forks so far (tests/docs_fork.py)."""
    log = os.environ.get("DOCS_FORK_CPU_LOG")
    if not log or not os.path.exists(log):
        return 0.0
    with open(log, encoding="utf-8") as f:
        return sum(float(line) for line in f if line.strip())


def start_fork_server(folder, env):
    """Starts tests/docs_fork.py's server in the environment `env` (the pages'); (its
    process, the environment variables that send a `python` command to it: a PATH entry
    first, DOCS_FORK_*)."""
    import subprocess
    import tempfile

    client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs_fork.py")
    os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
    for name in ("python", "python3"):
        path = os.path.join(folder, "bin", name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f'#!/bin/sh\nexec "$DOCS_FORK_PYTHON" -S {client} run "$@"\n')
        os.chmod(path, 0o755)
    socket_path = os.path.join(tempfile.mkdtemp(prefix="docs_fork"), "socket")  # <108 bytes
    server = subprocess.Popen([sys.executable, client, "serve", socket_path],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                              start_new_session=True)
    if server.stdout.readline().strip() != b"ready":
        server.kill()
        raise RuntimeError("tests/docs_fork.py's server did not start")
    return server, {"DOCS_FORK_PYTHON": sys.executable, "DOCS_FORK_SOCKET": socket_path,
                    "DOCS_FORK_BIN": os.path.join(folder, "bin")}


def main(plan_path, result_path):
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    return run_steps(plan, result_path)


def run_steps(plan, result_path):
    import time

    if plan.get("grappler_off") and any(
            step["kind"] == "python" and re.search(r"\b(tfxformer|tensorflow)\b", step["code"])
            for step in plan["steps"]):
        from docs_fork import grappler_off

        grappler_off()  # the blocks' functions run without it, as the forked commands
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.getcwd()] + [p for p in sys.path if os.path.abspath(p or ".") != here]
    namespace = {"__name__": "__main__"}
    results = []
    for step in plan["steps"]:
        start, cpu = time.monotonic(), cpu_seconds() + forked_cpu()
        output, shared = "", False
        if step["kind"] == "python":
            ok, error = run_python(step, namespace)
        elif step["kind"] == "shell" and step.get("outputs") is not None:
            ok, error, output, shared = run_shared(step, plan["timeout"], plan["cache"])
        elif step["kind"] == "shell":
            ok, error, output = run_shell(step, plan["timeout"])
        else:
            ok, error = run_check(step)
        results.append({"ok": ok, "error": error, "output": output, "shared": shared,
                        "seconds": round(time.monotonic() - start, 2),
                        "cpu": round(cpu_seconds() + forked_cpu() - cpu, 2)})
        with open(result_path, "w", encoding="utf-8") as f:
            json.dump(results, f)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
