"""Choosing the distribution strategy: all GPUs, logical CPU devices, or several workers."""

from __future__ import annotations

import json
import logging
import os

import tensorflow as tf

from tfxformer import checks

__all__ = ["barrier", "make_strategy", "mirrored_strategy", "split_cpu"]

log = logging.getLogger(__name__)


def split_cpu(num_devices: int) -> None:
    """Splits the physical CPU into `num_devices` logical devices (before any op runs).

    Lets MirroredStrategy run `num_devices` replicas on a machine without GPUs. When the
    caller already split the CPU into at least `num_devices` logical devices (TensorFlow
    initialised or not), the split is kept: a later call asking for more still finds them.
    """
    num_devices = checks.integer(num_devices, "cpu_devices", 1)
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) >= num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        have = len(tf.config.list_logical_devices("CPU"))
        if have < num_devices:
            raise RuntimeError(
                f"Cannot split the CPU into {num_devices} devices: TensorFlow is already "
                f"initialised with {have}. Call split_cpu() before running any op.") from error


def _num_workers_in_tf_config() -> int:
    """Number of workers (chief included) that TF_CONFIG names; 1 without TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 1
    try:
        cluster = json.loads(raw).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}: {raw[:200]!r}") from error
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


_STRATEGIES: dict = {}


def mirrored_strategy(devices: tuple[str, ...] | None = None) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per device set and process.

    Two strategies over the same devices in one process would reuse the same collective
    instance keys and fail with shape mismatches; calling train_and_evaluate twice in one
    process (tests, notebooks) must not do that.
    """
    key = ("mirrored", tuple(devices) if devices else None)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(devices) if devices else None)
    return _STRATEGIES[key]


def make_strategy(cpu_devices: int | None = None) -> tf.distribute.Strategy:
    """The strategy for this machine (§5.2: the paper trained on 8 GPUs of one machine).

    - TF_CONFIG naming several workers: MultiWorkerMirroredStrategy;
    - otherwise MirroredStrategy over all GPUs, or over `cpu_devices` logical CPU devices
      when there are no GPUs (one CPU device by default).
    """
    if _num_workers_in_tf_config() > 1:
        if cpu_devices and cpu_devices > 1:
            split_cpu(cpu_devices)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif tf.config.list_physical_devices("GPU"):
        strategy = mirrored_strategy()
    else:
        split_cpu(cpu_devices or 1)
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][: cpu_devices or 1]
        strategy = mirrored_strategy(tuple(devices))
    log.info("%s with %d replicas in sync", type(strategy).__name__,
             strategy.num_replicas_in_sync)
    return strategy


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` spans several worker processes."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
        _num_workers_in_tf_config() > 1


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Waits until every worker of a multi-worker run gets here (a no-op otherwise).

    A collective all-reduce: it waits as long as the slowest worker needs, and fails with
    `tf.errors.UnavailableError` instead of waiting forever when a worker dies (the
    coordination service's heartbeats abort pending collectives; :data:`LOST_WORKER_ERRORS`).
    """
    if not is_multi_worker(strategy):
        return

    @tf.function(autograph=False)
    def all_reduce():
        ones = strategy.run(lambda: tf.ones([]))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)
    all_reduce()


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints, logs and exports (the chief worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


# What a collective raises when a peer worker dies: UnavailableError, or AbortedError when
# the coordination service had already put the run in error (a heartbeat timed out first).
LOST_WORKER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError)


def lost_worker_reason(error: Exception) -> str:
    """The useful part of the error a collective raises when a peer worker is lost."""
    text = " ".join(str(getattr(error, "message", error)).split())
    marker = "Collective ops is aborted by:"
    reason = text[text.index(marker) + len(marker):] if marker in text else text
    for boilerplate in (" The tasks have crashed.", " The error could be from", " [["):
        reason = reason.split(boilerplate)[0]
    return reason.strip()[:300]
