"""Every form of trained model the package writes, given to every tool that takes a model.

tfxformer.locate is the one answer to "what is at this path"; each tool takes the forms
that make sense for it and refuses the others with one line naming the path, what is
there and the forms it takes. EXPECTED is that table, cell by cell: OK, or a pattern of
the error, or "as FORM" where the locator gives the path FORM's kind, so that FORM's cell
runs the same code. The forms are built once per module from conftest's small trained run.

The ensemble and multilingual exports hold the signatures the tools read
(SERVED_SIGNATURES: serving_default, translate_with_options for the scripts' decoding
flags, score); test_ensemble.py and test_multilingual.py export those kinds with all six.
The preset dir's export, written for real, holds all six.

What every form shares is done once, so that the cells test what differs by form: which
loader a tool takes it to, with which record. Each SavedModel is loaded once; the scripts
that translate (translate.py, evaluate.py, distill.py) share one translate function per
form and options (`load_translate_fn`'s own cell loads it anew); the export cells build
the form's translator and the config.json it is exported with, and only the preset dir's
is written as a SavedModel and served (writing a SavedModel is the same for every
translator: tests/test_serving.py); `--init-from` trains two steps from a preset dir, and
from the others builds the model the run would train (`tfxformer.pretrained`'s hooks of
`train_and_evaluate`; test_pretrained.py trains from a run dir).

The preset dir is the one a Keras user makes: `model.fit` -> `model.save_to_preset(dir)`;
its row exports it (`scripts/export.py --model dir`) and translates that export
(`scripts/translate.py --model EXPORT`) and the preset dir itself (`--model dir`). Also
here: the direction rule of `train_wmt.py --init-from` (the source's languages unless
given; a contradiction is an error unless --change-direction).
"""

import contextlib
import io
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED_DATA
from support.reliability import script_args, train_wmt
from support.serving import load_script

from tfxformer import Transformer, locate, multilingual, pretrained
from tfxformer.data import Tokenizer
from tfxformer.data.tokenizer import train_tokenizer
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.schedules import TransformerSchedule, paper_adam

pytestmark = pytest.mark.slow  # trains, exports and loads every form

try:
    import ctranslate2  # noqa: F401
    HAVE_CT2 = True
except ImportError:
    HAVE_CT2 = False

LINE = "A dog runs in the park."
SERVED_SIGNATURES = ["translate_with_options", "score"]  # and serving_default, always
LANGUAGES = ("de", "fr")
OK = "ok"

FORMS = ("run_dir", "averaged_run_dir", "export_dir", "version_dir", "preset", "ensemble",
         "multilingual", "ctranslate2")
TOOLS = ("export", "export_shortlist", "export_ct2", "translate", "evaluate", "score",
         "init_from", "plot_attention", "distill", "Transformer.from_preset",
         "Tokenizer.from_preset", "load_translate_fn")

# The errors, by what the path holds and what the tool takes.
ENSEMBLE = (r"is an ensemble export of 2 models \(run, preset\); expected a SavedModel "
            r"export dir of one model")
CT2 = r"is a CTranslate2 dir; expected a SavedModel"
MULTILINGUAL_CT2 = (r"is a multilingual SavedModel \(de, fr\); expected .*of one target "
                    r"language \(not multilingual\)")
REFUSED = (ENSEMBLE, CT2, MULTILINGUAL_CT2)  # a form refused: the message names the path
NO_DATA = r"The config names no training data .*--shortlist-data"
PORTABLE_DATA = r"the shortlist's training data, from the config; .*pass --shortlist-data"
# "as FORM": the locator gives this path the kind of FORM's path (an export dir: the same
# Source as its highest version dir), so the tool runs FORM's code path; that cell of
# FORM's row runs it. A run dir and an averaged run dir differ only in the checkpoint
# loaded (tfxformer.rundir.find_checkpoint, tested in test_serving_run_dir.py): the tools
# are shared between their two rows.
AS_RUN, AS_AVERAGED, AS_VERSION = "as averaged_run_dir", "as run_dir", "as version_dir"
ALL_OK = dict.fromkeys(TOOLS, OK)

EXPECTED = {
    "run_dir": {**ALL_OK, "export": AS_RUN, "init_from": AS_RUN,
                "Transformer.from_preset": AS_RUN, "plot_attention": AS_RUN},
    "averaged_run_dir": {**ALL_OK, "export_shortlist": AS_AVERAGED,
                         "export_ct2": AS_AVERAGED, "translate": AS_AVERAGED,
                         "evaluate": AS_AVERAGED, "score": AS_AVERAGED,
                         "distill": AS_AVERAGED, "load_translate_fn": AS_AVERAGED},
    # An export's record keeps no machine path: its training data is a bare folder name.
    "version_dir": {**ALL_OK, "export_shortlist": PORTABLE_DATA},
    "export_dir": {**dict.fromkeys(TOOLS, AS_VERSION), "Tokenizer.from_preset": OK,
                   "load_translate_fn": OK},
    # A preset dir records its languages, not its training data. Its row is the Keras
    # user's path: the preset is saved after model.fit, exported (and the export
    # translated), and translated as it is.
    "preset": {**ALL_OK, "export_shortlist": NO_DATA},
    "ensemble": {**ALL_OK, "export": ENSEMBLE, "export_shortlist": ENSEMBLE,
                 "export_ct2": ENSEMBLE, "init_from": ENSEMBLE, "plot_attention": ENSEMBLE,
                 "Transformer.from_preset": ENSEMBLE},
    "multilingual": {**ALL_OK, "export_shortlist": NO_DATA, "export_ct2": MULTILINGUAL_CT2,
                     "plot_attention": AS_VERSION},
    "ctranslate2": {**ALL_OK, "export": CT2, "export_shortlist": CT2, "export_ct2": CT2,
                    "score": CT2, "init_from": CT2, "plot_attention": CT2,
                    "Transformer.from_preset": CT2},
}


def test_the_table_covers_every_form_and_tool():
    assert set(EXPECTED) == set(FORMS)
    for form in FORMS:
        assert set(EXPECTED[form]) == set(TOOLS), form


# --- the forms -----------------------------------------------------------------------------

def _tagged_corpus(folder, lines=100):
    """A multilingual text folder (en -> mul, tags <2de>/<2fr>) of the first Multi30k lines."""
    plain = folder / "plain"
    plain.mkdir(parents=True)
    for lang in ("en", *LANGUAGES):
        with open(os.path.join(SHARED_DATA, "multi30k", f"train.{lang}"),
                  encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        for split in ("train", "val"):
            (plain / f"{split}.{lang}").write_text("".join(text), encoding="utf-8")
    multilingual.write_folder(str(plain), str(folder / "tagged"), "en", LANGUAGES)
    return folder / "tagged"


def _multilingual_export(folder, tagged):
    """An untrained tiny multilingual model's export (its vocabulary holds the tags)."""
    from tfxformer.serving import export_translator, make_translator

    lines = [*(tagged / "train.en").read_text(encoding="utf-8").splitlines(),
             *(tagged / "train.mul").read_text(encoding="utf-8").splitlines()]
    tags = [multilingual.target_tag(language) for language in LANGUAGES]
    spm_bytes = train_tokenizer(lines, 400, user_defined_symbols=tags,
                                num_threads=1).spm_bytes
    tf.random.set_seed(7)
    model = Transformer.from_preset("tiny", vocab_size=400, max_positions=48)
    translator = make_translator(model, spm_bytes, LANGUAGES, beam_size=2, extra_length=4,
                                 max_batch_size=4)
    return export_translator(translator, str(folder / "multilingual"), config={
        "src": "en", "tgt": multilingual.MULTI_TARGET,
        "train": {"target_languages": ",".join(LANGUAGES)}}, signatures=SERVED_SIGNATURES)


def _fitted_preset(run, directory):
    """The Keras user's path: a trained model loaded, fitted a step further, saved."""
    model = Transformer.from_preset(run, dropout=0.0)
    model.compile(optimizer=paper_adam(TransformerSchedule(32, warmup_steps=10)),
                  loss=LabelSmoothedCrossEntropy(0.1))
    before = model.get_weights()
    source_ids = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")
    decoder_in, labels = np.array([[2, 10, 11], [2, 12, 0]]), np.array([[10, 11, 3], [12, 3, 0]])
    model.fit((source_ids, decoder_in), labels, epochs=1, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(),
                                                         strict=True))
    return model.save_to_preset(directory)


def _remembered(function, key):
    """`function`, its results remembered by `key(*args, **kwargs)`."""
    results = {}

    def remembered(*args, **kwargs):
        name = key(*args, **kwargs)
        if name not in results:
            results[name] = function(*args, **kwargs)
        return results[name]
    return remembered


def _translate_fn_key(path, **options):
    given = {k: v for k, v in options.items()
             if v is not None and not (k == "precision" and v == "fp32")}
    return os.path.realpath(os.fspath(path)), tuple(sorted(given.items()))


_REAL = {}  # the functions _shared_work stands in for


@pytest.fixture(scope="module", autouse=True)
def _shared_work(forms):
    """What every form shares, done once in this module (see the module doc): each
    SavedModel loaded once (`tf.saved_model.load` remembers it by path), one translate
    function per form and options for the scripts, and exports that record what they
    would write."""
    from tfxformer import serving
    from tfxformer.serving import export

    def recorded(translator, export_dir, config=None, version=None, **_):
        """The version dir an export would write, with its config.json asset only."""
        assets = os.path.join(export_dir, str(version or 1), "assets")
        os.makedirs(assets)
        with open(os.path.join(assets, "config.json"), "w", encoding="utf-8") as f:
            json.dump(export._asset_config(translator, config), f)
        return os.path.dirname(assets)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf.saved_model, "load", _remembered(
            tf.saved_model.load, lambda path, *a, **k: (os.path.realpath(path), a, str(k))))
        # the scripts import it from tfxformer.serving; its own cell from serving.loading
        patch.setattr(serving, "load_translate_fn", _remembered(
            serving.load_translate_fn, _translate_fn_key))
        _REAL["export_translator"] = export.export_translator
        patch.setattr(export, "export_translator", recorded)
        yield


@pytest.fixture(scope="module")
def forms(one_replica_reference, tmp_path_factory):
    """{form: path} of every form, and the data the tools read: "corpus" (en/de), "tagged"
    (en/mul), "eval" (val.en/val.de)."""
    from tfxformer.serving import export_ensemble

    root = tmp_path_factory.mktemp("forms")
    reference = one_replica_reference
    run = root / "run"  # the reference run without averaged/: its latest checkpoint
    shutil.copytree(reference["run"], run,
                    ignore=shutil.ignore_patterns("averaged", "token_cache", "logs"))
    preset = _fitted_preset(reference["run"], str(root / "preset"))
    tagged = _tagged_corpus(root / "data")
    paths = {"run_dir": str(run), "averaged_run_dir": reference["run"],
             "export_dir": reference["export"],
             "version_dir": os.path.join(reference["export"], "1"), "preset": preset,
             "ensemble": os.path.dirname(export_ensemble(
                 [reference["run"], preset], str(root / "ensemble"), beam_size=2,
                 extra_length=4, signatures=SERVED_SIGNATURES)),
             "multilingual": os.path.dirname(_multilingual_export(root, tagged)),
             "ctranslate2": None}
    if HAVE_CT2:
        from tfxformer.serving.ctranslate2_export import export_ctranslate2

        paths["ctranslate2"] = export_ctranslate2(reference["run"], str(root / "ct2"),
                                                  beam_size=2)
    evaluation = root / "eval"
    evaluation.mkdir()
    (evaluation / "val.en").write_text(LINE + "\n", encoding="utf-8")
    (evaluation / "val.de").write_text("Ein Hund rennt im Park.\n", encoding="utf-8")
    return {**paths, "corpus": reference["corpus"], "tagged": str(tagged),
            "eval": str(evaluation)}


# --- the tools: each runs one cell, returning None or the error it printed or raised -------

@contextlib.contextmanager
def _stdio(stdin=b""):
    """The script's standard input `stdin`; yields {} that holds "out" (stdout, decoded)
    and "err" (stderr) when the block ends."""
    out, err, streams = io.BytesIO(), io.StringIO(), {}
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = err
    try:
        yield streams
    finally:
        sys.stdout.flush()
        streams.update(out=out.getvalue().decode("utf-8"), err=err.getvalue())
        sys.stdin, sys.stdout, sys.stderr = saved


def _script(name, argv, stdin=b""):
    """scripts/<name>.py's main(argv) in this process: (None, stdout) when it succeeds,
    (its error line, stdout) when it exits 2."""
    with _stdio(stdin) as streams:
        try:
            code = load_script(name).main(argv)
        except SystemExit as exit_:
            code = exit_.code
    if code == 0:
        return None, streams["out"]
    return _error_line(code, streams["err"]), streams["out"]


def _error_line(code, err):
    """The error a script printed as it exited with status 2: from its "error:" line to the
    end of stderr (one line, if it says what it should)."""
    assert code == 2, err[-2000:]
    lines = err.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if "error:" in line]
    assert starts, err[-2000:]
    return "\n".join(lines[starts[-1]:])


def _language(form):
    return ["--target-language", "de"] if form == "multilingual" else []


def _export(path, form, forms, tmp, *flags):
    from tfxformer.serving import export as exporting

    export = str(tmp / "out")
    with pytest.MonkeyPatch.context() as patch:
        if form == "preset":  # the Keras user's path, written and served for real
            patch.setattr(exporting, "export_translator", _REAL["export_translator"])
        error, out = _script("export", ["--model", path, "--export-dir", export,
                                        "--beam-size", "2", "--extra-length", "4", *flags])
    if error is None:
        assert out.strip() == os.path.join(export, "1")
        with open(os.path.join(export, "1", "assets", "config.json"), encoding="utf-8") as f:
            record = json.load(f)
        assert (record["src"], record["tgt"]) == locate.resolve(path).direction
        assert record["model"] == locate.resolve(path).model.to_dict()
    if error is None and form == "preset":  # fit -> save_to_preset -> export -> translate
        assert record["preset"] == "tiny" and record["max_length"] == 32
        assert os.path.isfile(os.path.join(export, "1", "saved_model.pb"))
        assert _translate(export, form, forms, tmp) is None
    return error


def _export_shortlist(path, form, forms, tmp):
    return _export(path, form, forms, tmp, "--shortlist", "2,10",
                   "--shortlist-max-pairs", "30")


def _export_ct2(path, form, forms, tmp):
    error, out = _script("export", ["--model", path, "--export-dir", str(tmp / "ct2"),
                                    "--format", "ctranslate2", "--beam-size", "2"])
    if error is None:
        assert locate.is_ctranslate2_dir(out.strip())
    return error


def _translate(path, form, forms, tmp):
    error, out = _script("translate", ["--model", path, "--beam-size", "2",
                                       *_language(form)], (LINE + "\n\n").encode())
    if error is None:
        assert len(out.splitlines()) == 2 and out.splitlines()[1] == ""
    return error


def _evaluate(path, form, forms, tmp):
    error, out = _script("evaluate", ["--model", path, "--data", forms["eval"], "--sets",
                                      "val", "--beam-size", "2"])
    if error is None:
        assert json.loads(out.splitlines()[0])["sentences"] == 1
    return error


def _score(path, form, forms, tmp):
    source, target = tmp / "src.en", tmp / "tgt.de"
    source.write_text(LINE + "\n", encoding="utf-8")
    target.write_text("Ein Hund rennt.\n", encoding="utf-8")
    error, out = _script("score", ["--model", path, "--src", str(source), "--tgt",
                                   str(target), *_language(form)])
    if error is None:
        assert float(out.split("\t")[0]) < 0
    return error


# --init-from: the model built (not trained) from these; a preset dir's run trains
BUILT_ONLY = ("averaged_run_dir", "version_dir", "multilingual")


def _init_from(path, form, forms, tmp):
    data = forms["tagged"] if form == "multilingual" else forms["corpus"]
    args = script_args(data, str(tmp / "fine_tuned"), 2, init_from=path, preset=False,
                       vocab_size=False, max_length=24, checkpoint_every=2)
    source = locate.resolve(path)
    if form in BUILT_ONLY:  # what train_and_evaluate does with init_from before it trains
        config = train_wmt.parse_args(args)
        config.validate()
        config = pretrained.fine_tune_config(config)
        model = Transformer(config.model_config())
        model.build()
        pretrained.load_initial_weights(model, config)
        reference = Transformer.from_preset(path)
        for weight, loaded in zip(model.weights, reference.weights, strict=True):
            np.testing.assert_array_equal(weight.numpy(), loaded.numpy())
        spm_bytes = pretrained.fine_tune_vocabulary(config)
        assert pretrained.init_record(config, spm_bytes)["kind"] == source.kind
        assert (config.src, config.tgt) == source.direction
        assert config.languages() == source.target_languages
        return None
    with _stdio() as streams:
        code = train_wmt.main(args)
    if code != 0:
        return _error_line(code, streams["err"])
    record = json.loads((tmp / "fine_tuned" / "config.json").read_text())
    assert (record["src"], record["tgt"]) == source.direction
    assert record["train"]["target_languages"] == (",".join(source.target_languages) or None)
    return None


def _plot_attention(path, form, forms, tmp):
    text = (multilingual.target_tag("de") + " " if form == "multilingual" else "") + LINE
    error, _ = _script("plot_attention", ["--model", path, "--text", text, "-o",
                                          str(tmp / "a.png"), "--extra-length", "3"])
    if error is None:
        assert (tmp / "a.png").stat().st_size > 0
    return error


def _distill(path, form, forms, tmp):
    error, _ = _script("distill", ["--data", forms["corpus"], "--out", str(tmp / "out"),
                                   "--teacher", path, "--limit", "2", "--chunk-lines", "2",
                                   "--beam-size", "2"])
    if error is None:
        assert len((tmp / "out" / "train.de").read_text(encoding="utf-8").splitlines()) == 2
    return error


def _raised(function):
    try:
        function()
    except (FileNotFoundError, ValueError) as error:
        return str(error)
    return None


def _transformer(path, form, forms, tmp):
    def load():
        model = Transformer.from_preset(path)
        assert model.model_config == locate.resolve(path).model
    return _raised(load)


def _tokenizer(path, form, forms, tmp):
    def load():
        assert Tokenizer.from_preset(path).vocab_size == locate.resolve(path).model.vocab_size
    return _raised(load)


def _load_translate_fn(path, form, forms, tmp):
    from tfxformer.serving.loading import load_translate_fn  # not _shared_work's

    def load():
        language = {"target_language": "de"} if form == "multilingual" else {}
        translate = load_translate_fn(path, beam_size=2, extra_length=4, **language)
        assert len(translate([LINE, ""])) == 2
    return _raised(load)


RUNNERS = {"export": _export, "export_shortlist": _export_shortlist,
           "export_ct2": _export_ct2, "translate": _translate, "evaluate": _evaluate,
           "score": _score, "init_from": _init_from, "plot_attention": _plot_attention,
           "distill": _distill, "Transformer.from_preset": _transformer,
           "Tokenizer.from_preset": _tokenizer, "load_translate_fn": _load_translate_fn}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("form", FORMS)
def test_every_form_with_every_tool(forms, form, tool, tmp_path):
    path, expected = forms[form], EXPECTED[form][tool]
    if path is None:
        pytest.skip("CTranslate2 is not installed (pip install -e \".[ctranslate2]\")")
    if expected.startswith("as "):
        other = expected[3:]
        assert not EXPECTED[other][tool].startswith("as "), "that cell runs the tool"
        here, there = locate.resolve(path), locate.resolve(forms[other])
        assert here == there if form == "export_dir" else here.kind == there.kind
        return
    if tool == "export_ct2" and not HAVE_CT2:
        pytest.skip("CTranslate2 is not installed")
    error = RUNNERS[tool](path, form, forms, tmp_path)
    if expected == OK:
        assert error is None, error
        return
    assert error is not None, f"{form} x {tool} worked; expected an error {expected!r}"
    assert "\n" not in error.strip(), error
    assert re.search(expected, error), error
    if expected in REFUSED:  # a form refused: the path is named
        assert repr(path) in error or repr(os.path.join(path, "1")) in error, error


# --- train_wmt.py --init-from: the direction is the source model's -------------------------

def _fine_tune(init_from, corpus, *flags):
    """TrainConfig of a tiny fine-tuning run's flags, with the source's settings filled in
    (pretrained.fine_tune_config), or the ValueError it raises."""
    args = script_args(corpus, "unused", 1, init_from=init_from, preset=False,
                       vocab_size=False) + list(flags)
    config = train_wmt.parse_args(args)
    config.validate()
    return pretrained.fine_tune_config(config)


def test_init_from_takes_the_direction_of_the_source_model(one_replica_reference, tmp_path):
    run, corpus = one_replica_reference["run"], one_replica_reference["corpus"]
    de_en = tmp_path / "de_en"  # the reference run's record, as if trained DE -> EN
    de_en.mkdir()
    record = json.loads(open(os.path.join(run, "config.json"), encoding="utf-8").read())
    (de_en / "config.json").write_text(json.dumps({**record, "src": "de", "tgt": "en"}))
    shutil.copy(os.path.join(run, "spm.model"), de_en / "spm.model")
    config = _fine_tune(str(de_en), corpus)
    assert (config.src, config.tgt, config.target_languages) == ("de", "en", None)
    assert (_fine_tune(str(de_en), corpus, "--src", "de").tgt) == "en"
    with pytest.raises(ValueError, match=r"^`src` 'en' given \(the source's: 'de'\); `tgt` "
                                         r"'de' given \(the source's: 'en'\)\. The source, "
                                         r"`init_from` '.*de_en', is a run dir: leave them out "
                                         r".*`change_direction`"):
        _fine_tune(str(de_en), corpus, "--src", "en", "--tgt", "de")
    with pytest.raises(ValueError, match=r"^`tgt` 'fr' given \(the source's: 'en'\)\. "):
        _fine_tune(str(de_en), corpus, "--tgt", "fr")
    changed = _fine_tune(str(de_en), corpus, "--src", "en", "--tgt", "de",
                         "--change-direction")
    assert (changed.src, changed.tgt) == ("en", "de")
    with pytest.raises(ValueError, match=r"Give `tgt`: `change_direction` trains another"):
        _fine_tune(str(de_en), corpus, "--src", "en", "--change-direction")
    with pytest.raises(ValueError, match=r"`target_languages` 'de,fr' given \(the source's: "
                                         r"None\)"):
        _fine_tune(str(de_en), corpus, "--target-languages", "de,fr")
    # The script says so in one line, with the flags' names, before anything is trained.
    args = script_args(corpus, str(tmp_path / "new"), 1, init_from=str(de_en), preset=False,
                       vocab_size=False, src="en", tgt="de")
    with _stdio() as streams:
        assert train_wmt.main(args) == 2
    assert re.fullmatch(r"train_wmt\.py: error: --src 'en' given \(the source's: 'de'\); "
                        r"--tgt 'de' given \(the source's: 'en'\)\. The source, --init-from "
                        r"'.*de_en', is a run dir: .*--change-direction to train another on "
                        r"purpose\.", streams["err"].strip()), streams["err"]
    assert not (tmp_path / "new").exists()
    with _stdio():
        assert train_wmt.main(script_args(corpus, str(tmp_path / "x"), 1,
                                          change_direction=True)) == 2


def test_a_preset_dir_keeps_the_direction_or_needs_one(one_replica_reference, tmp_path):
    run, corpus = one_replica_reference["run"], one_replica_reference["corpus"]
    loaded = tmp_path / "loaded"
    Transformer.from_preset(run).save_to_preset(loaded)
    assert json.loads((loaded / "config.json").read_text())["record"] == {
        "src": "en", "tgt": "de", "max_length": 32}
    assert (_fine_tune(str(loaded), corpus).src, locate.resolve(loaded).direction) == (
        "en", ("en", "de"))
    built = Transformer.from_preset("tiny", vocab_size=400)  # built in Keras: no languages
    built.save_to_preset(tmp_path / "built", tokenizer=Tokenizer.from_preset(run))
    assert locate.resolve(tmp_path / "built").direction is None
    with pytest.raises(ValueError, match=r"Give `src` and `tgt`: `init_from` '.*built' is a "
                                         r"preset dir of Transformer.save_to_preset that "
                                         r"records no languages \(save it with "
                                         r"`model.save_to_preset\(dir, src=\.\.\., tgt="):
        _fine_tune(str(tmp_path / "built"), corpus)
    given = _fine_tune(str(tmp_path / "built"), corpus, "--src", "de", "--tgt", "en")
    assert (given.src, given.tgt) == ("de", "en")
    built.save_to_preset(tmp_path / "named", tokenizer=Tokenizer.from_preset(run),
                         src="de", tgt="en")
    assert locate.resolve(tmp_path / "named").direction == ("de", "en")
