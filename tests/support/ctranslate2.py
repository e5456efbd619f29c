"""What the CTranslate2 tests share (test_ctranslate2.py, test_constraints.py,
test_token_log_probs.py): a stand-in CTranslate2 model directory."""

import json
import os

from tfxformer.config import DecodingOptions
from tfxformer.serving import ctranslate2 as ct2


def fake_ct2_dir(path, marker=True, version=ct2.FORMAT_VERSION, **decoding):
    """A stand-in CTranslate2 model directory at `path` (empty model files; with `marker`,
    tfxformer's marker of format `version` and `decoding` options); its path."""
    os.makedirs(path, exist_ok=True)
    for name in ("model.bin", "config.json"):
        open(os.path.join(path, name), "w").close()
    if marker:
        record = {"format": ct2.FORMAT, "format_version": version,
                  "decoding": DecodingOptions(**decoding).to_dict()}
        with open(os.path.join(path, ct2.MARKER_FILENAME), "w") as f:
            json.dump(record, f)
    return str(path)
