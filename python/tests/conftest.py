"""pytest set-up for numesh's Python tests: the package under test is the build tree's (CTest
puts <build>/python first on PYTHONPATH), and every test starts with an empty registry of
semantic axes and no last PartitionManager."""

import os
import pathlib

import pytest

import numesh
import numesh.partition_manager

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = pathlib.Path(os.environ.get("NUMESH_EFORMER_VECTORS", ROOT / "tests" / "data" / "eformer"))


@pytest.fixture(autouse=True)
def fresh_process_state():
    numesh.PartitionAxis.clear_registered_axes()
    numesh.partition_manager._last = None
    yield
    numesh.PartitionAxis.clear_registered_axes()
    numesh.partition_manager._last = None
