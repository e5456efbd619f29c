"""Every fenced code block of README.md, docs/**/*.md and the model cards
(saved_models/*/README.md) runs as a reader would run it (the convention: the "How
documentation code blocks are tested" rules; the parsing and the runner are in
tests/docs_blocks.py).

Where the blocks run: each page in a scratch copy of the repository root (its own, so pages
cannot see each other's output) with `../shared` beside it (`data` there is the folder
tests/conftest.py finds: `../shared/data` or TFXFORMER_SHARED_DATA). scripts/, tfxformer/,
tests/ and .venv are links to the repository; README.md, docs/ and bench/ are copies (a
command may write into them, e.g. `plot_training.py -o docs/...png`); runs/ starts empty;
saved_models/ holds copies of the shipped models the page names (links to the others), so
an export into saved_models/<name> never touches the repository.

How: one process per page (tests/docs_blocks.py as a script) runs the page's blocks in
order: its ```python blocks in one namespace, as cells of a notebook opened at the root
(exec, so a traceback names the page and its line), its shell blocks' commands with
`bash -o pipefail -c`, stdin empty, the project's venv first on PATH, HTTP(S) proxies
pointing nowhere (tests never touch the network). A failing block does not stop the page:
the test reports every failing block (page, line, traceback or the command's stderr); a
failure after an earlier one may follow from it. Pages run two at a time (DOCS_TEST_JOBS),
under pytest-xdist too (beside the other workers' files), started together when the first
page test runs, the slow cases and the pages of more steps first.

A `python scripts/NAME.py ...` of a shell command starts as a fork of a process that has
imported TensorFlow and the package (tests/docs_fork.py: the same arguments, directory,
environment and streams, without the 4.5 s of CPU each new interpreter spends importing
them; a command that sets TF_* or other import-time variables gets a new interpreter); the
forks run with Grappler off and the collector run less often, as the test processes
(TFXFORMER_TEST_GRAPPLER=1 keeps Grappler on), and TensorFlow's own oneDNN setting.
As users run them: when the slow tier is selected (a run without `-m "not slow"`, as CI's),
the first line that runs each script (in page order over the selected cases) starts it as
a new interpreter in the environment a user has (TensorFlow's own oneDNN and allocator
settings, Grappler on, Python's garbage collector as it comes: none of the test processes'
switches, tests/conftest.py), and a page's python blocks run in such an interpreter too;
so every documented script is started once as a user starts it, and its other documented
commands, which differ in flags, fork. In the fast tier alone (`-m "not slow"`) every
command forks and the python blocks run in a fork too. DOCS_TEST_FORK=0 gives every
command a new interpreter in any tier, DOCS_TEST_FORK=1 forks every one.

Shared between pages: a command that reads only what every scratch root holds unchanged
(the shipped models saved_models/multi30k_*, ../shared, the tiny corpus below) and writes
no redirection runs once per test run; another page running the same (rewritten) command
gets its outcome and a copy of the paths it wrote (--model-dir, --export-dir, --out,
--hyp-dir, -o), e.g. the README's and docs/training.md's tiny training, or the README's and
the EN->DE card's translation. Not when one of those paths already exists (a rerun resumes).

Which blocks:
- ```python / ```bash, ```sh, ```console blocks run; ```text, ```json, ```yaml, untagged
  fences and any other language do not.
- `<!-- docs-test: slow -->` on the line directly above the fence: the block runs only in
  the slow tier (not with `-m "not slow"`). A page with slow blocks has a second case
  (`[PAGE-slow]`, marked slow) that runs all its blocks, fast and slow, in order; when that
  case is selected, the page's fast case is skipped (the slow case runs its blocks too).
- `<!-- docs-test: skip: REASON -->`: never run. A skip without a reason fails
  test_every_block_is_accounted_for.
- In a shell block, a line (`\\` continuations joined; comments, blank lines, and in a
  block with `$ ` prompts the lines without one, ignored) runs when it runs `python ...`
  (scripts/, bench/, -m, -c) or `bash scripts/...`, with its pipes and redirections
  (`echo ... | python scripts/translate.py ...`). Not run: `bash scripts/quickstart.sh`
  (the main job, minutes long) and `bash scripts/test.sh` (this suite), for which the test
  checks that the file exists and is executable; lines with pip, apt, cd, ... (reported by
  test_every_block_is_accounted_for only when no line of the block runs).
  test_every_block_is_accounted_for fails for a block not marked skip that has a line with
  docker, tensorflow_model_server or curl, a multi-worker line (TF_CONFIG=...), or a
  training on tensorflow-datasets (train_wmt.py with --data wmt14, tfds:..., or no --data):
  they need a server, a cluster or the network; and for an unmarked block that trains,
  exports or distills (scripts/train_wmt.py, export.py, distill.py): mark it slow.

Rewrites that keep the commands cheap (only of `python scripts/NAME.py` arguments; python
blocks run exactly as written):
- every script: an argument starting with `/tmp/` points into the scratch root's tmp/
  instead (so runs never share or leave files in /tmp; a python block cannot be pointed
  there, so test_every_block_is_accounted_for asks pages for repository paths instead).
- every word of a line that runs (an argument, a `<` redirection, ...) naming
  `../shared/data/multi30k` or a file in it names a tiny Multi30k instead: the first 300
  training pairs (en, de, fr), the first 20 of val, the first 8 of each test set, made once
  per run (a training, an evaluation, a distillation or a `translate.py < test.en` of a few
  sentences; bleu.py's --ref stays aligned with them).
- train_wmt.py: `--train-steps` at most 2; `--batch-tokens` at most 512 (512 when absent);
  `--max-length` at most 32 (32 when absent); `--checkpoint-every 1`; `--average-last` at
  most 2 (when given); `--eval-every 0 --eval-sentences 0` (no validation); `--shuffle-buffer
  300` when absent; without --init-from also `--preset tiny` and `--vocab-size` at most 400
  (400 when absent).
- distill.py: `--limit` at most 40 (40 when absent: the first 40 training pairs).
- domain_adaptation.py: `--val` at most 20, `--test` at most 8 (so when absent): the
  evaluations of the Tatoeba split translate 8 sentences, not 2,000.
What is not rewritten costs what it costs: an export of a shipped model takes ~20 s of CPU,
a forked process that loads one and translates ~6 s, the README's tiny training ~40 s,
even at 2 steps (tracing the step and the translator). Each case prints its steps' wall and
CPU seconds with `-s`. A new interpreter costs more than a fork: the shipped EN->DE model's
one-sentence translation took 15 s of CPU as one, 5.8 s as a fork (2026-12-07); the slow
tier starts each script once as a new interpreter and forks its other commands for that
reason. A new page's commands should share an export another page makes (the same command
runs once) rather than make their own.
"""

import concurrent.futures
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import SHARED_DATA
from docs_blocks import (
    PYTHONS,
    TINY_TEST,
    TINY_VAL,
    classify,
    join,
    parse_blocks,
    program,
    rewrite,
    segments,
    shareable,
    shell_lines,
    start_fork_server,
    tokenize,
)
from support.environment import user_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs_blocks.py")
PAGES = sorted(os.path.relpath(p, ROOT) for p in [
    os.path.join(ROOT, "README.md"),
    *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True),
    *glob.glob(os.path.join(ROOT, "saved_models", "*", "README.md"))])
# Pages run at a time: 2, the cores of CI, under pytest-xdist too: the pages are the
# suite's longest file, and with one at a time its worker would still be running them
# long after the other workers ran out of files.
JOBS = int(os.environ.get("DOCS_TEST_JOBS", "2"))
# `python scripts/...` commands run as forks of a process that has imported TensorFlow and
# the package (tests/docs_fork.py), except, when the slow tier is selected, the first line
# that runs each script, a new interpreter as a user starts it ("auto"); "0" starts each
# command in a new interpreter, "1" forks every one.
FORK = os.environ.get("DOCS_TEST_FORK", "auto")
if FORK not in ("auto", "0", "1"):
    raise ValueError(f"DOCS_TEST_FORK={FORK!r}: accepted are auto (the default), 0 and 1")
# Against hangs only: on a loaded machine a command of 40 s of CPU can take 10 minutes.
COMMAND_TIMEOUT = 1200  # seconds, one shell command
PAGE_TIMEOUT = 3600  # seconds, one page
# Repository entries a page's scratch root links to (read-only use); the others are copied,
# except these, which it does not get or makes itself.
LINKED = {".venv", "scripts", "tfxformer", "tests", "tfxformer.egg-info"}
NOT_COPIED = {".git", ".pytest_cache", ".ruff_cache", "runs", "saved_models", "__pycache__"}
# Commands too long for the fast tier.
SLOW_SCRIPTS = {"scripts/train_wmt.py", "scripts/export.py", "scripts/distill.py"}
TINY_LINES = {"train": 300, "val": TINY_VAL}
TINY_TEST_LINES = TINY_TEST


def read_page(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return parse_blocks(page, f.read())


def has_slow(page):
    return any(b.marker == "slow" and b.kind for b in read_page(page)[0])


# Page cases known to fail because of the page's content, {(page, tier): reason}: a
# temporary list while the pages are being fixed (strict: a case that passes fails, so that
# its entry is removed).
KNOWN_FAILURES = {}


def case(page, tier):
    marks = [pytest.mark.slow, pytest.mark.user_env] if tier == "slow" else []
    if (page, tier) in KNOWN_FAILURES:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[page, tier]))
    return pytest.param(page, tier, id=f"{page}-{tier}", marks=marks)


CASES = [case(page, "fast") for page in PAGES] + [
    case(page, "slow") for page in PAGES if has_slow(page)]


def blocks_run(page, tier):
    """The blocks of `page` that run in `tier`, in page order."""
    return [block for block in read_page(page)[0] if block.kind and block.marker != "skip"
            and not (block.marker == "slow" and tier == "fast")]


def commands_run(cases):
    """(shell line as documented, the scripts it runs: `python X.py`) of every line that
    runs in `cases` ((page, tier) pairs), in PAGES order."""
    for page, tier in sorted(cases, key=lambda case: PAGES.index(case[0])):
        for block in blocks_run(page, tier):
            if block.kind != "shell":
                continue
            for _, text in shell_lines(block.code, block.line):
                if classify(text)[0] == "run":
                    yield text, {words[1] for words in (program(s)[1] for s in
                                                        segments(tokenize(text)))
                                 if len(words) > 1 and words[0] in PYTHONS
                                 and words[1].endswith(".py")}


def first_commands(cases):
    """The lines of commands_run(cases) that run a script no earlier line ran: the
    commands the slow tier starts as new interpreters."""
    seen, first = set(), set()
    for text, scripts in commands_run(cases):
        if scripts - seen:
            first.add(text)
            seen |= scripts
    return first


def plan(page, tier, tiny_corpus, scratch, fresh=frozenset()):
    """The runner's steps for `page` in `tier`: python blocks, shell commands (rewritten;
    those in `fresh` marked to start as new interpreters), script checks, in page order."""
    steps = []
    for block in blocks_run(page, tier):
        if block.kind == "python":
            steps.append({"kind": "python", "page": page, "line": block.line,
                          "block": block.line, "code": block.code})
            continue
        for number, text in shell_lines(block.code, block.line):
            what, detail = classify(text)
            if what == "run":
                command = rewrite(text, tiny_corpus, scratch)
                steps.append({"kind": "shell", "line": number, "block": block.line,
                              "original": text, "command": command, "fresh": text in fresh,
                              "outputs": shareable(command, tiny_corpus)})
            elif what == "check":
                steps.append({"kind": "check", "line": number, "block": block.line,
                              "path": detail})
    return steps


def make_tiny_corpus(folder, source=None):
    """The first lines of each Multi30k file (TINY_LINES; test sets TINY_TEST_LINES), its
    subfolders (tok/: the tokenized references) alike."""
    source = source or os.path.join(SHARED_DATA, "multi30k")
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if os.path.isdir(path):
            make_tiny_corpus(os.path.join(folder, name), path)
            continue
        lines = TINY_LINES.get(name.split(".")[0], TINY_TEST_LINES)
        with open(path, encoding="utf-8") as f:
            head = [line for _, line in zip(range(lines), f, strict=False)]
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write("".join(head))
    return folder


def make_scratch(folder, page_text):
    """A scratch repository root in folder/repo with folder/shared beside it; its path."""
    repo = os.path.join(folder, "repo")
    os.makedirs(os.path.join(repo, "runs"))
    os.makedirs(os.path.join(repo, "tmp"))
    for name in os.listdir(ROOT):
        if name in NOT_COPIED:
            continue
        source, target = os.path.join(ROOT, name), os.path.join(repo, name)
        if name in LINKED:
            os.symlink(source, target)
        elif os.path.isdir(source):
            shutil.copytree(source, target, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    models = os.path.join(ROOT, "saved_models")
    os.makedirs(os.path.join(repo, "saved_models"))
    for name in os.listdir(models):
        source, target = os.path.join(models, name), os.path.join(repo, "saved_models", name)
        if not os.path.isdir(source):
            shutil.copy2(source, target)
        elif f"saved_models/{name}" in page_text:
            shutil.copytree(source, target)  # the page may export into it
        else:
            os.symlink(source, target)
    shared = os.path.join(folder, "shared")
    os.makedirs(shared)
    os.symlink(SHARED_DATA, os.path.join(shared, "data"))
    real_shared = os.path.dirname(SHARED_DATA)
    if os.path.basename(SHARED_DATA) == "data" and os.path.isdir(real_shared):
        for name in os.listdir(real_shared):
            if name != "data":
                os.symlink(os.path.join(real_shared, name), os.path.join(shared, name))
    return repo


def runner_env(repo, fork=None):
    """The page process' environment; `fork`: tests/docs_fork.py's variables, or None."""
    env = {k: v for k, v in user_env().items()  # the machine's oneDNN setting, as users run
           if k not in ("TF_CONFIG", "PYTHONPATH")}
    nowhere = "http://127.0.0.1:9"
    path = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if fork:
        env.update(fork, DOCS_FORK_CPU_LOG=os.path.join(os.path.dirname(repo), "fork_cpu.log"))
        path = fork["DOCS_FORK_BIN"] + os.pathsep + path
    env.update(PATH=path,
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               HTTP_PROXY=nowhere, HTTPS_PROXY=nowhere, http_proxy=nowhere,
               https_proxy=nowhere, NO_GCE_CHECK="true", HF_HUB_OFFLINE="1",
               TFDS_DATA_DIR=os.path.join(repo, "tmp", "tfds"), MPLBACKEND="Agg")
    return env


def run_page(page, tier, base, tiny_corpus, fork=None, fresh=frozenset()):
    """Runs the page's blocks of `tier` in a fresh scratch root, its commands through the
    fork server `fork` (or None), those in `fresh` as new interpreters; (steps, results,
    stderr). The slow tier's python blocks run in a new interpreter, as users run them."""
    folder = os.path.join(base, page.replace("/", "_") + "-" + tier)
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        repo = make_scratch(folder, f.read())
    steps = plan(page, tier, tiny_corpus, repo, fresh)
    forked_blocks = fork is not None and tier == "fast"
    plan_path, result_path = os.path.join(folder, "plan.json"), os.path.join(folder,
                                                                              "result.json")
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump({"steps": steps, "timeout": COMMAND_TIMEOUT,
                   "cache": os.path.join(base, "shared_commands"),
                   "grappler_off": forked_blocks}, f)
    if not steps:
        return steps, [], ""
    try:
        python = (os.path.join(fork["DOCS_FORK_BIN"], "python") if forked_blocks
                  else sys.executable)
        done = subprocess.run([python, RUNNER, plan_path, result_path], cwd=repo,
                              env=runner_env(repo, fork), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=PAGE_TIMEOUT)
        stderr = done.stderr if done.returncode else ""
    except subprocess.TimeoutExpired:
        stderr = f"the page's process timed out after {PAGE_TIMEOUT} s"
    results = []
    if os.path.exists(result_path):
        with open(result_path, encoding="utf-8") as f:
            results = json.load(f)
    return steps, results, stderr


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """{(page, tier): future of run_page} for the cases selected in this run, started
    together (DOCS_TEST_JOBS at a time, the slow cases first, pages of more steps first)
    when the first case asks; commands through the fork server but for FORK's new
    interpreters."""
    base = str(tmp_path_factory.mktemp("docs_run"))
    tiny_corpus = make_tiny_corpus(os.path.join(base, "tiny_multi30k"))
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.path.name == os.path.basename(__file__) and callspec and \
                "tier" in callspec.params:
            selected.append((callspec.params["page"], callspec.params["tier"]))
    cases = [case for case in selected
             if not (case[1] == "fast" and (case[0], "slow") in selected)]
    server, fork = (start_fork_server(os.path.join(base, "fork"), runner_env(base))
                    if FORK != "0" else (None, None))
    fresh = (first_commands(cases) if FORK == "auto" and any(
        tier == "slow" for _, tier in cases) else frozenset())
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=JOBS)
    runs = {}
    for page, tier in sorted(cases, key=lambda case: (
            case[1] != "slow", -len(plan(*case, tiny_corpus, base)))):
        runs[page, tier] = pool.submit(run_page, page, tier, base, tiny_corpus, fork, fresh)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)
    if server is not None:
        os.killpg(server.pid, signal.SIGKILL)  # the server and any fork left running
        server.wait()


def failure_report(page, steps, results, stderr):
    """The text of every failed step: where, what ran, the error."""
    reports = []
    for step, result in zip(steps, results, strict=False):
        if result["ok"]:
            continue
        where = f"{page}:{step['line']}"
        if step["kind"] == "python":
            reports.append(f"{where}: python block failed:\n{result['error']}")
        elif step["kind"] == "shell":
            ran = ("" if step["command"] == join(tokenize(step["original"]))
                   else f"\n  ran (rewritten): {step['command']}")
            reports.append(f"{where}: `{step['original']}` failed: {result['error']}{ran}")
        else:
            reports.append(f"{where}: {result['error']}")
    if len(results) < len(steps):
        step = steps[len(results)]
        reports.append(f"{page}:{step['line']}: the page's process ended before this block"
                       f" ran:\n{stderr[-4000:]}")
    return reports


@pytest.mark.parametrize(("page", "tier"), CASES)
def test_page_blocks_run(page, tier, page_runs):
    """The page's blocks of this tier run without an error (fast: unmarked blocks; slow: the
    unmarked and the slow ones, in order)."""
    if (page, tier) not in page_runs:
        pytest.skip(f"the slow case of {page} runs its fast blocks too")
    steps, results, stderr = page_runs[page, tier].result()
    reports = failure_report(page, steps, results, stderr)
    timing = ", ".join(f"{step['line']}: {result['seconds']} s ({result['cpu']} s CPU"
                       + (", shared)" if result.get("shared") else ")")
                       for step, result in zip(steps, results, strict=False))
    print(f"{page} ({tier}): {len(steps)} steps; wall seconds by line: {timing}")
    assert not reports, (f"{len(reports)} of {len(steps)} steps of {page} failed"
                         f" (a later failure may follow from an earlier one):\n\n"
                         + "\n\n".join(reports))


def block_problems(block):
    """What is wrong with how `block` is marked, given what it does."""
    problems = [f"{block.where}: {error}" for error in block.errors]
    if block.kind and block.marker != "skip" and re.search(r"(?<![\w.])/tmp/", block.code):
        problems.append(f"{block.where}: names a path in /tmp: use one in the repository "
                        "(runs/, saved_models/), which the test's scratch copy holds (the "
                        "test points the shell commands' /tmp/ paths into it, not the python "
                        "blocks')")
    if block.kind != "shell" or block.marker == "skip":
        return problems
    lines = shell_lines(block.code, block.line)
    kinds = [(number, text, *classify(text)) for number, text in lines]
    for number, text, what, detail in kinds:
        if what == "server":
            problems.append(f"{block.page}:{number}: `{detail}` is never run by the test: "
                            "mark the block `<!-- docs-test: skip: REASON -->` (REASON: what "
                            "it needs, which test checks its claim)")
        elif what == "network":
            problems.append(f"{block.page}:{number}: {detail}: not possible in CI, mark the "
                            "block `<!-- docs-test: skip: REASON -->`")
        elif what == "run" and block.marker is None:
            words = tokenize(text)
            slow = [w for w in words if w in SLOW_SCRIPTS]
            if slow:
                problems.append(f"{block.page}:{number}: {slow[0]} in an unmarked block (the"
                                " fast tier is for what takes seconds): mark the block "
                                "`<!-- docs-test: slow -->`")
    if not problems and not any(what in ("run", "check") for _, _, what, _ in kinds):
        problems.append(f"{block.where}: a {block.lang} block that runs nothing (no "
                        "`python ...` or `bash scripts/...` line): mark it `<!-- docs-test: "
                        "skip: REASON -->` or make it ```text")
    return problems


def test_every_block_is_accounted_for():
    """Every fenced block of every page is run in a tier, skipped with a reason, or in a
    language that is not run; markers are well formed and sit directly above a fence;
    blocks that need a server, a cluster or the network are marked skip; blocks that train,
    export or distill are not in the fast tier."""
    problems = []
    counts = {"python": 0, "shell": 0, "skipped": 0, "not executed": 0}
    for page in PAGES:
        blocks, errors = read_page(page)
        problems += errors
        for block in blocks:
            problems += block_problems(block)
            counts["skipped" if block.kind and block.marker == "skip" else
                   block.kind or "not executed"] += 1
    print("fenced blocks:", counts)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_each_script_starts_once_as_a_new_interpreter():
    """In a run of every page (the slow tier), each documented script's first command is a
    new interpreter, its others forks."""
    lines = list(commands_run([(page, "slow" if has_slow(page) else "fast")
                               for page in PAGES]))
    first = first_commands([(page, "slow" if has_slow(page) else "fast") for page in PAGES])
    scripts = set().union(*(scripts for _, scripts in lines))
    assert "scripts/train_wmt.py" in scripts and "scripts/translate.py" in scripts
    for script in scripts:
        starting = [text for text, run in lines if script in run]
        assert starting[0] in first, script
    assert len(first) <= len(scripts) < len(lines)


def test_pages_found():
    """The pages this file runs include the README, the docs and the three model cards."""
    assert "README.md" in PAGES
    assert any(p.startswith("docs/") for p in PAGES)
    assert sum(p.startswith("saved_models/") for p in PAGES) >= 3
