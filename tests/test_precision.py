"""Tests of tfxformer.precision: `--precision auto`'s choice, on fake machines (pure)."""

import pytest

from tfxformer.precision import Machine, choose, cpu_flags, resolve, this_machine
from tfxformer.train_config import TrainConfig

# /proc/cpuinfo excerpts: two processors each, as Linux writes them.
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni
"""
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 fma avx2\n" * 2
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


def test_cpu_flags_are_read_from_cpuinfo_text():
    assert {"avx2", "avx512_bf16"} <= cpu_flags(ZEN4) and "AuthenticAMD" not in cpu_flags(ZEN4)
    assert cpu_flags(ZEN3) == {"fpu", "sse2", "fma", "avx2"}
    assert "bf16" in cpu_flags(GRAVITON)
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize("cpuinfo, expected", [
    (ZEN4, "bf16"), (SAPPHIRE_RAPIDS, "bf16"), (ZEN3, "fp32"), (GRAVITON, "fp32")])
def test_a_cpu_trains_in_bf16_only_with_bf16_instructions(cpuinfo, expected):
    precision, reason = choose(Machine(cpu_flags(cpuinfo)))
    assert precision == expected
    if expected == "bf16":
        assert "CPU only, with" in reason and "bf16" in reason
    else:
        assert reason.startswith("CPU only, without avx512_bf16 or amx_bf16: float32")


def test_a_cpu_whose_flags_are_unknown_trains_in_fp32():
    precision, reason = choose(Machine(cpu_flags=None))
    assert precision == "fp32" and "no /proc/cpuinfo" in reason


@pytest.mark.parametrize("gpus, expected, says", [
    (((8, 0),), "bf16", "compute capability 8.0 >= 8.0"),
    (((9, 0), (9, 0)), "bf16", "2 GPU(s), compute capability 9.0"),
    (((7, 5),), "fp16", "float16 tensor cores, no bfloat16 ones: mixed float16 with loss"),
    (((8, 6), (7, 0)), "fp16", "compute capability 7.0 (the oldest)"),
    (((6, 0),), "fp32", "6.0 < 7.0: no tensor cores"),
    (((8, 0), None), "fp32", "compute capability unknown"),
])
def test_gpus_decide_before_the_cpu(gpus, expected, says):
    precision, reason = choose(Machine(cpu_flags(ZEN3 if expected == "bf16" else ZEN4), gpus))
    assert precision == expected and says in reason


def test_tpus_train_in_bf16():
    assert choose(Machine(cpu_flags(ZEN3), tpus=8)) == \
        ("bf16", "8 TPU device(s): mixed bfloat16, their native format")


def test_auto_resolves_for_the_machine_or_keeps_what_a_run_dir_records():
    zen3, zen4 = Machine(cpu_flags(ZEN3)), Machine(cpu_flags(ZEN4))
    assert resolve("fp16", "bf16", zen3) == ("fp16", "given (`precision`)")
    assert resolve("auto", None, zen4)[0] == "bf16"
    assert resolve("auto", None, zen3) == ("fp32", "auto: " + choose(zen3)[1])
    precision, reason = resolve("auto", "bf16", zen3)  # resumed on a machine without BF16
    assert precision == "bf16"
    assert reason.startswith("auto: the run dir records bf16, which the resumed run keeps; "
                             "this machine alone would choose fp32 (CPU only, without")
    assert resolve("auto", "bf16", zen4) == \
        ("bf16", "auto: the run dir records bf16; " + choose(zen4)[1])
    assert resolve("auto", "auto", zen3)[0] == "fp32"  # no precision recorded


def test_this_machine_reads_cpuinfo_or_says_it_cannot(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ZEN4, encoding="utf-8")
    assert "avx512_bf16" in this_machine(str(path)).cpu_flags
    assert this_machine(str(tmp_path / "none")).cpu_flags is None


def test_auto_is_the_default_and_a_checked_choice():
    assert TrainConfig(model_dir="runs/x").precision == "auto"
    TrainConfig(model_dir="runs/x").validate()
    with pytest.raises(ValueError, match=r"`precision` 'bf32' not in \('fp32', 'bf16', "
                                         r"'fp16', 'auto'\)"):
        TrainConfig(model_dir="runs/x", precision="bf32").validate()
