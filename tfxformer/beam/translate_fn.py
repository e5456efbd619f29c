"""`translate(list[str]) -> list[str]` through the Beam pipeline, for the tools that
translate lists (scripts/evaluate.py, scripts/distill.py)."""

from __future__ import annotations

import shlex
import shutil
import tempfile
import uuid

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from tfxformer.beam.pipeline import check_model, translate_files
from tfxformer.config import DecodingOptions


class BeamTranslateFn:
    """Translates a list of lines on a Beam pipeline: writes them to a file in the work
    folder, runs :func:`tfxformer.beam.translate_files` and reads the output back. The
    interface of :class:`tfxformer.serving.TranslateFn` (`path`, `kind`, `options`,
    `describe()`).

    Args:
        model, pipeline_args, batch_size, options: as :func:`translate_files`.
        work_dir: the folder of the input and output files, on a path every worker reads
            (default: the pipeline's --temp_location if given, else a local temporary one).
    """

    def __init__(self, model, pipeline_args=(), batch_size=None, work_dir=None, **options):
        source = check_model(model)
        self.path = source.path if source else model
        self.kind = source.kind if source else "remote"
        record = source.record() if source else None
        exported = (record.decoding if record else None) or DecodingOptions()
        self.options = exported.replace(**{k: options.get(k) for k in (
            "beam_size", "alpha", "extra_length")}).search_options()
        self.compute_type = options.get("compute_type") or "default"
        self._model, self._options = model, dict(options)
        self._pipeline_args, self._batch_size = list(pipeline_args), batch_size
        self._work_dir = work_dir or PipelineOptions(self._pipeline_args).view_as(
            GoogleCloudOptions).temp_location

    def __call__(self, lines) -> list[str]:
        lines = [line.encode("utf-8") if isinstance(line, str) else line for line in lines]
        for number, line in enumerate(lines):
            if b"\n" in line or b"\r" in line:
                raise ValueError(f"Line {number} holds a line break; give one sentence per "
                                 f"line: {line[:60]!r}")
        local = None if self._work_dir else tempfile.mkdtemp(prefix="tfxformer-beam-")
        work = FileSystems.join(self._work_dir or local, f"translate-{uuid.uuid4().hex[:8]}")
        source, target = FileSystems.join(work, "input.txt"), FileSystems.join(work, "output")
        with FileSystems.create(source) as f:
            f.write(b"".join(line + b"\n" for line in lines))
        try:
            translate_files(self._model, [source], target, self._pipeline_args,
                            self._batch_size, **self._options)
            with FileSystems.open(target) as f:
                return [line.rstrip(b"\n").decode("utf-8") for line in iter(f.readline, b"")]
        finally:
            FileSystems.delete([path for path in (source, target) if FileSystems.exists(path)])
            if local:
                shutil.rmtree(local, ignore_errors=True)

    def describe(self) -> str:
        options = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.options.items())
        runner = PipelineOptions(self._pipeline_args).get_all_options()["runner"]
        return (f"model: {self.path} ({self.kind.replace('_', ' ')}) on Apache Beam "
                f"({runner or 'DirectRunner'}); {options}")


def load_translate_fn(path, pipeline_args=(), batch_size=None, **options) -> BeamTranslateFn:
    """:class:`BeamTranslateFn` for the model at `path`, with the keyword arguments of
    :func:`tfxformer.serving.load_translate_fn` (beam_size, alpha,
    extra_length, target_language, precision, checkpoint, compute_type, stopping,
    length_normalization) and Beam's `pipeline_args`, a list of flags or one string
    ("--runner DirectRunner --direct_num_workers 2")."""
    if isinstance(pipeline_args, str):
        pipeline_args = shlex.split(pipeline_args)
    return BeamTranslateFn(path, pipeline_args, batch_size, **options)
