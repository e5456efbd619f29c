"""The training precision for this machine (`--precision auto`).

Mixed precision (Micikevicius et al., 2018; Keras' `mixed_bfloat16` / `mixed_float16`
policies: float32 weights, lower-precision compute, LayerNorm, softmax and logits in
float32) pays only where the hardware computes in the lower precision natively, and costs
elsewhere: on a CPU without BF16 instructions each bfloat16 op converts to float32 and back.
:func:`choose` is the rule, a pure function of a :class:`Machine`:

- TPU: bf16 (its native matrix format);
- GPU of compute capability >= 8.0 (Ampere and later, bfloat16 tensor cores): bf16;
- GPU of 7.x (Volta, Turing: float16 tensor cores only): fp16, with loss scaling;
- older GPUs (no tensor cores; Keras warns that mixed float16 runs slowly there): fp32;
- CPU with AVX512_BF16 or AMX-BF16 (Zen 4, Cooper Lake, Sapphire Rapids and later): bf16;
- any other CPU, or one whose flags cannot be read (no /proc/cpuinfo): fp32.

:func:`this_machine` reads the machine tfxformer trains on: /proc/cpuinfo's flags (Linux)
and TensorFlow's physical GPUs, without initialising them (so logical CPU devices can still
be set up). It lists no TPUs: `tfxformer.distribute.make_strategy` trains on GPUs or the CPU
(no TPUStrategy), so a TPU host's CPU decides there.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from tfxformer.config import PRECISION_POLICIES

__all__ = ["AUTO", "BF16_CPU_FLAGS", "Machine", "choose", "cpu_flags", "resolve", "this_machine"]

log = logging.getLogger("tfxformer")

AUTO = "auto"  # the `precision` setting that asks for this module's choice
# /proc/cpuinfo flags of CPUs with bfloat16 dot-product or matrix instructions.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = "/proc/cpuinfo"


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the precision choice looks at.

    Attributes:
        cpu_flags: the CPU's feature flags (/proc/cpuinfo), or None when unknown.
        gpus: the compute capability `(major, minor)` of each GPU (None: unknown).
        tpus: the number of TPU devices.
    """

    cpu_flags: frozenset[str] | None = None
    gpus: tuple[tuple[int, int] | None, ...] = ()
    tpus: int = 0


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo text (its `flags` lines; `Features` on Arm)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def _choose_gpu(gpus: tuple[tuple[int, int] | None, ...]) -> tuple[str, str]:
    """The precision for training on all of `gpus` (the oldest decides)."""
    if any(capability is None for capability in gpus):
        return "fp32", (f"{len(gpus)} GPU(s), compute capability unknown: float32, "
                        "which every GPU runs")
    oldest = min(gpus)
    named = f"{len(gpus)} GPU(s), compute capability {oldest[0]}.{oldest[1]}" + \
        (" (the oldest)" if len(set(gpus)) > 1 else "")
    if oldest >= (8, 0):
        return "bf16", f"{named} >= 8.0: mixed bfloat16 on bfloat16 tensor cores"
    if oldest >= (7, 0):
        return "fp16", (f"{named}: float16 tensor cores, no bfloat16 ones: mixed float16 "
                        "with loss scaling")
    return "fp32", f"{named} < 7.0: no tensor cores, mixed precision would not pay"


def choose(machine: Machine) -> tuple[str, str]:
    """`(precision, reason)`: the precision ("fp32", "bf16", "fp16") to train in on
    `machine` (the module docstring's rule) and why, for the log."""
    if machine.tpus:
        return "bf16", f"{machine.tpus} TPU device(s): mixed bfloat16, their native format"
    if machine.gpus:
        return _choose_gpu(machine.gpus)
    if machine.cpu_flags is None:
        return "fp32", (f"CPU only, its flags unknown (no {CPUINFO} on this platform): "
                        "float32, since mixed bfloat16 is slower than float32 on CPUs "
                        "without BF16 instructions")
    found = [flag for flag in BF16_CPU_FLAGS if flag in machine.cpu_flags]
    if found:
        return "bf16", f"CPU only, with {', '.join(found)}: mixed bfloat16"
    return "fp32", (f"CPU only, without {' or '.join(BF16_CPU_FLAGS)}: float32, since mixed "
                    "bfloat16 is slower than float32 on CPUs without BF16 instructions")


def _gpu_capability(device) -> tuple[int, int] | None:
    import tensorflow as tf

    try:
        capability = tf.config.experimental.get_device_details(device).get(
            "compute_capability")
    except (ValueError, RuntimeError):
        return None
    return tuple(capability) if capability else None


def this_machine(cpuinfo_path: str = CPUINFO) -> Machine:
    """This machine's CPU flags and physical GPUs (no device is initialised; no TPUs, see
    the module docstring)."""
    import tensorflow as tf

    flags = None
    if os.path.isfile(cpuinfo_path):
        try:
            with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
                flags = cpu_flags(f.read())
        except OSError as error:
            log.warning("Cannot read %s (%s); CPU flags unknown", cpuinfo_path, error)
    gpus = tuple(_gpu_capability(d) for d in tf.config.list_physical_devices("GPU"))
    return Machine(flags, gpus)


def resolve(requested: str, recorded: str | None = None,
            machine: Machine | None = None) -> tuple[str, str]:
    """`(precision, reason)` of a run that asks for `requested` (a precision, or AUTO)
    and whose run dir records `recorded` (None: a new run).

    AUTO is :func:`choose` on `machine` (default: :func:`this_machine`) for a new run; a
    resumed run keeps the precision its run dir records (its checkpoints were written in
    it), even on a machine that would choose another, and the reason says so.
    """
    if requested != AUTO:
        return requested, "given (`precision`)"
    chosen, why = choose(machine if machine is not None else this_machine())
    if recorded not in PRECISION_POLICIES:
        return chosen, f"auto: {why}"
    if recorded == chosen:
        return recorded, f"auto: the run dir records {recorded}; {why}"
    return recorded, (f"auto: the run dir records {recorded}, which the resumed run keeps; "
                      f"this machine alone would choose {chosen} ({why})")
