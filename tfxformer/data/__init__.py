"""Data for translation (§5.1): sources, the shared BPE vocabulary, tf.data pipelines.

Typical use::

    corpus = load_corpus("../shared/data/multi30k", src="en", tgt="de")  # or "tfds:NAME/CONFIG"
    tokenizer = train_tokenizer(corpus.training_text(), vocab_size=8000, save_dir=run_dir)
    count_filtered(corpus.train.dataset(), tokenizer, max_length=256)     # logs the counts
    train = train_dataset(corpus.train.dataset(), tokenizer,
                          batch_tokens=TokenBudget(25_000, num_replicas=R).per_step,
                          num_replicas=R)
    val = eval_dataset(corpus.val.dataset(), tokenizer, with_text=False)

Or tokenize the training pairs once (`tfxformer.data.token_cache`; the same batches)::

    cache = token_cache.open_or_build(corpus.train, tokenizer, run_dir, max_length=256)
    train = train_dataset(None, tokenizer, token_cache=cache, batch_tokens=...,
                          num_replicas=R)
"""

from tfxformer.data.pipeline import (
    FilterStats,
    TokenBudget,
    bucket_plan,
    count_filtered,
    eval_dataset,
    make_examples,
    tokenize_pairs,
    train_dataset,
)
from tfxformer.data.sources import (
    Corpus,
    ParallelSplit,
    check_aligned,
    iter_lines,
    load_corpus,
    load_text_folder,
    load_tfds,
    load_wmt14,
)
from tfxformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    MODEL_FILENAME,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    keras_tokenizer,
    train_tokenizer,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MODEL_FILENAME",
    "PAD_ID",
    "UNK_ID",
    "Corpus",
    "FilterStats",
    "ParallelSplit",
    "TokenBudget",
    "Tokenizer",
    "bucket_plan",
    "check_aligned",
    "count_filtered",
    "eval_dataset",
    "iter_lines",
    "keras_tokenizer",
    "load_corpus",
    "load_text_folder",
    "load_tfds",
    "load_wmt14",
    "make_examples",
    "tokenize_pairs",
    "train_dataset",
    "train_tokenizer",
]
