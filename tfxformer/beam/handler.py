"""A RunInference model handler that runs any model of this package in one of the modes of
:mod:`tfxformer.beam.modes` (translations, n-best lists, samples, scores).

Beam's stock `TFModelHandlerTensor` calls a Keras model or a SavedModel's default function
on a batched tensor; a translator export's signatures take (N,) string tensors and more,
and the package already has the loaders that open every model form it writes
(:func:`tfxformer.serving.load_translate_fn` and its kin: SavedModel, export dir,
ensemble, run dir, preset dir, CTranslate2 dir) and sort a batch by length before decoding
it. This handler calls the mode's loader once per worker process (Beam keeps the loaded
model for every bundle the process runs) and hands it Beam's batches of `max_batch_lines`
lines (the rest of a bundle at its end), as many as `scripts/translate.py` reads ahead,
which the loaded function decodes `batch_size` at a time in length order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from tfxformer.beam.modes import Translate

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


class TranslateHandler(ModelHandler):
    """Runs batches of input rows (the columns of :meth:`Translate.columns`, UTF-8 bytes)
    through a model: one shard value (a line of text) per row.

    Args:
        model: any model of this package on a path the workers read (a local path;
            :func:`tfxformer.beam.staging.stage_model` copies one on gs:// or hdfs://
            to the worker first).
        batch_size: sentences per model call.
        max_batch_lines: the lines of one inference call (default 16 batches; a bundle's
            last call takes the rest): a fixed size, as scripts/translate.py reads ahead,
            rather than Beam's adaptive one, which starts at `batch_size` lines and so
            sorts only that many by length at first; they are sorted by length and
            decoded `batch_size` at a time.
        mode: a mode of :mod:`tfxformer.beam.modes` (default: :class:`Translate` with
            `options`).
        options: keyword arguments of the default mode's loader: beam_size, alpha,
            extra_length, target_language, precision, checkpoint, compute_type, stopping,
            length_normalization.
    """

    def __init__(self, model: str, batch_size: int, max_batch_lines: int | None = None,
                 mode: Translate | None = None, **options):
        max_batch_lines = max_batch_lines or batch_size * READ_AHEAD_BATCHES
        super().__init__(min_batch_size=max_batch_lines, max_batch_size=max_batch_lines)
        self._model, self._batch_size = model, batch_size
        self.mode = mode or Translate(**options)

    def load_model(self):
        from tfxformer.beam.staging import stage_model

        return self.mode.load(stage_model(self._model), self._batch_size)

    def run_inference(self, batch: Sequence, model, inference_args=None):
        _kill_once_for_tests()
        return [PredictionResult(row, value) for row, value in
                zip(batch, self.mode.run(model, list(batch)), strict=True)]

    def get_num_bytes(self, batch: Sequence) -> int:
        return sum(len(column) for row in batch for column in row)

    def get_metrics_namespace(self) -> str:
        return "tfxformer_translate"
