"""The documentation runs as written: the README's Python examples, every script flag the
docs name, and every training setting listed in docs/training.md."""

import contextlib
import dataclasses
import glob
import io
import os
import re
import runpy
import sys
import textwrap

import pytest

from tfxformer.training import TrainConfig

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = sorted([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "bench", "README.md"),
               os.path.join(ROOT, "saved_models", "README.md"),
               *glob.glob(os.path.join(ROOT, "docs", "*.md")),
               *glob.glob(os.path.join(ROOT, "saved_models", "*", "README.md"))])
# `python scripts/NAME.py ...` or `python bench/NAME.py ...` up to the end of the command.
COMMAND = re.compile(r"python (?P<script>(?:scripts|bench)/[a-z0-9_/]+\.py)(?P<args>[^`|<>;&#\n]*)")
# Scripts whose --help needs more than the project venv with its test extra (none now:
# CTranslate2 is in the test extra).
OTHER_VENV = set()


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _python_blocks(text):
    """The ```python blocks of `text`, dedented (a block may sit in a list item)."""
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def _commands(text):
    """(script, flags) of every documented command; backslash continuations joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    for match in COMMAND.finditer(text):
        flags = {a.split("=", 1)[0] for a in match["args"].split() if a.startswith("--")}
        yield match["script"], flags


def _help(script):
    """The --help text of `script`, run in this process (as `python SCRIPT --help`)."""
    out, argv, path = io.StringIO(), sys.argv, list(sys.path)
    sys.argv = [script, "--help"]
    sys.path.insert(0, os.path.dirname(os.path.join(ROOT, script)))
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    assert exit_.value.code in (0, None), f"{script} --help exited with {exit_.value.code}"
    return out.getvalue()


README_BLOCKS = _python_blocks(_read(os.path.join(ROOT, "README.md")))


def test_readme_has_python_examples():
    assert len(README_BLOCKS) >= 2


def test_documented_commands_name_real_flags():
    wanted = {}
    for path in DOCS:
        for script, flags in _commands(_read(path)):
            wanted.setdefault(script, {}).update({f: os.path.relpath(path, ROOT) for f in flags})
    assert "scripts/train_wmt.py" in wanted and "scripts/export.py" in wanted
    bad = []
    for script, flags in sorted(wanted.items()):
        assert os.path.isfile(os.path.join(ROOT, script)), f"{script} (named in the docs) is gone"
        flags.pop("--help", None)
        if script in OTHER_VENV or not flags:
            continue
        text = _help(script)
        bad += [f"{doc}: {script} {flag}" for flag, doc in sorted(flags.items())
                if not re.search(rf"{re.escape(flag)}\b(?!-)", text)]
    assert not bad, "flags the docs name that --help does not list:\n" + "\n".join(bad)


def test_training_page_lists_every_setting():
    page = _read(os.path.join(ROOT, "docs", "training.md"))
    missing = [f.name for f in dataclasses.fields(TrainConfig)
               if f"--{f.name.replace('_', '-')}" not in page]
    assert not missing, f"docs/training.md does not mention: {missing}"


def test_relative_links_point_at_files():
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(path)):
            if not re.match(r"[a-z]+://", target) and not os.path.exists(
                    os.path.join(os.path.dirname(path), target)):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def _expand_braces(name):
    """`a_{x,y}.log` -> [`a_x.log`, `a_y.log`] (as the docs abbreviate sibling logs)."""
    match = re.search(r"\{([^}]*)\}", name)
    if not match:
        return [name]
    return [full for part in match[1].split(",")
            for full in _expand_braces(name[:match.start()] + part + name[match.end():])]


def test_cited_bench_logs_exist():
    """Every log under bench/results/ that a document (docs/results/ included) cites is in
    the tree: a path `bench/results/...` anywhere (not `COMMIT:bench/results/...`, which git
    keeps), and in bench/README.md above its Studies also `results/...` and a bare
    `NAME.log`."""
    results = os.path.join(ROOT, "bench", "results")
    in_tree = {os.path.relpath(os.path.join(folder, f), results)
               for folder, _, files in os.walk(results) for f in files}
    names = {os.path.basename(p) for p in in_tree}
    cited, missing = 0, []
    for path in DOCS + sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.md"))):
        text = _read(path)
        found = re.findall(r"(?<![:\w/])bench/results/([\w./{},-]*\w)", text)
        if os.path.relpath(path, ROOT) == os.path.join("bench", "README.md"):
            text = text.split("\n## Studies")[0]
            found += re.findall(r"`(?:results/)?([\w./{},-]+\.(?:log|jsonl))`", text)
        for name in (n for entry in found for n in _expand_braces(entry)):
            cited += 1
            if name not in (in_tree if "/" in name else names):
                missing.append(f"{os.path.relpath(path, ROOT)}: {name}")
    assert cited >= 20, f"found only {cited} log citations: has the docs' form changed?"
    assert not missing, "cited logs missing from bench/results/:\n" + "\n".join(missing)


def _version_cells(path):
    """{model name: the `version` cell} of every table row in `path` that has one."""
    cells, column = {}, None
    for line in _read(path).splitlines():
        if not line.startswith("|"):
            column = None
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if "version" in row:
            column = row.index("version")
        elif column is not None and (name := re.fullmatch(r"`([a-z0-9_]+)`", row[0])):
            cells[name[1]] = row[column]
    return cells


def test_model_tables_name_the_shipped_versions():
    folders = [os.path.dirname(card) for card in  # shipped models have a card
               glob.glob(os.path.join(ROOT, "saved_models", "*", "README.md"))]
    shipped = {os.path.basename(f): str(max(int(v) for v in os.listdir(f) if v.isdigit()))
               for f in folders}
    for path in (os.path.join(ROOT, "README.md"),
                 os.path.join(ROOT, "saved_models", "README.md")):
        cells = _version_cells(path)
        assert {name: cells.get(name) for name in shipped} == shipped, os.path.relpath(path, ROOT)


# Pages a user reads: the front page, the guides and the model cards (docs/results/ and
# bench/README.md hold the dated measurements and the history).
CARDS = sorted(glob.glob(os.path.join(ROOT, "saved_models", "*", "README.md")))
USER_PAGES = sorted([os.path.join(ROOT, "README.md"),
                     *glob.glob(os.path.join(ROOT, "docs", "*.md")), *CARDS])
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _lines(path):
    return len(_read(path).splitlines())


def test_readme_is_a_front_page():
    assert _lines(os.path.join(ROOT, "README.md")) <= 200
    assert "bash scripts/test.sh\n" in _read(os.path.join(ROOT, "README.md"))  # what CI runs


@pytest.mark.parametrize("card", CARDS, ids=lambda p: os.path.basename(os.path.dirname(p)))
def test_model_card_follows_the_template(card):
    assert _lines(card) <= 120, f"{os.path.relpath(card, ROOT)}: {_lines(card)} lines > 120"
    headings = re.findall(r"^## (.+)$", _read(card), re.M)
    assert headings == ["Intended use", "Data and licence", "Scores", "How to run", "Speed",
                        "Limits", "How it was trained"], headings


def test_few_dated_measurements_on_user_pages():
    """Measurements live in bench/README.md (and history in docs/results/); user pages
    link there, so they hold few dates."""
    dated = {os.path.relpath(p, ROOT): len(DATE.findall(_read(p))) for p in USER_PAGES}
    assert sum(dated.values()) <= 15, {p: n for p, n in dated.items() if n}


def test_card_scores_are_stated_once():
    """A card's score figures appear on no other user page (those link to the card)."""
    repeated = []
    for card in CARDS:
        rows = re.findall(r"^\| test_\w+ \| [\d,]+ \| (\d+\.\d\d) \| (\d+\.\d\d) \|$", _read(card),
                          re.M)
        assert rows, f"{os.path.relpath(card, ROOT)} has no score table"
        for figure in {f for row in rows for f in row}:
            repeated += [f"{figure} ({os.path.relpath(card, ROOT)}) in {os.path.relpath(p, ROOT)}"
                         for p in USER_PAGES
                         if p != card and re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d)",
                                                    _read(p))]
    assert not repeated, "figures stated twice:\n" + "\n".join(repeated)


def test_license_is_apache_2():
    text = _read(os.path.join(ROOT, "LICENSE"))
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    setup = _read(os.path.join(ROOT, "setup.py"))
    assert 'license="Apache-2.0"' in setup  # the SPDX name (the classifier is deprecated)


def _anchors(path):
    """The anchors GitHub gives the headings of the Markdown file `path`."""
    text = re.sub(r"```.*?```", "", _read(path), flags=re.S)
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
    return found


def test_links_to_headings_find_them():
    pages = DOCS + sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
    broken = []
    for path in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", _read(path)):
            linked = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target \
                else path
            if linked.endswith(".md") and os.path.isfile(linked) \
                    and anchor not in _anchors(linked):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target}#{anchor}")
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)
