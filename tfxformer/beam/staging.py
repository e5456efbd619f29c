"""A model on any of Beam's file systems (gs://, hdfs://, s3://, ...) copied to the worker.

The loaders of this package read a model directory with local file calls; a worker of a
cluster gets the model from a path every worker reads: a local path (a shared disk, or one
baked into the worker image) is used as it is, any other is copied once per worker to its
temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from apache_beam.io.filesystems import FileSystems

COMPLETE = ".staged"  # written last: a copy without it was cut short and is made again


def is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def stage_model(path: str) -> str:
    """`path` itself if it is local, else a local copy of the directory at `path` (made
    once per machine, reused by the worker processes that come after)."""
    if is_local(path):
        return path
    root = path.rstrip("/")
    local = os.path.join(tempfile.gettempdir(), "tfxformer-models",
                         hashlib.sha256(root.encode()).hexdigest()[:16])
    if os.path.isfile(os.path.join(local, COMPLETE)):
        return local
    matches = FileSystems.match([root + "/**"])[0].metadata_list
    if not matches:
        raise FileNotFoundError(f"Model {path!r}: no files under it (Beam's file systems "
                                "read gs://, hdfs://, s3:// where their extras are installed).")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    partial = tempfile.mkdtemp(prefix="staging-", dir=os.path.dirname(local))
    for metadata in matches:
        relative = metadata.path[len(root) + 1:]
        target = os.path.join(partial, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with FileSystems.open(metadata.path, compression_type="uncompressed") as source, \
                open(target, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
    open(os.path.join(partial, COMPLETE), "wb").close()
    try:
        os.rename(partial, local)
    except OSError:  # another worker process staged it first
        shutil.rmtree(partial, ignore_errors=True)
    return local
