"""tfxformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras."""

from setuptools import find_packages, setup

setup(
    name="tfxformer",
    version="0.1.0",
    description="The Transformer (Vaswani et al., 2017) for machine translation in TF/Keras",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["tfxformer", "tfxformer.*"]),
    install_requires=[
        "tensorflow==2.21.*",
        # TF Serving 2.21 links tensorflow-text 2.21: keep them on the same minor version.
        "tensorflow-text==2.21.*",
        "keras>=3.12,<4",
        "keras-nlp==0.32.*",
        "tensorflow-datasets==4.9.*",
        "sacrebleu==2.6.*",
        "sacremoses>=0.1,<0.3",
        "sentencepiece==0.2.*",
        "matplotlib>=3.8,<4",
        "tqdm>=4.66,<5",
        "tensorboard==2.21.*",
        # TF Serving protos: every export writes warm-up records (PredictionLog).
        "tensorflow-serving-api==2.21.*",
    ],
    extras_require={
        # CI runs the CTranslate2 export's tests too (tests/test_ctranslate2.py).
        # filelock: the test builds shared by the pytest-xdist workers (tests/conftest.py).
        # pytest-xdist 3.8: --no-loadscope-reorder (scripts/test.sh keeps tests/conftest.py's
        # longest-first order; from 3.5 on, files are otherwise sorted by their test count).
        "test": ["pytest>=8,<10", "pytest-xdist>=3.8,<4", "hypothesis>=6.100,<7", "ruff>=0.6",
                 "ctranslate2>=4.8,<5", "filelock>=3.12"],
        # scripts/export.py --format ctranslate2 and translation with its directories
        # (tfxformer.serving.ctranslate2): OpenNMT's CPU runtime, 4.8.5 tested.
        "ctranslate2": ["ctranslate2>=4.8,<5"],
        # tfxformer.beam, scripts/translate_beam.py (docs/beam.md): Apache Beam 2.78 takes
        # TensorFlow < 2.22 and Python 3.11. It needs protobuf < 7, so it installs 6.33 where
        # TensorFlow alone gets 7.x (both within TensorFlow's >= 6.31.1, < 8). Not in "test":
        # the suite would then test the core package with another protobuf than users get;
        # scripts/test.sh runs tests/test_beam.py in a second environment, .venv-beam, with
        # "test" and "beam" (it skips where Beam is not installed).
        "beam": ["apache-beam==2.78.*"],
        # gRPC client of scripts/serving_client.py (the protos are installed anyway)
        "serving": ["tensorflow-serving-api==2.21.*"],
    },
)
