#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into tests/fuzz/corpus/<target>:
small real files from torch, safetensors and huggingface_hub (the venv of
scripts/setup.sh), files ckptio itself writes (through the Python binding over
build/libckptio.so), and a few hand-made edge cases. Regenerate with

    PYTHONPATH=python CKPTIO_LIB=build/libckptio.so .venv/bin/python tests/fuzz/make_corpus.py

It replaces the generated seeds and keeps the crash-* regression inputs (and
any other file whose name it does not write). The total stays well under
1 MiB: libFuzzer starts from the seeds, it does not need large ones."""

import io
import json
import os
import struct
import sys
import tempfile

import numpy as np
import safetensors.numpy
import torch
from huggingface_hub import save_torch_state_dict

import ckptio

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TARGETS = ("safetensors", "torch", "zstd_table", "hf_index", "reader")
PREFIX = "seed-"  # what this script owns; crash-* files are kept


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, PREFIX + name), "wb") as f:
        f.write(data)


def file_bytes(write):
    """Runs write(path) in a scratch directory and returns the file's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seed")
        write(path)
        with open(path, "rb") as f:
            return f.read()


def st_raw(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def arrays():
    rng = np.random.default_rng(15)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": np.arange(3, dtype=np.int64),
        "h": rng.standard_normal(5).astype(np.float16),
        "m": np.array([True, False]),
        "s": np.array(7, dtype=np.uint8),
        "e": np.zeros((0, 2), dtype=np.float64),
    }


def safetensors_seeds():
    a = arrays()
    out = {
        "st-numpy": safetensors.numpy.save(a, metadata={"format": "np"}),
        "st-numpy-one": safetensors.numpy.save({"x": a["w"]}),
        "st-ckptio-crc": file_bytes(lambda p: ckptio.save_file(a, p, metadata={"k": "v"})),
        "st-ckptio-nocrc": file_bytes(lambda p: ckptio.save_file({"x": a["b"]}, p, crc=False)),
        "st-empty": st_raw({}),
        "st-meta-only": st_raw({"__metadata__": {"a": "b"}}),
        "st-bf16": st_raw({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
        "st-escapes": st_raw({"t\\u00e9\"q": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\1"),
        "st-crc-key": st_raw({"__metadata__": {"ckptio.crc32.t": "d202ef8d"},
                              "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
    }
    from safetensors.torch import save as torch_st_save
    out["st-torch"] = torch_st_save({"a": torch.ones(2, 2, dtype=torch.bfloat16),
                                     "f8": torch.zeros(3, dtype=torch.float8_e4m3fn)})
    return out


def torch_seeds():
    def ts(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = {
        "pt-one": ts({"w": torch.ones(2, 2)}),
        "pt-nested": ts({"model": {"l.weight": base, "l.bias": torch.zeros(4, dtype=torch.float16)},
                         "step": 3, "lr": 0.5, "ok": True, "name": "adam"}),
        "pt-views": ts({"t": base.t(), "row": base[1], "shared": base}),
        "pt-dtypes": ts({"i8": torch.tensor([1, -2], dtype=torch.int8),
                         "bf": torch.tensor([1.5], dtype=torch.bfloat16),
                         "b": torch.tensor([True]), "c": torch.tensor(3, dtype=torch.int64)}),
        "pt-list": ts([torch.ones(1), (torch.zeros(1), None)]),
        "pt-ckptio": file_bytes(lambda p: ckptio.save_file({"x": arrays()["w"], "y": arrays()["b"]},
                                                        p, format="pt")),
        # A training checkpoint: tuple/int keys, an optimizer's state, numpy's RNG state.
        "pt-training": ts({"optim": {"state": {0: {"step": torch.tensor(1.0), "m": base[0]}},
                                     "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]},
                           (1, 2): base.t(), "rng": np.random.RandomState(0).get_state(), "b": b"\x00"}),
    }
    return out


def zstd_seeds():
    a = {"w": np.tile(np.arange(64, dtype=np.float32), 8), "b": np.arange(100, dtype=np.int16)}
    return {
        "zs-ckptio": file_bytes(lambda p: ckptio.save_file(a, p, compress=3)),
        "zs-ckptio-shuffle": file_bytes(lambda p: ckptio.save_file(a, p, compress=1, shuffle=True)),
    }


def hf_seeds():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        sd = {f"layer.{i}.weight": torch.zeros(16) for i in range(4)}
        save_torch_state_dict(sd, tmp, max_shard_size=100)
        with open(os.path.join(tmp, "model.safetensors.index.json"), "rb") as f:
            out["hf-hub"] = f.read()
    out["hf-min"] = b'{"metadata":{},"weight_map":{"a":"m-00001-of-00001.safetensors"}}'
    out["hf-meta"] = (b'{"metadata":{"total_size":1234,"format":"pt"},"weight_map":'
                      b'{"a.b":"x.safetensors","c":"y.safetensors","d":"x.safetensors"}}')
    out["hf-escapes"] = b'{"weight_map":{"\\u00e9\\n":"f\\u00e9.safetensors"}}'
    return out


def main():
    for t in TARGETS:
        d = os.path.join(CORPUS, t)
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.startswith(PREFIX):
                    os.unlink(os.path.join(d, name))
    st, pt, zs = safetensors_seeds(), torch_seeds(), zstd_seeds()
    for name, data in st.items():
        put("safetensors", name, data)
        put("reader", name, data)
    for name, data in pt.items():
        put("torch", name, data)
        put("reader", name, data)
    for name, data in zs.items():
        put("zstd_table", name, data)
        put("reader", name, data)
    for name, data in hf_seeds().items():
        put("hf_index", name, data)
    total = 0
    for t in TARGETS:
        d = os.path.join(CORPUS, t)
        files = os.listdir(d)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        total += size
        print(f"make_corpus: {t}: {len(files)} files, {size} bytes")
    print(f"make_corpus: total {total} bytes")
    if total >= 1 << 20:
        sys.exit("make_corpus: the corpus grew past 1 MiB; keep the seeds small")


if __name__ == "__main__":
    main()
