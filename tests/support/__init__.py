"""Helpers the test files share: tests/test_*.py import these modules, never each other.

`support.environment` is the test processes' environment (the switches TEST_ENV sets, the
environment a user's process has, the shared data folder); `support.serving`,
`support.reliability`, `support.decoding`, `support.steering`, `support.serving_cpp`,
`support.ctranslate2` and `support.data_tfds_source` hold what the test file of the same
name and others use; `support.fixtures` holds the fixtures several files use (registered by
tests/conftest.py: a test names them, it does not import them); `support.durations` orders
the test files by their recorded wall time (tests/durations.json).
"""
