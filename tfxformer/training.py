"""Training and evaluation (§5): data → vocabulary → model → distributed steps → checkpoints.

`train_and_evaluate(config)` is what `scripts/train_wmt.py` calls. A run directory holds
everything: `config.json` (the resolved configuration), `spm.model` (the shared
vocabulary), `checkpoints/ckpt-<step>`, `averaged/ckpt-<step>`, `logs/` (TensorBoard),
`train.log`. Running the same command again resumes from the latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import keras
import sacrebleu
import tensorflow as tf
from tqdm import tqdm

from tfxformer import checkpoints as ckpt
from tfxformer.config import get_preset
from tfxformer.data import pipeline, sources
from tfxformer.data.tokenizer import Tokenizer, train_tokenizer
from tfxformer.distribute import is_chief, make_strategy
from tfxformer.models.transformer import Transformer
from tfxformer.schedules import TransformerSchedule, paper_adam
from tfxformer.trainer import Trainer, learning_rate

log = logging.getLogger("tfxformer")

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run; defaults are the paper's base model on WMT14."""

    model_dir: str
    data: str = "wmt14"
    src: str = "en"
    tgt: str = "de"
    preset: str = "base"
    vocab_size: int = 37_000
    dropout: float | None = None  # None: the preset's
    max_length: int = 256
    batch_tokens: int = 25_000
    accumulation_steps: int = 1
    train_steps: int = 100_000
    warmup_steps: int = 4_000
    lr_scale: float = 1.0
    label_smoothing: float = 0.1
    checkpoint_every: int = 1_000
    keep_checkpoints: int = 20
    average_last: int = 5
    eval_every: int = 1_000
    eval_sentences: int = 500
    beam_size: int = 4
    alpha: float = 0.6
    log_every: int = 100
    cpu_devices: int | None = None
    precision: str = "fp32"
    xla: bool = False
    seed: int = 0
    shuffle_buffer: int = 100_000
    on_nonfinite: str = "skip"
    deterministic: bool = False
    export_dir: str | None = None
    tfds_data_dir: str | None = None
    tfds_manual_dir: str | None = None

    def validate(self):
        positive = ("vocab_size", "max_length", "batch_tokens", "accumulation_steps",
                    "train_steps", "warmup_steps", "checkpoint_every", "keep_checkpoints",
                    "log_every", "beam_size")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} not in {PRECISIONS}.")
        if self.on_nonfinite not in ("skip", "stop"):
            raise ValueError(f"on_nonfinite {self.on_nonfinite!r} not in ('skip', 'stop').")
        if self.average_last < 0 or self.eval_every < 0 or self.eval_sentences < 0:
            raise ValueError("average_last, eval_every and eval_sentences must be >= 0.")

    def model_kwargs(self) -> dict:
        overrides = {} if self.dropout is None else {"dropout": self.dropout}
        return get_preset(self.preset, vocab_size=self.vocab_size,
                          max_length=max(self.max_length, 1024), **overrides)


def set_precision(precision: str) -> None:
    """fp32, or mixed bfloat16 / float16 (LayerNorm, softmax and logits stay float32)."""
    policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision]
    keras.mixed_precision.set_global_policy(policy)


def _setup_logging(model_dir: str, chief: bool) -> None:
    log.setLevel(logging.INFO)
    log.propagate = False  # one line per message, whatever the root logger does
    if not any(isinstance(h, logging.StreamHandler) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    if chief:
        path = os.path.join(model_dir, "train.log")
        if not any(getattr(h, "baseFilename", None) == path for h in log.handlers):
            handler = logging.FileHandler(path, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            log.addHandler(handler)


def prepare_vocabulary(config: TrainConfig, corpus, chief: bool) -> Tokenizer:
    """Loads `spm.model` from the run dir, or trains it (chief) / waits for it (others)."""
    path = os.path.join(config.model_dir, "spm.model")
    if not os.path.exists(path):
        if chief:
            log.info("Training the shared %d-token SentencePiece BPE vocabulary on %s",
                     config.vocab_size, corpus.origin)
            train_tokenizer(corpus.training_text(), config.vocab_size,
                            save_dir=config.model_dir, seed=config.seed)
        else:
            _wait_for(path)
    tokenizer = ckpt.load_vocabulary(path)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{path} has {tokenizer.vocab_size} tokens but --vocab-size is "
            f"{config.vocab_size}; use a new --model-dir or the vocabulary's size.")
    return tokenizer


def _wait_for(path: str, timeout_s: float = 3600.0) -> None:
    start = time.time()
    while not os.path.exists(path):
        if time.time() - start > timeout_s:
            raise TimeoutError(f"Waited {timeout_s:.0f}s for the chief to write {path}.")
        time.sleep(2.0)


def build_training(config: TrainConfig, strategy):
    """Model, optimizer and Trainer under `strategy.scope()`."""
    with strategy.scope():
        model = Transformer(**config.model_kwargs())
        model.build()
        schedule = TransformerSchedule(model.model_config["d_model"], config.warmup_steps,
                                       config.lr_scale)
        optimizer = paper_adam(schedule)
        if config.precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    trainer = Trainer(model, optimizer, strategy, config.label_smoothing,
                      config.accumulation_steps, jit_compile=config.xla)
    return model, optimizer, trainer


def make_translate_fn(model, tokenizer: Tokenizer, beam_size: int, alpha: float):
    """A function list[str] -> list[str] translating with beam search in one graph."""
    from tfxformer.serving.translator import Translator

    translator = Translator(model, tokenizer.proto, beam_size=beam_size, alpha=alpha)

    def translate(lines: list[str]) -> list[str]:
        if not lines:
            return []
        out = translator(tf.constant(lines))["translation"].numpy()
        return [t.decode("utf-8") for t in out]
    return translate


def evaluate(trainer, tokenizer, split, strategy, sentences: int, translate_fn=None,
             batch_size: int = 64) -> dict:
    """Validation loss, perplexity (on `split`), and sacreBLEU on its first `sentences`."""
    data = pipeline.eval_dataset(split.dataset(), tokenizer, batch_size=batch_size,
                                 with_text=False)
    totals = [0.0, 0.0, 0.0]
    for batch in data:
        totals = [t + float(v) for t, v in zip(totals, trainer.eval_step(batch), strict=True)]
    smoothed, nll, tokens = totals
    result = {"val_loss": smoothed / max(tokens, 1.0), "val_nll": nll / max(tokens, 1.0)}
    if sentences and translate_fn is not None:
        src, ref = split.lists()
        src, ref = src[:sentences], ref[:sentences]
        hyps = []
        for i in range(0, len(src), batch_size):
            hyps += translate_fn(src[i:i + batch_size])
        result["val_bleu"] = sacrebleu.corpus_bleu(hyps, [ref]).score
    return result


def _write_config(config: TrainConfig, model_config: dict, chief: bool) -> None:
    """Writes config.json, or checks a resumed run against the one already there."""
    path = os.path.join(config.model_dir, "config.json")
    record = {"model": model_config, "src": config.src, "tgt": config.tgt,
              "max_length": config.max_length, "preset": config.preset,
              "train": dataclasses.asdict(config)}
    if os.path.exists(path):
        ckpt.check_compatible(path, record)
    elif chief:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
        os.replace(path + ".tmp", path)


def train_and_evaluate(config: TrainConfig) -> dict:
    """Runs (or resumes) training as `config` says; returns the last metrics."""
    config.validate()
    if config.deterministic:
        keras.utils.set_random_seed(config.seed)
        tf.config.experimental.enable_op_determinism()
    set_precision(config.precision)
    strategy = make_strategy(config.cpu_devices)
    chief = is_chief(strategy)
    os.makedirs(config.model_dir, exist_ok=True)
    _setup_logging(config.model_dir, chief)
    replicas = strategy.num_replicas_in_sync
    log.info("%d replicas in sync (%s)", replicas, type(strategy).__name__)

    corpus = sources.load_corpus(config.data, config.src, config.tgt,
                                 data_dir=config.tfds_data_dir,
                                 manual_dir=config.tfds_manual_dir)
    tokenizer = prepare_vocabulary(config, corpus, chief)
    model, optimizer, trainer = build_training(config, strategy)
    _write_config(config, model.model_config, chief)
    log.info("Model %s: %s parameters", config.preset, f"{model.count_params():,}")
    budget = pipeline.TokenBudget(config.batch_tokens * config.accumulation_steps, replicas,
                                  config.accumulation_steps)
    train_data = pipeline.train_dataset(
        corpus.train.dataset(), tokenizer, batch_tokens=budget.per_step,
        max_length=config.max_length, num_replicas=replicas,
        shuffle_buffer=config.shuffle_buffer, seed=config.seed)
    batches = iter(train_data)
    manager = ckpt.Manager(config.model_dir, model, optimizer, config.keep_checkpoints,
                           chief=chief, data_iterator=batches)
    step = manager.restore_latest()
    if step == 0 and chief:
        pipeline.count_filtered(corpus.train.dataset(), tokenizer, max_length=config.max_length)
    translate_fn = make_translate_fn(model, tokenizer, config.beam_size, config.alpha) \
        if config.eval_sentences else None
    writer = tf.summary.create_file_writer(os.path.join(config.model_dir, "logs")) \
        if chief else tf.summary.create_noop_writer()
    metrics = _train_loop(config, trainer, batches, manager, writer, step,
                          lambda: evaluate(trainer, tokenizer, corpus.val, strategy,
                                           config.eval_sentences, translate_fn))
    if config.average_last > 1 and chief:
        ckpt.average_checkpoints(config.model_dir, config.average_last)
    if config.export_dir and chief:
        from tfxformer.serving.export import export_run_dir

        path = export_run_dir(config.model_dir, config.export_dir, beam_size=config.beam_size,
                              alpha=config.alpha)
        log.info("Exported the translator to %s", path)
        metrics["export_path"] = path
    return metrics


def _train_loop(config, trainer, iterator, manager, writer, step, run_eval) -> dict:
    """Steps until `config.train_steps`, logging, evaluating and checkpointing."""
    metrics: dict = {}
    bar = tqdm(total=config.train_steps, initial=step, unit="step", dynamic_ncols=True,
               disable=None)
    window_tokens, window_start, window_loss, window_steps = 0.0, time.time(), 0.0, 0
    while step < config.train_steps:
        result = trainer.train_step(iterator)
        if not result["finite"]:
            message = (f"Non-finite loss or gradient at step {step + 1} "
                       f"(loss {result['loss']}); the update was skipped")
            if config.on_nonfinite == "stop":
                raise FloatingPointError(message + f"; stopping. The last good checkpoint "
                                         f"is kept in {manager.directory}.")
            log.warning(message + ".")
            continue
        step += 1
        bar.update(1)
        window_tokens += result["tokens"]
        window_loss += result["loss"]
        window_steps += 1
        if step % config.log_every == 0 or step == config.train_steps:
            elapsed = max(time.time() - window_start, 1e-9)
            metrics = {"loss": window_loss / window_steps, "lr": learning_rate(trainer.optimizer),
                       "tokens_per_second": window_tokens / elapsed}
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", lr=f"{metrics['lr']:.2e}",
                            tok_s=f"{metrics['tokens_per_second']:.0f}")
            log.info("step %d loss %.4f lr %.3e target tokens/s %.0f", step, metrics["loss"],
                     metrics["lr"], metrics["tokens_per_second"])
            _summaries(writer, step, metrics)
            window_tokens, window_start, window_loss, window_steps = 0.0, time.time(), 0.0, 0
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


def _summaries(writer, step, values: dict) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.scalar(name, value)
    writer.flush()
