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

# Every architecture argument of Transformer, with its default (the paper's base model).
MODEL_DEFAULTS: dict = dict(
    num_layers=6,
    d_model=512,
    num_heads=8,
    d_ff=2048,
    dropout=0.1,
    attention_dropout=0.0,
    activation_dropout=0.0,
    norm_first=False,
    position_embedding="sinusoidal",
    max_length=1024,
    layer_norm_epsilon=1e-6,
)


def get_preset(name: str, **overrides) -> dict:
    """Returns the full model keyword arguments of preset `name`, with `overrides` applied.

    Raises:
        ValueError: `name` is not a preset, or an override names no model argument.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; accepted presets: {sorted(PRESETS)}.")
    unknown = sorted(set(overrides) - set(MODEL_DEFAULTS) - {"vocab_size"})
    if unknown:
        raise ValueError(
            f"Unknown model argument(s) {unknown} for preset {name!r}; "
            f"accepted: {sorted(MODEL_DEFAULTS) + ['vocab_size']}."
        )
    config = copy.deepcopy(MODEL_DEFAULTS)
    config.update(PRESETS[name])
    config.update(overrides)
    return config
