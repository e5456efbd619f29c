"""The input files' lines: text lines, or one bytes feature of each tf.train.Example of a
TFRecord file; files compressed by name (.gz, .bz2, .zst, ...) are read decompressed.

A TFRecord file is read by its records' length fields (the format of
`tf.io.TFRecordWriter`: a little-endian uint64 length, its masked CRC-32C, the data, the
data's CRC-32C); the CRCs are not checked, a record cut short is an error.
"""

from __future__ import annotations

import struct

FORMATS = ("auto", "text", "tfrecord")
TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords")
_COMPRESSIONS = (".gz", ".bz2", ".zst", ".deflate", ".lzma", ".xz", ".snappy")


def file_format(path: str, given: str = "auto") -> str:
    """"tfrecord" for a path ending in .tfrecord or .tfrecords (before a compression
    extension) where `given` is "auto", else `given`'s "text" or "tfrecord"."""
    if given not in FORMATS:
        raise ValueError(f"Input format {given!r}: expected one of {', '.join(FORMATS)}.")
    if given != "auto":
        return given
    name = path.lower()
    for extension in _COMPRESSIONS:
        name = name.removesuffix(extension)
    return "tfrecord" if name.endswith(TFRECORD_EXTENSIONS) else "text"


def text_lines(f):
    """Each line of the binary file `f` without its line end (CR LF or LF)."""
    for line in iter(f.readline, b""):
        yield line.rstrip(b"\r\n")


def tfrecords(f, name: str = "the file"):
    """Each record (bytes) of the TFRecord file `f`, opened binary (`name` for errors)."""
    number = 0
    while header := f.read(12):
        if len(header) < 12:
            raise ValueError(f"{name}: record {number} is cut short (a {len(header)}-byte "
                             "header); is it a TFRecord file?")
        (length,) = struct.unpack("<Q", header[:8])
        data = f.read(length + 4)
        if len(data) < length + 4:
            raise ValueError(f"{name}: record {number} is cut short ({len(data)} of "
                             f"{length + 4} bytes); is it a TFRecord file?")
        yield data[:length]
        number += 1


def example_feature(record: bytes, feature: str, where: str) -> bytes:
    """The one value of the bytes feature `feature` of the serialized tf.train.Example
    `record` (`where`: the file and record number, for errors)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example.example_pb2 import Example

    try:
        features = Example.FromString(record).features.feature
    except DecodeError as error:
        raise ValueError(f"{where}: not a tf.train.Example ({error})") from None
    if feature not in features:
        raise ValueError(f"{where}: no feature {feature!r}; it has "
                         f"{', '.join(sorted(features)) or 'none'} (--tfrecord-feature)")
    values = features[feature].bytes_list.value
    if len(values) != 1:
        raise ValueError(f"{where}: feature {feature!r} holds {len(values)} byte strings; "
                         "one sentence per record is read (a bytes feature of one value)")
    return values[0]


def read_lines(f, path: str, form: str, feature: str = "source"):
    """The lines of the opened file `f` at `path`: text lines, or the feature `feature`
    of each record where `form` is "tfrecord"."""
    if form == "text":
        yield from text_lines(f)
        return
    for number, record in enumerate(tfrecords(f, path)):
        yield example_feature(record, feature, f"{path} record {number}")
