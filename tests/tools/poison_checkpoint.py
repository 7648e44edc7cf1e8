#!/usr/bin/python3
"""Copies a model folder and makes the first value of one F32 tensor of its model.safetensors
NaN: a checkpoint for the checks that numesh names non-finite weights where it reads them.

    poison_checkpoint.py SRC DST TENSOR

Only the standard library: a safetensors file is an 8-byte little-endian header length, a
JSON header of {name: {dtype, shape, data_offsets}} and the data after it.
"""
import json
import shutil
import struct
import sys


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    src, dst, tensor = sys.argv[1:]
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = f"{dst}/model.safetensors"
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        info = header.get(tensor)
        if info is None or info["dtype"] != "F32":
            print(f"poison_checkpoint: {path} has no F32 tensor {tensor}")
            return 1
        f.seek(8 + length + info["data_offsets"][0])
        f.write(struct.pack("<f", float("nan")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
