"""An export of only some signatures (`export_translator(signatures=...)`,
`scripts/export.py --signatures`): what it holds, that it translates as the full export,
and the error a loader gives for a signature it left out."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_export_translator
from support.serving import load_script

from tfxformer.pretrained import saved_model_variables
from tfxformer.rundir import RunRecord
from tfxformer.serving import export_translator, load_translate_fn
from tfxformer.serving.scoring import load_score_fn
from tfxformer.serving.signatures import SIGNATURES, check_signatures, missing_signature
from tfxformer.serving.warmup import read_warmup_records

TEXTS = ["A dog runs in the park.", "Two men are talking on a bench.", ""]
LEAN = ("serving_default", "translate_per_example")


@pytest.fixture(scope="module")
def lean_export(tiny_export, spm_model, tmp_path_factory):
    """conftest's tiny export again, with serving_default and translate_per_example only
    (serving_default left for export_translator to add)."""
    translator = tiny_export_translator(tiny_export, spm_model)
    return export_translator(translator, str(tmp_path_factory.mktemp("lean") / "lean"),
                             config={"src": "en", "tgt": "de"},
                             signatures=["translate_per_example"])


def _per_example(signature, **options):
    return signature(text=tf.constant(TEXTS), **{k: tf.constant(v) for k, v in options.items()})


@pytest.mark.slow
def test_a_lean_export_holds_the_asked_signatures_and_translates_as_the_full_one(
        lean_export, tiny_export):
    lean, full = tf.saved_model.load(lean_export), tf.saved_model.load(tiny_export)
    assert sorted(lean.signatures) == sorted(LEAN)
    assert sorted(full.signatures) == sorted(SIGNATURES)
    with open(os.path.join(lean_export, "assets", "config.json")) as f:
        config = json.load(f)
    assert config["signatures"] == list(LEAN)
    assert {log.predict_log.request.model_spec.signature_name
            for log in read_warmup_records(lean_export)} == set(LEAN)
    # The same weights: a re-export or a CTranslate2 conversion of it loses nothing.
    lean_weights, full_weights = (saved_model_variables(p) for p in (lean_export, tiny_export))
    assert sorted(lean_weights) == sorted(full_weights)
    for key, value in lean_weights.items():
        np.testing.assert_array_equal(value, full_weights[key])
    # The search reads the weights derived beforehand (the transposed embedding ...),
    # saved beside the model's own.
    assert lean.derived_weights and {
        v.name for v in lean.derived_weights} <= {v.name for v in lean.translate.variables}
    got, expected = (s.signatures["serving_default"](text=tf.constant(TEXTS))
                     for s in (lean, full))
    assert got["translation"].numpy().tolist() == expected["translation"].numpy().tolist()
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5)
    # translate_per_example with the export's own options is serving_default; other
    # options per text work.
    per_example = _per_example(lean.signatures["translate_per_example"], **{
        name: [config["decoding"][name]] * len(TEXTS)
        for name in ("beam_size", "alpha", "extra_length", "max_input_tokens")})
    assert per_example["translation"].numpy().tolist() == \
        got["translation"].numpy().tolist()
    assert _per_example(lean.signatures["translate_per_example"], beam_size=[1, 3, 2],
                        alpha=[0.0, 0.6, 1.0], extra_length=[4, 2, 4],
                        max_input_tokens=[48, 5, 48])["truncated"].numpy().tolist() == \
        [False, True, False]


@pytest.mark.slow
def test_a_loader_asking_for_a_left_out_signature_names_the_re_export(lean_export, capsys):
    command = (f"python scripts/export.py --model {lean_export} --export-dir NEW_EXPORT_DIR "
               "--signatures serving_default translate_per_example ")
    for load, missing in ((lambda: load_translate_fn(lean_export, beam_size=2),
                           "translate_with_options"),
                          (lambda: load_score_fn(lean_export), "score")):
        with pytest.raises(ValueError) as error:
            load()
        message = str(error.value)
        assert f"SavedModel {lean_export!r} has no `{missing}` signature" in message
        assert "exported with `--signatures serving_default translate_per_example`" in message
        assert message.endswith(command + missing), message
    assert load_translate_fn(lean_export).kind == "saved_model"  # serving_default suffices
    with pytest.raises(SystemExit) as exit_:  # load_nbest_fn's error, through the script
        load_script("translate").main(["--model", lean_export, "--n-best", "2"])
    assert exit_.value.code == 2
    assert command + "translate_nbest" in capsys.readouterr().err


def test_signature_names_are_checked_before_anything_is_exported(tmp_path, capsys):
    assert check_signatures(None) == tuple(SIGNATURES)
    assert check_signatures(["score", "serving_default", "score"]) == ("serving_default",
                                                                       "score")
    assert check_signatures([]) == ("serving_default",)
    with pytest.raises(ValueError, match=r"Unknown signature name\(s\) \['nbest'\]; "
                                         r"accepted: serving_default, translate_per_example"):
        check_signatures(["score", "nbest"])
    with pytest.raises(ValueError, match="a sequence of signature names, got the string "
                                         "'score'"):
        check_signatures("score")
    with pytest.raises(ValueError, match="'translate'"):
        export_translator(None, str(tmp_path / "never"), signatures=["translate"])
    assert not (tmp_path / "never").exists()
    with pytest.raises(SystemExit) as exit_:
        load_script("export").main(["--model", str(tmp_path / "missing"), "--export-dir",
                                    str(tmp_path / "out"), "--signatures", "scores"])
    assert exit_.value.code == 2
    assert "Unknown signature name(s) ['scores']" in capsys.readouterr().err
    help_text = load_script("export").build_parser().format_help()
    for name in SIGNATURES:
        assert name in help_text


def test_an_ensemble_or_reranking_export_is_re_exported_as_it_was_made():
    """Its models are not in the SavedModel's name: the message says which flags remake it
    and where the record of its models is, not `--model` (which would drop them)."""
    for entry, flags in (("ensemble", "--ensemble MODEL MODEL ..."),
                         ("rerank", "--model MODEL --rerank-with MODEL ...")):
        record = RunRecord.from_dict({"model": {"vocab_size": 8}, entry: [{"source": "a"}],
                                      "signatures": ["serving_default"]})
        message = str(missing_signature("exports/x/1", "translate_nbest", ["serving_default"],
                                        record))
        assert f"python scripts/export.py {flags}" in message
        assert ("--export-dir NEW_EXPORT_DIR --signatures serving_default translate_nbest "
                f"(as its assets/config.json `{entry}` entry records)") in message
        assert "--model exports/x/1" not in message
