"""pytest set-up for numesh's Python tests: the package under test is the build tree's (CTest
puts <build>/python first on PYTHONPATH), and every test starts with an empty registry of
semantic axes and no last PartitionManager."""

import os
import pathlib

import pytest

import numesh
import numesh.partition_manager

# The numesh program the tests run (NUMESH_CLI) compares its results with this process's bit for
# bit: it keeps the OpenBLAS kernels OpenBLAS chose, as this process must, instead of starting
# again on faster ones where OpenBLAS chose old ones (docs/building.md).
os.environ["NUMESH_KEEP_OPENBLAS_CORE"] = "1"

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = pathlib.Path(os.environ.get("NUMESH_EFORMER_VECTORS", ROOT / "tests" / "data" / "eformer"))


@pytest.fixture(autouse=True)
def fresh_process_state():
    numesh.PartitionAxis.clear_registered_axes()
    numesh.partition_manager._last = None
    yield
    numesh.PartitionAxis.clear_registered_axes()
    numesh.partition_manager._last = None


def share_of_a_python_thread_during(call):
    """How much a Python thread that counts in a loop got done while `call()` ran, as a share of
    what it does alone over the same time: about 1 (it ran beside the call, on the other core)
    when the call releases the GIL, near 0 when the call holds it (the counter then waits out
    the whole call: Python switches threads only between bytecodes)."""
    import threading
    import time

    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=counter)
    thread.start()
    try:
        time.sleep(0.1)  # the counter alone (sleep releases the GIL)
        n0, t0 = count[0], time.perf_counter()
        time.sleep(0.2)
        rate = (count[0] - n0) / (time.perf_counter() - t0)
        n1, t1 = count[0], time.perf_counter()
        call()
        during = (count[0] - n1) / (rate * (time.perf_counter() - t1))
    finally:
        stop.set()
        thread.join()
    return during
