"""The bulk-translation pipeline: lines keyed by (file, line number), RunInference,
sharded keyed outputs, and the merge that puts them back in input order.

    files --Read lines--> ((file, line), columns) --Reshuffle--> RunInference(TranslateHandler)
          --Format--> "file<TAB>line<TAB>value" shards in OUTPUT.shards/part-*
          \\-> "file<TAB>line count" in OUTPUT.shards/counts-*

A line is a text line or a TFRecord record's feature (:mod:`tfxformer.beam.records`), its
columns and value those of the handler's mode (:mod:`tfxformer.beam.modes`).

The shard files are written by the workers themselves (:class:`WriteShards`), each whole
or not at all, so the lines of a pipeline that failed are kept: :func:`translate_files`
runs it again for the rest. A bundle run twice writes its lines twice; :func:`merge_shards`
keeps one translation per key, checks that every line of every input file has one, and
writes OUTPUT, one line per input line, the files in the order :func:`match_inputs`
gives; it holds the translations in memory (about the output's size).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import threading
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from tfxformer.beam.handler import TranslateHandler
from tfxformer.beam.modes import Translate
from tfxformer.beam.records import file_format, read_lines
from tfxformer.beam.staging import is_local
from tfxformer.config import DecodingOptions

SHARDS_SUFFIX = ".shards"
COUNTS = "counts"
FLUSH_LINES = 1000  # a bundle's translations are written every FLUSH_LINES lines


def match_inputs(patterns) -> list[str]:
    """The files the globs `patterns` match (any of Beam's file systems), each pattern's
    sorted by name, in the order of the patterns, each file once."""
    paths = []
    for pattern in patterns:
        try:
            found = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        except beam.io.filesystem.BeamIOError:
            found = []
        if not found:
            raise FileNotFoundError(f"Input {pattern!r} matches no file (a path or a glob "
                                    "such as 'data/*.en' or 'gs://bucket/mono-*.gz').")
        paths += [path for path in found if path not in paths]
    return paths


class ReadKeyedLines(beam.DoFn):
    """(index, path, done) -> ((index, line number from 0), the line's columns) for each
    line (text line, or TFRecord record) of the file not in the set `done`, decompressed by
    its name (.gz, .bz2, .zst, ...), and "index<TAB>line count" on the `counts` output.
    A line's bytes are kept as they are: the model replaces invalid UTF-8, translates an
    empty line into an empty one and cuts long ones.

    Args:
        mode: the mode whose columns a line holds (:meth:`Translate.columns`).
        input_format: "auto" (TFRecord by the extension .tfrecord or .tfrecords), "text"
            or "tfrecord".
        feature: the bytes feature of a TFRecord's tf.train.Example that holds the line.
    """

    def __init__(self, mode: Translate, input_format: str = "auto", feature: str = "source"):
        self._mode, self._format, self._feature = mode, input_format, feature

    def process(self, element):
        index, path, done = element
        done, number = frozenset(done), 0
        with FileSystems.open(path) as f:
            lines = read_lines(f, path, file_format(path, self._format), self._feature)
            for number, line in enumerate(lines, 1):
                if number - 1 in done:
                    continue
                try:
                    columns = self._mode.columns(line)
                except ValueError as error:
                    raise ValueError(f"{path} line {number}: {error}") from None
                yield (index, number - 1), columns
        yield beam.pvalue.TaggedOutput(COUNTS, f"{index}\t{number}".encode())


class WriteShards(beam.DoFn):
    """Writes the lines (bytes) it gets to files `folder/prefix-<random>`, every
    FLUSH_LINES lines and at the end of a bundle: each under a temporary name first,
    renamed when whole, so a file that exists is complete. A bundle run again after a
    failure writes its lines again under new names (the merge keeps one per key)."""

    def __init__(self, folder: str, prefix: str):
        self._folder, self._prefix = folder, prefix

    def start_bundle(self):
        self._lines = []

    def process(self, line):
        self._lines.append(line)
        if len(self._lines) >= FLUSH_LINES:
            self._flush()

    def finish_bundle(self):
        self._flush()

    def _flush(self):
        if not self._lines:
            return
        name = f"{self._prefix}-{uuid.uuid4().hex}"
        temp = FileSystems.join(self._folder, f".tmp-{name}")
        with FileSystems.create(temp, compression_type="uncompressed") as f:
            f.write(b"".join(line + b"\n" for line in self._lines))
        FileSystems.rename([temp], [FileSystems.join(self._folder, name)])
        self._lines = []


def _shard_line(element) -> bytes:
    (index, number), result = element
    return f"{index}\t{number}\t{result.inference}".encode()


def build(pipeline, files, shards: str, handler: TranslateHandler, input_format="auto",
          feature="source"):
    """Adds the translation by `handler` of `files`, (index, path, line numbers done)
    triples, to `pipeline`, written to the shards folder `shards` (see the module
    docstring; `input_format`, `feature`: :class:`ReadKeyedLines`')."""
    read = (pipeline
            | "Files" >> beam.Create(files)
            | "Read lines" >> beam.ParDo(ReadKeyedLines(handler.mode, input_format, feature))
            .with_outputs(COUNTS, main="lines"))
    (read.lines
     | "Spread" >> beam.Reshuffle()
     | "Translate" >> RunInference(KeyedModelHandler(handler))
     | "Format" >> beam.Map(_shard_line)
     | "Write" >> beam.ParDo(WriteShards(shards, "part")))
    read[COUNTS] | "Write counts" >> beam.ParDo(WriteShards(shards, COUNTS))


def _shard_records(pattern):
    """The tab-separated fields of each line of the files matching `pattern`."""
    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except beam.io.filesystem.BeamIOError:
        matched = []
    for metadata in matched:
        with FileSystems.open(metadata.path, compression_type="uncompressed") as f:
            for line in iter(f.readline, b""):
                yield line.rstrip(b"\n").split(b"\t", 2)


def read_shards(shards: str):
    """({file index: line count}, {(file index, line number): translation}) of the
    shards folder `shards`, one translation per key (a bundle run twice wrote its lines
    twice)."""
    counts, texts = {}, {}
    for index, count in _shard_records(FileSystems.join(shards, COUNTS + "-*")):
        counts[int(index)] = int(count)
    for index, number, text in _shard_records(FileSystems.join(shards, "part-*")):
        texts.setdefault((int(index), int(number)), text)
    return counts, texts


def missing_lines(counts, texts, num_files):
    """{file index: line numbers without a translation} for the files whose count is known,
    and the indices of the files whose count is not."""
    unread = [index for index in range(num_files) if index not in counts]
    missing = {index: [n for n in range(count) if (index, n) not in texts]
               for index, count in counts.items()}
    return {index: numbers for index, numbers in missing.items() if numbers}, unread


def merge_shards(shards: str, num_files: int, output: str, mode: Translate | None = None
                 ) -> int:
    """Writes `output` (compressed by its name, e.g. .gz) from the shards folder `shards`
    of :func:`build` over `num_files` files: each input line's value once, in input
    order, as the output lines of `mode` (default: one translation a line,
    :meth:`Translate.output`). Returns the number of input lines.

    Raises:
        RuntimeError: a file whose lines were not counted, or a line without a translation
            (nothing is written).
    """
    counts, texts = read_shards(shards)
    missing, unread = missing_lines(counts, texts, num_files)
    if missing or unread:
        lines = [(index, numbers[0]) for index, numbers in missing.items()]
        raise RuntimeError(f"{shards!r} lacks translations: the first missing of "
                           f"{sum(map(len, missing.values()))} lines (file index, line from "
                           f"0): {lines[:5]}; files not read: {unread}. Its pipeline did not "
                           "finish: run it again.")
    mode, line = mode or Translate(), 0
    with FileSystems.create(output) as f:
        for index in range(num_files):
            for number in range(counts[index]):
                f.write(mode.output(line, texts[index, number]))
                line += 1
    return sum(counts.values())


def _remove(folder: str):
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
    elif FileSystems.exists(folder):
        FileSystems.delete([m.path for m in FileSystems.match([folder + "/**"])[0].metadata_list])


def check_model(model: str):
    """The model's :class:`tfxformer.locate.Loader` where it is local (its form and
    records checked before any worker starts), else None."""
    from tfxformer.locate import resolve

    return resolve(model, tool="tfxformer.beam") if is_local(model) else None


def direct_runner(options: PipelineOptions):
    """The runner of `options`: Beam's FnApiRunner where they name the DirectRunner (or no
    runner), else None (Beam's choice). Beam's DirectRunner first tries the Prism runner,
    downloaded from GitHub on first use (a network call, and a runner that ignores
    --direct_num_workers); the FnApiRunner is what it falls back to and runs this pipeline
    in one process or in --direct_num_workers worker processes."""
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    given = options.get_all_options()
    if given["runner"] not in (None, "DirectRunner", "direct"):
        return None
    encoded = JobServiceHandle.encode_pipeline_options(given)
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def workers_elsewhere(pipeline_args) -> bool:
    """Whether the bundles run in worker processes of their own (the DirectRunner's
    multi_processing mode): then the process that runs the pipeline never calls the model,
    and may be a fork of one that loaded TensorFlow."""
    given = PipelineOptions(list(pipeline_args)).get_all_options()
    return given["runner"] in (None, "DirectRunner", "direct") and \
        given["direct_running_mode"] == "multi_processing"


def _run_watched(pipeline_args, files, shards, handler, read_options):
    """Runs the pipeline in this process, a new process group with the runner's worker
    processes: the DirectRunner waits forever for the bundle of a worker process that died
    (Beam 2.78), so the first worker that exits with an error kills the group; so does
    the end of the parent process, however it ended."""
    os.setpgrp()
    parent = os.getppid()

    def watch_parent():
        while os.getppid() == parent:
            time.sleep(1)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch_parent, daemon=True).start()

    def hook(args):
        if isinstance(args.exc_value, RuntimeError) and \
                str(args.exc_value).startswith("Worker subprocess exited"):
            os.killpg(0, signal.SIGKILL)
        threading.__excepthook__(args)

    threading.excepthook = hook
    options = PipelineOptions(list(pipeline_args))
    with beam.Pipeline(runner=direct_runner(options), options=options) as pipeline:
        build(pipeline, files, shards, handler, *read_options)


class WorkerLost(RuntimeError):
    """The pipeline was killed: a worker process died (its lines can be run again)."""


def run_in_process_group(pipeline_args, files, shards: str, handler: TranslateHandler,
                         read_options=()):
    """Runs the pipeline of :func:`build` in a child process and its own process group
    (killed whole if this process is interrupted): a fork of this process where the
    bundles run in worker processes of their own (:func:`workers_elsewhere`: no TensorFlow
    and Beam imported again before the workers start), else a new Python process.

    Raises:
        WorkerLost: the pipeline was killed (a worker died).
        RuntimeError: it failed otherwise (its error is on stderr).
    """
    method = "fork" if workers_elsewhere(pipeline_args) else "spawn"
    process = multiprocessing.get_context(method).Process(
        target=_run_watched, args=(list(pipeline_args), files, shards, handler,
                                   tuple(read_options)))
    process.start()
    try:
        process.join()
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    if process.exitcode and process.exitcode < 0:
        raise WorkerLost(f"The pipeline was killed by signal {-process.exitcode}")
    if process.exitcode:
        raise RuntimeError(f"The pipeline exited with status {process.exitcode} (its error "
                           "is above)")


def translate_files(model, inputs, output, pipeline_args=(), batch_size=None,
                    max_batch_lines=None, retries=2, mode=None, input_format="auto",
                    tfrecord_feature="source", **options) -> int:
    """Runs `model` over every line of the files `inputs` (paths or globs,
    :func:`match_inputs`) on a Beam pipeline and writes `output`: by default one
    translation per input line, in order; another `mode` writes its own lines per input
    line (:mod:`tfxformer.beam.modes`). Returns the number of input lines.

    A pipeline that a dead worker ends (a worker killed: the DirectRunner does not run its
    bundle again; Dataflow gives up after 4 tries) is run again, up to `retries` times, for
    the lines whose values its finished shards lack; one that fails otherwise (a bad input
    line, a model that does not load) is not. Each run is a child process of its own
    process group (:func:`run_in_process_group`).

    Args:
        model: any model of this package (SavedModel, export dir, ensemble, run dir, preset
            dir, CTranslate2 dir) on a path every worker reads.
        pipeline_args: Beam's pipeline options as command-line flags ("--runner",
            "DataflowRunner", ...); none: the DirectRunner in one process.
        batch_size: sentences per model call (default: DecodingOptions').
        max_batch_lines: the lines of one inference call (default 16 batches).
        retries: runs after one a dead worker ended; the last failure is raised.
        mode: a mode of :mod:`tfxformer.beam.modes` (default: translations, with
            `options`, the loader's keyword arguments: :class:`TranslateHandler`).
        input_format: "auto" (TFRecord files by the extension .tfrecord or .tfrecords, text
            files otherwise), "text" or "tfrecord".
        tfrecord_feature: the bytes feature of each TFRecord record's tf.train.Example
            that holds its line.
    """
    paths = match_inputs(inputs)
    for path in paths:
        file_format(path, input_format)  # a bad format fails here, before any worker starts
    check_model(model)
    handler = TranslateHandler(model, batch_size or DecodingOptions().batch_size,
                               max_batch_lines, mode, **options)
    shards = output + SHARDS_SUFFIX
    _remove(shards)
    for attempt in range(retries + 1):
        counts, texts = read_shards(shards)
        missing, unread = missing_lines(counts, texts, len(paths))
        if attempt and not missing and not unread:
            break
        done = {}
        for index, number in texts:
            done.setdefault(index, []).append(number)
        rerun = sorted({*missing, *unread}) if attempt else range(len(paths))
        files = [(index, paths[index], done.get(index, [])) for index in rerun]
        try:
            run_in_process_group(pipeline_args, files, shards, handler,
                                 (input_format, tfrecord_feature))
        except WorkerLost as error:
            if attempt == retries:
                raise
            logging.warning("%s; running it again for the lines it did not translate.",
                            error)
    count = merge_shards(shards, len(paths), output, handler.mode)
    _remove(shards)
    return count
