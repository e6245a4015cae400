"""One rank of a timed group-load contender (bench/group/group_bench.py
starts N of these with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set):

    worker.py CONTENDER PATH OUT_JSON

Contenders: ckptio_alone (ckptio.torch.load_file, each rank alone),
ckptio_group (load_file with group=, each stored byte read once per
group: on one machine through the shared page cache), ckptio_group_x (the
same exchanging bytes over gloo, exchange=True), runai_alone (SafetensorsStreamer.stream_file, each rank alone),
runai_dist (the same with is_distributed=True and RUNAI_STREAMER_DIST=1:
runai's distributed mode over gloo, device cpu). Every rank then reads one
byte of every 4 KiB page of every tensor (what makes a mapped result
resident; a copy already is). The time runs from a barrier to a barrier
after that: until every rank holds the model. Rank 0 writes
{seconds, bytes_per_rank} and every rank its peak RSS and read_bytes."""
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist


def touch(t: torch.Tensor) -> int:
    b = t.reshape(-1).view(torch.uint8) if t.nelement() else t
    return int(b[::4096].sum()) if b.nelement() else 0


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def load(contender: str, path: str):
    if contender.startswith("ckptio"):
        import ckptio.torch as ct
        group = dist.group.WORLD if contender.startswith("ckptio_group") else None
        return ct.load_file(path, group=group, exchange=contender == "ckptio_group_x")
    from runai_model_streamer import SafetensorsStreamer
    out = {}
    with SafetensorsStreamer() as s:
        s.stream_file(path, None, "cpu", contender == "runai_dist")
        for name, t in s.get_tensors():
            out[name] = t
    return out


def main() -> None:
    contender, path, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    before = read_bytes()
    t0 = time.monotonic()
    tensors = load(contender, path)
    held = sum(touch(t) * 0 + t.nelement() * t.element_size() for t in tensors.values())
    dist.barrier()
    seconds = time.monotonic() - t0
    mine = read_bytes() - before
    rows = [None] * world
    dist.all_gather_object(rows, {"rank": rank, "read_bytes": mine,
                                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"seconds": seconds, "bytes_per_rank": held, "ranks": rows}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
