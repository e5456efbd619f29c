"""What the TFDS tests share (test_data_tfds_source.py, test_training.py): the metadata of
a prepared TFDS dataset, which `tfds.testing.mock_data` serves."""

import os

import tensorflow_datasets as tfds


def tfds_metadata(data_dir, name: str, splits: dict[str, int]) -> str:
    """Writes the metadata of TFDS dataset `name` with `splits` ({split: examples}) into
    `data_dir`, as preparing it would (no records); `tfds.testing.mock_data(data_dir=...)`
    then serves those splits. Returns `data_dir`."""
    builder = tfds.builder(name, data_dir=str(data_dir))
    builder.info.set_splits(tfds.core.SplitDict([
        tfds.core.SplitInfo(name=split, shard_lengths=[n], num_bytes=0, filename_template=None)
        for split, n in splits.items()]))
    os.makedirs(builder.data_dir, exist_ok=True)
    builder.info.write_to_directory(builder.data_dir)
    return str(data_dir)
