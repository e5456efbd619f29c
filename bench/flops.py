"""Matmul FLOP accounting, the same as the peer benchmarks' `common_flops.py`.

Exact matmul FLOPs (2 per multiply-add) of the post-LN encoder-decoder of "Attention Is All
You Need", counted on the padded shapes actually computed. Elementwise ops, softmax, layer
norm and embedding gathers are ignored (< 2 %). A training step is 3 x forward (backward =
2 x forward). MFU divides achieved FLOP/s by PEAK_GFLOPS, the fp32 GEMM ceiling the peers
measured on this machine (TF eager fp32 matmul at n = 4096); bf16 runs use the same
denominator, as in the peers' table.

The formulas are copied from the peers' `common_flops.py` (not imported, so the
benchmarks run without the peers' code).
"""

from __future__ import annotations

PEAK_GFLOPS = 221.5
BASE = dict(vocab=32000, d_model=512, heads=8, d_ff=2048, layers=6)


def forward_flops(batch, src_len, tgt_len, vocab=32000, d_model=512, d_ff=2048, layers=6, **_):
    """Teacher-forced forward pass of one (B, S) / (B, T) batch."""
    d, f, n = d_model, d_ff, layers
    s, t = batch * src_len, batch * tgt_len
    enc = s * n * (8 * d * d + 4 * d * f + 4 * src_len * d)  # QKVO proj, FFN, QK^T + AV
    dec = t * n * (8 * d * d + 4 * tgt_len * d  # self-attention (full T x T, masked)
                   + 4 * d * d + 4 * src_len * d  # cross-attention Q, O proj + QK^T, AV
                   + 4 * d * f)  # FFN
    dec_kv = s * n * 4 * d * d  # cross-attention K, V projection of the memory
    out = t * 2 * d * vocab  # tied pre-softmax projection
    return enc + dec + dec_kv + out


def train_step_flops(batch, src_len, tgt_len, **cfg):
    """One optimizer step: 3 x forward."""
    return 3 * forward_flops(batch, src_len, tgt_len, **{**BASE, **cfg})


def decode_flops_cached(batch, src_len, steps, beams=1, vocab=32000, d_model=512, d_ff=2048,
                        layers=6, **_):
    """Incremental (KV-cached) decoding: encoder once, cross K/V once per sentence (not per
    beam), then per step one token per hypothesis through the decoder (attention over t
    cached positions) plus the vocabulary projection."""
    d, f, n = d_model, d_ff, layers
    hyps = batch * beams
    enc = batch * src_len * n * (8 * d * d + 4 * d * f + 4 * src_len * d)
    cross_kv = batch * src_len * n * 4 * d * d
    per_steps = 0
    for t in range(1, steps + 1):
        per_steps += hyps * (n * (8 * d * d + 4 * t * d + 4 * d * d + 4 * src_len * d
                                  + 4 * d * f) + 2 * d * vocab)
    return enc + cross_kv + per_steps


def model_flop_kwargs(config: dict) -> dict:
    """FLOP keyword arguments from a tfxformer model config (get_preset output)."""
    return dict(vocab=config["vocab_size"], d_model=config["d_model"], d_ff=config["d_ff"],
                layers=config["num_layers"])

