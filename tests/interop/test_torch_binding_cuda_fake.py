"""ckptio.torch's CUDA path (save_file / save_file_async of CUDA tensors with
torch.cuda.current_stream, load_file(device="cuda:N")) on the fake CUDA
runtime (tests/fake_cudart), since these machines have no GPU and real torch
cannot make CUDA tensors.

The stand-in: FakeCudaTensor, a real torch.Tensor subclass made with
_make_wrapper_subclass (device cuda:N, dtype, shape and strides are torch's
own; there is no storage) whose data_ptr() is memory of fake GPU N from
ckptio_device_alloc. torch.cuda.is_available / device_count / current_device /
current_stream and torch.empty (for cuda devices) are monkeypatched; the
streams are real streams of the fake. So ckptio/torch.py runs unchanged, and
the library really copies from and to "device memory" (PROT_NONE in this
process: only the fake's copy engine can touch it), ordered after the stream
current_stream returned.

Covered: tensors on both GPUs (and one on the CPU) saved in both formats hold
the bytes put in device memory; load_file / get_tensor / get_slice onto
cuda:1 put the file's bytes in GPU 1 memory, after draining GPU 1's current
stream; a save (also a sharded one, save_torch_state_dict) holds what the work queued before it on the current stream
of the tensors' device wrote, and not what is written after its snapshot;
host / GPU / wrong-GPU pointer mix-ups raise CkptioError naming them;
nothing is leaked.

Needs the env that tests/CMakeLists.txt sets: CKPTIO_CUDART (the fake's
libcudart.so.13), FAKE_CUDART_DEVICES=2, FAKE_CUDART_REPORT_LEAKS=1 (a CUDA
object left at exit makes the process exit 3, which fails the test)."""

import contextlib
import ctypes
import os
import pathlib
import sys
import time

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402
from ckptio import _lib  # noqa: E402

H2D, D2H = 1, 2  # cudaMemcpyKind


def _load_fake():
    path = os.environ.get("CKPTIO_CUDART")
    if not path or os.environ.get("FAKE_CUDART_DEVICES") != "2":
        pytest.skip("needs CKPTIO_CUDART=<fake libcudart.so.13> and FAKE_CUDART_DEVICES=2 "
                    "(ctest sets them)", allow_module_level=True)
    fake = ctypes.CDLL(path)  # the instance ckptio dlopens: same path
    if not hasattr(fake, "fake_cudart_stats"):
        pytest.skip(f"{path} is not the fake runtime", allow_module_level=True)
    P, I, N = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for name, args in {"cudaMemcpy": [P, P, N, I], "cudaMemcpyAsync": [P, P, N, I, P],
                       "cudaMemsetAsync": [P, I, N, P], "cudaSetDevice": [I],
                       "cudaStreamCreateWithFlags": [ctypes.POINTER(P), ctypes.c_uint],
                       "cudaStreamDestroy": [P], "cudaStreamSynchronize": [P],
                       "fake_cudart_set_delay_us": [ctypes.c_long],
                       "fake_cudart_stats": [ctypes.c_void_p]}.items():
        fn = getattr(fake, name)
        fn.argtypes, fn.restype = args, I
    return fake


FAKE = _load_fake()
LIB = _lib.lib()
LIB.ckptio_device_alloc.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                                    ctypes.POINTER(ctypes.c_void_p)]
LIB.ckptio_device_free.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]


def cuda(rc, what):
    assert rc == 0, f"{what}: cudaError {rc}"


def device_allocs():
    """Live cudaMalloc blocks (fake_cudart_stats.device_allocs)."""
    class Stats(ctypes.Structure):  # struct fake_cudart_stats up to device_allocs
        _fields_ = [("size", ctypes.c_size_t)] \
            + [(f"u{i}", ctypes.c_uint64) for i in range(14)] \
            + [("device_allocs", ctypes.c_uint64)]
    st = Stats(ctypes.sizeof(Stats))
    assert FAKE.fake_cudart_stats(ctypes.byref(st)) == 0
    return st.device_allocs


class FakeCudaTensor(torch.Tensor):
    """A torch.Tensor on cuda:N whose bytes live at `ptr` on fake GPU N."""

    @staticmethod
    def __new__(cls, shape, dtype, device, ptr):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device)
        t.ptr = ptr
        return t

    def data_ptr(self):
        return self.ptr or 0

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"FakeCudaTensor has no {func}")  # torch.py must not need one

    def __repr__(self):
        return f"FakeCudaTensor({tuple(self.shape)}, {self.dtype}, {self.device}, {self.ptr})"


class FakeStream:
    """What torch.cuda.current_stream returns, as far as torch.py uses it."""

    def __init__(self, device):
        self.device = device
        handle = ctypes.c_void_p()
        cuda(FAKE.cudaSetDevice(device.index), "cudaSetDevice")
        # cudaStreamNonBlocking, as torch's side streams: no implicit sync
        # with the legacy default stream.
        cuda(FAKE.cudaStreamCreateWithFlags(ctypes.byref(handle), 1), "cudaStreamCreate")
        cuda(FAKE.cudaSetDevice(0), "cudaSetDevice")
        self.cuda_stream = handle.value

    def synchronize(self):
        cuda(FAKE.cudaStreamSynchronize(self.cuda_stream), "cudaStreamSynchronize")


class FakeGPUs:
    """Two fake GPUs seen through torch: allocations, streams, the calls made."""

    def __init__(self, monkeypatch):
        self.ctx = ckptio._core.ctx()
        self.allocs = []  # (ckptio device code, ptr)
        self.streams = {i: FakeStream(torch.device("cuda", i)) for i in (0, 1)}
        self.stream_calls = []
        real_empty = torch.empty

        def empty(*size, dtype=None, device=None, **kw):
            if device is None or torch.device(device).type != "cuda":
                return real_empty(*size, dtype=dtype, device=device, **kw)
            shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
            return self.empty(shape, dtype, torch.device(device).index)

        def current_stream(device=None):
            self.stream_calls.append(device)
            return self.streams[torch.device(device).index if device is not None else 0]

        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "current_stream", current_stream)

    def empty(self, shape, dtype, gpu):
        """An uninitialised FakeCudaTensor on fake GPU `gpu`."""
        nbytes = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        ptr = ctypes.c_void_p()
        rc = LIB.ckptio_device_alloc(self.ctx, _lib.device_cuda(gpu), nbytes, ctypes.byref(ptr))
        assert rc == 0, f"ckptio_device_alloc: {rc}"
        self.allocs.append((_lib.device_cuda(gpu), ptr.value))
        return FakeCudaTensor(shape, dtype, torch.device("cuda", gpu), ptr.value)

    def to_gpu(self, cpu_tensor, gpu):
        """A FakeCudaTensor on `gpu` holding cpu_tensor's bytes (copied by the fake)."""
        t = self.empty(tuple(cpu_tensor.shape), cpu_tensor.dtype, gpu)
        write(t, raw(cpu_tensor))
        return t

    def close(self):
        for code, ptr in self.allocs:
            assert LIB.ckptio_device_free(self.ctx, code, ptr) == 0
        for s in self.streams.values():
            cuda(FAKE.cudaStreamDestroy(s.cuda_stream), "cudaStreamDestroy")
        assert device_allocs() == 0, "device memory still allocated after the test"


@pytest.fixture
def gpus(monkeypatch):
    g = FakeGPUs(monkeypatch)
    yield g
    g.close()


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def nbytes(t):
    return t.numel() * t.element_size()


def write(t, data):
    """Synchronous H2D copy of `data` into FakeCudaTensor t."""
    assert len(data) == nbytes(t)
    if data:
        cuda(FAKE.cudaMemcpy(t.data_ptr(), data, len(data), H2D), "cudaMemcpy H2D")


def read(t):
    """t's bytes, through a synchronous D2H copy."""
    buf = ctypes.create_string_buffer(nbytes(t))
    if nbytes(t):
        cuda(FAKE.cudaMemcpy(buf, t.data_ptr(), nbytes(t), D2H), "cudaMemcpy D2H")
    return buf.raw


def sample():
    """Tensors of several dtypes and shapes; 'big' spans more than one 8 MiB chunk."""
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(3, 5, generator=g),
        "b": torch.randn(7, generator=g).bfloat16(),
        "step": torch.tensor(12345678901, dtype=torch.int64),
        "empty": torch.empty(2, 0, 3, dtype=torch.float16),
        "mask": torch.randint(0, 2, (4, 4), generator=g).bool(),
        "big": torch.randn(9 * 262144 + 3, generator=g),
    }


GPU_OF = {"w": 0, "b": 1, "step": 1, "empty": 0, "mask": 0, "big": 1}


# ------------------------------------------------------------ round trip

@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_save_from_two_gpus_and_load_onto_gpu1(gpus, tmp_path, fmt):
    want = sample()
    tensors = {n: gpus.to_gpu(t, GPU_OF[n]) for n, t in want.items()}
    tensors["host"] = torch.arange(5, dtype=torch.int32)  # a CPU tensor in the same save
    want["host"] = tensors["host"]
    path = tmp_path / f"m.{fmt}"
    ct.save_file(tensors, path, format=fmt)

    # Each GPU's current stream was asked for once, for the tensor's device.
    assert sorted(gpus.stream_calls, key=str) == [torch.device("cuda", i) for i in (0, 1)]
    # The bytes in the file are those put in device memory.
    got = ct.load_file(path)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert raw(got[name]) == raw(t), name

    # Onto GPU 1: every destination is fake GPU 1 memory holding the file's bytes.
    calls = len(gpus.stream_calls)
    on_gpu = ct.load_file(path, device="cuda:1")
    assert gpus.stream_calls[calls:] == [torch.device("cuda", 1)]  # drained before the writes
    assert sorted(on_gpu) == sorted(want)
    for name, t in on_gpu.items():
        assert isinstance(t, FakeCudaTensor) and t.device == torch.device("cuda", 1), name
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        assert read(t) == raw(want[name]), name
    with ct.safe_open(path, device="cuda:1") as f:
        assert read(f.get_tensor("big")) == raw(want["big"])
        assert read(f.get_slice("big")[1000:300000]) == raw(want["big"][1000:300000])
        assert read(f.get_slice("w")[:, 1:4]) == raw(want["w"][:, 1:4])


# ------------------------------------------------------------ streams

@contextlib.contextmanager
def slow_write_queued(gpus, x, value):
    """On the current stream of x's GPU: 10 slow memsets, then x filled with
    `value`, about 0.2 s from now. A save not ordered after that stream
    would read x long before, and find its old value."""
    gpu = x.device.index
    scratch = gpus.empty(tuple(x.shape), x.dtype, gpu)
    stream = gpus.streams[gpu].cuda_stream
    data = raw(torch.full(tuple(x.shape), value, dtype=x.dtype))
    FAKE.fake_cudart_set_delay_us(20_000)
    try:
        for _ in range(10):
            cuda(FAKE.cudaMemsetAsync(scratch.data_ptr(), 0, nbytes(scratch), stream), "memset")
        cuda(FAKE.cudaMemcpyAsync(x.data_ptr(), data, len(data), H2D, stream), "H2D")
        yield
    finally:
        FAKE.fake_cudart_set_delay_us(2000)
        gpus.streams[gpu].synchronize()


def wait_snapshot_then_write(h, x):
    """The snapshot waited for the queued write; a write after it is not saved."""
    t0 = time.monotonic()
    h.wait_snapshot()
    assert time.monotonic() - t0 > 0.1, "the snapshot did not wait for the stream"
    write(x, raw(torch.full(tuple(x.shape), 3.0, dtype=x.dtype)))
    h.wait_durable()


def test_save_is_ordered_after_the_current_stream(gpus, tmp_path):
    new = torch.full((1 << 16,), 2.0)
    x = gpus.to_gpu(torch.full((1 << 16,), 1.0), 1)
    with slow_write_queued(gpus, x, 2.0):
        wait_snapshot_then_write(ct.save_file_async({"x": x}, tmp_path / "x.safetensors"), x)
    assert gpus.stream_calls == [torch.device("cuda", 1)]
    assert torch.equal(ct.load_file(tmp_path / "x.safetensors")["x"], new)


def test_sharded_save_from_two_gpus_is_ordered_after_their_streams(gpus, tmp_path):
    # save_torch_state_dict hands each device's current stream to the shard
    # writer (the code save_file_async uses): a copy queued on GPU 1's stream
    # before the call is in the set, a write after the snapshot is not.
    want = sample()
    tensors = {n: gpus.to_gpu(t, GPU_OF[n]) for n, t in want.items()}
    x = tensors["x"] = gpus.to_gpu(torch.full((1 << 16,), 1.0), 1)
    want["x"] = torch.full((1 << 16,), 2.0)
    with slow_write_queued(gpus, x, 2.0):
        wait_snapshot_then_write(
            ct.save_torch_state_dict_async(tensors, tmp_path, max_shard_size="200KB"), x)
    assert sorted(gpus.stream_calls, key=str) == [torch.device("cuda", i) for i in (0, 1)]
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) == 3
    got = ct.load_file(tmp_path)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert raw(got[name]) == raw(t), name


def test_a_bad_stream_fails_the_save(gpus, tmp_path):
    # The handle current_stream returns is what ckptio records its event on:
    # GPU 0's stream for a GPU 1 tensor is refused by the runtime.
    gpus.streams[1], keep = gpus.streams[0], gpus.streams[1]
    try:
        x = gpus.to_gpu(torch.ones(4), 1)
        with pytest.raises(ckptio.CkptioError, match="recording the snapshot event") as e:
            ct.save_file({"x": x}, tmp_path / "x.safetensors")
        assert e.value.code == ckptio.ERRORS["DEVICE"], e.value
    finally:
        gpus.streams[1] = keep
    assert not (tmp_path / "x.safetensors").exists()


# ------------------------------------------------------------ pointer mix-ups

def test_save_refuses_memory_of_another_place(gpus, tmp_path):
    path = tmp_path / "x.safetensors"
    host = ctypes.create_string_buffer(16)
    on_gpu1 = gpus.empty((4,), torch.float32, 1)
    cases = [
        (FakeCudaTensor((4,), torch.float32, torch.device("cuda", 0), ctypes.addressof(host)),
         "data is host memory but the descriptor says GPU"),
        (FakeCudaTensor((4,), torch.float32, torch.device("cuda", 0), on_gpu1.data_ptr()),
         "data is on GPU 1 but the descriptor says GPU 0"),
        (FakeCudaTensor((4,), torch.float32, torch.device("cpu"), on_gpu1.data_ptr()),
         "data is GPU memory but the descriptor says host"),
    ]
    for t, message in cases:
        with pytest.raises(ckptio.CkptioError, match=message) as e:
            ct.save_file({"x": t}, path)
        assert e.value.code == ckptio.ERRORS["DEVICE"], e.value
        assert "tensor 'x'" in str(e.value), e.value
        assert not path.exists()


def test_load_refuses_a_host_destination_for_a_gpu(gpus, tmp_path, monkeypatch):
    path = tmp_path / "x.safetensors"
    ct.save_file({"x": torch.ones(4)}, path)
    host = ctypes.create_string_buffer(16)
    monkeypatch.setattr(gpus, "empty", lambda shape, dtype, gpu: FakeCudaTensor(
        shape, dtype, torch.device("cuda", gpu), ctypes.addressof(host)))
    with pytest.raises(ckptio.CkptioError,
                       match="destination is host memory but the request says memory of GPU 1") as e:
        ct.load_file(path, device="cuda:1")
    assert e.value.code == ckptio.ERRORS["DEVICE"], e.value


# ------------------------------------------------------------ load_model in place

def test_load_into_gpu_tensors_in_place_after_their_streams(gpus, tmp_path):
    """load_model's in-place path (TorchReader.load_into): the file's bytes
    land in the model's own GPU memory on each tensor's GPU, after the work
    queued on that GPU's current stream (a write queued there before the
    load must not land over the loaded bytes)."""
    want = {"a": torch.randn(1 << 16), "b": torch.randn(9 * 262144 + 3).bfloat16()}
    path = tmp_path / "m.safetensors"
    ct.save_file(want, path)
    targets = {"a": gpus.empty((1 << 16,), torch.float32, 0),
               "b": gpus.empty((9 * 262144 + 3,), torch.bfloat16, 1)}
    with slow_write_queued(gpus, targets["a"], 7.0), ct.TorchReader(path, "cpu", False) as r:
        r.index()
        assert all(r.fits_in_place(r.by_name[n], t) for n, t in targets.items())
        r.load_into({r.by_name[n]: t for n, t in targets.items()})
    for name, t in targets.items():
        assert read(t) == raw(want[name]), name
    # A wrong shape or dtype never fits.
    with ct.TorchReader(path, "cpu", False) as r:
        r.index()
        assert not r.fits_in_place(r.by_name["a"], gpus.empty((1 << 15,), torch.float32, 0))
        assert not r.fits_in_place(r.by_name["a"], gpus.empty((1 << 16,), torch.float16, 0))
