"""Every setting of a training run (`TrainConfig`), its command-line help and its checks.

scripts/train_wmt.py makes one flag per field (`max_length` is `--max-length`), typed by
the field's annotation (`typing.get_type_hints`), with the field's `metadata["help"]` and
`metadata["choices"]`. Library errors and help name settings in backticks;
:func:`settings_as_flags` spells them as flags for the script.
"""

from __future__ import annotations

import dataclasses
import os
import re

from tfxformer import checks, multilingual
from tfxformer.config import PRECISION_POLICIES, PRESETS, DecodingOptions, ModelConfig, get_preset
from tfxformer.data.sampling import check_alpha
from tfxformer.precision import AUTO as AUTO_PRECISION

__all__ = ["TrainConfig", "setting", "settings_as_flags"]

PRECISIONS = tuple(PRECISION_POLICIES)
_DECODING = DecodingOptions()
ON_NONFINITE = ("skip", "stop")


def _setting(default=dataclasses.MISSING, help="", choices=None):
    """A TrainConfig field with its command-line help (and choices) as metadata."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a training run; defaults are the paper's base model on WMT14.

    Each field's `metadata["help"]` is its documentation (and the `--help` text of
    scripts/train_wmt.py, which makes one flag per field: max_length is --max-length);
    settings named in help and errors are in backticks (:func:`settings_as_flags`).
    """

    model_dir: str = _setting(
        help="run directory: config.json, spm.model, checkpoints/, logs/ (TensorBoard), "
             "train.log. Rerunning with the same directory resumes from its latest "
             "checkpoint")
    data: str = _setting("wmt14", "'wmt14' (tensorflow-datasets wmt14_translate/de-en), "
                         "'tfds:NAME[/CONFIG]' (any tensorflow-datasets translation dataset, "
                         "e.g. tfds:wmt14_translate/fr-en, tfds:ted_hrlr_translate/pt_to_en) "
                         "or a folder with train.SRC/train.TGT and val.SRC/val.TGT text files "
                         "(.gz accepted)")
    src: str | None = _setting(
        None, "source language code (file suffix; for tensorflow-datasets, one of the "
              "dataset's languages) (default: en; with `init_from`, the source model's)")
    tgt: str | None = _setting(
        None, "target language code (file suffix; for tensorflow-datasets, one of the "
              "dataset's languages) (default: de; with `init_from`, the source model's)")
    preset: str = _setting("base", "model preset (base and big are the paper's Table 3)",
                           choices=tuple(PRESETS))
    vocab_size: int = _setting(ModelConfig().vocab_size, "shared SentencePiece BPE "
                               "vocabulary size (paper: about 37000 for EN-DE)")
    dropout: float | None = _setting(None, "override the preset's dropout P_drop (paper: 0.1 "
                                     "base, 0.3 big; default: the preset's)")
    attention_dropout: float | None = _setting(
        None, "dropout on the attention weights (tensor2tensor's attention_dropout; not in "
              "the paper; default: the preset's, 0)")
    activation_dropout: float | None = _setting(
        None, "dropout on the feed-forward's inner activations (tensor2tensor's "
              "relu_dropout; not in the paper; default: the preset's, 0)")
    max_length: int = _setting(256, "training length filter: drop training pairs longer than "
                               "this many tokens (either side, BOS/EOS included)")
    max_positions: int | None = _setting(
        None, "size of the model's position table, the longest source or output it can "
              "take (default: the preset's, 1024, or `max_length` if larger, so that "
              "translation can run past the training length)")
    batch_tokens: int = _setting(25_000, "padded tokens per side in one global step, over all "
                                 "replicas (paper: 25000 source + 25000 target)")
    accumulation_steps: int = _setting(1, "global steps whose gradients make one update "
                                       "(reach a token budget larger than memory allows)")
    steps_per_loop: int = _setting(
        8, "updates run inside one tf.function call (batches read in the graph, metrics "
           "kept on the device until the next log, checkpoint or evaluation); a call that "
           "would pass one of those is shortened to end there. Keras' `steps_per_execution` "
           "for model.fit")
    train_steps: int = _setting(100_000, "number of updates (paper: 100000 base, 300000 big)")
    warmup_steps: int = _setting(4_000, "linear warmup of the learning rate (paper: 4000)")
    lr_scale: float = _setting(1.0, "factor on the paper's learning-rate schedule")
    label_smoothing: float = _setting(0.1, "label smoothing epsilon (paper: 0.1)")
    r_drop: float = _setting(0.0, "R-Drop alpha (Liang et al., 2021; not in the paper): each "
                             "batch runs through the model twice with independent dropout "
                             "and the loss adds alpha times their symmetric KL divergence. "
                             "Twice the compute per update; 0 = off")
    subword_sampling: float = _setting(
        0.0, "subword regularisation (BPE-dropout, Provilkov et al., 2020; not in the "
             "paper): every read of a training pair segments it anew by SentencePiece "
             "sampling, each BPE merge skipped with this probability (theirs: 0.1); "
             "validation, BLEU and the export segment deterministically. Seeded by `seed` "
             "and the pair's place in the data stream (reproducible, exact on resume). "
             "Needs the text, so the token cache is not used; 0 = off")
    reverse_target: bool = _setting(
        False, "train a right-to-left model (not in the paper): each target's pieces are "
               "reversed before BOS/EOS are added, so the decoder writes the sentence from "
               "its last piece to its first. The run record keeps the setting, and every tool "
               "that reads the model follows it: validation BLEU, translation and the export "
               "put the pieces back in order before detokenizing, and scoring reverses the "
               "given target's pieces (a reranker's right-to-left score, docs/reranking.md)")
    guided_alignment: str | None = _setting(
        None, "guided alignment (Garg et al., 2019; not in the paper): a file of word "
              "alignments of the training pairs, one Pharaoh line ('0-0 1-2 ...': source "
              "word i, target word j, 0-based, words split at whitespace) per pair of the "
              "training split, in its order (.gz accepted); `scripts/align.py` makes one "
              "from a trained model's attention, fast_align or eflomal from the text. One "
              "head (the first of the model's `alignment_layer`, the penultimate) is trained "
              "to attend as the links say, and is what the model's word alignments read "
              "(the exported `translate_nbest`'s, inline markup's). The token cache is not "
              "used (it holds no links)")
    guided_alignment_weight: float = _setting(
        0.05, "with `guided_alignment`: the alignment loss' weight beside the translation "
              "loss (Garg et al.'s lambda)")
    checkpoint_every: int = _setting(1_000, "save a checkpoint ckpt-<step> every this many "
                                     "updates")
    keep_checkpoints: int = _setting(20, "checkpoints kept on disk")
    average_last: int = _setting(5, "at the end, average the last K checkpoints into "
                                 "averaged/ (paper: 5 base, 20 big; 0 or 1 = no averaging)")
    eval_every: int = _setting(1_000, "validation loss and BLEU every this many updates "
                               "(0 = never)")
    eval_sentences: int = _setting(500, "validation sentences translated for BLEU (0 = loss "
                                   "only)")
    beam_size: int = _setting(_DECODING.beam_size, "beam size for validation BLEU and the "
                              "export (paper: 4)")
    alpha: float = _setting(_DECODING.alpha, "length penalty alpha for validation BLEU and "
                            "the export (paper: 0.6)")
    log_every: int = _setting(100, "log loss, learning rate and tokens/s every this many "
                              "updates")
    cpu_devices: int | None = _setting(None, "split the CPU into N logical devices so "
                                       "MirroredStrategy runs N replicas on a machine "
                                       "without GPUs")
    precision: str = _setting(
        AUTO_PRECISION, "fp32 (float32), bf16 (mixed bfloat16), fp16 (mixed float16 with loss "
        "scaling), or auto: chosen for this machine (bf16 on GPUs of compute capability >= 8.0 "
        "and on CPUs with AVX512_BF16 or AMX-BF16; fp16 on GPUs of 7.x; otherwise fp32), the "
        "reason logged; a resumed run keeps the precision its run dir records. config.json "
        "records the precision used, never auto", choices=PRECISIONS + (AUTO_PRECISION,))
    xla: bool = _setting(False, "compile the training step with XLA")
    seed: int = _setting(0, "random seed (data order, vocabulary sampling)")
    shuffle_buffer: int = _setting(100_000, "training pairs in the shuffle buffer")
    token_cache: bool = _setting(
        True, "tokenize the training pairs once, into token_cache/ of the run dir (rebuilt when "
              "spm.model, the training files' size or mtime, or `max_length` change; the "
              "length check reads its counts from it) instead of on every epoch; the same "
              "batches either way. Off: tokenize on the fly")
    on_nonfinite: str = _setting("skip", "on a NaN/Inf loss or gradient: 'skip' the update "
                                 "or 'stop' training", choices=ON_NONFINITE)
    deterministic: bool = _setting(False, "enable TensorFlow op determinism (slower; "
                                   "reproducible runs)")
    export_dir: str | None = _setting(None, "at the end, export the translator SavedModel "
                                      "to EXPORT_DIR/<version>/")
    target_languages: str | None = _setting(
        None, "a multilingual run (Johnson et al., 2017): its target languages, comma-"
              "separated, e.g. 'de,fr'. Each source line starts with the tag of its target "
              "and a space ('<2de> A dog runs.'; scripts/prepare_multilingual.py writes such "
              "data, with `tgt` 'mul'); the tags are pieces of the vocabulary, and the "
              "export's signatures take a `target_language` input. See "
              "tfxformer.multilingual")
    init_from: str | None = _setting(
        None, "start from a trained model: a SavedModel export or version dir, a run dir "
              "(its averaged checkpoint first) or a preset dir. Its model settings, "
              "vocabulary and weights are taken (a different `preset`, `vocab_size` or "
              "`max_positions` is an error; the dropout settings may be set); optimizer and "
              "schedule start fresh. The direction (`src`, `tgt`, `target_languages`) is "
              "the source's too: one given that differs is an error unless "
              "`change_direction`; a preset dir that records no languages needs `src` and "
              "`tgt`. See tfxformer.pretrained")
    change_direction: bool = _setting(
        False, "with `init_from`: train the direction `src` -> `tgt` (both required) although "
               "the source model translates another, e.g. a DE->EN start for an EN->DE "
               "run; without it, a `src`, `tgt` or `target_languages` that differs from the "
               "source model's is an error")
    tfds_data_dir: str | None = _setting(None, "tensorflow-datasets data directory for "
                                         "`data` wmt14 or tfds:NAME")
    tfds_manual_dir: str | None = _setting(None, "tensorflow-datasets manual download "
                                           "directory for `data` wmt14 or tfds:NAME")
    tfds_train_split: str | None = _setting(
        None, "tensorflow-datasets split (or split expression, e.g. 'train[2000:]') to train "
              "on (default: train)")
    tfds_val_split: str | None = _setting(
        None, "tensorflow-datasets split (or split expression, e.g. 'train[:2000]') to "
              "validate on (default: the split named validation, valid, val, dev or "
              "development, else the one whose name starts with valid or dev)")

    def __post_init__(self):
        """`src` and `tgt` left unset (None) are en and de, except with `init_from`: the
        source model's then (:func:`tfxformer.pretrained.fine_tune_config`)."""
        if self.init_from is None:
            self.src = "en" if self.src is None else self.src
            self.tgt = "de" if self.tgt is None else self.tgt

    def validate(self):
        """Raises ValueError naming the setting (in backticks) and what is accepted."""
        positive = ("vocab_size", "max_length", "batch_tokens", "accumulation_steps",
                    "steps_per_loop", "train_steps", "warmup_steps", "checkpoint_every",
                    "keep_checkpoints", "log_every")
        for name in positive:
            checks.integer(getattr(self, name), name, 1)
        self.decoding_options()
        for name in ("precision", "on_nonfinite", "preset"):
            choices = setting(name).metadata["choices"]
            if getattr(self, name) not in choices:
                raise ValueError(f"`{name}` {getattr(self, name)!r} not in {choices}.")
        for name in ("average_last", "eval_every", "eval_sentences"):
            checks.integer(getattr(self, name), name, 0)
        checks.number(self.r_drop, "r_drop", 0.0)
        checks.number(self.guided_alignment_weight, "guided_alignment_weight", 0.0)
        if self.guided_alignment is not None:
            if not os.path.isfile(self.guided_alignment):
                raise ValueError(f"`guided_alignment` {self.guided_alignment!r} is not a "
                                 "file: give the word alignments of the training pairs, "
                                 "one Pharaoh line per pair (scripts/align.py makes them).")
            if self.r_drop:
                raise ValueError("`guided_alignment` and `r_drop` do not go together: "
                                 "set one.")
        check_alpha(self.subword_sampling, "subword_sampling")
        if self.max_positions is not None and self.max_positions < self.max_length:
            raise ValueError(f"`max_positions` {self.max_positions} is below `max_length` "
                             f"{self.max_length}: training pairs would not fit the model's "
                             "position table.")

        self.languages()
        if self.change_direction and self.init_from is None:
            raise ValueError("`change_direction` applies to a run from `init_from`; without "
                             "it, `src` and `tgt` are the direction trained.")
        if self.init_from is not None:
            from tfxformer.pretrained import check_fine_tune

            check_fine_tune(self)

    def model_config(self) -> ModelConfig:
        """The model: the preset with the vocabulary size, the dropout settings and the
        position-table size `max_positions` (by default the preset's, 1024, raised to
        `max_length` if that is larger: this is the one place it is chosen); with
        `init_from`, the source model's (and the dropout settings); with
        `guided_alignment`, its alignments read one head (`alignment_heads` 1)."""
        if self.init_from is not None:
            from tfxformer.pretrained import fine_tune_model_config

            config = fine_tune_model_config(self)
        else:
            preset = get_preset(self.preset, vocab_size=self.vocab_size, **self.dropouts())
            positions = self.max_positions if self.max_positions is not None else \
                max(self.max_length, preset.max_positions)
            config = preset.replace(max_positions=positions)
        # guided alignment supervises one head, which the model's alignments then read
        return config.replace(alignment_heads=1) if self.guided_alignment else config

    def dropouts(self) -> dict:
        """The dropout settings given (`dropout`, `attention_dropout`,
        `activation_dropout`), as ModelConfig overrides."""
        given = {"dropout": self.dropout, "attention_dropout": self.attention_dropout,
                 "activation_dropout": self.activation_dropout}
        return {name: value for name, value in given.items() if value is not None}

    def languages(self) -> tuple[str, ...]:
        """The target languages of a multilingual run (`target_languages`), or ()."""
        return multilingual.parse_languages(self.target_languages)

    def decoding_options(self) -> DecodingOptions:
        """The decoding options of validation BLEU and the export (`beam_size`, `alpha`;
        the others :class:`DecodingOptions`' defaults); raises ValueError for a bad one."""
        return _DECODING.replace(beam_size=self.beam_size, alpha=self.alpha)


def setting(name: str) -> dataclasses.Field:
    """The TrainConfig field `name` (its type, default and help)."""
    return {f.name: f for f in dataclasses.fields(TrainConfig)}[name]


def settings_as_flags(message: str) -> str:
    """`message` with each TrainConfig setting named in backticks spelled as its flag
    (`max_length` -> --max-length), for scripts/train_wmt.py."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return re.sub(r"`(\w+)`", lambda m: "--" + m.group(1).replace("_", "-")
                  if m.group(1) in names else m.group(0), message)
