"""ckptio next to its peers (torch.save / torch.load, safetensors, numpy; and
with --peers2 the second ring: runai-model-streamer, fastsafetensors,
tensorizer) on the same in-memory state dicts, each figure beside the raw
limit of the disk or memory measured in the same run (the best of several
ways of reading or writing the same file), interleaved, the order of the
contenders rotated each round, as bench/README.md asks.

Run it through bench/peers/run.sh, which builds the library and picks the
interpreter; `python peers.py --help` lists the options.
"""

import argparse
import csv
import ctypes
import errno
import gc
import json
import math
import mmap
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 4096
RAW_BLOCK = 8 << 20          # as src/cli/rawlimit.c: 8 MiB requests ...
RAW_DEPTH = 32               # ... 32 in flight (32 threads doing blocking pwrite/pread)
RAW_BUF = 512 << 20          # the raw steps cycle through this much touched memory
# The other ways of the raw limit (as src/cli/rawlimit.c): a buffered
# sequential read of 1 MiB requests behind the kernel's readahead, and
# buffered preads by 16 threads of 8 MiB each: runai-model-streamer's file
# system concurrency (RUNAI_STREAMER_CONCURRENCY, default 16) and chunk (8 MiB
# in 0.17; its default strategy there is io_uring O_DIRECT at depth 64, the
# fourth way, with 16 buffered workers as the fallback). Writes: buffered
# 8 MiB + fdatasync.
RAW_SEQ_BLOCK = 1 << 20
RAW_PAR_THREADS = 16
RAW_PAR_BLOCK = 8 << 20
MEMCPY_BUF = 256 << 20       # memcpy: copies between two touched buffers of this size


def import_peers():
    """The modules every contender (and the RSS baseline) imports."""
    import torch  # noqa: F401
    import safetensors  # noqa: F401
    import safetensors.torch  # noqa: F401
    import ckptio  # noqa: F401
    import ckptio.torch  # noqa: F401
    return sys.modules["torch"], sys.modules["safetensors"], sys.modules["ckptio"]


# ------------------------------------------------------------------ sizes

def parse_size(text):
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
             "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    i = 0
    while i < len(t) and (t[i].isdigit() or t[i] == "."):
        i += 1
    if i == 0 or t[i:] not in units:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 256MiB, 1GiB)")
    return int(float(t[:i]) * units[t[i:]])


def size_label(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"


# ------------------------------------------------------------------ models

LLM_VOCAB = 32000


def _round_up(v, to):
    return (v + to - 1) // to * to


def llm_dims(target):
    """The shapes `ckptio bench --shapes llm` builds (src/cli/synth.c): the
    widest hidden size with about 128 units per layer that fits, then the
    nearest number of layers."""
    inter = lambda h: _round_up(8 * h // 3, 256)  # noqa: E731
    fixed = lambda h: 2 * LLM_VOCAB * h * 2 + 4 * h  # noqa: E731
    layer = lambda h: 4 * h * h * 2 + 3 * inter(h) * h * 2 + 2 * h * 4  # noqa: E731
    for h in range(16384, 63, -64):
        layers = max(h // 128, 1)
        if fixed(h) + layers * layer(h) > target:
            continue
        layers = (target - fixed(h) + layer(h) // 2) // layer(h)
        return h, max(layers, 1), inter(h)
    raise SystemExit(f"size {target} is too small for the llm model")


def model_specs(kind, target):
    """[(name, torch dtype name, shape)] of the state dict."""
    if kind == "llm":
        h, layers, f = llm_dims(target)
        specs = [("model.embed_tokens.weight", "bfloat16", (LLM_VOCAB, h))]
        for i in range(layers):
            p = f"model.layers.{i}."
            for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
                specs.append((p + f"self_attn.{k}.weight", "bfloat16", (h, h)))
            specs.append((p + "mlp.gate_proj.weight", "bfloat16", (f, h)))
            specs.append((p + "mlp.up_proj.weight", "bfloat16", (f, h)))
            specs.append((p + "mlp.down_proj.weight", "bfloat16", (h, f)))
            specs.append((p + "input_layernorm.weight", "float32", (h,)))
            specs.append((p + "post_attention_layernorm.weight", "float32", (h,)))
        specs.append(("model.norm.weight", "float32", (h,)))
        specs.append(("lm_head.weight", "bfloat16", (LLM_VOCAB, h)))
        return specs, f"hidden {h}, {layers} layers, MLP {f}, vocab {LLM_VOCAB}; bf16, norms fp32"
    # nn.Sequential of 10 x Linear(d, d), fp32: 10 * (4 d^2 + 4 d) <= target
    d = int(math.isqrt(target // 40))
    while 10 * (4 * (d + 1) ** 2 + 4 * (d + 1)) <= target:
        d += 1
    while 10 * (4 * d * d + 4 * d) > target:
        d -= 1
    specs = []
    for i in range(10):
        specs.append((f"{i}.weight", "float32", (d, d)))
        specs.append((f"{i}.bias", "float32", (d,)))
    return specs, f"10 x Linear({d}, {d}) fp32, weights + biases"


def build_state_dict(torch, specs):
    """Allocates every tensor and writes every byte (normal_ touches each
    page), before anything is timed."""
    gen = torch.Generator().manual_seed(1234)
    sd = {}
    for name, dt, shape in specs:
        t = torch.empty(shape, dtype=getattr(torch, dt))
        t.normal_(0.0, 0.02, generator=gen)
        sd[name] = t
    return sd


def byte_view(v):
    """A flat uint8 numpy view (no copy) of whatever a contender returned."""
    import torch
    import ckptio
    if isinstance(v, torch.Tensor):
        return v.reshape(-1).view(torch.uint8).numpy()
    if isinstance(v, ckptio.Tensor):
        return np.asarray(v.buffer).reshape(-1).view(np.uint8)
    return np.asarray(v).reshape(-1).view(np.uint8)


TOUCH = {"mode": "byte"}


def touch_words():
    return "touch every byte" if TOUCH["mode"] == "byte" else "touch every page"


def touch_one(v):
    """Reads one byte of every 4 KiB page of a returned tensor (plus its last
    byte, so a tensor that straddles pages has each of them read): the same
    cheap pass for every contender, and enough to fault in every page of a
    lazily mapped (mmap) result. With --touch byte, sums every byte instead
    (as 8-byte words; the tail byte by byte)."""
    u = byte_view(v)
    if not u.size:
        return 0
    if TOUCH["mode"] == "byte":
        # The buffer's start may not be 8-byte aligned: sum the head and
        # tail bytes, the aligned middle as words.
        head = (-u.ctypes.data) % 8
        head = min(head, u.size)
        mid = (u.size - head) // 8 * 8
        return (int(u[:head].sum(dtype=np.uint64))
                + int(u[head:head + mid].view(np.uint64).sum(dtype=np.uint64))
                + int(u[head + mid:].sum(dtype=np.uint64)))
    return int(u[::PAGE].sum(dtype=np.uint64)) + int(u[-1])


def touch(obj):
    """touch_one over every tensor of a returned dict."""
    return sum(touch_one(v) for v in obj.values())


def touch_consume(name, v):
    """What a streaming contender does with each tensor as it is yielded:
    the same touch pass, before the next one may reuse its buffer."""
    touch_one(v)


# ------------------------------------------------------------------ contenders

def ckptio_views(torch, ckptio, sd):
    """What ckptio.save_file takes, without copies: numpy views of the torch
    tensors; bf16 (which numpy lacks) as ckptio.Tensor over an int16 view."""
    out = {}
    for k, t in sd.items():
        if t.dtype == torch.bfloat16:
            out[k] = ckptio.Tensor("BF16", t.shape, t.view(torch.int16).numpy())
        else:
            out[k] = t.numpy()
    return out


def numpy_views(torch, sd):
    """np.savez takes numpy arrays: the same views (bf16 as int16)."""
    return {k: (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
            for k, t in sd.items()}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    fsync_path(os.path.dirname(os.path.abspath(path)) or ".")


class Contenders:
    def __init__(self):
        self.torch, self.safetensors, self.ckptio = import_peers()
        import safetensors.torch as st_torch
        self.st_torch = st_torch
        self.ck_torch = sys.modules["ckptio.torch"]
        # Where save_file takes its options from (the binding has moved it
        # between releases): the module and the name the no-fsync swap patches.
        self._opt_mod, self._opt_name = next(
            (m, n) for m in (sys.modules.get("ckptio.numpy"), self.ckptio) if m is not None
            for n in ("options", "_options") if hasattr(m, n))

    # Saves. `durable` adds what makes the bytes durable: ckptio does it
    # itself (fdatasync of its temp file, rename, directory fsync); the peers
    # get an fsync of the file and of its directory.
    def save_ckptio(self, sd, path, durable, fmt):
        views = ckptio_views(self.torch, self.ckptio, sd)
        if durable:
            self.ckptio.save_file(views, path, format=fmt)
            return
        # The binding has no fsync switch: swap in options with fsync = 0
        # (the library's own CKPTIO_OPTIONS_INIT field) for this call only.
        orig = getattr(self._opt_mod, self._opt_name)

        def no_fsync(ctx, crc):
            o = orig(ctx, crc)
            o.fsync = 0
            return o
        setattr(self._opt_mod, self._opt_name, no_fsync)
        try:
            self.ckptio.save_file(views, path, format=fmt)
        finally:
            setattr(self._opt_mod, self._opt_name, orig)

    def save_torch(self, sd, path, durable):
        with open(path, "wb") as f:
            self.torch.save(sd, f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable:
            fsync_dir(path)

    def save_safetensors(self, sd, path, durable):
        self.st_torch.save_file(sd, path)
        if durable:
            fsync_path(path)
            fsync_dir(path)

    def save_numpy(self, sd, path, durable):
        arrays = numpy_views(self.torch, sd)
        with open(path, "wb") as f:
            np.savez(f, **arrays)  # uncompressed zip of one .npy per tensor
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if durable:
            fsync_dir(path)

    # Loads: each returns name -> tensor / array.
    def load_ckptio(self, path):
        # The copying load: fresh memory filled by parallel preads.
        return self.ckptio.load_file(path, backend="pread")

    def load_ckptio_map(self, path):
        # The zero-copy load (the default on the CPU): torch tensors viewing
        # a private copy-on-write mapping, every CRC checked over it first.
        return self.ck_torch.load_file(path, mmap=True)

    def load_torch(self, path):
        return self.torch.load(path)

    def load_torch_mmap(self, path):
        return self.torch.load(path, mmap=True, weights_only=True)

    def load_safetensors(self, path):
        return self.st_torch.load_file(path)

    def load_safetensors_pread(self, path):
        # safetensors >= 0.8 only; its default backend is "mmap".
        return self.st_torch.load_file(path, backend="pread")

    def load_numpy(self, path):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}

    # The second ring (--peers2). Their modules are imported by prepare(),
    # before the clock, as torch and safetensors are for everyone; a load
    # into a model (MODEL_LOADS) has its model built there too.
    def prepare(self, name, path=None):
        mod = PEER_MODULES.get(name)
        if mod:
            __import__(mod)
        self.model = built_model(self.ck_torch, path) if name in MODEL_LOADS and path else None

    # A load into a model built before the clock (as an inference server
    # restores weights); the model's state dict is what is touched.
    def load_model_ckptio(self, path):
        self.ck_torch.load_model(self.model, path)
        return self.model.state_dict()

    def load_model_safetensors(self, path):
        self.st_torch.load_model(self.model, path)
        return self.model.state_dict()

    def save_tensorizer(self, sd, path, durable):
        from tensorizer import TensorSerializer
        s = TensorSerializer(path)
        s.write_state_dict(sd)
        s.close()
        if durable:
            fsync_path(path)
            fsync_dir(path)

    def load_tensorizer(self, path):
        from tensorizer import TensorDeserializer
        d = TensorDeserializer(path, device="cpu")
        try:
            return dict(d.items())
        finally:
            d.close()

    def load_fastsafetensors(self, path):
        # Its tensors keep their buffer alive after the context closes.
        from fastsafetensors import fastsafe_open
        with fastsafe_open(filenames=[path], nogds=True, device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def load_ckptio_default(self, path):
        # The library's default call, whatever its default is at the time:
        # what the issue judges.
        return self.ck_torch.load_file(path)

    def load_ckptio_torch_copy(self, path):
        return self.ck_torch.load_file(path, backend="pread")

    def load_runai_keep(self, path):
        # As a user of 0.17 keeps a state dict: stream_file's owned=True
        # (its default) yields tensors the caller owns, valid after the
        # streamer closes, so none is copied (until 1.0 of this bench, each
        # was cloned: a copy no user of 0.17 pays).
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as st:
            st.stream_file(path, owned=True)
            return dict(st.get_tensors())

    # Streaming: consume(name, tensor) on each tensor as it arrives; nothing
    # is kept.
    def stream_runai(self, path, consume):
        from runai_model_streamer import SafetensorsStreamer
        with SafetensorsStreamer() as st:
            st.stream_file(path)
            for k, t in st.get_tensors():
                consume(k, t)

    def stream_ckptio(self, path, consume):
        # In file order, as runai yields them.
        with self.ck_torch.safe_open(path) as f:
            for k in f.offset_keys():
                consume(k, f.get_tensor(k))

    # The usual loop over a safetensors file, `for k in f.keys()`: sorted
    # names, which leave file order wherever dtypes are mixed.
    def stream_ckptio_keys(self, path, consume):
        with self.ck_torch.safe_open(path) as f:
            for k in f.keys():
                consume(k, f.get_tensor(k))

    def stream_safetensors_keys(self, path, consume):
        from safetensors import safe_open
        with safe_open(path, "pt") as f:
            for k in f.keys():
                consume(k, f.get_tensor(k))


# name, label, file key, save function
SAVES = [
    ("ckptio_st", "ckptio save_file (safetensors)", "ckptio_st",
     lambda c, sd, p, d: c.save_ckptio(sd, p, d, "safetensors")),
    ("ckptio_pt", "ckptio save_file (format=pt)", "ckptio_pt",
     lambda c, sd, p, d: c.save_ckptio(sd, p, d, "pt")),
    ("torch", "torch.save", "torch", lambda c, sd, p, d: c.save_torch(sd, p, d)),
    ("safetensors", "safetensors.torch.save_file", "safetensors",
     lambda c, sd, p, d: c.save_safetensors(sd, p, d)),
    ("numpy", "numpy.savez (uncompressed)", "numpy", lambda c, sd, p, d: c.save_numpy(sd, p, d)),
    ("tensorizer", "tensorizer TensorSerializer (its own format)", "tensorizer",
     lambda c, sd, p, d: c.save_tensorizer(sd, p, d)),
]
FILE_EXT = {"ckptio_st": ".safetensors", "ckptio_pt": ".pt", "torch": ".pt",
            "safetensors": ".safetensors", "numpy": ".npz", "tensorizer": ".tensors"}
# Contender -> the module prepare() imports before the clock (and the pip
# package run.sh installs when it is missing).
PEER_MODULES = {"runai_stream": "runai_model_streamer", "runai_keep": "runai_model_streamer",
                "fastsafetensors": "fastsafetensors", "tensorizer": "tensorizer"}
# name, label, file it reads (written by that save), load function
LOADS = [
    ("ckptio_st", "ckptio load_file (safetensors, backend='pread': copy)", "ckptio_st",
     lambda c, p: c.load_ckptio(p)),
    ("ckptio_pt", "ckptio load_file (.pt, backend='pread': copy)", "ckptio_pt",
     lambda c, p: c.load_ckptio(p)),
    ("ckptio_st_map", "ckptio.torch.load_file (safetensors, zero-copy, CRC checked)", "ckptio_st",
     lambda c, p: c.load_ckptio_map(p)),
    ("ckptio_pt_map", "ckptio.torch.load_file (.pt, zero-copy, CRC checked)", "ckptio_pt",
     lambda c, p: c.load_ckptio_map(p)),
    ("torch", "torch.load", "torch", lambda c, p: c.load_torch(p)),
    ("torch_mmap", "torch.load(mmap=True, weights_only=True)", "torch",
     lambda c, p: c.load_torch_mmap(p)),
    ("safetensors", "safetensors.torch.load_file", "safetensors",
     lambda c, p: c.load_safetensors(p)),
    ("safetensors_pread", "safetensors.torch.load_file(backend=\"pread\")", "safetensors",
     lambda c, p: c.load_safetensors_pread(p)),
    ("numpy", "numpy.load (.npz)", "numpy", lambda c, p: c.load_numpy(p)),
    # The second ring, each on ckptio's safetensors file where its format
    # allows. "keep": a state dict is returned; "stream": each tensor is
    # touched as it is yielded and nothing is kept.
    ("ckptio_default", "ckptio.torch.load_file(path) (default call; keep)", "ckptio_st",
     lambda c, p: c.load_ckptio_default(p)),
    ("ckptio_torch_copy", "ckptio.torch.load_file(path, backend='pread') (keep)", "ckptio_st",
     lambda c, p: c.load_ckptio_torch_copy(p)),
    ("ckptio_stream", "ckptio.torch.safe_open, get_tensor each, touched as read (stream)",
     "ckptio_st", lambda c, p: _streamed(c.stream_ckptio, p)),
    ("ckptio_stream_keys", "ckptio.torch.safe_open, get_tensor for k in keys() (sorted names; stream)",
     "ckptio_st", lambda c, p: _streamed(c.stream_ckptio_keys, p)),
    ("safetensors_stream_keys", "safetensors safe_open, get_tensor for k in keys() (sorted names; stream)",
     "ckptio_st", lambda c, p: _streamed(c.stream_safetensors_keys, p)),
    ("runai_stream", "runai-model-streamer SafetensorsStreamer, touched as yielded (stream)",
     "ckptio_st", lambda c, p: _streamed(c.stream_runai, p)),
    ("runai_keep", "runai-model-streamer SafetensorsStreamer, owned tensors kept (keep)",
     "ckptio_st", lambda c, p: c.load_runai_keep(p)),
    ("fastsafetensors", "fastsafetensors fastsafe_open (cpu, nogds; keep)", "ckptio_st",
     lambda c, p: c.load_fastsafetensors(p)),
    ("tensorizer", "tensorizer TensorDeserializer (its own file; keep)", "tensorizer",
     lambda c, p: c.load_tensorizer(p)),
    ("ckptio_model", "ckptio.torch.load_model into a model built before the clock", "ckptio_st",
     lambda c, p: c.load_model_ckptio(p)),
    ("safetensors_model", "safetensors.torch.load_model into a model built before the clock", "ckptio_st",
     lambda c, p: c.load_model_safetensors(p)),
]
MODEL_LOADS = ("ckptio_model", "safetensors_model")


def built_model(ct, path):
    """A module with a parameter of the file's shape and dtype for each of
    its tensors (under the same dotted names), every page written: the
    model an inference server builds before it loads the weights. ct:
    ckptio.torch (its safe_open reads the header; s3:// too)."""
    import torch
    root = torch.nn.Module()
    with ct.safe_open(path) as f:
        for name in f.offset_keys():
            s = f.get_slice(name)
            *parents, leaf = name.split(".")
            parent = root
            for part in parents:
                if not hasattr(parent, part):
                    parent.add_module(part, torch.nn.Module())
                parent = getattr(parent, part)
            t = torch.zeros(s.get_shape(), dtype=s.dtype)
            parent.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


# The streaming contenders: name -> (contenders, path, consume) -> None.
STREAMS = {"ckptio_stream": lambda c, p, f: c.stream_ckptio(p, f),
           "ckptio_stream_keys": lambda c, p, f: c.stream_ckptio_keys(p, f),
           "safetensors_stream_keys": lambda c, p, f: c.stream_safetensors_keys(p, f),
           "runai_stream": lambda c, p, f: c.stream_runai(p, f)}
# The first ring (the default) and --peers2: the second ring and what it is
# compared with (issue 26).
FIRST_SAVES = ["ckptio_st", "ckptio_pt", "torch", "safetensors", "numpy"]
FIRST_LOADS = ["ckptio_st", "ckptio_pt", "ckptio_st_map", "ckptio_pt_map", "torch", "torch_mmap",
               "safetensors", "safetensors_pread", "numpy"]
PEERS2_SAVES = ["ckptio_st", "torch", "safetensors", "numpy", "tensorizer"]
PEERS2_LOADS = ["ckptio_default", "ckptio_torch_copy", "ckptio_stream", "runai_stream",
                "runai_keep", "fastsafetensors", "tensorizer", "safetensors",
                "safetensors_pread", "torch", "numpy"]
# With --peers2 every safetensors reader reads the one file ckptio wrote.
SAME_FILE = {"on": False, "loads": ("safetensors", "safetensors_pread")}


def load_file_key(name, fkey):
    return "ckptio_st" if SAME_FILE["on"] and name in SAME_FILE["loads"] else fkey


def _streamed(stream, path):
    """A streaming contender run as a load: every tensor touched as it
    arrives; returns an empty dict (nothing kept, nothing left to touch)."""
    stream(path, touch_consume)
    return {}
LOAD_BY_NAME = {l[0]: l for l in LOADS}
# Measured beside the contenders, not one of them.
REFERENCES = {"raw_fresh": "raw O_DIRECT read into fresh, unfaulted memory (reference)",
              "raw_thp": "raw O_DIRECT read, 32 x 8 MiB, into a 256 MiB window of 2 MiB pages "
                         "(reference, not in the limit)",
              "raw_pagecache": "cold file into the page cache through a private mapping, "
                               "32 threads populating 8 MiB each (reference)"}


# ------------------------------------------------------------------ page cache

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_POPULATE_READ = 22  # Linux 5.14


def resident_fraction(path):
    """Share of the file's pages in the page cache (mincore on a mapping that
    is never touched, so asking does not change the answer)."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        try:
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            _libc.munmap(addr, size)
        return float((np.frombuffer(vec, np.uint8) & 1).sum()) / pages
    finally:
        os.close(fd)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_cache(path):
    buf = bytearray(8 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def cold_probe(path):
    """The timing sanity check: GB/s of a buffered 16 MiB read from the middle
    of a just-dropped file, and the same read again (now cached). Drops the
    file again afterwards."""
    size = os.path.getsize(path)
    n = min(16 << 20, size)
    off = (size // 2 - n // 2) // PAGE * PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(b"\1" * n)  # touched: the probe must time the read, not page faults
        rates = []
        for _ in range(2):
            t0 = time.perf_counter()
            got = os.preadv(fd, [buf], off)
            rates.append(got / (time.perf_counter() - t0) / 1e9)
    finally:
        os.close(fd)
    drop_cache(path)
    return rates


# ------------------------------------------------------------------ raw limits

def blocks_in_parallel(n, do, threads=RAW_DEPTH, block=RAW_BLOCK):
    """`threads` threads take [0, n) `block` bytes at a time, in order, and
    call do(offset, length) on each piece, the GIL released inside the calls.
    Returns the perf_counter() when all threads stood ready (the clock's
    start); the first OSError of any piece is raised after all have ended."""
    nxt, lock, err = [0], threading.Lock(), []
    start = threading.Barrier(threads + 1)

    def worker():
        start.wait()
        while not err:
            with lock:
                off = nxt[0]
                nxt[0] += block
            if off >= n:
                return
            try:
                do(off, min(block, n - off))
            except OSError as e:
                err.append(e)
                return

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    if err:
        raise err[0]
    return t0


class Raw:
    """Sequential O_DIRECT write and read of the same byte count on the same
    filesystem, with the method of src/cli/rawlimit.c: 32 threads each
    holding one blocking 8 MiB pwrite / pread (GIL released in the call), the
    file preallocated with posix_fallocate before the clock starts (as fio
    does by default), fdatasync inside the write's time. And memcpy: one
    thread (numpy.copyto) between two touched buffers."""

    def __init__(self):
        self.buf = mmap.mmap(-1, RAW_BUF)  # page aligned, as O_DIRECT needs
        self.view = memoryview(self.buf)
        rng = np.random.default_rng(7)
        np.frombuffer(self.buf, np.uint8)[:] = rng.integers(0, 256, RAW_BUF, np.uint8)
        self.src = np.frombuffer(self.buf, np.uint8)[:MEMCPY_BUF]
        self.dst = np.ones(MEMCPY_BUF, np.uint8)  # touched

    def _run(self, fd, n, writing, dest=None, threads=RAW_DEPTH, block=RAW_BLOCK, window=None):
        mem, cycle = (self.view, RAW_BUF) if dest is None else (dest, window)

        def io(off, ln):
            slot = off % cycle if cycle else off
            mv = mem[slot:slot + ln]
            done = 0
            while done < ln:
                if writing:
                    r = os.pwrite(fd, mv[done:], off + done)
                else:
                    r = os.preadv(fd, [mv[done:]], off + done)
                if r <= 0:
                    raise OSError("short I/O")
                done += r

        t0 = blocks_in_parallel(n, io, threads, block)
        if writing:
            os.fdatasync(fd)
        return time.perf_counter() - t0

    def write(self, path, n):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            os.posix_fallocate(fd, 0, n)
            return self._run(fd, n, True)
        finally:
            os.close(fd)

    def write_buffered(self, path, n):
        """One thread, sequential 8 MiB buffered writes, fdatasync inside the
        time; the file is dropped from the page cache afterwards (untimed)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, n)
            return self._run(fd, n, True, threads=1)
        finally:
            os.close(fd)
            drop_cache(path)

    def write_ways(self, path, n):
        """{way: seconds} of each way of writing n bytes to a new file at
        path (the last way's file stays, dropped from the page cache)."""
        out = {"raw_write_direct": self.write(path, n)}
        rm(path)
        out["raw_write_buffered"] = self.write_buffered(path, n)
        return out

    def read_buffered(self, path, n, threads, block):
        drop_cache(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            return self._run(fd, n, False, threads=threads, block=block)
        finally:
            os.close(fd)

    def read_ways(self, path, n):
        """{way: seconds} of each way of reading the cold file (dropped from
        the page cache before each): O_DIRECT at depth 32 x 8 MiB, buffered
        sequential 1 MiB with readahead, buffered 16 threads x 8 MiB, and
        O_DIRECT at depth 64 x 8 MiB (runai-model-streamer's default, which
        read this disk faster than depth 32 at times)."""
        return {"raw_read_direct": self.read(path, n),
                "raw_read_seq": self.read_buffered(path, n, 1, RAW_SEQ_BLOCK),
                "raw_read_par": self.read_buffered(path, n, RAW_PAR_THREADS, RAW_PAR_BLOCK),
                "raw_read_deep": self.read(path, n, threads=2 * RAW_DEPTH)}

    def read(self, path, n, fresh=False, threads=RAW_DEPTH):
        """fresh: into n bytes of new, untouched memory, whose pages fault in
        inside the reads, as they do for every loader that returns new
        tensors; else into the touched buffer."""
        drop_cache(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE) if fresh else None
        try:
            return self._run(fd, n, False, memoryview(buf) if fresh else None, threads=threads)
        finally:
            os.close(fd)
            if buf is not None:
                buf.close()

    def read_thp(self, path, n):
        """The O_DIRECT read at depth 32 x 8 MiB into one 256 MiB window in
        transparent huge pages that the requests cycle through (as
        src/cli/rawlimit.c's cli_raw_thp): an 8 MiB request is then 4
        contiguous pieces, not 2048 pages, and this virtual disk moves those
        much faster. A reference, not one of the limit's ways (a caller's
        tensors are in 4 KiB pages), but a streamer reading into buffers of
        its own may reach it."""
        huge = 2 << 20
        window = RAW_DEPTH * RAW_BLOCK
        # Private: a shared anonymous map is shmem, which madvise does not
        # make huge.
        m = mmap.mmap(-1, window + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            skip = (-addr) % huge
            mv = memoryview(m)[skip:skip + window]
            np.frombuffer(mv, np.uint8)[:] = 1  # touched before the clock
            drop_cache(path)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            try:
                return self._run(fd, n, False, mv, window=window)
            finally:
                os.close(fd)
                del mv
        finally:
            m.close()

    def pagecache(self, path, n):
        """The cold file into the page cache the way a zero-copy load gets
        it: a private read-only mapping, RAW_DEPTH threads each populating
        RAW_BLOCK at a time (MADV_POPULATE_READ; ctypes drops the GIL). No
        CRC and no touch: the ceiling of the mapped path. None where the
        kernel lacks MADV_POPULATE_READ."""
        drop_cache(path)
        fd = os.open(path, os.O_RDONLY)
        addr = _libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")

        def populate(off, ln):
            if _libc.madvise(addr + off, ln, MADV_POPULATE_READ) != 0:
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_READ)")

        try:
            t0 = blocks_in_parallel(n, populate)
            return time.perf_counter() - t0
        except OSError as e:
            if e.errno == errno.EINVAL:  # no MADV_POPULATE_READ before Linux 5.14
                return None
            raise
        finally:
            _libc.munmap(addr, n)

    def memcpy(self, n):
        t0 = time.perf_counter()
        left = n
        while left > 0:
            k = min(left, MEMCPY_BUF)
            np.copyto(self.dst[:k], self.src[:k])
            left -= k
        return time.perf_counter() - t0


# ------------------------------------------------------------------ measuring

def usage():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime, ru.ru_minflt, ru.ru_majflt


PRIME = {"bytes": 0, "on": False}


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def settle():
    """Between timed steps: no writeback of an earlier step may overlap the
    next one, and nothing freed may linger. Then the memory primer: on these
    VMs memory freed more than a second or two ago has gone back to the host
    (virtio-balloon free page reporting), and the next first touch of it
    costs a host fault per page (0.4-1 GB/s instead of 5-7 GB/s, see
    profile.py). Whichever contender ran right after another one freed its
    result would get hot memory and the one after a pause cold memory; so
    before every timed step the same amount of memory is touched and freed,
    and every contender that allocates starts from the same, hot, state."""
    gc.collect()
    os.sync()
    n = PRIME["bytes"]
    if n:
        a = np.ones(n, np.uint8)
        del a


# A timed child's word that its imports and setup are done (await_go).
READY = "PEERS-READY"


def await_go():
    """In a timed child, its imports and setup done, just before its clock:
    asks the parent (run_settled) to settle() now and waits for it. Settled
    before the child started, the primed memory would be partly handed back
    to the host by the clock's start: an interpreter's imports take 1.4-2 s
    here, and free page reporting returns memory freed 2 s ago (the kernel's
    page_reporting delay), so Python contenders would start on colder memory
    than the C ceilings, which start at once, and by how much would vary
    from run to run. Outside run_settled it returns at once."""
    if os.environ.get("PEERS_SETTLED"):
        print(READY, flush=True)
        sys.stdin.readline()


def run_settled(cmd, env, timeout=900, signals=True, **popen):
    """Runs a timed child; the machine is settled just before its clock:
    when it says so (await_go), or, for a child that does not (signals=False:
    the C clients, which start their clocks at once), before it starts.
    Returns a CompletedProcess with its stdout (without the ready line) and
    stderr; the child is killed after timeout seconds."""
    if not signals:
        settle()
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **popen)
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, env=dict(env, PEERS_SETTLED="1"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, text=True, **popen)
        watchdog = threading.Timer(timeout, p.kill)
        watchdog.start()
        out = []
        try:
            for line in p.stdout:
                if line.rstrip("\n") != READY:
                    out.append(line)
                    continue
                settle()
                p.stdin.write("go\n")
                p.stdin.close()
            p.wait()
        finally:
            watchdog.cancel()
        err.seek(0)
        return subprocess.CompletedProcess(cmd, p.returncode, "".join(out), err.read())


def timed(fn):
    u0 = usage()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    u1 = usage()
    return dt, out, {"user_s": u1[0] - u0[0], "sys_s": u1[1] - u0[1],
                     "minflt": u1[2] - u0[2], "majflt": u1[3] - u0[3]}


def rm(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def verify_load(sd, got, what):
    """Untimed, once per case: every byte of every tensor as saved."""
    if set(got) != set(sd):
        raise SystemExit(f"{what}: names differ from the state dict")
    for k, t in sd.items():
        if not np.array_equal(byte_view(got[k]), byte_view(t)):
            raise SystemExit(f"{what}: tensor {k} differs from what was saved")


DTYPE_SIZE = {"bfloat16": 2, "float32": 4}
SAVE_BY_NAME = {s[0]: s for s in SAVES}


class InProcess:
    """The warm variant: every step in this interpreter, on one state dict,
    after warm_up() has run each contender once."""

    def __init__(self, c, kind, target):
        self.c = c
        t0 = time.perf_counter()
        self.sd = build_state_dict(c.torch, model_specs(kind, target)[0])
        self.built_s = time.perf_counter() - t0

    def save(self, name, path, durable):
        return timed(lambda: SAVE_BY_NAME[name][3](self.c, self.sd, path, durable))

    def load(self, name, path, verify):
        return timed_load(self.c, name, path, self.sd if verify else None)


def timed_load(c, name, path, sd=None):
    """One timed load + touch of `path` by contender `name`, checked against
    sd (untimed) when given: (seconds, None, usage)."""
    c.prepare(name, path)
    res = resident_fraction(path)
    dt, out, u = timed(lambda: _load_touch(LOAD_BY_NAME[name][3], c, path))
    u.update(resident_before=res, touch_s=out[1])
    if sd is not None:
        if name in STREAMS:
            # Nothing was kept: stream again, untimed, keeping copies.
            got = {}
            STREAMS[name](c, path, lambda k, t: got.__setitem__(k, t.clone()))
            verify_load(sd, got, f"{name} ({path})")
        else:
            verify_load(sd, out[0], f"{name} ({path})")
    return dt, None, u


class Fresh:
    """The fresh variant (--fresh): every timed step in a new interpreter, as
    a script that saves or loads once runs it. The child imports what every
    contender imports and builds its state dict before the clock starts;
    what the first call pays (a context, lazy setup, fresh memory) is timed."""

    def __init__(self, kind, target):
        self.kind, self.target, self.built_s = kind, target, 0.0

    def _child(self, **step):
        step.update(kind=self.kind, target=self.target, touch=TOUCH["mode"])
        p = run_settled([sys.executable, os.path.abspath(__file__), "--step", json.dumps(step)], os.environ)
        if p.returncode != 0:
            raise SystemExit(f"step {step} failed in its interpreter:\n{p.stderr}")
        got = json.loads(p.stdout.strip().splitlines()[-1])
        return got.pop("seconds"), None, got

    def save(self, name, path, durable):
        return self._child(op="save", name=name, path=path, durable=durable)

    def load(self, name, path, verify):
        return self._child(op="load", name=name, path=path, verify=verify)


def step_child(step):
    """Runs in a fresh interpreter (Fresh): one timed save or load + touch;
    prints its seconds and usage as JSON."""
    TOUCH["mode"] = step["touch"]
    c = Contenders()
    specs = model_specs(step["kind"], step["target"])[0]
    sd = build_state_dict(c.torch, specs) if step["op"] == "save" or step["verify"] else None
    c.prepare(step["name"], step["path"])  # a peer's module, imported before the clock
    gc.collect()
    await_go()
    if step["op"] == "save":
        dt, _, u = timed(lambda: SAVE_BY_NAME[step["name"]][3](c, sd, step["path"],
                                                               step["durable"]))
    else:
        dt, _, u = timed_load(c, step["name"], step["path"], sd)
    u["seconds"] = dt
    print(json.dumps(u))


STEPS = ("save", "save_nofsync", "load_cold", "load_warm")


def rotated(items, run):
    """The contenders' order in round `run`: rotated by one each round, so
    no contender always runs first (cold memory, a fresh disk queue) or
    right after the same neighbour."""
    items = list(items)
    k = run % len(items) if items else 0
    return items[k:] + items[:k]


def best_way(before, after):
    """Per way of a raw limit, the mean of its measurement before and after
    the block of contenders; and the best (shortest) of those means."""
    ways = {w: (before[w] + after[w]) / 2 for w in before}
    return ways, min(ways, key=ways.get)


def run_case(c, raw, kind, target, runs, d, rows, log, fresh, steps_on=STEPS):
    specs, desc = model_specs(kind, target)
    nbytes = sum(math.prod(shape) * DTYPE_SIZE[dt] for _, dt, shape in specs)
    steps = Fresh(kind, target) if fresh else InProcess(c, kind, target)
    raw_n = _round_up(nbytes, PAGE)
    label = size_label(target)
    log(f"\n== {kind} {label}: {len(specs)} tensors, {nbytes / 1e9:.3f} GB ({desc})"
        + ("; every timed step in a fresh interpreter" if fresh
           else f"; built and touched in {steps.built_s:.1f} s"))
    base = os.path.join(d, f".peers-{os.getpid()}-{kind}-{label}")
    load_keys = {load_file_key(n, fk) for n, _, fk, _ in LOADS}
    save_keys = {fk for _, _, fk, _ in SAVES}
    files = {k: base + "." + k + FILE_EXT[k] for k in sorted(load_keys | save_keys)}
    raw_path = base + ".raw"
    nofsync_path = base + ".nofsync"
    # Every file of the case, the raw file and a no-fsync save exist at once
    # (4 GiB x 7 with --peers2 --big): refuse before writing, not half way.
    need = (len(files) + 2) * raw_n + (1 << 30)
    free = shutil.disk_usage(d).free
    if free < need:
        raise SystemExit(f"{d}: {free / 2**30:.1f} GiB free, this case needs {need / 2**30:.1f} "
                         "GiB (its files, the raw file, a no-fsync save, 1 GiB spare)")
    log(f"  disk: {free / 2**30:.1f} GiB free in {d}, the case needs {need / 2**30:.1f} GiB")
    case = {"model": kind, "size": label, "bytes": nbytes, "tensors": len(specs), "desc": desc,
            "fresh": fresh}
    if PRIME["on"]:
        # Enough for a load's destination and the page cache of its file,
        # without pushing a warm file out of the page cache.
        PRIME["bytes"] = max(0, min(2 * nbytes + (256 << 20), mem_available() // 2 - (1 << 30)))
        case["prime_bytes"] = PRIME["bytes"]
        log(f"  memory primer before every timed step: {PRIME['bytes'] / 2**30:.2f} GiB")
    probes = []

    def row(run, op, name, seconds, limit_s, extra=None):
        r = dict(case)
        r.update(run=run, op=op, contender=name, seconds=seconds,
                 gbps=nbytes / seconds / 1e9,
                 limit_gbps=(raw_n / limit_s / 1e9) if limit_s else "",
                 vs_limit=(nbytes / seconds) / (raw_n / limit_s) if limit_s else "")
        r.update(extra or {})
        rows.append(r)
        lim = f"  ({r['vs_limit']:.2f} of limit)" if limit_s else ""
        if "resident_before" in r:
            lim += f"  cached before: {r['resident_before']:.0%}"
        if "touch_s" in r:
            lim += f", touch pass {r['touch_s']:.3f} s, {r['minflt']} minor faults"
        log(f"  run {run} {op:12s} {name:17s} {seconds:7.3f} s {r['gbps']:6.2f} GB/s{lim}")

    def limit_rows(run, name, before, after):
        """One row per way (x its best), then the best, the run's limit."""
        ways, best = best_way(before, after)
        for w, sec in ways.items():
            row(run, "limit", w, sec, ways[best], {"first_s": before[w], "second_s": after[w]})
        row(run, "limit", name, ways[best], ways[best], {"way": best})
        return ways[best]

    save_names = [n for n, *_ in SAVES]
    load_names = [n for n, *_ in LOADS]
    try:
        # Files no timed durable save of this run writes: written once, untimed.
        made = set(save_keys) if "save" in steps_on else set()
        for k in sorted(set(files) - made):
            steps.save(k, files[k], True)
        for run in range(runs):
            log(f"-- run {run + 1}/{runs}, order " + ", ".join(rotated(load_names, run)))
            w1 = None
            if "save" in steps_on:
                # Saves, durable: raw writes before and after, their mean is
                # the run's limit (the disk drifts within a run too).
                settle()
                w0 = raw.write_ways(raw_path, raw_n)
                rm(raw_path)
                results = {}
                for name in rotated(save_names, run):
                    fkey = SAVE_BY_NAME[name][2]
                    rm(files[fkey])
                    settle()
                    results[name] = steps.save(name, files[fkey], True)
                settle()
                w1 = raw.write_ways(raw_path, raw_n)
                rm(raw_path)
                wlim = limit_rows(run, "raw_write", w0, w1)
                for name, (dt, _, u) in results.items():
                    row(run, "save", name, dt, wlim, u)
            if "save_nofsync" in steps_on:
                # Saves without fsync (the page cache keeps what it likes).
                if w1 is None:
                    settle()
                    w1 = raw.write_ways(raw_path, raw_n)
                    rm(raw_path)
                results = {}
                for name in rotated(save_names, run):
                    settle()
                    results[name] = steps.save(name, nofsync_path, False)
                    rm(nofsync_path)
                settle()
                w2 = raw.write_ways(raw_path, raw_n)
                rm(raw_path)
                ways, best = best_way(w1, w2)
                for name, (dt, _, u) in results.items():
                    row(run, "save_nofsync", name, dt, ways[best], u)

            if "load_cold" in steps_on:
                # Cold loads: each file fdatasync'ed and dropped from the page cache.
                settle()
                raw.write(raw_path, raw_n)  # untimed: the file the raw reads read
                settle()
                r0 = raw.read_ways(raw_path, raw_n)
                results = {}
                for name in rotated(load_names, run):
                    path = files[load_file_key(name, LOAD_BY_NAME[name][2])]
                    settle()
                    drop_cache(path)
                    if run == 0 and name not in ("torch_mmap",) and name not in STREAMS:
                        probes.append((name, cold_probe(path)))
                    results[name] = steps.load(name, path, False)
                settle()
                r1 = raw.read_ways(raw_path, raw_n)
                rlim = limit_rows(run, "raw_read", r0, r1)
                settle()
                row(run, "load_cold", "raw_fresh", raw.read(raw_path, raw_n, fresh=True), rlim)
                settle()
                row(run, "load_cold", "raw_thp", raw.read_thp(raw_path, raw_n), rlim)
                settle()
                pc = raw.pagecache(raw_path, raw_n)
                if pc is not None:
                    row(run, "load_cold", "raw_pagecache", pc, rlim)
                for name, (dt, _, u) in results.items():
                    row(run, "load_cold", name, dt, rlim, u)
                rm(raw_path)

            if "load_warm" in steps_on:
                # Warm loads: each file read once through the page cache first.
                settle()
                m0 = raw.memcpy(nbytes)
                results = {}
                for name in rotated(load_names, run):
                    path = files[load_file_key(name, LOAD_BY_NAME[name][2])]
                    settle()
                    warm_cache(path)
                    results[name] = steps.load(name, path, run == 0)
                settle()
                m1 = raw.memcpy(nbytes)
                mlim = (m0 + m1) / 2 * raw_n / nbytes  # limits count raw_n bytes
                row(run, "limit", "memcpy", mlim, mlim, {"first_s": m0, "second_s": m1})
                for name, (dt, _, u) in results.items():
                    row(run, "load_warm", name, dt, mlim, u)
        for name, p in probes:
            log(f"  cold-cache check before {name}: 16 MiB read right after the drop "
                f"{p[0]:.2f} GB/s, the same again (cached) {p[1]:.2f} GB/s: "
                + ("dropped" if p[1] > 1.5 * p[0] else "NOT CLEARLY DROPPED"))
        case["probes"] = {k: p for k, p in probes}
        case["file_bytes"] = {k: os.path.getsize(p) for k, p in files.items()}
        return case, files
    except BaseException:
        for p in list(files.values()) + [raw_path, nofsync_path]:
            rm(p)
        raise


def warm_up(c, d):
    sd = {"a": c.torch.ones(64, 64, dtype=c.torch.bfloat16), "b": c.torch.ones(64)}
    path = os.path.join(d, f".peers-{os.getpid()}-warmup")
    try:
        keys = {fk for _, _, fk, _ in SAVES} | {load_file_key(n, fk) for n, _, fk, _ in LOADS}
        for fkey in sorted(keys):
            SAVE_BY_NAME[fkey][3](c, sd, path + "." + fkey, True)
        for name, _, fkey, fn in LOADS:
            file = path + "." + load_file_key(name, fkey)
            c.prepare(name, file)
            _load_touch(fn, c, file)
    finally:
        for k in FILE_EXT:
            rm(path + "." + k)


def _load_touch(fn, c, path):
    """Loads and touches; returns (result, seconds of the touch pass)."""
    out = fn(c, path)
    t0 = time.perf_counter()
    touch(out)
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------ peak RSS

def rss_child(name, path):
    """Runs in a fresh interpreter: imports what every contender imports,
    then (unless name is "baseline") loads `path` with contender `name` and
    touches it. Prints ru_maxrss and VmHWM in bytes."""
    import_peers()

    def status():
        got = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    got[k] = int(v.split()[0]) * 1024
        return got
    out = {}
    if name != "baseline":
        c = Contenders()
        c.prepare(name, path)
        warm_cache(path)
        fn = LOAD_BY_NAME[name][3]
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS now
        out["rss_before"] = status()["VmRSS"]
        res = _load_touch(fn, c, path)
        out["touched"] = touch(res[0])
    out.update(status())
    print(json.dumps(out))


def measure_rss(case, files, log):
    def child(name, path=""):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--rss-child", name,
                            path, TOUCH["mode"]], capture_output=True, text=True, env=os.environ)
        if p.returncode != 0:
            raise SystemExit(f"rss child {name} failed:\n{p.stderr}")
        return json.loads(p.stdout.strip().splitlines()[-1])
    base = [child("baseline")["VmHWM"] for _ in range(2)]
    baseline = min(base)
    out = {"baseline": baseline}
    for name, _, fkey, _ in LOADS:
        settle()
        got = child(name, files[load_file_key(name, fkey)])
        out[name] = got["VmHWM"] - baseline
        out[name + "_reset"] = got["VmHWM"] - got["rss_before"]
        log(f"  peak RSS {name:12s} {got['VmHWM'] / 2**20:8.0f} MiB - baseline "
            f"{baseline / 2**20:.0f} MiB = {out[name] / 2**20:8.0f} MiB "
            f"({out[name] / case['bytes']:.2f} x the tensors); above the RSS after imports "
            f"{out[name + '_reset'] / 2**20:.0f} MiB")
    return out


# ------------------------------------------------------------------ report

def machine_info(d):
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    real = os.path.realpath(d)
    best = ("", "?", "?")
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fs = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, fs, dev)
    return {"nproc": os.cpu_count(), "mem_bytes": mem, "cpu": cpu,
            "kernel": platform.release(), "dir": real, "fs_type": best[1],
            "fs_device": best[2], "fs_mount": best[0]}


def med(v):
    return statistics.median(v) if v else float("nan")


SAVE_REFS = ("ckptio_st", "ckptio_pt")
LOAD_REFS = ("ckptio_st", "ckptio_pt", "ckptio_st_map", "ckptio_pt_map", "ckptio_default",
             "ckptio_torch_copy", "ckptio_stream", "ckptio_stream_keys")
REF_TITLES = {"ckptio_st": "ckptio st", "ckptio_pt": "ckptio pt", "ckptio_st_map": "ckptio st map",
              "ckptio_pt_map": "ckptio pt map", "ckptio_default": "ckptio default",
              "ckptio_torch_copy": "ckptio pread", "ckptio_stream": "ckptio stream",
              "ckptio_stream_keys": "ckptio keys() loop"}
WAY_LABELS = {"raw_write_direct": "raw write, O_DIRECT 32 x 8 MiB in flight",
              "raw_write_buffered": "raw write, buffered 8 MiB + fdatasync",
              "raw_read_direct": "raw read, O_DIRECT 32 x 8 MiB in flight",
              "raw_read_seq": "raw read, buffered, 1 thread x 1 MiB (readahead)",
              "raw_read_par": "raw read, buffered, 16 threads x 8 MiB pread",
              "raw_read_deep": "raw read, O_DIRECT 64 x 8 MiB in flight"}


def summarize(rows):
    """Per case, op and contender: median and min / max of GB/s, the median
    of the per-run ratios to the limit and to ckptio (each run's pair ran
    side by side, so the ratio is taken per run first)."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["size"], r["op"], r["contender"]), []).append(r)
    ref = {"save": SAVE_REFS, "save_nofsync": SAVE_REFS, "load_cold": LOAD_REFS,
           "load_warm": LOAD_REFS}
    out = []
    for (model, size, op, name), rs in by.items():
        g = [r["gbps"] for r in rs]
        vl = [r["vs_limit"] for r in rs if r["vs_limit"] != ""]
        s = {"model": model, "size": size, "bytes": rs[0]["bytes"], "op": op, "contender": name,
             "runs": len(rs), "gbps_median": med(g), "gbps_min": min(g), "gbps_max": max(g),
             "seconds_median": med([r["seconds"] for r in rs]),
             # a limit's ways: x the best way of the same run
             "vs_limit_median": med(vl) if vl else 1.0,
             "vs_limit_min": min(vl) if vl else 1.0,
             "vs_limit_max": max(vl) if vl else 1.0}
        if op in ref:
            for refname in ref[op]:
                refrows = {r["run"]: r for r in by.get((model, size, op, refname), [])}
                # ckptio / this: how many times faster ckptio was, per run
                ratios = [refrows[r["run"]]["gbps"] / r["gbps"] for r in rs if r["run"] in refrows]
                if ratios:  # only the ckptio contenders this case measured
                    s[f"{refname}_over_this"] = med(ratios)
        for k in ("minflt", "user_s", "sys_s", "resident_before", "touch_s"):
            vals = [r[k] for r in rs if k in r and r[k] != ""]
            if vals:
                s[k + "_median"] = med(vals)
        out.append(s)
    return out


def op_titles():
    return [("save", "save, durable (fsync of file and directory)", "raw_write"),
            ("save_nofsync", "save, without fsync", "raw_write"),
            ("load_cold", f"load, cold page cache (+ {touch_words()})", "raw_read"),
            ("load_warm", f"load, warm page cache (the file read once by 8 MiB reads just before; "
                          f"+ {touch_words()})", "memcpy")]


def _ratio(v):
    return "" if v is None else f"{v:.2f}"


def format_tables(summary, cases, rss):
    lines = []
    save_labels = {n: l for n, l, *_ in SAVES}
    load_labels = {n: l for n, l, *_ in LOADS}
    load_labels.update(REFERENCES)
    lim_labels = dict(raw_write="raw write, best way of the run (limit)",
                      raw_read="raw read, best way of the run (limit)", memcpy="memcpy (limit)")
    idx = {(s["model"], s["size"], s["op"], s["contender"]): s for s in summary}
    for case in cases:
        m, sz = case["model"], case["size"]
        mine = [s for s in summary if (s["model"], s["size"]) == (m, sz)]
        # A column per ckptio contender this case measured.
        refs = [k for k in LOAD_REFS if any(s.get(k + "_over_this") is not None for s in mine)]
        lines.append(f"\n### {m} {sz}: {case['tensors']} tensors, {case['bytes'] / 1e9:.3f} GB "
                     f"({case['desc']})\n")
        lines.append("| step | contender | GB/s median | min-max | x limit | "
                     + "".join(f"{REF_TITLES[k]} / this | " for k in refs)
                     + "minor faults / 4 KiB |")
        lines.append("|---|---|---|---|---|" + "---|" * len(refs) + "---|")
        blank = "| " * len(refs) + "|"
        for op, title, lim in op_titles():
            names = [n for n, *_ in (SAVES if op.startswith("save") else LOADS)]
            if op == "load_cold":
                names += list(REFERENCES)
            labels = save_labels if op.startswith("save") else load_labels
            limop = idx.get((m, sz, "limit", lim))
            if limop and (op != "save_nofsync"):
                for w, wl in WAY_LABELS.items():
                    ws = idx.get((m, sz, "limit", w))
                    if ws and w.startswith(lim):
                        lines.append(f"| {title} | {wl} | {ws['gbps_median']:.2f} | "
                                     f"{ws['gbps_min']:.2f}-{ws['gbps_max']:.2f} | "
                                     f"{ws['vs_limit_median']:.2f} {blank}")
                lines.append(f"| {title} | {lim_labels[lim]} | {limop['gbps_median']:.2f} | "
                             f"{limop['gbps_min']:.2f}-{limop['gbps_max']:.2f} | 1 {blank}")
            for n in names:
                s = idx.get((m, sz, op, n))
                if not s:
                    continue
                flt = s.get("minflt_median")
                flt = f"{flt / (s['bytes'] / PAGE):.2f}" if flt is not None else ""
                lines.append(
                    f"| {title} | {labels[n]} | {s['gbps_median']:.2f} | "
                    f"{s['gbps_min']:.2f}-{s['gbps_max']:.2f} | {s['vs_limit_median']:.2f} | "
                    + "".join(f"{_ratio(s.get(k + '_over_this'))} | " for k in refs)
                    + f"{flt} |")
        r = rss.get((m, sz))
        if r:
            lines.append("")
            lines.append(f"Peak RSS loading it (a fresh interpreter per contender, warm cache, "
                         f"load + touch; its VmHWM minus the {r['baseline'] / 2**20:.0f} MiB "
                         "VmHWM of one that only imported torch, safetensors, numpy and ckptio; "
                         "cross-check: the peak above the RSS once imports were done, with "
                         "VmHWM reset through /proc/self/clear_refs):\n")
            lines.append("| contender | peak RSS above baseline, MiB | x tensor bytes "
                         "| peak above RSS after imports, MiB |")
            lines.append("|---|---|---|---|")
            for n, *_ in LOADS:
                if n in r:
                    lines.append(f"| {load_labels[n]} | {r[n] / 2**20:.0f} | "
                                 f"{r[n] / case['bytes']:.2f} | {r[n + '_reset'] / 2**20:.0f} |")
    return "\n".join(lines)


# (text, op, ckptio contender, against, goal ratio): the goals of issue 16
# item 5. `against` is a peer contender, "best" (the fastest peer of that run)
# or "limit" (the raw limit of that run). "{touch}" is the touch pass every
# timed load includes (--touch byte by default: every byte summed).
GOALS = [
    ("ckptio save (durable) >= 3x torch.save", "save", "ckptio_st", "torch", 3.0),
    ("ckptio save (durable) >= 3x safetensors save_file + fsync", "save", "ckptio_st",
     "safetensors", 3.0),
    ("ckptio save (durable) >= 0.95x the raw write", "save", "ckptio_st", "limit", 0.95),
    ("ckptio .pt save (durable) >= 3x torch.save", "save", "ckptio_pt", "torch", 3.0),
    ("ckptio copying load >= 1.1x the best peer (cold, + {touch})", "load_cold", "ckptio_st",
     "best", 1.1),
    ("ckptio zero-copy load >= 1.1x the best peer (cold, + {touch})", "load_cold",
     "ckptio_st_map", "best", 1.1),
    ("ckptio copying load >= 0.95x the raw read (cold, + {touch})", "load_cold", "ckptio_st",
     "limit", 0.95),
    ("ckptio zero-copy load >= 0.95x the raw read (cold, + {touch})", "load_cold",
     "ckptio_st_map", "limit", 0.95),
    ("(reference) ckptio copying load >= 0.95x the raw read into fresh memory (cold, + {touch})",
     "load_cold", "ckptio_st", "raw_fresh", 0.95),
    ("(reference) ckptio zero-copy load >= 0.95x the page cache's own fill (cold, + {touch})",
     "load_cold", "ckptio_st_map", "raw_pagecache", 0.95),
    ("ckptio zero-copy load, CRC checked, >= 0.6x safetensors load_file (warm, + {touch})",
     "load_warm", "ckptio_st_map", "safetensors", 0.6),
]
# A contender name + NO_TOUCH in a goal: its load alone, the time of its
# touch pass taken out (a keep job's touch runs after the load; the raw
# reads it is compared with have none).
NO_TOUCH = ":no-touch"
# The Done-means lines of issue 26 (the second ring, --peers2): cold loads
# in fresh interpreters, ratios per round, medians. "best_other" is the
# fastest peer of the round that is neither ckptio nor runai.
GOALS26 = [
    ("stream job: ckptio safe_open + get_tensor >= 1.1x runai-model-streamer (cold, + {touch})",
     "load_cold", "ckptio_stream", "runai_stream", 1.1),
    ("keep job: ckptio.torch.load_file(path), the default call, >= 1.1x runai-model-streamer "
     "keeping its owned tensors (cold, + {touch})", "load_cold", "ckptio_default", "runai_keep", 1.1),
    ("(info) keep job, ckptio.torch.load_file(backend='pread') / runai-model-streamer, owned tensors "
     "(cold, + {touch})", "load_cold", "ckptio_torch_copy", "runai_keep", 1.1),
    ("ckptio's default call >= 1.1x every other peer (cold, + {touch})", "load_cold",
     "ckptio_default", "best_other", 1.1),
    ("ckptio's default call >= 0.95x the best raw read of the round (cold, + {touch})",
     "load_cold", "ckptio_default", "limit", 0.95),
    ("(info) the keys() loop: ckptio safe_open / safetensors safe_open (cold, + {touch})",
     "load_cold", "ckptio_stream_keys", "safetensors_stream_keys", 1.1),
    ("(info) the keys() loop, ckptio safe_open / runai-model-streamer's stream (cold, + {touch})",
     "load_cold", "ckptio_stream_keys", "runai_stream", 1.1),
    ("(info) ckptio stream >= 0.95x the best raw read of the round (cold, + {touch})",
     "load_cold", "ckptio_stream", "limit", 0.95),
    ("(info) ckptio's default call without its touch pass / the best raw read of the round "
     "(the raw read has no touch pass)", "load_cold", "ckptio_default" + NO_TOUCH, "limit", 0.95),
    ("(info) ckptio save (durable) >= 0.95x the best raw write of the round", "save",
     "ckptio_st", "limit", 0.95),
    ("(info) ckptio save (durable) / tensorizer save + fsync", "save", "ckptio_st",
     "tensorizer", 1.1),
]
LIMIT_OF = {"save": "raw_write", "load_cold": "raw_read", "load_warm": "memcpy"}


def _against(rows, case, op, against):
    """run -> (GB/s of what a goal compares with, the limit's GB/s, its name)."""
    m, sz = case["model"], case["size"]
    mine = [r for r in rows if (r["model"], r["size"], r["op"]) == (m, sz, op)]
    if against == "limit":
        return {r["run"]: (r["limit_gbps"], r["limit_gbps"], LIMIT_OF[op]) for r in mine}
    # A load into a model is a job of its own: no goal compares with it.
    mine_jobs = [r for r in mine if r["contender"] not in MODEL_LOADS]
    if against == "best":
        peers = [r for r in mine_jobs if not r["contender"].startswith(("ckptio", "raw"))]
    elif against == "best_other":
        peers = [r for r in mine_jobs if not r["contender"].startswith(("ckptio", "raw", "runai"))]
    else:
        peers = [r for r in mine if r["contender"] == against]
    out = {}
    for r in peers:
        if r["run"] not in out or r["gbps"] > out[r["run"]][0]:
            out[r["run"]] = (r["gbps"], r["limit_gbps"], r["contender"])
    return out


def format_goals(rows, cases, goal_list=GOALS):
    """Per goal and case: the median over runs of (ckptio GB/s / what it is
    compared with) taken per run, its min-max, every run's ratio in run
    order, and the ceiling: what a saver or loader running exactly at the
    limit of the same run would score."""
    lines = ["| goal | case | measured ratio median (min-max) | met | per round "
             "| ceiling: limit / peer |",
             "|---|---|---|---|---|---|"]
    goals = []
    for text, op, mine, against, goal in goal_list:
        text = text.format(touch=touch_words())
        base = mine[:-len(NO_TOUCH)] if mine.endswith(NO_TOUCH) else mine
        for case in cases:
            a = {r["run"]: (r["bytes"] / (r["seconds"] - r["touch_s"]) / 1e9 if base != mine else r["gbps"])
                 for r in rows
                 if (r["model"], r["size"], r["op"], r["contender"])
                 == (case["model"], case["size"], op, base)}
            b = _against(rows, case, op, against)
            ratios = [a[k] / b[k][0] for k in sorted(a) if k in b]
            if not ratios:
                continue
            ceil = med([v[1] / v[0] for v in b.values() if v[1] != ""])
            best = ""
            if against in ("best", "best_other"):
                names = sorted({v[2] for v in b.values()})
                best = f" (best: {', '.join(names)})"
            mr = med(ratios)
            met = "yes" if mr >= goal else f"no ({mr / goal:.0%} of the goal)"
            lines.append(f"| {text}{best} | {case['model']} {case['size']} | {mr:.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f}) | {met} | "
                         + ", ".join(f"{x:.2f}" for x in ratios)
                         + f" | {ceil:.2f} ({LIMIT_OF[op]}) |")
            goals.append({"goal": text, "model": case["model"], "size": case["size"],
                          "ratio": mr, "target": goal, "ceiling": ceil, "ratios": ratios})
    return "\n".join(lines), goals


def format_rounds(rows, cases):
    """Every round's ratio of each ckptio load of the second ring to each
    peer's load of the same round (cold page cache), and their median."""
    lines = ["| case | ckptio | / peer | per round | median |", "|---|---|---|---|---|"]
    for case in cases:
        m, sz = case["model"], case["size"]
        mine = [r for r in rows if (r["model"], r["size"], r["op"]) == (m, sz, "load_cold")]
        by = {}
        for r in mine:
            by.setdefault(r["contender"], {})[r["run"]] = r["gbps"]
        peers = [n for n in by if not n.startswith(("ckptio", "raw")) and n not in MODEL_LOADS]
        for ck in ("ckptio_default", "ckptio_torch_copy", "ckptio_stream", "ckptio_stream_keys", "ckptio_model"):
            if ck not in by:
                continue
            # A load into a model against the same job only.
            for p in (["safetensors_model"] if ck == "ckptio_model" else peers):
                if p not in by:
                    continue
                ratios = [by[ck][k] / by[p][k] for k in sorted(by[ck]) if k in by[p]]
                if ratios:
                    lines.append(f"| {m} {sz} | {ck} | {p} | "
                                 + ", ".join(f"{x:.2f}" for x in ratios)
                                 + f" | {med(ratios):.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def draw(summary, cases, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    idx = {(s["model"], s["size"], s["op"], s["contender"]): s for s in summary}
    ops = [("save", "raw_write"), ("load_cold", "raw_read"), ("load_warm", "memcpy")]
    fig, axes = plt.subplots(len(ops), len(cases), figsize=(4.2 * len(cases), 9.5),
                             squeeze=False)
    colors = {"ckptio_st": "#1f77b4", "ckptio_pt": "#6baed6", "ckptio_st_map": "#08306b",
              "ckptio_pt_map": "#4292c6", "ckptio_default": "#08306b",
              "ckptio_torch_copy": "#1f77b4", "ckptio_stream": "#6baed6", "ckptio_stream_keys": "#9ecae1",
              "safetensors_stream_keys": "#bcbd22",
              "runai_stream": "#ff7f0e", "runai_keep": "#ffbb78", "fastsafetensors": "#8c564b",
              "tensorizer": "#e377c2", "torch": "#d62728",
              "torch_mmap": "#ff9896", "safetensors": "#2ca02c",
              "safetensors_pread": "#98df8a", "numpy": "#9467bd"}
    for j, case in enumerate(cases):
        m, sz = case["model"], case["size"]
        for i, (op, lim) in enumerate(ops):
            ax = axes[i][j]
            names = [n for n, *_ in (SAVES if op == "save" else LOADS)]
            vals, lo, hi, cols = [], [], [], []
            for n in names:
                s = idx.get((m, sz, op, n))
                v = s["vs_limit_median"] if s else 0
                vals.append(v)
                lo.append(v - (s["vs_limit_min"] if s else 0))
                hi.append((s["vs_limit_max"] if s else 0) - v)
                cols.append(colors.get(n, "grey"))
            ax.bar(range(len(names)), vals, yerr=[lo, hi], color=cols, capsize=3)
            if op == "load_warm" and max(vals) > 3:
                # mmap loaders map the page cache without copying and run far
                # above memcpy; a log scale keeps the copying ones visible.
                ax.set_yscale("log")
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
            l = idx.get((m, sz, "limit", lim))
            lg = f"{l['gbps_median']:.2f} GB/s" if l else "?"
            ax.set_title(f"{m} {sz}: {op}\n(1 = {lim} {lg})", fontsize=9)
            if j == 0:
                ax.set_ylabel("x limit of the same run (median, min-max)")
            for k, v in enumerate(vals):
                s = idx.get((m, sz, op, names[k]))
                if s:
                    ax.text(k, v, f"{s['gbps_median']:.2f}", ha="center", va="bottom", fontsize=7)
    fig.suptitle("ckptio vs peers: throughput as a fraction of the raw limit measured in the "
                 "same run (labels: median GB/s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


# ------------------------------------------------------------------ main

def peer_versions():
    """The second ring's packages that this run uses, by their dist names."""
    from importlib import metadata
    out = {}
    for dist, mod in (("runai-model-streamer", "runai_model_streamer"),
                      ("fastsafetensors", "fastsafetensors"), ("tensorizer", "tensorizer")):
        if any(PEER_MODULES.get(e[0]) == mod for e in SAVES + LOADS):
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                out[dist] = "?"
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--redraw":
        # Redraws DIR/results.png from DIR/results.json.
        with open(os.path.join(sys.argv[2], "results.json")) as f:
            saved = json.load(f)
        draw(saved["summary"], saved["cases"], os.path.join(sys.argv[2], "results.png"))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--step":
        step_child(json.loads(sys.argv[2]))
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--rss-child":
        if len(sys.argv) > 4:
            TOUCH["mode"] = sys.argv[4]
        rss_child(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256MiB,1GiB",
                    help="comma-separated model sizes (default 256MiB,1GiB)")
    ap.add_argument("--big", action="store_true", help="add 4GiB")
    ap.add_argument("--models", default="llm,linear",
                    help="llm (bf16 Llama-like) and/or linear (10 x Linear fp32)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=".", help="where the checkpoints go (default .)")
    ap.add_argument("--out", default=HERE, help="results.{csv,png,md} go here")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS children")
    ap.add_argument("--no-prime", action="store_true",
                    help="skip the memory primer before each timed step (see settle())")
    ap.add_argument("--touch", choices=("page", "byte"), default="byte",
                    help="after each load, sum every byte (default: the issue's 'touching "
                         "every byte') or read one byte per 4 KiB page")
    ap.add_argument("--fresh", action="store_true",
                    help="run every timed save and load in a fresh interpreter (what a script "
                         "that saves or loads once pays); default: all in this one, warmed up")
    ap.add_argument("--peers2", action="store_true",
                    help="the second ring (issue 26): runai-model-streamer (stream and keep), "
                         "fastsafetensors, tensorizer, ckptio's default call, stream and "
                         "pread copy, next to torch, safetensors and numpy; every safetensors "
                         "reader reads ckptio's file")
    ap.add_argument("--contenders", default=None,
                    help="comma-separated contender names (saves and loads; see SAVES and LOADS "
                         "in peers.py); default: the first ring, or the second with --peers2")
    ap.add_argument("--steps", default=",".join(STEPS),
                    help=f"which blocks run each round (default {','.join(STEPS)})")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    steps_on = tuple(x for x in a.steps.split(",") if x)
    for x in steps_on:
        if x not in STEPS:
            ap.error(f"unknown step {x!r} (of {', '.join(STEPS)})")
    if a.contenders:
        wanted = [x for x in a.contenders.split(",") if x]
        known = set(SAVE_BY_NAME) | set(LOAD_BY_NAME)
        for x in wanted:
            if x not in known:
                ap.error(f"unknown contender {x!r} (saves: {', '.join(SAVE_BY_NAME)}; loads: "
                         f"{', '.join(LOAD_BY_NAME)})")
        saves, loads = wanted, wanted  # a name picks its save and its load
    elif a.peers2:
        saves, loads = PEERS2_SAVES, PEERS2_LOADS
    else:
        saves, loads = FIRST_SAVES, FIRST_LOADS
    SAVES[:] = [e for e in SAVES if e[0] in saves]
    LOADS[:] = [e for e in LOADS if e[0] in loads]
    SAME_FILE["on"] = a.peers2
    for n in {e[0] for e in SAVES + LOADS}:
        mod = PEER_MODULES.get(n)
        if mod:
            try:
                __import__(mod)
            except ImportError as e:
                raise SystemExit(f"contender {n} needs the Python module {mod} ({e}); "
                                 "bench/peers/run.sh installs it with pip")
    TOUCH["mode"] = a.touch
    PRIME["on"] = not a.no_prime
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    if a.big and (4 << 30) not in sizes:
        sizes.append(4 << 30)
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in ("llm", "linear"):
            ap.error(f"unknown model {m!r}")
    os.makedirs(a.dir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)

    report = []

    def log(msg=""):
        print(msg, flush=True)
        report.append(msg)

    c = Contenders()
    import safetensors
    mi = machine_info(a.dir)
    ck = c.ckptio._lib.lib()
    versions = {"python": platform.python_version(), "torch": c.torch.__version__,
                "safetensors": safetensors.__version__, "numpy": np.__version__,
                **peer_versions(),
                "ckptio": ck.ckptio_version_string().decode(),
                "libckptio": ck._name}
    cmd = a.command or " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv)
    log(f"command:  {cmd}")
    log(f"resolved: --sizes {','.join(size_label(s) for s in sizes)} --models {','.join(models)} "
        f"--runs {a.runs} --dir {mi['dir']} --touch {a.touch} --steps {','.join(steps_on)}"
        + (" --peers2" if a.peers2 else "")
        + f" --contenders {','.join(e[0] for e in SAVES)};{','.join(e[0] for e in LOADS)}"
        + (" --no-prime" if a.no_prime else "") + (" --fresh" if a.fresh else ""))
    log(f"machine:  {mi['nproc']} CPUs ({mi['cpu']}), {mi['mem_bytes'] / 2**30:.1f} GiB, "
        f"Linux {mi['kernel']}")
    log(f"dir:      {mi['dir']} on {mi['fs_type']} ({mi['fs_device']} at {mi['fs_mount']})")
    log("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    log(f"torch threads: {c.torch.get_num_threads()}")
    log("limits:   raw write/read: the best way of the run, each way measured before and "
        "after each block of contenders (mean), same byte count, same directory, as "
        "src/cli/rawlimit.c: writes O_DIRECT 32 x 8 MiB in flight (32 threads, blocking "
        "pwrite) | buffered 8 MiB + fdatasync; reads (page cache dropped before each) "
        "O_DIRECT 32 x 8 MiB | buffered 1 thread x 1 MiB (readahead) | buffered 16 threads "
        "x 8 MiB (runai-model-streamer's concurrency and chunk) | O_DIRECT 64 x 8 MiB "
        "(runai's default depth); memcpy: numpy.copyto, "
        "1 thread")
    log("order:    the contenders of each block rotated by one each round (listed per run)")
    if a.touch == "page":
        log("touch:    every load is timed with a pass reading one byte per 4 KiB page (and the "
            "last byte) of each returned tensor")
    else:
        log("touch:    every load is timed with a pass summing every byte of each returned "
            "tensor (as 8-byte words)")

    log("load avg: %.2f %.2f %.2f (other work on this machine competes for its %d CPUs)"
        % (os.getloadavg() + (mi["nproc"],)))
    if a.fresh:
        log("fresh:    every timed save and load runs in a new interpreter that has imported "
            "torch, safetensors, numpy and ckptio and built its state dict before the clock "
            "starts; its first call's setup (ckptio's context, lazy imports) is timed")
    else:
        # Untimed: ckptio's context and every contender's lazy imports, on a
        # tiny dict; every timed step after this is a warm one.
        t0 = time.perf_counter()
        (getattr(c.ckptio, "_ctx", None) or sys.modules["ckptio._core"].ctx)()
        log(f"ckptio context created in {time.perf_counter() - t0:.3f} s (untimed, once)")
        warm_up(c, a.dir)
    raw = Raw()
    rows, cases, rss = [], [], {}
    all_files = []
    try:
        for target in sizes:
            for kind in models:
                case, files = run_case(c, raw, kind, target, a.runs, a.dir, rows, log, a.fresh,
                                       steps_on)
                all_files.append(files)
                gc.collect()
                cases.append(case)
                if not a.no_rss:
                    rss[(kind, case["size"])] = measure_rss(case, files, log)
                for p in files.values():
                    rm(p)
    finally:
        for files in all_files:
            for p in files.values():
                rm(p)

    log("load avg at the end: %.2f %.2f %.2f" % os.getloadavg())
    summary = summarize(rows)
    log("\n## Results (GB = 10^9 bytes of tensor data; limits count the same bytes rounded up "
        "to 4 KiB; 'x limit' and 'ckptio / this' are medians of per-run ratios)")
    log(format_tables(summary, cases, rss))
    goals_md, goals = format_goals(rows, cases)
    log("\n## Goals (issue 16)\n")
    log(goals_md)
    goals_md, goals26 = format_goals(rows, cases, GOALS26)
    if goals26:
        log("\n## Goals of issue 26 (the second ring: per-round ratios, median of the rounds)\n")
        log(goals_md)
        goals += goals26
    rounds_md = format_rounds(rows, cases)
    if rounds_md:
        log("\n## Cold loads, ckptio / each peer, round by round (the second ring)\n")
        log(rounds_md)

    keys = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with open(os.path.join(a.out, "results_runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    keys = []
    for s in summary:
        for k in s:
            if k not in keys:
                keys.append(k)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(summary)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"command": cmd, "machine": mi, "versions": versions, "cases": cases,
                   "rss": {f"{k[0]} {k[1]}": v for k, v in rss.items()},
                   "goals": goals, "summary": summary}, f, indent=1, default=str)
    png = os.path.join(a.out, "results.png")
    draw(summary, cases, png)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(report) + "\n")
    log(f"\nwrote {a.out}/results.csv, results_runs.csv, results.json, results.md, results.png")


if __name__ == "__main__":
    main()
