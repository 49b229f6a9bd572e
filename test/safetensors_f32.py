"""Test helper: the float32 tensors of a folder of .safetensors files (shardlm's exports with
export.dtype fp32), read with the standard library only: {name: array('f')}."""
import glob
import json
import struct
from array import array


def load(folder):
    tensors = {}
    for path in sorted(glob.glob(folder + "/*.safetensors")):
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        for name, info in json.loads(raw[8:8 + n]).items():
            if name == "__metadata__":
                continue
            assert info["dtype"] == "F32", (path, name, info["dtype"])
            a, b = info["data_offsets"]
            tensors[name] = array("f", raw[8 + n + a:8 + n + b])
    return tensors
