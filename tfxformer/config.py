"""Model presets: the paper's Table 3 (base, big) and small ones for tests and demos.

Presets are data. :func:`get_preset` is the one place that resolves a preset name
(plus overrides) into the keyword arguments of :class:`tfxformer.Transformer`.
"""

from __future__ import annotations

import copy

# Table 3 of "Attention Is All You Need". `dropout` is P_drop (§5.4); label smoothing
# (ε_ls = 0.1 for both) is a training setting, see tfxformer.losses.
PRESETS: dict[str, dict] = {
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
    "big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    # Small models, not from the paper.
    "tiny": dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.1),
    "small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1),
    # The paper's recipe scaled to Multi30k's 29k pairs: a narrower model and heavier
    # dropout against over-fitting (cf. fairseq's transformer_iwslt_de_en on small data).
    "multi30k": dict(num_layers=4, d_model=128, num_heads=4, d_ff=256, dropout=0.3),
    "multi30k_wide": dict(num_layers=4, d_model=192, num_heads=4, d_ff=768, dropout=0.3),
}

# --precision names and the Keras dtype policies they select (mixed: float32 weights,
# float32 LayerNorm/softmax/logits; bf16 on CPU/TPU, fp16 with loss scaling on GPU).
PRECISION_POLICIES: dict[str, str] = {
    "fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}

# Old names of model arguments -> their names now (#11: one meaning per name). Configs
# written before (run directories, SavedModel assets, .keras files) still load.
RENAMED_ARGUMENTS: dict[str, str] = {"max_length": "max_positions"}


def model_defaults() -> dict:
    """Every architecture argument of Transformer but vocab_size, with its default (the
    paper's base model). Read from the constructors, where each default is written once."""
    from tfxformer.models.transformer import Transformer  # models import this module

    return Transformer.defaults()


def renamed_model_arguments(arguments: dict) -> dict:
    """`arguments` with old argument names (RENAMED_ARGUMENTS) replaced by today's.

    Raises:
        ValueError: an argument is given under both its old and its new name.
    """
    arguments = dict(arguments)
    for old, new in RENAMED_ARGUMENTS.items():
        if old in arguments:
            if new in arguments:
                raise ValueError(f"Give `{new}` or its old name `{old}`, not both (got "
                                 f"{new}={arguments[new]!r}, {old}={arguments[old]!r}).")
            arguments[new] = arguments.pop(old)
    return arguments


def get_preset(name: str, **overrides) -> dict:
    """Returns the full model keyword arguments of preset `name`, with `overrides` applied.

    Overrides may use an argument's old name (RENAMED_ARGUMENTS, e.g. `max_length`).

    Raises:
        ValueError: `name` is not a preset, or an override names no model argument.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; accepted presets: {sorted(PRESETS)}.")
    overrides = renamed_model_arguments(overrides)
    defaults = model_defaults()
    unknown = sorted(set(overrides) - set(defaults) - {"vocab_size"})
    if unknown:
        raise ValueError(
            f"Unknown model argument(s) {unknown} for preset {name!r}; "
            f"accepted: {sorted(defaults) + ['vocab_size']}."
        )
    config = copy.deepcopy(defaults)
    config.update(PRESETS[name])
    config.update(overrides)
    return config
