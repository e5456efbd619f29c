"""tfxformer.rerank and scripts/rerank.py: n-best reranking by weighted scores."""

import importlib.util
import json
import math
import os

import pytest

from tfxformer.rerank import (
    Candidate,
    combine,
    forward_score,
    length_score,
    mbr_score,
    model_score,
    read_nbest,
    rerank,
)
from tfxformer.serving.scoring import PairScore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["A dog runs.", "Two men sit on a bench."]
# Not sorted by score: the forward best is the second candidate of the first list.
NBEST = [[Candidate("Ein Hund läuft.", -0.7), Candidate("Ein Hund rennt.", -0.2),
          Candidate("Hund", -0.9)],
         [Candidate("Zwei Männer sitzen auf einer Bank.", -0.3),
          Candidate("Zwei Männer sitzen.", -0.5)]]


def _fake_score_fn(calls):
    """A `score` function: log P = -(number of characters of the target) / 10."""
    def score(sources, targets):
        calls.append((list(sources), list(targets)))
        return [PairScore(-len(t) / 10, -len(t) / 10 / max(len(t.split()), 1), [], False)
                for t in targets]
    return score


def test_with_every_other_weight_zero_the_forward_best_wins():
    calls = []
    scorers = {"forward": forward_score(), "length": length_score(),
               "mbr_bleu": mbr_score("bleu"),
               "channel": model_score(_fake_score_fn(calls), "channel")}
    result = rerank(NBEST, SOURCES, scorers,
                    {"forward": 1.0, "length": 0.0, "mbr_bleu": 0.0, "channel": 0.0})
    assert result.index == [1, 0]
    assert result.best == ["Ein Hund rennt.", "Zwei Männer sitzen auf einer Bank."]
    assert result.scores[0] == [-0.7, -0.2, -0.9]
    # The channel score is log P(source | candidate): the candidates are the sources.
    assert calls[0][0][:3] == [c.text for c in NBEST[0]]
    assert calls[0][1][:3] == [SOURCES[0]] * 3
    assert result.features["channel"][0] == [-len(SOURCES[0]) / 10] * 3
    assert result.features["length"][1] == [6.0, 3.0]


def test_mbr_picks_the_consensus_candidate():
    consensus = "a dog runs on the grass"
    row = [Candidate("a cat sleeps", -0.1), Candidate(consensus, -0.5),
           Candidate("a dog runs on grass", -0.6), Candidate("the dog runs on the grass", -0.6)]
    for utility in ("bleu", "chrf"):
        result = rerank([row], ["x"], {"mbr": mbr_score(utility)}, {"mbr": 1.0})
        assert result.best == [consensus], utility
    # Weighted against the forward score, a large forward weight brings the search's
    # best back.
    scorers = {"mbr": mbr_score("chrf"), "forward": forward_score()}
    assert rerank([row], ["x"], scorers, {"mbr": 1.0, "forward": 1000.0}).index == [0]


def test_hostile_inputs():
    scorers = {"forward": forward_score(), "mbr": mbr_score("bleu")}
    weights = {"forward": 1.0, "mbr": 1.0}
    result = rerank([[], [("", -1.0)], [(b"caf\xe9 \xff", -0.1), ("x", -5.0)]],
                    ["", "", b"\xff"], scorers, weights)
    assert result.best == ["", "", "caf\ufffd \ufffd"] and result.index == [-1, 0, 0]
    assert result.scores[0] == []
    index, _ = combine({"forward": [[math.nan, -3.0]]}, {"forward": 1.0})
    assert index == [1]  # a NaN never wins
    with pytest.raises(ValueError, match="One candidate list per source"):
        rerank([[]], [], scorers, weights)
    with pytest.raises(ValueError, match=r"Weights for \['channel'\].*features"):
        rerank(NBEST, SOURCES, scorers, {"channel": 1.0})
    with pytest.raises(ValueError, match="finite number"):
        rerank(NBEST, SOURCES, scorers, {"forward": math.inf})
    with pytest.raises(ValueError, match="utility 'ter'"):
        mbr_score("ter")
    with pytest.raises(ValueError, match="direction 'backward'"):
        model_score(_fake_score_fn([]), "backward")


def test_read_nbest_lines_and_their_errors():
    lines = [b"0 ||| Ein Hund. ||| -0.5\n", b"\n", b"2 ||| caf\xe9 ||| tm= -1 ||| -1.5\n",
             "0 ||| Hund ||| -2"]
    lists = read_nbest(lines, 4)
    assert lists == [[Candidate("Ein Hund.", -0.5), Candidate("Hund", -2.0)], [],
                     [Candidate("caf\ufffd", -1.5)], []]
    assert len(read_nbest(lines)) == 3
    for bad, match in (("x ||| a ||| 1", "index 'x'"), ("0 ||| a", "expected 'i |||"),
                       ("0 ||| a ||| high", "score 'high'"), ("9 ||| a ||| 1", "index 9")):
        with pytest.raises(ValueError, match=match):
            read_nbest([bad], 4, "val.nbest")


def _script():
    spec = importlib.util.spec_from_file_location(
        "rerank_script", os.path.join(ROOT, "scripts", "rerank.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_reranks_a_small_nbest_file(tmp_path, capsys):
    script = _script()
    nbest, source = tmp_path / "val.nbest", tmp_path / "val.en"
    nbest.write_bytes("0 ||| Ein Hund läuft schnell. ||| -0.7\n"
                      "0 ||| Ein Hund rennt. ||| -0.2\n"
                      "2 ||| Zwei Männer. ||| -0.3\n".encode() + b"2 ||| M\xe4nner ||| -0.1\n")
    source.write_text("A dog runs.\nNothing here.\nTwo men.\n", encoding="utf-8")
    out, scores = tmp_path / "best.de", tmp_path / "scores.jsonl"
    assert script.main(["--nbest", str(nbest), "--source", str(source), "--output", str(out),
                        "--weight", "forward=1", "--weight", "length=1",
                        "--scores", str(scores)]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == [
        "Ein Hund läuft schnell.", "", "Zwei Männer."]
    assert "1 source line(s) have no candidate" in capsys.readouterr().err
    rows = [json.loads(line) for line in scores.read_text(encoding="utf-8").splitlines()]
    assert rows[0]["scores"]["length"] == [4.0, 3.0] and rows[1]["chosen"] == -1
    assert rows[2]["candidates"][1] == "M\ufffdnner"
    assert script.main(["--nbest", str(nbest)]) == 0  # forward=1, 3 lines from the indices
    assert capsys.readouterr().out.splitlines() == ["Ein Hund rennt.", "", "M\ufffdnner"]
    for argv, message in ((["--weight", "channel=1"], "scores need --source"),
                          (["--weight", "channel=1", "--source", str(source)],
                           "needs --channel-model"),
                          (["--weight", "beauty=1"], "NAME one of")):
        with pytest.raises(SystemExit):
            script.main(["--nbest", str(nbest), *argv])
        assert message in capsys.readouterr().err


@pytest.mark.slow  # loads a SavedModel twice (about a minute on 2 busy cores)
def test_the_script_scores_the_channel_with_a_models_score_signature(tiny_export, tmp_path):
    from tfxformer.serving import load_score_fn

    script = _script()
    nbest, source = tmp_path / "val.nbest", tmp_path / "val.en"
    nbest.write_text("0 ||| Ein Hund. ||| -0.5\n0 ||| Hund ||| -0.6\n", encoding="utf-8")
    source.write_text("A dog.\n", encoding="utf-8")
    scores = tmp_path / "scores.jsonl"
    assert script.main(["--nbest", str(nbest), "--source", str(source), "--output",
                        str(tmp_path / "best"), "--weight", "channel=1",
                        "--channel-model", tiny_export, "--scores", str(scores)]) == 0
    row = json.loads(scores.read_text(encoding="utf-8"))
    want = load_score_fn(tiny_export)(["Ein Hund.", "Hund"], ["A dog.", "A dog."])
    assert row["scores"]["channel"] == pytest.approx([s.log_prob for s in want], abs=1e-4)
    best = max(range(2), key=lambda k: want[k].log_prob)
    assert (tmp_path / "best").read_text(encoding="utf-8") == ["Ein Hund.", "Hund"][best] + "\n"
