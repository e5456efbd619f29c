"""The fixtures several test files use, registered by tests/conftest.py (`pytest_plugins`):
a test names them as arguments, it does not import them."""

import os

import pytest
import sentencepiece as spm

from support.serving import DATA, saved_models_loaded_once
from tfxformer.decoding import build_shortlist_table


@pytest.fixture
def load_each_saved_model_once():
    """saved_models_loaded_once() for one test."""
    with saved_models_loaded_once() as loaded:
        yield loaded


@pytest.fixture(scope="module")
def spm_table(spm_model):
    """A table from 2000 Multi30k pairs (vocabulary 320), K = 3, N = 10: small enough
    that the shortlist leaves tokens out."""
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    with open(os.path.join(DATA, "multi30k", "train.en"), encoding="utf-8") as f:
        sources = [next(f) for _ in range(2000)]
    with open(os.path.join(DATA, "multi30k", "train.de"), encoding="utf-8") as f:
        targets = [next(f) for _ in range(2000)]
    return build_shortlist_table(zip(processor.encode(sources), processor.encode(targets),
                                     strict=True), 320, per_source=3, frequent=10)


@pytest.fixture(scope="module")
def program(request):
    """The C++ serving program (support/serving_cpp.py), built once and cached in the
    pytest cache; the test is skipped where it cannot be built."""
    from support.serving_cpp import build_program, missing  # imports tensorflow_text

    reason = missing()
    if reason:
        pytest.skip(f"C++ serving path not testable: {reason}")
    return build_program(str(request.config.cache.mkdir("tfxformer_cpp")))
