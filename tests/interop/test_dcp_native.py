"""torch.distributed.checkpoint's own format (.metadata + __R_K.distcp, as
DCP's FileSystemWriter writes it) read by ckptio, never running its pickle:
checkpoints written by 1, 2 and 3 gloo processes on the CPU (DTensors with
row, column and replicated placements, FSDP2 parameters and Adam state,
bf16 / fp16 / int / bool / scalar tensors, byte items) compared bit for bit
with what torch's own loader (dcp_to_torch_save) makes of them; slices and
boxes at other rank counts; the CLI's inspect, verify and convert; and
hostile .metadata files refused without running anything."""

import io
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
dcp = pytest.importorskip("torch.distributed.checkpoint")
mp = pytest.importorskip("torch.multiprocessing")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp  # noqa: E402
import ckptio.torch  # noqa: E402
from ckptio import _lib  # noqa: E402
import rendezvous  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

CLI = os.environ.get("CKPTIO_CLI")


def full(name, shape, dtype):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    if dtype == torch.bool:
        return torch.rand(*shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-1000, 1000, shape, generator=g).to(dtype)
    return torch.randn(*shape, generator=g).to(dtype)


# name -> shape, dtype, placement (sizes chosen so 2 and 3 ranks split unevenly)
TENSORS = {
    "row": ((10, 6), torch.float32, Shard(0)),
    "col": ((7, 9), torch.bfloat16, Shard(1)),
    "rep": ((5,), torch.float16, Replicate()),
    "ints": ((11,), torch.int32, Shard(0)),
    "flags": ((6, 4), torch.bool, Shard(0)),
    "cube": ((4, 5, 6), torch.float64, Shard(2)),
}


def fsdp_model(world):
    """A small MLP under FSDP2 (fully_shard on a CPU mesh) with Adam, one step taken."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(), torch.nn.Linear(12, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m(torch.randn(3, 8, generator=torch.Generator().manual_seed(1))).sum().backward()
    opt.step()
    return m, opt


def worker(rank, world, init_method, steps):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        for mode, path, out in steps:
            try:
                step(rank, world, mode, path, out)
            except BaseException:
                print(f"rank {rank} of {world}: step {mode} on {path} failed", file=sys.stderr, flush=True)
                raise
            dist.barrier()  # every rank done with a step before any starts the next
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown (test_dcp.py says why).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def step(rank, world, mode, path, out):
    if mode == "load":
        # What was loaded goes to `out` for the test to check: an assertion
        # here would fail saved(), and with it the fixture of every test at
        # this world size, before the test it belongs to checked anything.
        sd = load_resharded(world, path)
        sd = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}  # collectives
        if rank == 0:
            torch.save(sd, out)
        return
    from torch.distributed.checkpoint.state_dict import get_state_dict

    mesh = init_device_mesh("cpu", (world,))
    sd = {name: distribute_tensor(full(name, shape, dt), mesh, [pl]) for name, (shape, dt, pl) in TENSORS.items()}
    sd["plain_i64"] = full("plain_i64", (3, 2), torch.int64)  # a plain tensor, the same on every rank
    sd["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    sd["extra"] = {"step": 42, "lr": 0.125, "names": ["a", "b"]}
    m, opt = fsdp_model(world)
    msd, osd = get_state_dict(m, opt)
    sd["model"], sd["optim"] = msd, osd
    if mode == "zstd":  # DCP's zstd stream extension on every chunk and byte item
        from torch.distributed.checkpoint._extension import ZStandard
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, _extensions=[ZStandard()]))
    else:
        dcp.save(sd, checkpoint_id=path)


def load_resharded(world, path):
    """dcp.load through ckptio.dcp.Reader of a checkpoint DCP's own writer
    made: every tensor split on another dim than it was saved on (or
    replicated), the byte items back as Python values. Returns the state
    dict it loaded into."""
    mesh = init_device_mesh("cpu", (world,))
    other = {"row": Shard(1), "col": Shard(0), "rep": Shard(0), "ints": Replicate(), "flags": Shard(1),
             "cube": Shard(0)}
    sd = {name: distribute_tensor(torch.zeros(shape, dtype=dt), mesh, [other[name]])
          for name, (shape, dt, _) in TENSORS.items()}
    sd["plain_i64"] = torch.zeros(3, 2, dtype=torch.int64)
    sd["scalar"] = torch.tensor(0.0, dtype=torch.float64)
    sd["extra"] = {"step": 0, "lr": 0.0, "names": []}
    dcp.load(sd, storage_reader=ckptio.dcp.Reader(path))
    return sd


def check_resharded(sd):
    """What load_resharded loaded (its DTensors as full tensors) equals what was saved."""
    for name, (shape, dt, _) in TENSORS.items():
        assert torch.equal(bits(sd[name]), bits(full(name, shape, dt))), name
    assert torch.equal(sd["plain_i64"], full("plain_i64", (3, 2), torch.int64))
    assert sd["scalar"].item() == 2.5
    assert sd["extra"] == {"step": 42, "lr": 0.125, "names": ["a", "b"]}, sd["extra"]


def run(world, *steps):
    """One process group of `world` ranks running the steps, each
    (mode, path) or (mode, path, out), in order."""
    steps = [(mode, str(path), str(out[0]) if out else "") for mode, path, *out in steps]
    mp.start_processes(worker, args=(world, rendezvous.init_method(), steps), nprocs=world, join=True,
                       start_method="spawn")


def torch_reference(path, tmp):
    """What torch's own loader makes of the checkpoint: its fqn -> value, and
    the metadata (read with torch's unpickler: this is our own file)."""
    out = tmp / "ref.pt"
    dcp_to_torch_save(str(path), str(out))
    ref = torch.load(out, weights_only=False)
    with open(path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    values = {}
    for fqn in meta.state_dict_metadata:
        v = ref
        for k in meta.planner_data[fqn]:
            v = v[k]
        values[fqn] = v
    return values, meta


def bits(t):
    t = t.contiguous()
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


_SAVED = {}


def saved(world, tmp_path_factory):
    """The checkpoint `world` ranks saved, once per session, in tmp/ckpt.
    Process start-ups are most of this file's time, so each world size's
    group does all its work: at 2 ranks also the save through DCP's zstd
    extension (tmp/z, test_dcp_zstd_extension), at 3 ranks also the load of
    the 2-rank checkpoint into tmp/loaded.pt, after its own save (checked by
    test_ckptio_dcp_reader_loads_it_at_another_world_size)."""
    if world not in _SAVED:
        if world == 3:
            saved(2, tmp_path_factory)
        tmp = tmp_path_factory.mktemp(f"dcp{world}")
        steps = [("save", tmp / "ckpt")]
        if world == 2 and zstd_available():
            steps.append(("zstd", tmp / "z"))
        if world == 3:
            steps.append(("load", _SAVED[2] / "ckpt", tmp / "loaded.pt"))
        run(world, *steps)
        _SAVED[world] = tmp
    return _SAVED[world]


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda w: f"{w}ranks")
def ckpt(request, tmp_path_factory):
    tmp = saved(request.param, tmp_path_factory)
    path = tmp / "ckpt"
    values, meta = torch_reference(path, tmp)
    return request.param, path, values, meta, tmp


def test_every_tensor_and_byte_item_equals_torchs_own_load(ckpt):
    world, path, values, meta, _ = ckpt
    assert sorted(p.name for p in path.iterdir() if p.suffix == ".distcp") == [f"__{r}_0.distcp" for r in range(world)]
    for backend in ("pread", "mmap"):
        got = ckptio.torch.load_file(path, backend=backend)
        # Byte items carry the name ckptio.dcp.Writer gives them in ckptio's own checkpoints.
        named = {fqn if isinstance(v, torch.Tensor) else ckptio.dcp.BYTES_PREFIX + fqn: fqn
                 for fqn, v in values.items()}
        assert sorted(got) == sorted(named)
        got = {named[k]: v for k, v in got.items()}
        nbytes = 0
        for fqn, want in values.items():
            if isinstance(want, torch.Tensor):
                assert got[fqn].dtype == want.dtype and got[fqn].shape == want.shape, fqn
                assert torch.equal(bits(got[fqn]), bits(want)), fqn
            else:  # a byte item: the torch.save of a Python value, returned as its bytes
                assert got[fqn].dtype == torch.uint8 and got[fqn].dim() == 1, fqn
                assert torch.load(io.BytesIO(got[fqn].numpy().tobytes()), weights_only=True) == want, fqn
                nbytes += 1
        assert nbytes >= 4  # extra.* and the optimizer's param groups
    # The split tensors are stored in `world` chunks each (Replicate: one).
    assert len(meta.state_dict_metadata["row"].chunks) == world
    assert len(meta.state_dict_metadata["rep"].chunks) == 1
    with ckptio.torch.safe_open(path) as f:
        assert f.format() == "dcp"
        assert torch.equal(bits(f.get_tensor("col")), bits(values["col"]))


def test_slices_and_boxes_at_other_rank_counts(ckpt):
    world, path, values, _, _ = ckpt
    with ckptio.torch.safe_open(path) as f:
        for name in ("row", "col", "flags", "cube"):
            want = values[name]
            s = f.get_slice(name)
            for ranks in (1, 2, 3, 4):
                if ranks == world:
                    continue
                for dim in range(want.dim()):
                    for part in torch.arange(want.shape[dim]).tensor_split(ranks):
                        if not len(part):
                            continue
                        a, b = int(part[0]), int(part[-1]) + 1
                        key = tuple([slice(None)] * dim + [slice(a, b)])
                        assert torch.equal(bits(s[key]), bits(want[key])), (name, ranks, dim, a, b)
        # A 2-D box crossing every chunk boundary of a row- and a column-split tensor.
        r = f._reader()
        for name, (start, stop) in {"row": ((1, 1), (9, 5)), "col": ((2, 1), (6, 8))}.items():
            want = values[name][start[0]:stop[0], start[1]:stop[1]].contiguous()
            out = torch.empty_like(want)
            q = _lib.BoxRequest()
            q.index = r.by_name[name]
            for d in range(2):
                q.start[d], q.stop[d] = start[d], stop[d]
            q.dst, q.dst_bytes, q.device = out.data_ptr(), out.numel() * out.element_size(), _lib.DEVICE_HOST
            assert r.lib.ckptio_reader_load_boxes(r.handle, (_lib.BoxRequest * 1)(q), 1) == 0
            assert torch.equal(bits(out), bits(want)), name


def test_ckptio_dcp_reader_loads_it_at_another_world_size(ckpt, tmp_path_factory):
    """A job that switched its writer to ckptio.dcp resumes from its old
    checkpoints: ckptio.dcp.Reader reads DCP's own format into dcp.load."""
    world, path, _, _, _ = ckpt
    if world != 2:
        pytest.skip("loaded at 3 ranks from the 2-rank checkpoint only (process start-ups are slow here)")
    loaded = saved(3, tmp_path_factory) / "loaded.pt"  # the 3-rank group's load step, after its own save
    check_resharded(torch.load(loaded, weights_only=True))


@pytest.mark.skipif(not CLI, reason="CKPTIO_CLI not set (ctest sets it)")
def test_cli_inspect_verify_and_convert(ckpt):
    world, path, values, meta, tmp = ckpt
    r = subprocess.run([CLI, "inspect", "--json", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "dcp" and j["tensor_count"] == len(values)
    assert len(j["shards"]) == world
    row = next(t for t in j["tensors"] if t["name"] == "row")
    assert len(row.get("parts", [])) == (world if world > 1 else 0)
    r = subprocess.run([CLI, "verify", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "records no checksums" in r.stdout
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    from safetensors.torch import load_file as st_load

    for out, args in (("one.safetensors", []), ("one.pt", []), ("hf", ["--max-shard-size", "600"])):
        dst = tmp / f"{world}-{out}"
        r = subprocess.run([CLI, "convert", str(path), str(dst)] + args, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        if out.endswith(".pt"):
            got = torch.load(dst, weights_only=True)
        elif out.endswith(".safetensors"):
            got = st_load(dst)
        else:
            index = json.loads(next(dst.glob("*.index.json")).read_text())
            assert len(set(index["weight_map"].values())) > 1
            got = {}
            for f in sorted(dst.glob("*.safetensors")):
                got.update(st_load(f))
        for fqn, want in tensors.items():
            assert torch.equal(bits(got[fqn]), bits(want)), (out, fqn)
        assert subprocess.run([CLI, "verify", str(dst)], capture_output=True).returncode == 0, out
    if world == 1:
        return
    # A flipped byte in the data of a split tensor's chunk: convert, which
    # checks each chunk's CRC as it copies it (no separate verify pass for a
    # checkpoint with split tensors), refuses and writes nothing.
    chunk = meta.state_dict_metadata["row"].chunks[0]
    info = next(v for k, v in meta.storage_data.items() if k.fqn == "row" and list(k.offset) == list(chunk.offsets))
    rows = slice(chunk.offsets[0], chunk.offsets[0] + chunk.sizes[0])
    want = values["row"][rows].contiguous().view(torch.uint8).numpy().tobytes()
    bad = tmp / f"{world}-bad"
    bad.mkdir()
    for p in path.iterdir():
        data = bytearray(p.read_bytes())
        if p.name == info.relative_path:
            at = data.find(want, info.offset, info.offset + info.length)
            assert at >= 0
            data[at + 5] ^= 0x40
        (bad / p.name).write_bytes(bytes(data))
    dst = tmp / f"{world}-bad.safetensors"
    r = subprocess.run([CLI, "convert", str(bad), str(dst)], capture_output=True, text=True)
    assert r.returncode == 1 and "row" in r.stderr, r.stdout + r.stderr
    assert not dst.exists()


# ------------------------------------------------------------ hostile .metadata

@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """A 1-rank checkpoint whose .metadata the tests below replace (in
    copies: with_metadata)."""
    return saved(1, tmp_path_factory) / "ckpt"


def with_metadata(one, tmp_path, data):
    d = tmp_path / "ckpt"
    d.mkdir(parents=True)
    for p in one.iterdir():
        if p.suffix == ".distcp":
            (d / p.name).write_bytes(p.read_bytes())
    (d / ".metadata").write_bytes(data)
    return d


def refused(path, *words):
    with pytest.raises(Exception) as e:
        ckptio.torch.load_file(path)
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    return msg


def test_a_reduce_of_os_system_is_refused_and_never_runs(one, tmp_path):
    marker = tmp_path / "ran"
    cmd = f"touch {marker}".encode()
    proto2 = b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
    proto4 = (b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c" + bytes([len(cmd)]) + cmd + b"\x85R.")
    for data, name in ((proto2, "os.system"), (proto4, "posix.system")):
        refused(with_metadata(one, tmp_path / name, data), name, "not allowed")
        assert not marker.exists()
    # The same bytes do run the command under pickle.load: the test's pickle is real.
    pickle.loads(proto4)
    assert marker.exists()


def test_globals_outside_the_allowlist_are_refused(one, tmp_path):
    for i, (mod, name) in enumerate([("torch.distributed.checkpoint.metadata", "Evil"), ("subprocess", "Popen"),
                                     ("builtins", "eval"), ("torch.distributed.checkpoint.filesystem", "FileSystem")]):
        data = (b"\x80\x04\x8c" + bytes([len(mod)]) + mod.encode() + b"\x8c" + bytes([len(name)]) + name.encode() +
                b"\x93)\x81.")
        refused(with_metadata(one, tmp_path / str(i), data), f"{mod}.{name}", "not allowed")


def test_recursion_and_memo_bombs_are_bounded(one, tmp_path):
    # MARKs nested past the limit.
    refused(with_metadata(one, tmp_path / "marks", b"\x80\x04" + b"(" * 100000 + b"."), "MARKs nested deeper")
    # A million nested lists where DCP keeps planner_data: the schema walk never enters them.
    good = (one / ".metadata").read_bytes()
    meta = pickle.loads(good)
    deep = []
    for _ in range(100):
        deep = [deep]
    meta.planner_data = {"x": deep}
    data = pickle.dumps(meta, protocol=4)
    t0 = time.monotonic()
    bomb = b"\x80\x04" + b"]" * 200000 + b"a" * 199999 + b"."  # nested lists, 200,000 deep
    refused(with_metadata(one, tmp_path / "lists", bomb), "Metadata")
    # Memo doubling: each level a list holding the previous one twice (2**60 leaves if walked).
    laughs = b"\x80\x04]\x94" + b"".join(b"]\x94h" + bytes([k]) + b"ah" + bytes([k]) + b"a" for k in range(60)) + b"."
    refused(with_metadata(one, tmp_path / "laughs", laughs), "Metadata")
    assert time.monotonic() - t0 < 10
    # planner_data holding a deep structure is not looked into: the checkpoint opens.
    d = with_metadata(one, tmp_path / "planner", data)
    assert "row" in ckptio.torch.load_file(d)


def test_lying_offsets_lengths_and_names_are_refused(one, tmp_path):
    good = pickle.loads((one / ".metadata").read_bytes())
    size = (one / "__0_0.distcp").stat().st_size
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def variant(name, change, *words):
        meta = pickle.loads(pickle.dumps(good))
        change(meta)
        refused(with_metadata(one, tmp_path / name, pickle.dumps(meta, protocol=4)), *words)

    def storage(meta, fqn):
        return next(v for k, v in meta.storage_data.items() if k.fqn == fqn)

    variant("past-end", lambda m: setattr(storage(m, "row"), "length", size), "row", "which has")
    variant("far-offset", lambda m: setattr(storage(m, "row"), "offset", 1 << 62), "row", "which has")
    variant("overflow", lambda m: setattr(storage(m, "row"), "offset", (1 << 64) - 8), "row")
    variant("shifted", lambda m: setattr(storage(m, "row"), "offset", storage(m, "row").offset + 1), "row")
    variant("path", lambda m: setattr(storage(m, "row"), "relative_path", "../__0_0.distcp"), "not a plain file name")
    variant("chunk-outside", lambda m: setattr(m.state_dict_metadata["row"], "chunks", [ChunkStorageMetadata(
        offsets=torch.Size([1, 0]), sizes=torch.Size([10, 6]))]), "runs past the tensor")
    variant("size-lies", lambda m: setattr(m.state_dict_metadata["row"], "size", torch.Size([20, 6])),
            "do not cover it")
    variant("dtype-lies", lambda m: setattr(m.state_dict_metadata["row"].properties, "dtype", torch.float64),
            "the .metadata says F64")
    variant("transform", lambda m: setattr(storage(m, "row"), "transform_descriptors", ["stream.evil/1"]),
            "stream.evil/1")
    variant("no-storage", lambda m: m.storage_data.pop(next(k for k in m.storage_data if k.fqn == "row")),
            "has no entry in storage_data")


def zstd_available():
    from torch.distributed.checkpoint._extension import ZStandard
    return ZStandard.is_available()


def test_dcp_zstd_extension(tmp_path, tmp_path_factory):
    """Chunks and byte items written through DCP's zstd stream extension
    (2 ranks), read bit for bit as torch reads them; a corrupt stream and a
    zstd bomb are refused."""
    if not zstd_available():
        pytest.skip("torch's DCP zstd extension needs the zstandard or pyzstd module, which this venv lacks "
                    "(scripts/setup.sh installs zstandard)")
    path = saved(2, tmp_path_factory) / "z"  # the 2-rank group's zstd step
    values, meta = torch_reference(path, tmp_path)
    assert all(v.transform_descriptors == ["stream.zstd/1"] for v in meta.storage_data.values())
    got = ckptio.torch.load_file(path)
    for fqn, want in values.items():
        if isinstance(want, torch.Tensor):
            assert torch.equal(bits(got[fqn]), bits(want)), fqn
        else:
            b = got[ckptio.dcp.BYTES_PREFIX + fqn].numpy().tobytes()
            assert torch.load(io.BytesIO(b), weights_only=True) == want, fqn
    with ckptio.torch.safe_open(path) as f:  # a slice across the chunks of a column-split tensor
        assert torch.equal(bits(f.get_slice("col")[:, 2:8]), bits(values["col"][:, 2:8]))
    # A flipped byte inside a chunk's compressed stream.
    row = next(v for k, v in meta.storage_data.items() if k.fqn == "row")
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in path.iterdir():
        data = bytearray(p.read_bytes())
        if p.name == row.relative_path:
            data[row.offset + row.length // 2] ^= 0xFF
        (bad / p.name).write_bytes(bytes(data))
    with pytest.raises(Exception) as e:
        ckptio.torch.load_file(bad)
    assert "row" in str(e.value), str(e.value)
    # A bomb: row's chunk replaced by a small stream of 64 MiB of zeros.
    import zstandard
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))
    meta2 = pickle.loads((path / ".metadata").read_bytes())
    info = next(v for k, v in meta2.storage_data.items() if k.fqn == "row")
    data = (path / info.relative_path).read_bytes()
    info.offset, info.length = len(data), len(bomb)
    d = with_metadata(path, tmp_path / "bomb", pickle.dumps(meta2, protocol=4))
    (d / info.relative_path).write_bytes(data + bomb)
    refused(d, "row", "decompresses to more than")
