"""The C++ serving path's program (test_serving_cpp.py, test_compiled_search.py): what it
needs from the installed wheels, and its build (bench/serving_memory.py's)."""

import importlib.util
import os
import shutil

import tensorflow as tf

BENCH_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "bench", "serving_memory.py")
TF_DIR = os.path.dirname(tf.__file__)
def _bench():
    """bench/serving_memory.py, which builds the program and names its op libraries."""
    spec = importlib.util.spec_from_file_location("serving_memory", BENCH_SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


# tensorflow-text's op libraries an export uses, ':'-separated (the program's first argument)
OP_LIBRARY = _bench().op_library()


def missing():
    """Why the C++ program cannot be built here, or None."""
    if not (shutil.which("g++") or shutil.which("c++")):
        return "no C++ compiler (g++ or c++) on PATH"
    for path, what in ((os.path.join(tf.sysconfig.get_include(), "tensorflow", "cc",
                                     "saved_model", "loader.h"), "TensorFlow C++ headers"),
                       (os.path.join(TF_DIR, "libtensorflow_cc.so.2"), "libtensorflow_cc.so.2"),
                       *((library, "tensorflow-text's op library")
                         for library in OP_LIBRARY.split(":"))):
        if not os.path.exists(path):
            return f"the installed wheel has no {what} ({path})"
    return None


def build_program(cache_dir):
    """The path of the compiled program: the one build of it, bench/serving_memory.py's,
    cached in `cache_dir` under a hash of its source and the compile flags."""
    return _bench().build_program(cache_dir)
