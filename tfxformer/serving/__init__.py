"""Translation as a TensorFlow graph (string in, string out), its export and loading."""

from tfxformer.serving.export import export_run_dir, export_translator, next_version
from tfxformer.serving.loading import (
    find_checkpoint,
    load_run_dir,
    read_run_config,
    resolve_model_dir,
    saved_model_versions,
    untracked_weights,
)
from tfxformer.serving.translator import Translator, sanitize_utf8

__all__ = [
    "Translator", "export_run_dir", "export_translator", "find_checkpoint", "load_run_dir",
    "next_version", "read_run_config", "resolve_model_dir", "sanitize_utf8",
    "saved_model_versions", "untracked_weights",
]
