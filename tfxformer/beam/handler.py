"""A RunInference model handler that translates with any model of this package.

Beam's stock `TFModelHandlerTensor` calls a Keras model or a SavedModel's default function
on a batched tensor; a translator export's `serving_default` takes a (N,) string tensor
`text` and returns `translation`, and the package already has the one loader that opens
every model form it writes (:func:`tfxformer.serving.load_translate_fn`:
SavedModel, export dir, ensemble, run dir, preset dir, CTranslate2 dir) and sorts a batch
by length before decoding it. This handler calls that loader once per worker process
(Beam keeps the loaded model for every bundle the process runs) and hands it Beam's
batches: `batch_size` to `max_batch_lines` lines, as many as `scripts/translate.py` reads
ahead, which it decodes `batch_size` at a time in length order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

# Test-only: a marker file path. The first worker whose inference finds no file there
# creates it and exits at once (os._exit), as a worker killed mid-bundle does; the runner
# must retry the bundle elsewhere (tests/test_beam.py).
KILL_ONCE_ENV = "TFXFORMER_BEAM_TEST_KILL_ONCE"
READ_AHEAD_BATCHES = 16  # scripts/translate.py's read-ahead, in batches


def _kill_once_for_tests():
    marker = os.environ.get(KILL_ONCE_ENV)
    if not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(17)


def one_line(text: str) -> str:
    """`text` on one line: a translation's CR and LF become spaces (one output line per
    input line, as scripts/translate.py writes)."""
    return text.replace("\r", " ").replace("\n", " ")


class TranslateHandler(ModelHandler):
    """Translates batches of lines (UTF-8 bytes or str) into one-line strings.

    Args:
        model: any model of this package on a path the workers read (a local path;
            :func:`tfxformer.beam.staging.stage_model` copies one on gs:// or hdfs://
            to the worker first).
        batch_size: sentences per translation call.
        max_batch_lines: the most lines Beam hands one inference call (default 16 batches);
            they are sorted by length and decoded `batch_size` at a time.
        options: keyword arguments of the loader: beam_size, alpha, extra_length,
            target_language, precision, checkpoint, compute_type, stopping,
            length_normalization.
    """

    def __init__(self, model: str, batch_size: int, max_batch_lines: int | None = None,
                 **options):
        max_batch_lines = max_batch_lines or batch_size * READ_AHEAD_BATCHES
        super().__init__(min_batch_size=min(batch_size, max_batch_lines),
                         max_batch_size=max_batch_lines)
        self._model, self._batch_size, self._options = model, batch_size, options

    def load_model(self):
        from tfxformer.beam.staging import stage_model
        from tfxformer.serving import load_translate_fn

        return load_translate_fn(stage_model(self._model), batch_size=self._batch_size,
                                 **self._options)

    def run_inference(self, batch: Sequence, model, inference_args=None):
        _kill_once_for_tests()
        return [PredictionResult(line, one_line(text))
                for line, text in zip(batch, model(list(batch)), strict=True)]

    def get_num_bytes(self, batch: Sequence) -> int:
        return sum(len(line) for line in batch)

    def get_metrics_namespace(self) -> str:
        return "tfxformer_translate"
