"""The model and decoding settings, each a frozen dataclass with its defaults written once.

:class:`ModelConfig` is the architecture (its defaults: the paper's base model, Table 3);
presets are `ModelConfig` instances and :func:`get_preset` resolves a preset name plus
overrides into one. :class:`DecodingOptions` is how a model translates (§6.1: beam 4,
α 0.6, output up to the source length + 50). Both round-trip through JSON
(`to_dict` / `from_dict`), which is how run dirs and SavedModels store them.

The module itself uses no TensorFlow, but importing it runs the package's `__init__`,
which imports Keras and TensorFlow.
"""

from __future__ import annotations

import dataclasses

from tfxformer import checks

__all__ = [
    "DEFAULT_STOPPING", "LENGTH_NORMALIZATIONS", "PRECISION_POLICIES", "PRESETS",
    "STOPPING_RULES", "DecodingOptions", "ModelConfig", "get_preset",
]

# Names that model settings had in files written by earlier versions (run dirs'
# config.json, SavedModel assets, .keras files): read as the new name, never written.
_OLD_MODEL_NAMES = {"max_length": "max_positions"}
_OLD_DECODING_NAMES = {"max_batch_size": "batch_size", "max_input_length": "max_input_tokens"}
POSITION_EMBEDDINGS = ("sinusoidal", "learned")

# When beam search ends a sentence (DecodingOptions.stopping): "bound", when no alive
# hypothesis could still beat the worst finished one; "finished", when beam_size
# hypotheses have finished (CTranslate2, fairseq). DEFAULT_STOPPING is the default of every
# entry point (DecodingOptions, the searches, the exporter, the scripts): "finished", chosen
# on Multi30k val with the shipped models (each rule at its best α: EN->DE 41.59 against
# 41.32, EN->FR 57.97 against 58.12, within two seeds' 0.65) for its ~0.56x steps per
# sentence (saved_models/*/README.md, bench/STUDIES.md, "Stopping rule").
STOPPING_RULES = ("bound", "finished")
DEFAULT_STOPPING = "finished"
# What a finished hypothesis' log-probability is divided by (length_normalization):
# "gnmt", ((5 + |Y|) / 6)^α with |Y| counting the EOS (§6.1); "length", |Y|^α without the
# EOS (CTranslate2's).
LENGTH_NORMALIZATIONS = ("gnmt", "length")
# The search settings a stored dict written before they existed ran with (read so, not as
# today's defaults, so an old export's record stays true if a default changes).
_DECODING_BEFORE_RULES = {"stopping": "bound", "length_normalization": "gnmt"}


def _upgraded(data: dict, old_names: dict, what: str) -> dict:
    """`data` with the old names of `old_names` replaced by today's."""
    data = dict(data)
    for old, new in old_names.items():
        if old in data:
            value = data.pop(old)
            if new in data and data[new] != value:
                raise ValueError(f"{what} gives `{new}` {data[new]!r} and its old name "
                                 f"`{old}` {value!r}; give one.")
            data.setdefault(new, value)
    return data


class _Settings:
    """JSON round-trip and checked overrides of a frozen settings dataclass."""

    _old_names: dict = {}

    @classmethod
    def field_names(cls) -> tuple:
        """The settings' names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def stored_names(cls) -> set:
        """Every name a stored dict may give a setting: today's and earlier versions'."""
        return set(cls.field_names()) | set(cls._old_names)

    def to_dict(self) -> dict:
        """The settings as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def upgrade(cls, data: dict) -> dict:
        """The settings `data` gives (a `to_dict` result, or one written by an earlier
        version), under today's names; settings it lacks stay absent.

        Raises:
            ValueError: `data` is not a dict, or names a setting that does not exist.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__} settings must be a dict, got "
                             f"{type(data).__name__}: {data!r:.200}.")
        data = _upgraded(data, cls._old_names, cls.__name__)
        unknown = sorted(set(data) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"Unknown {cls.__name__} setting(s) {unknown}; accepted: "
                             f"{list(cls.field_names())}.")
        return data

    @classmethod
    def from_dict(cls, data: dict):
        """The settings of `data` (see :meth:`upgrade`); missing ones take their defaults."""
        return data if isinstance(data, cls) else cls(**cls.upgrade(data))

    def replace(self, **overrides):
        """A copy with `overrides` applied (None values are ignored); unknown names raise
        ValueError listing the accepted ones."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - set(self.field_names()))
        if unknown:
            raise ValueError(f"Unknown {type(self).__name__} setting(s) {unknown}; accepted: "
                             f"{list(self.field_names())}.")
        return dataclasses.replace(self, **given)


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Settings):
    """The architecture of a :class:`tfxformer.Transformer`; defaults: the paper's base model.

    Args:
        vocab_size: size of the shared source/target vocabulary (§5.1: about 37000 BPE
            tokens for EN-DE).
        num_layers: N, layers in each of the encoder and decoder (6).
        d_model: model width (512). num_heads: h (8). d_ff: FFN inner width (2048).
        dropout: P_drop on sub-layer outputs and embedding sums (§5.4, 0.1).
        attention_dropout, activation_dropout: dropout on attention weights and inside
            the FFN (departures; 0).
        norm_first: pre-norm instead of the paper's post-norm (departure; False).
        layer_norm_epsilon: LayerNorm epsilon (1e-6).
        position_embedding: "sinusoidal" (§3.5) or "learned" (Table 3 row E).
        max_positions: size of the position table: the longest sequence a learned table
            embeds, and the cap on source and output length (1024).
        alignment_layer: the decoder layer whose encoder–decoder attention word alignments
            read (0 the bottom, negative from the top; -2, the penultimate, as Garg et al.,
            2019). alignment_heads: how many of its heads, from the first, are averaged
            for them (0: all). A model trained with guided alignment
            (`train_wmt.py --guided-alignment`) reads its supervised head: 1. As
            CTranslate2's model spec; no weight depends on either.

    Example:
    >>> ModelConfig(vocab_size=100).replace(d_model=256).d_model
    256
    """

    vocab_size: int = 37_000
    num_layers: int = 6
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    norm_first: bool = False
    layer_norm_epsilon: float = 1e-6
    position_embedding: str = "sinusoidal"
    max_positions: int = 1024
    alignment_layer: int = -2
    alignment_heads: int = 0

    _old_names = _OLD_MODEL_NAMES

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff",
                     "max_positions"):
            object.__setattr__(self, name, checks.integer(getattr(self, name), name, 1))
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            object.__setattr__(self, name, checks.number(getattr(self, name), name, 0.0, 1.0))
        object.__setattr__(self, "layer_norm_epsilon",
                           checks.number(self.layer_norm_epsilon, "layer_norm_epsilon", 0.0))
        object.__setattr__(self, "norm_first", bool(self.norm_first))
        object.__setattr__(self, "alignment_layer",  # in range: checked where it is read
                           checks.integer(self.alignment_layer, "alignment_layer"))
        object.__setattr__(self, "alignment_heads", checks.integer(
            self.alignment_heads, "alignment_heads", 0, self.num_heads))
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"Unknown `position_embedding` {self.position_embedding!r}; "
                             f"accepted: {POSITION_EMBEDDINGS}.")

    def layer_settings(self) -> dict:
        """The arguments of one encoder or decoder layer (TransformerBlock)."""
        return dict(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                    dropout=self.dropout, attention_dropout=self.attention_dropout,
                    activation_dropout=self.activation_dropout, norm_first=self.norm_first,
                    layer_norm_epsilon=self.layer_norm_epsilon)


@dataclasses.dataclass(frozen=True)
class DecodingOptions(_Settings):
    """How a model translates: beam search (§6.1) and the limits of one call.

    Args:
        beam_size: hypotheses kept per sentence (4; 1 with alpha 0 is greedy).
        alpha: length penalty exponent α of ((5 + |Y|) / 6)^α (0.6).
        extra_length: output tokens allowed beyond the source length (50).
        batch_size: sentences per translation call, and the largest batch an export
            serves (64).
        max_input_tokens: source tokens kept per sentence, EOS included; longer ones are
            cut (256).
        max_output_tokens: output tokens per sentence at most, EOS included (256).
        stopping: when beam search ends a sentence before its limit (`DEFAULT_STOPPING`,
            "bound"): "bound", once no alive hypothesis, even at the limit's length
            penalty, could beat the worst of the beam_size finished ones (the n-best list
            of the full search); "finished", once beam_size hypotheses have finished
            (CTranslate2, fairseq; Hugging Face's early_stopping=True): fewer steps.
        length_normalization: what a finished hypothesis' log P(Y | X) is divided by
            ("gnmt"): "gnmt", ((5 + |Y|) / 6)^α with |Y| counting the EOS (§6.1, GNMT);
            "length", |Y|^α with |Y| not counting it (CTranslate2's; at least 1).
        sampling_topk: 1 (greedy, or beam search): the argmax; otherwise the greedy
            decoder samples each token (Edunov et al., 2018, back-translation): K > 1 from
            the K most probable tokens, 0 from the whole vocabulary (OpenNMT-tf's
            `sampling_topk`). Needs beam_size 1: sampling replaces beam search.
        sampling_temperature: the logits are divided by it before sampling (1.0; > 0:
            below 1 sharpens the distribution, above 1 flattens it).
        sampling_topp: nucleus sampling (Holtzman et al., 2020): only the most probable
            tokens whose probabilities sum to at least p are kept, after temperature
            and top-k (1.0: all; in (0, 1]). Temperature and top-p apply only when
            sampling (`sampling_topk` != 1).
        no_repeat_ngram_size: n > 0 bans every token that would complete an n-gram the
            output already holds (0: off; CTranslate2's option of that name).
        repetition_penalty: p > 0 divides the positive logits of the tokens the output
            already holds and multiplies their negative ones (1.0: off; > 1 discourages
            repeats; CTranslate2's). Both apply in beam search, greedy decoding and
            sampling (:mod:`tfxformer.decoding.steering`, docs/steering.md).

    An export fixes `stopping` and `length_normalization` in its graph; a stored dict
    without them (written before they existed) reads as "bound" and "gnmt", what it ran.

    Sentence-level MT: the longest newstest2014 sentence is 134 (EN) / 153 (DE) pieces
    even under the shipped 8k caption vocabulary, which over-segments news text; longer
    inputs are paragraphs. A translator caps both limits by the model's positions.

    Example:
    >>> DecodingOptions().replace(beam_size=1, alpha=0.0).validate().beam_size
    1
    """

    beam_size: int = 4
    alpha: float = 0.6
    extra_length: int = 50
    batch_size: int = 64
    max_input_tokens: int = 256
    max_output_tokens: int = 256
    stopping: str = DEFAULT_STOPPING
    length_normalization: str = "gnmt"
    sampling_topk: int = 1
    sampling_temperature: float = 1.0
    sampling_topp: float = 1.0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0

    _old_names = _OLD_DECODING_NAMES

    def __post_init__(self):
        self.validate()

    def validate(self) -> DecodingOptions:
        """Returns self with each option as a Python int or float, or raises ValueError
        naming the first bad option and what is accepted (run at construction)."""
        for name, minimum in (("beam_size", 1), ("extra_length", 0), ("batch_size", 1),
                              ("max_input_tokens", 1), ("max_output_tokens", 1)):
            object.__setattr__(self, name, checks.integer(getattr(self, name), name, minimum))
        # α >= 0 makes the length penalty non-decreasing in |Y|, which beam search's early
        # stop relies on.
        object.__setattr__(self, "alpha", checks.number(self.alpha, "alpha", 0.0))
        object.__setattr__(self, "no_repeat_ngram_size", checks.integer(
            self.no_repeat_ngram_size, "no_repeat_ngram_size", 0))
        penalty = checks.number(self.repetition_penalty, "repetition_penalty", 0.0)
        if penalty == 0.0:
            raise ValueError("`repetition_penalty` must be a number > 0 (1.0: off), got "
                             f"{self.repetition_penalty!r}.")
        object.__setattr__(self, "repetition_penalty", penalty)
        checks.choice(self.stopping, "stopping", STOPPING_RULES)
        checks.choice(self.length_normalization, "length_normalization",
                      LENGTH_NORMALIZATIONS)
        self._validate_sampling()
        return self

    def _validate_sampling(self):
        """Checks the sampling options and that they fit the rest (see the class doc)."""
        object.__setattr__(self, "sampling_topk",
                           checks.integer(self.sampling_topk, "sampling_topk", 0))
        temperature = checks.number(self.sampling_temperature, "sampling_temperature", 0.0)
        if temperature == 0.0:
            raise ValueError("`sampling_temperature` must be a number > 0, got "
                             f"{self.sampling_temperature!r} (sampling_topk 1 is greedy).")
        object.__setattr__(self, "sampling_temperature", temperature)
        topp = checks.number(self.sampling_topp, "sampling_topp", 0.0, 1.0)
        if topp == 0.0:
            raise ValueError(f"`sampling_topp` must be a number in (0, 1], got "
                             f"{self.sampling_topp!r}.")
        object.__setattr__(self, "sampling_topp", topp)
        if self.sampling and self.beam_size != 1:
            raise ValueError(f"`sampling_topk` {self.sampling_topk} samples one hypothesis "
                             f"per sentence: it needs `beam_size` 1, got {self.beam_size}.")
        if not self.sampling and (temperature != 1.0 or topp != 1.0):
            raise ValueError(
                f"`sampling_temperature` {temperature} and `sampling_topp` {topp} apply "
                "when sampling: set `sampling_topk` (0 = the whole vocabulary, K > 1 = "
                "the K most probable tokens); `sampling_topk` 1 is greedy.")

    @property
    def sampling(self) -> bool:
        """Whether these options sample tokens (`sampling_topk` != 1)."""
        return self.sampling_topk != 1

    def sampling_options(self) -> dict:
        """The three sampling options (sampling_topk, sampling_temperature, sampling_topp)."""
        return dict(sampling_topk=self.sampling_topk,
                    sampling_temperature=self.sampling_temperature,
                    sampling_topp=self.sampling_topp)

    @classmethod
    def from_dict(cls, data: dict) -> DecodingOptions:
        """The options of `data` (see :meth:`upgrade`); missing ones take their defaults,
        but a dict without `stopping` / `length_normalization` was written before they
        existed and reads as the rules it ran ("bound", "gnmt")."""
        if isinstance(data, cls):
            return data
        return cls(**{**_DECODING_BEFORE_RULES, **cls.upgrade(data)})

    def repetition_options(self) -> dict:
        """The two repetition controls (no_repeat_ngram_size, repetition_penalty)."""
        return dict(no_repeat_ngram_size=self.no_repeat_ngram_size,
                    repetition_penalty=self.repetition_penalty)

    def search_options(self) -> dict:
        """The three options a translation call takes (beam_size, alpha, extra_length)."""
        return dict(beam_size=self.beam_size, alpha=self.alpha,
                    extra_length=self.extra_length)


# Table 3 of "Attention Is All You Need" (base: the ModelConfig defaults). Label
# smoothing (ε_ls = 0.1 for both) is a training setting, see tfxformer.losses.
PRESETS: dict[str, ModelConfig] = {
    "base": ModelConfig(),
    "big": ModelConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    # Small models, not from the paper.
    "tiny": ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64),
    "small": ModelConfig(num_layers=3, d_model=256, num_heads=4, d_ff=1024),
    # The paper's recipe scaled to Multi30k's 29k pairs: a narrower model and heavier
    # dropout against over-fitting (cf. fairseq's transformer_iwslt_de_en on small data).
    "multi30k": ModelConfig(num_layers=4, d_model=128, num_heads=4, d_ff=256, dropout=0.3),
    "multi30k_wide": ModelConfig(num_layers=4, d_model=192, num_heads=4, d_ff=768,
                                 dropout=0.3),
}

# --precision names and the Keras dtype policies they select (mixed: float32 weights,
# float32 LayerNorm/softmax/logits; bf16 on CPU/TPU, fp16 with loss scaling on GPU).
PRECISION_POLICIES: dict[str, str] = {
    "fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def get_preset(name: str, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of preset `name`, with `overrides` applied.

    Raises:
        ValueError: `name` is not a preset, or an override names no model setting.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; accepted presets: {sorted(PRESETS)}.")
    return PRESETS[name].replace(**overrides)
