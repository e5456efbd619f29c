"""Training and evaluation (§5): data → vocabulary → model → distributed steps → checkpoints.

`train_and_evaluate(config)` is what `scripts/train_wmt.py` calls. It writes a run
directory (:mod:`tfxformer.rundir`: `config.json`, `spm.model`, `checkpoints/`,
`averaged/`, `logs/`, `train.log`); running the same command again resumes from the latest
checkpoint its state file names.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import keras
import sacrebleu
import tensorflow as tf
from tqdm import tqdm

from tfxformer import checkpoints as ckpt
from tfxformer import multilingual, precision, pretrained, rundir
from tfxformer.config import PRECISION_POLICIES, ModelConfig
from tfxformer.data import pipeline, sources, token_cache
from tfxformer.data.sampling import SubwordSampler
from tfxformer.data.tokenizer import Tokenizer, load_vocabulary, train_tokenizer
from tfxformer.distribute import (
    LOST_WORKER_ERRORS,
    barrier,
    is_chief,
    is_multi_worker,
    lost_worker_reason,
    make_strategy,
)
from tfxformer.models.transformer import Transformer
from tfxformer.schedules import TransformerSchedule, paper_adam
from tfxformer.serving.loading import make_translate_fn
from tfxformer.train_config import (  # noqa: F401 (the names callers import from here)
    ON_NONFINITE,
    PRECISIONS,
    TrainConfig,
    setting,
    settings_as_flags,
)
from tfxformer.trainer import Trainer, learning_rate

log = logging.getLogger("tfxformer")

# With --on-nonfinite skip, this many non-finite updates in a row stop training: the run
# is diverging, and skipping forever would look like progress that never comes.
__all__ = ["TrainConfig", "WorkerLostError", "train_and_evaluate", "training_dataset"]

MAX_CONSECUTIVE_NONFINITE = 50


class WorkerLostError(RuntimeError):
    """A worker of a multi-worker run died or became unreachable: restart every worker."""


def set_precision(name: str) -> None:
    """fp32, or mixed bfloat16 / float16 (LayerNorm, softmax and logits stay float32)."""
    keras.mixed_precision.set_global_policy(PRECISION_POLICIES[name])


def resolve_precision(config: TrainConfig) -> tuple[TrainConfig, str]:
    """`config` with `precision` auto resolved (:func:`tfxformer.precision.resolve`: for
    this machine, or as the run dir's config.json records it), and the reason."""
    recorded = None
    if os.path.exists(os.path.join(config.model_dir, rundir.CONFIG_FILENAME)):
        train = rundir.read_config(config.model_dir).get("train")
        recorded = train.get("precision") if isinstance(train, dict) else None
    name, reason = precision.resolve(config.precision, recorded)
    return dataclasses.replace(config, precision=name), reason


def _setup_logging(model_dir: str | None) -> None:
    """INFO to stderr, and with `model_dir` (the chief's) to `model_dir/train.log`."""
    log.setLevel(logging.INFO)
    log.propagate = False  # one line per message, whatever the root logger does
    for handler in [h for h in log.handlers if getattr(h, "tfxformer_run", False)]:
        log.removeHandler(handler)  # an earlier run's, in the same process
        handler.close()
    handlers = [logging.StreamHandler()]  # today's sys.stderr
    if model_dir:
        handlers.append(logging.FileHandler(os.path.join(model_dir, rundir.TRAIN_LOG),
                                            encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.tfxformer_run = True
        log.addHandler(handler)


def prepare_vocabulary(config: TrainConfig, corpus, strategy, chief: bool) -> Tokenizer:
    """Loads `spm.model` from the run dir, or trains it (chief) while the others wait."""
    path = os.path.join(config.model_dir, rundir.SPM_FILENAME)
    if chief and not os.path.exists(path) and config.init_from:
        rundir.write_atomically(path, pretrained.fine_tune_vocabulary(config))
        log.info("Took the vocabulary of %s (`init_from`)", config.init_from)
    elif chief and not os.path.exists(path):
        log.info("Training the shared %d-token SentencePiece BPE vocabulary on %s",
                 config.vocab_size, corpus.origin)
        tags = [multilingual.target_tag(language) for language in config.languages()]
        trained = train_tokenizer(corpus.training_text(), config.vocab_size, seed=config.seed,
                                  user_defined_symbols=tags)
        rundir.write_atomically(path, trained.spm_bytes)  # never half a vocabulary
        log.info("Saved the vocabulary to %s", path)
    barrier(strategy)  # the other workers read the chief's file
    if not os.path.exists(path) and not chief:
        raise FileNotFoundError(f"{path} does not exist after the chief wrote it: every "
                                "worker needs the same `model_dir` (a shared filesystem).")
    tokenizer = load_vocabulary(path)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{path} has {tokenizer.vocab_size} tokens but `vocab_size` is "
            f"{config.vocab_size}; use a new `model_dir` or the vocabulary's size.")
    for language in config.languages():
        try:
            multilingual.tag_pieces(tokenizer.spm_bytes, language)
        except ValueError as error:
            raise ValueError(f"{path}: {error} Use a new `model_dir`.") from None
    return tokenizer


def build_training(config: TrainConfig, strategy, nonfinite_fault_steps=()):
    """Model, optimizer and Trainer under `strategy.scope()`."""
    with strategy.scope():
        model = Transformer(config.model_config())
        model.build()
        if config.init_from:  # a resumed run's own checkpoint is restored over these
            pretrained.load_initial_weights(model, config)
        schedule = TransformerSchedule(model.model_config.d_model, config.warmup_steps,
                                       config.lr_scale)
        optimizer = paper_adam(schedule)
        if config.precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    halt = 1 if config.on_nonfinite == "stop" else MAX_CONSECUTIVE_NONFINITE
    trainer = Trainer(model, optimizer, strategy, config.label_smoothing,
                      config.accumulation_steps, jit_compile=config.xla,
                      halt_after_nonfinite=halt, nonfinite_fault_steps=nonfinite_fault_steps,
                      r_drop=config.r_drop,
                      alignment_weight=config.guided_alignment_weight
                      if config.guided_alignment else 0.0)
    return model, optimizer, trainer


def evaluate(trainer, tokenizer, split, strategy, sentences: int, translate_fn=None,
             batch_size: int = 64, reverse_target: bool = False) -> dict:
    """Validation loss, perplexity (on `split`; a right-to-left model's on reversed
    targets, `reverse_target`), and sacreBLEU on its first `sentences` translated by
    `translate_fn` (:func:`tfxformer.serving.make_translate_fn`, which puts a
    right-to-left model's pieces back in order)."""
    data = pipeline.eval_dataset(split.dataset(), tokenizer, batch_size=batch_size,
                                 with_text=False, reverse_target=reverse_target)
    totals = [0.0, 0.0, 0.0]
    for batch in data:
        totals = [t + float(v) for t, v in zip(totals, trainer.eval_step(batch), strict=True)]
    smoothed, nll, tokens = totals
    result = {"val_loss": smoothed / max(tokens, 1.0), "val_nll": nll / max(tokens, 1.0)}
    if sentences and translate_fn is not None:
        src, ref = split.lists()
        hyps = translate_fn(src[:sentences])
        result["val_bleu"] = sacrebleu.corpus_bleu(hyps, [ref[:sentences]]).score
    return result


def _write_config(config: TrainConfig, model_config: ModelConfig, chief: bool,
                  tokenizer: Tokenizer) -> None:
    """Writes config.json, or checks a resumed run against the one already there."""
    record = rundir.make_record(model_config, config.src, config.tgt, config.max_length,
                                config.preset, tokenizer.spm_bytes,
                                dataclasses.asdict(config))
    if config.init_from:
        record["init_from"] = pretrained.init_record(config, tokenizer.spm_bytes)
    if os.path.exists(os.path.join(config.model_dir, rundir.CONFIG_FILENAME)):
        rundir.check_compatible(config.model_dir, record)
    elif chief:
        rundir.write_config(config.model_dir, record)


def _data_settings(config: TrainConfig, replicas: int, cache=None) -> dict:
    """The settings that shape the training pipeline (and so its checkpointed position).

    With the token cache, also its content key: a position in one cache's pairs is not one
    in another's (and the cache's pipeline is not the on-the-fly one), but it is one in a
    rebuild of the same ids (a corpus copied afresh). Without it, the settings are those of
    runs made before the cache existed, which resume as they did.
    """
    names = ("batch_tokens", "accumulation_steps", "max_length", "shuffle_buffer", "seed")
    settings = dict({name: getattr(config, name) for name in names}, replicas=replicas)
    if cache is not None:
        settings["token_cache"] = cache.content_key
    if config.subword_sampling:  # only when on: runs without it resume as they did
        settings["subword_sampling"] = config.subword_sampling
    if config.reverse_target:  # likewise
        settings["reverse_target"] = True
    if config.guided_alignment:  # likewise: its batches carry the links
        settings["guided_alignment"] = True
    return settings


def check_splits(config: TrainConfig, corpus) -> None:
    """Empty training data, or empty validation data to evaluate on, is an error."""
    if corpus.train.num_examples == 0:
        raise ValueError(f"The training split {corpus.train.origin} is empty.")
    if config.eval_every and corpus.val.num_examples == 0:
        raise ValueError(f"The validation split {corpus.val.origin} is empty; give it pairs, "
                         "or set `eval_every` 0 to train without evaluation.")


def check_training_pairs(config: TrainConfig, corpus, tokenizer: Tokenizer,
                         stats: pipeline.FilterStats | None = None) -> None:
    """Counts what the length filter keeps (or logs `stats`, the token cache's counts);
    none kept would make tf.data spin forever."""
    if stats is None:
        stats = pipeline.count_filtered(corpus.train.dataset(), tokenizer,
                                        max_length=config.max_length)
    else:
        log.info("Data filter: %s", stats)
    if stats.kept == 0:
        raise ValueError(f"No training pair of {corpus.train.origin} is usable: {stats}. "
                         "Pairs need a non-empty source and target of at most `max_length` "
                         f"{config.max_length} tokens each (BOS/EOS included).")


def prepare_token_cache(config: TrainConfig, corpus, tokenizer: Tokenizer, strategy,
                        chief: bool) -> token_cache.TokenCache | None:
    """The run dir's token cache of the training split: opened, or built by the chief
    while the others wait (then they read the chief's); None without `token_cache`, or
    when the split's files are unknown (then training tokenizes on the fly)."""
    if not config.token_cache:
        return None
    if config.guided_alignment:
        log.info("Token cache: not used with `guided_alignment`: the pairs are read with "
                 "their word links and tokenized on the fly.")
        return None
    if config.subword_sampling:
        log.info("Token cache: not used with `subword_sampling` %g: each read of a training "
                 "pair samples a new segmentation of its text, so training tokenizes on the "
                 "fly.", config.subword_sampling)
        return None
    if not corpus.train.files:
        log.warning("No token cache: the files of %s are unknown, so a cache could not tell "
                    "when they change; tokenizing on every epoch.", corpus.train.origin)
        return None
    options = dict(max_length=config.max_length)
    cache = token_cache.open_or_build(corpus.train, tokenizer, config.model_dir, **options) \
        if chief else None
    barrier(strategy)  # the other workers read the chief's cache
    if not chief:
        cache = token_cache.open_cache(corpus.train, tokenizer, config.model_dir, **options)
        if cache is None:
            raise FileNotFoundError(
                f"No token cache of {corpus.train.origin} in "
                f"{os.path.join(config.model_dir, token_cache.CACHE_DIRNAME)} after the chief "
                "built it: every worker needs the same `model_dir` and `data` files (a "
                "shared filesystem), or turn `token_cache` off.")
    return cache


def training_dataset(config: TrainConfig, corpus, tokenizer: Tokenizer, replicas: int,
                     cache: token_cache.TokenCache | None = None):
    """The training batches of `config` over `replicas`: from `cache`, else tokenized on
    the fly (the same batches either way); with `subword_sampling`, tokenized on the fly
    by BPE-dropout sampling (:class:`tfxformer.data.sampling.SubwordSampler`, seeded by
    `seed`)."""
    budget = pipeline.TokenBudget(config.batch_tokens * config.accumulation_steps, replicas,
                                  config.accumulation_steps)
    options = dict(batch_tokens=budget.per_step, max_length=config.max_length,
                   num_replicas=replicas, shuffle_buffer=config.shuffle_buffer,
                   seed=config.seed, reverse_target=config.reverse_target)
    if cache is not None:
        return pipeline.train_dataset(None, tokenizer, token_cache=cache, **options)
    if config.guided_alignment:
        options["word_links"] = word_links(config, corpus.train)
    if config.subword_sampling:
        options["sampler"] = SubwordSampler(tokenizer.spm_bytes, config.subword_sampling,
                                            config.seed)
        log.info("Subword sampling: BPE-dropout of the training pairs, merge-dropout "
                 "probability %g, seed %d; validation and export unsampled.",
                 config.subword_sampling, config.seed)
    return pipeline.train_dataset(corpus.train.dataset(), tokenizer, **options)


def word_links(config: TrainConfig, split) -> tf.data.Dataset:
    """The Pharaoh lines of `guided_alignment`, one per pair of the training `split`
    (checked: as many lines as pairs, where the split's size is known)."""
    path = config.guided_alignment
    compression = "GZIP" if path.endswith(".gz") else ""
    lines = tf.data.TextLineDataset(path, compression_type=compression)
    if split.num_examples is not None:
        count = int(lines.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        if count != split.num_examples:
            raise ValueError(f"`guided_alignment` {path!r} has {count:,} lines, the training "
                             f"split {split.origin} {split.num_examples:,} pairs: give one "
                             "Pharaoh line per training pair, in their order.")
    log.info("Guided alignment: word links of %s, weight %g, on the first head of the "
             "model's alignment layer.", path, config.guided_alignment_weight)
    return lines


def train_and_evaluate(config: TrainConfig, *, kill_at_save_step: int | None = None,
                       nonfinite_fault_steps=()) -> dict:
    """Runs (or resumes) training as `config` says; returns the last metrics.

    Fault injection for tests (scripts/train_wmt.py sets both from the environment):
    `kill_at_save_step` (:class:`tfxformer.checkpoints.Manager`) and `nonfinite_fault_steps`,
    update numbers whose first attempt gets a NaN loss. Errors name settings in backticks
    (`max_length`); :func:`settings_as_flags` spells them as flags.

    Raises:
        ValueError, FileNotFoundError: bad settings, data, vocabulary, config.json or
            checkpoint (the message names the file and what is accepted).
        FloatingPointError: non-finite loss or gradient with --on-nonfinite stop (or too
            many in a row with skip).
        WorkerLostError: another worker of a multi-worker run died or became unreachable.
    """
    config.validate()
    config = pretrained.fine_tune_config(config)  # the model settings of `init_from`
    config, precision_reason = resolve_precision(config)  # config.json records the result
    if config.deterministic:
        keras.utils.set_random_seed(config.seed)
        tf.config.experimental.enable_op_determinism()
    set_precision(config.precision)
    _setup_logging(None)
    strategy = make_strategy(config.cpu_devices)
    chief = is_chief(strategy)
    os.makedirs(config.model_dir, exist_ok=True)
    _setup_logging(config.model_dir if chief else None)
    log.info("%d replicas in sync (%s)", strategy.num_replicas_in_sync, type(strategy).__name__)
    log.info("Precision %s: %s", config.precision, precision_reason)
    try:
        return _run(config, strategy, chief, kill_at_save_step, nonfinite_fault_steps)
    except LOST_WORKER_ERRORS as error:
        if not is_multi_worker(strategy):
            raise
        raise WorkerLostError(
            f"Lost contact with another worker of this multi-worker run "
            f"({lost_worker_reason(error)}); a worker that stopped with an error says why in "
            "its own log. Restart every worker with the same command; they resume from the "
            "last checkpoint: "
            f"{ckpt.describe_last_checkpoint(config.model_dir)}.") from error


def _run(config: TrainConfig, strategy, chief: bool, kill_at_save_step=None,
         nonfinite_fault_steps=()) -> dict:
    corpus = sources.load_corpus(config.data, config.src, config.tgt,
                                 data_dir=config.tfds_data_dir,
                                 manual_dir=config.tfds_manual_dir,
                                 train_split=config.tfds_train_split,
                                 val_split=config.tfds_val_split)
    check_splits(config, corpus)
    if config.languages():
        for split in (corpus.train, corpus.val):
            multilingual.check_tagged((source for source, _ in split.pairs()),
                                      config.languages(), f"the {split.name} sources "
                                      f"({split.origin})")
    tokenizer = prepare_vocabulary(config, corpus, strategy, chief)
    model, optimizer, trainer = build_training(config, strategy, nonfinite_fault_steps)
    _write_config(config, model.model_config, chief, tokenizer)
    log.info("Model %s: %s parameters", config.preset, f"{model.count_params():,}")
    replicas = strategy.num_replicas_in_sync
    cache = prepare_token_cache(config, corpus, tokenizer, strategy, chief)
    if cache is not None:  # counted when it was built: free, so checked at every start
        check_training_pairs(config, corpus, tokenizer, cache.stats)
    batches = iter(training_dataset(config, corpus, tokenizer, replicas, cache))
    manager = ckpt.Manager(config.model_dir, model, optimizer, config.keep_checkpoints,
                           chief=chief, data_iterator=batches,
                           data_settings=_data_settings(config, replicas, cache),
                           kill_at_save_step=kill_at_save_step)
    step = manager.restore_latest()
    if step == 0 and cache is None:  # every worker: one that found nothing would spin forever
        check_training_pairs(config, corpus, tokenizer)
    translate_fn = make_translate_fn(model, tokenizer.spm_bytes, config.beam_size,
                                     config.alpha, reverse_target=config.reverse_target) \
        if config.eval_sentences else None
    writer = tf.summary.create_file_writer(os.path.join(config.model_dir, rundir.LOGS)) \
        if chief else tf.summary.create_noop_writer()
    metrics = train_loop(config, trainer, batches, manager, writer, step,
                          lambda: evaluate(trainer, tokenizer, corpus.val, strategy,
                                           config.eval_sentences, translate_fn,
                                           reverse_target=config.reverse_target))
    if config.average_last > 1 and chief:
        ckpt.average_checkpoints(config.model_dir, config.average_last)
    if config.export_dir and chief:
        from tfxformer.serving.export import export_run_dir

        path = export_run_dir(config.model_dir, config.export_dir, beam_size=config.beam_size,
                              alpha=config.alpha)
        log.info("Exported the translator to %s", path)
        metrics["export_path"] = path
    return metrics


def _on_nonfinite(config: TrainConfig, step: int, loss: float, in_a_row: int) -> None:
    """Logs a skipped update, or raises FloatingPointError naming the step."""
    message = f"Non-finite loss or gradient at step {step} (loss {loss}); the update was " \
              "not applied"
    if config.on_nonfinite == "skip" and in_a_row < MAX_CONSECUTIVE_NONFINITE:
        log.warning("%s: skipped (--on-nonfinite skip).", message)
        return
    why = "--on-nonfinite stop" if config.on_nonfinite == "stop" else \
        f"{in_a_row} non-finite updates in a row"
    raise FloatingPointError(f"{message}; stopping ({why}). The last good checkpoint is "
                             f"kept: {ckpt.describe_last_checkpoint(config.model_dir)}.")


def _next_sync(config: TrainConfig, step: int) -> int:
    """The next update number at which the loop logs, checkpoints, evaluates or ends."""
    every = [config.log_every, config.checkpoint_every] + \
        ([config.eval_every] if config.eval_every else [])
    return min([config.train_steps] + [(step // n + 1) * n for n in every])


def train_loop(config, trainer, iterator, manager, writer, step, run_eval) -> dict:
    """Steps until `config.train_steps`, logging, evaluating and checkpointing.

    The device runs the updates up to the next sync point (log, checkpoint, evaluation or
    end) without the host reading anything, `config.steps_per_loop` of them per
    `tf.function` call (:class:`tfxformer.trainer.UpdateLoop`); the call before a sync point
    is shortened to end on it, so intervals need not be multiples of `steps_per_loop`.
    At the sync point the results of all of them are read at once. A non-finite update is
    not applied (on the device) and is named in the log when read; the missing updates
    are run before the sync point. With --on-nonfinite stop (or too many in a row) the
    device applies nothing after it, and the loop raises at the sync point, before any
    checkpoint is written.
    """
    metrics: dict = {}
    bar = tqdm(total=config.train_steps, initial=step, unit="step", dynamic_ncols=True,
               disable=None)
    window, updates, in_a_row = _Window(), trainer.loop(iterator), 0
    while step < config.train_steps:
        target = _next_sync(config, step)
        results = []
        for start in range(step, target, config.steps_per_loop):
            results.append(updates(min(config.steps_per_loop, target - start)))
        for update, loss, tokens, applied in _read(results):
            if not applied:
                in_a_row += 1
                _on_nonfinite(config, update, loss, in_a_row)
                continue
            step, in_a_row = step + 1, 0
            window.add(loss, tokens)
        bar.update(step - bar.n)
        if step < target:  # skipped updates: run the missing ones before the sync point
            continue
        if step % config.log_every == 0 or step == config.train_steps:
            metrics = window.report(step, trainer.optimizer, bar, writer)
        if step % config.checkpoint_every == 0 or step == config.train_steps:
            manager.save(step)
        if config.eval_every and (step % config.eval_every == 0 or step == config.train_steps):
            evaluation = run_eval()
            metrics.update(evaluation)
            log.info("step %d %s", step, " ".join(f"{k} {v:.4f}" for k, v in evaluation.items()))
            _summaries(writer, step, evaluation)
    bar.close()
    metrics["step"] = step
    return metrics


def _read(results: list[dict]) -> list[tuple[int, float, float, bool]]:
    """(update number, loss, tokens, applied) of each attempt of `results` (UpdateLoop
    records), in one device-to-host read."""
    if not results:
        return []
    rows = tf.concat(results, axis=0).numpy().tolist()
    return [(int(update), loss, tokens, bool(applied))
            for update, loss, tokens, applied in rows]


class _Window:
    """Loss and throughput since the last log line."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tokens, self.loss, self.steps, self.start = 0.0, 0.0, 0, time.time()

    def add(self, loss: float, tokens: float) -> None:
        self.tokens += tokens
        self.loss += loss
        self.steps += 1

    def report(self, step, optimizer, bar, writer) -> dict:
        elapsed = max(time.time() - self.start, 1e-9)
        metrics = {"loss": self.loss / max(self.steps, 1), "lr": learning_rate(optimizer),
                   "tokens_per_second": self.tokens / elapsed}
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", lr=f"{metrics['lr']:.2e}",
                        tok_s=f"{metrics['tokens_per_second']:.0f}")
        log.info("step %d loss %.4f lr %.3e target tokens/s %.0f", step, metrics["loss"],
                 metrics["lr"], metrics["tokens_per_second"])
        _summaries(writer, step, metrics)
        self.reset()
        return metrics


def _summaries(writer, step, values: dict) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.scalar(name, value)
    writer.flush()
