"""The CTranslate2 export (tfxformer.serving.ctranslate2_export) and translation with it
(tfxformer.serving.ctranslate2): the converted model's log-probabilities against the Keras
model's, the decoding rules on a stand-in translator, the directory's detection and the
errors; slow: the shipped EN→DE model translating 200 val sentences as its SavedModel."""

import io
import json
import os
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from conftest import shared_data
from support.ctranslate2 import fake_ct2_dir

from tfxformer import pretrained
from tfxformer.config import DecodingOptions
from tfxformer.models.transformer import Transformer
from tfxformer.serving import ctranslate2 as ct2
from tfxformer.serving import ctranslate2_export as ct2_export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "saved_models", "multi30k_en_de")
SPM = os.path.join(SHIPPED, str(max(int(v) for v in os.listdir(SHIPPED) if v.isdigit())),
                   "assets", "spm.model")
INSTALL = 'pip install -e ".[ctranslate2]"'


def _pieces(vocab_size):
    return list(ct2.SPECIAL_PIECES) + [f"t{i}" for i in range(4, vocab_size)]


def _weights(model):
    return {pretrained.weight_key(w.path): w.numpy() for w in model.weights}


@pytest.mark.parametrize("variant", [{}, {"norm_first": True, "position_embedding": "learned"}],
                         ids=["post-norm-sinusoidal", "pre-norm-learned"])
def test_converted_model_scores_tokens_as_the_keras_model(tiny_config, tmp_path, variant):
    ctranslate2 = pytest.importorskip("ctranslate2")
    config = tiny_config.replace(**variant)
    model = Transformer(config)
    model.build()
    pieces = _pieces(config.vocab_size)
    ct2_export.save_spec(ct2_export.build_spec(config, _weights(model), pieces), str(tmp_path))
    rng = np.random.default_rng(0)
    source = rng.integers(4, config.vocab_size, (3, 7))
    source[:, -1], source[1, 4:] = 3, 0  # EOS last; row 1 padded after its EOS
    source[1, 4] = 3
    target = rng.integers(4, config.vocab_size, (3, 6))
    target[:, -1] = 3
    inputs = np.concatenate([np.full((3, 1), 2), target[:, :-1]], axis=1)  # BOS first
    log_probs = tf.nn.log_softmax(model((tf.constant(source), tf.constant(inputs)))).numpy()
    ours = np.take_along_axis(log_probs, target[..., None], axis=-1)[..., 0]
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", intra_threads=1)
    theirs = translator.score_batch(  # scores the target and its EOS
        [[pieces[i] for i in row if i] for row in source],
        [[pieces[i] for i in row[:-1]] for row in target])
    np.testing.assert_allclose([r.log_probs for r in theirs], ours, atol=1e-4)


def test_weights_and_vocabularies_that_do_not_fit_are_named(tiny_config):
    pytest.importorskip("ctranslate2")
    model = Transformer(tiny_config)
    model.build()
    weights = _weights(model)
    del weights["decoder/layer_1/cross_attention/key_kernel"]
    with pytest.raises(ValueError, match="decoder/layer_1/cross_attention/key_kernel"):
        ct2_export.build_spec(tiny_config, weights, _pieces(tiny_config.vocab_size))
    with pytest.raises(ValueError, match="64 pieces starting"):
        ct2_export.build_spec(tiny_config, _weights(model), ["<unk>", "<s>", "</s>"] + ["x"] * 61)


def test_multilingual_models_and_ensembles_do_not_convert(tiny_config):
    with pytest.raises(ValueError, match="multilingual model .*de, fr"):
        ct2_export.check_convertible(tiny_config, target_languages=("de", "fr"))
    with pytest.raises(ValueError, match="ensemble"):
        ct2_export.check_convertible(tiny_config, ensemble=True)


def test_beta_grows_the_penalty_as_gnmt_at_the_batch_length():
    assert ct2.ct2_length_penalty(1.4, 15) == pytest.approx(1.05)
    n, alpha = 20.0, 0.6
    beta = ct2.ct2_length_penalty(alpha, n)
    gnmt = alpha * (np.log((5 + n + 0.5) / 6) - np.log((5 + n - 0.5) / 6))
    assert beta * (np.log(n + 0.5) - np.log(n - 0.5)) == pytest.approx(gnmt, rel=1e-3)


def test_directories_are_told_apart(tmp_path):
    ours = fake_ct2_dir(tmp_path / "ours")
    foreign = fake_ct2_dir(tmp_path / "foreign", marker=False)
    newer = fake_ct2_dir(tmp_path / "newer", version=ct2.FORMAT_VERSION + 1)
    assert ct2.is_ctranslate2_dir(ours)
    assert not ct2.is_ctranslate2_dir(foreign) and not ct2.is_ctranslate2_dir(SHIPPED)
    assert ct2.read_marker(ours)["format"] == ct2.FORMAT
    with pytest.raises(ValueError, match="not one exported by tfxformer.*--format ctranslate2"):
        ct2.read_marker(foreign)
    with pytest.raises(ValueError, match="format version 2"):
        ct2.read_marker(newer)
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 model directory"):
        ct2.read_marker(SHIPPED)


def test_options_of_the_other_runtime_are_errors(tmp_path):
    ours = fake_ct2_dir(tmp_path / "ours")
    from tfxformer.serving import load_nbest_fn, load_translate_fn

    with pytest.raises(ValueError, match=r"\['precision'\] apply to SavedModels"):
        load_translate_fn(ours, precision="bf16")
    with pytest.raises(ValueError, match=r"\['target_language'\] apply to SavedModels"):
        load_nbest_fn(ours, target_language="de")
    with pytest.raises(ValueError, match="`compute_type` 'int8' applies to CTranslate2"):
        load_translate_fn(SHIPPED, compute_type="int8")
    with pytest.raises(ValueError, match="`threads` 2 applies to CTranslate2"):
        load_nbest_fn(SHIPPED, threads=2)


def test_a_directory_is_resolved_once_on_the_way_to_its_translate_fn(monkeypatch, tmp_path):
    from tfxformer import locate
    from tfxformer.serving import load_translate_fn

    ours = fake_ct2_dir(tmp_path / "ours", beam_size=2)
    with open(SPM, "rb") as f:
        (tmp_path / "ours" / "spm.model").write_bytes(f.read())
    reads, original = [], locate.read_ctranslate2_marker

    def read(path):
        reads.append(path)
        return original(path)

    for module in (locate, ct2):
        monkeypatch.setattr(module, "read_ctranslate2_marker", read)
    monkeypatch.setitem(sys.modules, "ctranslate2", SimpleNamespace(
        Translator=lambda *args, **kwargs: SimpleNamespace(compute_type="float32")))
    translate = load_translate_fn(ours)
    assert reads == [ours] and translate.decoding.beam_size == 2


def test_a_missing_ctranslate2_is_an_error_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    with pytest.raises(ImportError, match=re.escape(INSTALL)):
        ct2.import_ctranslate2()
    export = _script("export")
    with pytest.raises(SystemExit) as exit_:
        export.main(["--model", SHIPPED, "--export-dir", str(tmp_path / "ct2"),
                     "--format", "ctranslate2"])
    assert exit_.value.code == 2 and INSTALL in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--quantization", "int8"], "--quantization int8 applies to --format ctranslate2"),
    (["--format", "ctranslate2", "--shortlist", "20,100"], "--shortlist apply to --format "
     "saved_model")])
def test_export_flags_of_the_other_format_are_errors(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _script("export").main(["--model", SHIPPED, "--export-dir", str(tmp_path / "x"),
                                *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


class _StandIn:
    """A CTranslate2 Translator (asynchronous results) that echoes each source (its EOS
    included) and records its calls; `long` sources instead run to the batch limit
    without an EOS."""

    compute_type = "float32"

    def __init__(self, long=()):
        self.calls, self.long = [], set(long)

    def translate_batch(self, sources, **options):
        self.calls.append((sources, options))
        limit, hypotheses = options["max_decoding_length"], []
        for source in sources:
            pieces = ["▁x"] * limit if tuple(source) in self.long else list(source)
            if not options["return_end_token"] and pieces[-1:] == [ct2.EOS]:
                pieces = pieces[:-1]
            result = SimpleNamespace(hypotheses=[pieces])
            hypotheses.append(SimpleNamespace(result=lambda result=result: result))
        return hypotheses


def _translate_fn(translator, **decoding):
    import sentencepiece

    options = DecodingOptions(max_input_tokens=8, max_output_tokens=30, extra_length=5,
                              batch_size=2, alpha=1.4, **decoding)
    processor = sentencepiece.SentencePieceProcessor(model_file=SPM)
    return ct2.Ct2TranslateFn(translator, processor, "stand-in", {}, options), processor


def test_lines_are_cut_batched_by_length_class_and_returned_in_order():
    translator = _StandIn()
    translate, sp = _translate_fn(translator)
    lines = ["A dog.", "", "Two men are talking in a park near the river today.", b"Hi.",
             b" \t ", "A cat."]
    out = translate(lines)
    assert out[1] == out[4] == ""  # blank: never sent
    assert [out[i] for i in (0, 3, 5)] == ["A dog.", "Hi.", "A cat."]  # echoes, in order
    long_pieces = sp.encode(lines[2], out_type=str)
    assert out[2] == sp.decode(long_pieces[:7])  # cut to max_input_tokens - 1, then EOS
    assert sorted(len(batch) for batch, _ in translator.calls) == [1, 1, 2]
    for batch, options in translator.calls:  # one length class, so one β, per call
        lengths = {len(source) for source in batch}
        length_class = {round(np.log(n) / np.log(ct2.LENGTH_CLASS_RATIO)) for n in lengths}
        assert len(length_class) == 1
        assert options["length_penalty"] == pytest.approx(ct2.ct2_length_penalty(
            1.4, ct2.LENGTH_CLASS_RATIO ** length_class.pop()))
        assert options["max_decoding_length"] == max(lengths) + 5  # + extra_length
        assert options["return_end_token"] and options["patience"] == 1
    assert [long_pieces[:7] + [ct2.EOS]] in [batch for batch, _ in translator.calls]


def test_an_output_past_its_own_limit_is_decoded_again_alone():
    import sentencepiece

    short = "A dog."
    sp = sentencepiece.SentencePieceProcessor(model_file=SPM)
    short_source = tuple(sp.encode(short, out_type=str) + [ct2.EOS])
    translator = _StandIn(long=[short_source])
    translate, _ = _translate_fn(translator, length_normalization="length")  # one class
    translate([short, "Two men are talking in a park."])
    (batch, options), (alone, again) = translator.calls
    assert len(batch) == 2 and alone == [list(short_source)]
    assert again["max_decoding_length"] == len(short_source) + 5 < options[
        "max_decoding_length"]


def test_ctranslate2s_own_normalization_goes_through_as_it_is():
    translator = _StandIn()
    translate, _ = _translate_fn(translator, length_normalization="length",
                                 stopping="finished")
    assert translate(["A dog.", "Two men."]) == ["A dog.", "Two men."]
    (_, options), = translator.calls
    assert options["length_penalty"] == 1.4 and not options["return_end_token"]


class _NBestStandIn(_StandIn):
    """A CTranslate2 Translator giving `num_hypotheses` hypotheses of each source: the
    k-th echoes it with k pieces `extra` before its EOS, scored -(k + 1)."""

    def __init__(self, extra):
        super().__init__()
        self.extra = extra

    def translate_batch(self, sources, **options):
        self.calls.append((sources, options))
        results = []
        for source in sources:
            body = [p for p in source if p != ct2.EOS]
            found = [body + [self.extra] * k + [ct2.EOS]
                     for k in range(options["num_hypotheses"])]
            result = SimpleNamespace(hypotheses=found,
                                     scores=[-(k + 1.0) for k in range(len(found))])
            results.append(SimpleNamespace(result=lambda result=result: result))
        return results


def test_nbest_reads_a_line_as_the_saved_models_translate_nbest():
    """A line's sentences are decoded as rows, the prefix with the first; hypothesis j
    joins the rows' j-th in the source's case, its score their sum; blank stays blank."""
    import sentencepiece

    from tfxformer.serving.nbest import Line

    (extra,) = sentencepiece.SentencePieceProcessor(model_file=SPM).encode("und", out_type=str)
    translator = _NBestStandIn(extra)
    translate, sp = _translate_fn(translator, beam_size=2)
    lines = ["A dog runs.  TWO CATS ARE SLEEPING!", " ", Line("A bird sings. A fish swims.",
                                                            prefix="Ein")]
    first, blank, steered = translate.nbest(lines)
    assert [(h.text, h.score) for h in first] == [
        ("A dog runs.  TWO CATS ARE SLEEPING!", -2.0),
        ("A dog runs. und  TWO CATS ARE SLEEPING! UND", -4.0)]
    assert [(h.text, h.score) for h in blank] == [("", 0.0)]
    assert [h.score for h in steered] == [-2.0, -4.0]
    prefixed = [(source, prefix) for sources, options in translator.calls
                if "target_prefix" in options
                for source, prefix in zip(sources, options["target_prefix"], strict=True)]
    assert prefixed == [(sp.encode("A bird sings.", out_type=str) + [ct2.EOS],
                         sp.encode("Ein", out_type=str))]
    assert len(translate.nbest(lines, num_hypotheses=1)[0]) == 1


@pytest.mark.slow
def test_shipped_model_translates_as_its_saved_model(tmp_path, monkeypatch, capsys):
    """scripts/export.py --format ctranslate2 on the shipped EN→DE model; its first 200
    Multi30k val translations against the SavedModel's; translate.py and evaluate.py take
    the directory."""
    pytest.importorskip("ctranslate2")
    from tfxformer.serving import load_translate_fn

    directory = str(tmp_path / "en_de")
    assert _script("export").main(["--model", SHIPPED, "--export-dir", directory,
                                   "--format", "ctranslate2"]) == 0
    assert {"model.bin", "config.json", "shared_vocabulary.json", "spm.model",
            ct2.MARKER_FILENAME} <= set(os.listdir(directory))
    record = ct2.read_marker(directory)
    assert (record["src"], record["tgt"], record["quantization"]) == ("en", "de", "float32")
    with open(shared_data("multi30k", "val.en"), encoding="utf-8") as f:
        sources = [line.rstrip("\n") for line in f][:200]
    expected = load_translate_fn(SHIPPED)(sources)
    got = load_translate_fn(directory, threads=1)(sources)
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    assert same >= 190, f"{same} of 200 translations identical"
    capsys.readouterr()  # export.py's line

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        "\n".join(sources[:3]).encode() + b"\n")))
    assert _script("translate").main(["--model", directory, "--threads", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == got[:3]
    data = tmp_path / "data"
    data.mkdir()
    (data / "five.en").write_text("\n".join(sources[:5]) + "\n")
    (data / "five.de").write_text("\n".join(expected[:5]) + "\n")
    assert _script("evaluate").main(["--model", directory, "--data", str(data),
                                     "--sets", "five", "--compute-type", "int8"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["precision"].startswith("ctranslate2 int8") and row["bleu"] > 50


def _script(name):
    """scripts/<name>.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"{name}_script", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
