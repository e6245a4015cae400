"""Loads from and saves to object storage (issue 27, the "bench" bullet).
Loads: ckptio next to
runai-model-streamer and boto3 + safetensors on one safetensors object in a
real S3 server (SeaweedFS's `weed` on 127.0.0.1, tests/s3/weed_server.py),
each load in a fresh interpreter with every byte of every tensor read, the
order of the contenders rotated each round, and beside them the server's
own ceiling measured in the same round: parallel ranged GETs of the same
object by plain clients (bench/s3/s3_get.c over libcurl; boto3 in threads).
Saves: ckptio.torch.save_file("s3://...") next to boto3 (safetensors to a
local file + upload_file with boto3's default transfer config; safetensors
to bytes + upload_fileobj with a tuned parallel one), each in a fresh
interpreter holding the same state dict, order rotated per round, beside
the server's own multipart-upload ceiling of the same round: plain clients
uploading the same byte count in parallel 8 MiB parts (bench/s3/s3_put.c
over libcurl; boto3 upload_part in threads).

Run it through bench/s3/run.sh, which builds the library and s3_get and
picks the interpreter; `python s3_peers.py --help` lists the options.
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "s3"))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
import peers  # noqa: E402  (the state-dict builder, sizes and the touch pass)
import weed_server  # noqa: E402

# runai-model-streamer reads S3 itself (the AWS C++ SDK): the endpoint from
# AWS_ENDPOINT_URL, credentials from the environment, and path-style
# addressing (a bucket in the path, as weed on 127.0.0.1 needs) only when
# asked with this variable.
RUNAI_ENV = {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}

LOADERS = {
    "ckptio": "ckptio.torch.load_file(s3://...) (defaults)",
    "runai_stream": "runai SafetensorsStreamer, each tensor touched as yielded",
    "runai_keep": "runai SafetensorsStreamer, each tensor cloned (a state dict kept)",
    "boto3_st": "boto3 download_file to a local file + safetensors.torch.load_file",
    "ckptio_model": "ckptio.torch.load_model(model, s3://...) into a model built and touched before the clock "
                    "(as an inference server restores weights; not one of the issue's jobs)",
}
# The ceiling: the best of these in each round. 8 MiB ranges, as ckptio's
# staging chunk and runai's S3 block, and 16 MiB ones (two whole parts, as
# ckptio's GETs into host memory: weed serves them with less CPU); 16 and 32
# in flight (runai's streamer concurrency, ckptio's workers).
CEILINGS = {
    "get_c16": ("libcurl, 16 threads x 8 MiB ranged GETs into one buffer", ("c", 16, 8 << 20)),
    "get_c32": ("libcurl, 32 threads x 8 MiB ranged GETs into one buffer", ("c", 32, 8 << 20)),
    "get_c16_16m": ("libcurl, 16 threads x 16 MiB ranged GETs into one buffer", ("c", 16, 16 << 20)),
    "get_c32_16m": ("libcurl, 32 threads x 16 MiB ranged GETs into one buffer", ("c", 32, 16 << 20)),
    "get_py16": ("boto3 get_object, 16 threads x 8 MiB ranges, bytes discarded", ("py", 16, 8 << 20)),
}
# References, shown but outside the ceiling: the best way again into fresh,
# untouched memory, whose page faults a loader filling new tensors pays
# too (about 20 us per 4 KiB page on these VMs).
REFERENCES = {
    "get_c16_fresh": ("libcurl, 16 threads x 8 MiB into fresh memory (reference)", ("c", 16, 8 << 20)),
    "get_c16_thp": ("libcurl, 16 threads x 8 MiB into fresh memory in 2 MiB pages (reference)",
                    ("c", 16, 8 << 20)),
    "get_c32_16m_thp": ("libcurl, 32 threads x 16 MiB into fresh memory in 2 MiB pages (reference)",
                        ("c", 32, 16 << 20)),
}
WAYS = dict(CEILINGS, **REFERENCES)
RATIOS = [("ckptio / runai stream", "runai_stream"), ("ckptio / runai keep", "runai_keep"),
          ("ckptio / boto3 + safetensors", "boto3_st"), ("ckptio / ceiling", "ceiling"),
          ("ckptio / libcurl into fresh memory (reference)", "get_c16_fresh"),
          ("ckptio / libcurl 16 MiB GETs into fresh 2 MiB pages (reference)", "get_c32_16m_thp")]
GOALS = {"runai_stream": 1.1, "runai_keep": 1.1, "ceiling": 0.9}

# Saves. Each child holds the state dict (read from a local safetensors
# file and cloned, untimed; its peak RSS reset after) and times one save.
SAVERS = {
    "ckptio_save": "ckptio.torch.save_file(sd, s3://...) (defaults), after one untimed save of the same state "
                   "(a training loop's Nth save: context, staging ring touched, connections open)",
    "ckptio_first": "the same, the process's first save (its context, pool and staging ring made and touched "
                    "inside the time)",
    "boto3_file": "safetensors.torch.save_file to a local file + boto3 upload_file (default TransferConfig)",
    "boto3_tuned": "safetensors.torch.save to bytes + boto3 upload_fileobj, TransferConfig(8 MiB parts, "
                   "32 threads)",
}
WARM_PAUSE_S = 3.0
# The upload ceiling: the best of these in each round, the same byte count
# as the state dict's tensors, 8 MiB parts (ckptio's chunk and part).
PUT_CEILINGS = {
    "put_c16": ("libcurl multipart upload, 16 threads x 8 MiB parts from one touched buffer", ("c", 16, 8 << 20)),
    "put_c32": ("libcurl multipart upload, 32 threads x 8 MiB parts from one touched buffer", ("c", 32, 8 << 20)),
    "put_py16": ("boto3 upload_part, 16 threads x 8 MiB parts from one bytes buffer", ("py", 16, 8 << 20)),
}
SAVE_RATIOS = [("ckptio save / ceiling", "put_ceiling"), ("ckptio save / boto3 file + upload_file", "boto3_file"),
               ("ckptio save / boto3 bytes + tuned upload", "boto3_tuned")]
FIRST_SAVE_RATIOS = [("ckptio first save / ceiling", "put_ceiling"),
                     ("ckptio first save / boto3 file + upload_file", "boto3_file")]
SAVE_GOALS = {"put_ceiling": 0.9}
ALT_SAVE_RATIOS = [("ckptio save alt / ceiling", "put_ceiling"), ("ckptio save alt / ckptio save (speed-up)",
                                                                  "ckptio_save")]


# --split-cpus: weed on the first CPU, every contender on the others (None:
# all share every CPU).
CPUS = {"server": None, "client": None}


def vm_status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------ children

def child(a):
    """One timed load in this fresh interpreter: imports first (untimed),
    then the load and the touch pass inside the clock. Prints one JSON line."""
    import torch  # noqa: F401
    import ckptio.torch as ct
    bucket, key = a.url[len("s3://"):].split("/", 1)
    out = {"name": a.child}
    kind = a.child
    if kind in SAVERS or kind.startswith("put_py"):
        return child_save(a, ct, bucket, key, out)
    if kind.startswith("get_py"):
        import boto3
        from concurrent.futures import ThreadPoolExecutor
        threads, chunk = CEILINGS[kind][1][1:]
        c = boto3.client("s3")
        size = c.head_object(Bucket=bucket, Key=key)["ContentLength"]
        c.get_object(Bucket=bucket, Key=key, Range="bytes=0-0")["Body"].read()  # client warmed

        def get(off):
            end = min(off + chunk, size) - 1
            return len(c.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{end}")["Body"].read())
        peers.await_go()
        base = vm_status("VmRSS")
        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as ex:
            got = sum(ex.map(get, range(0, size, chunk)))
        out["seconds"] = time.monotonic() - t0
        out["bytes"] = got
        out["ok"] = got == size
    else:
        from runai_model_streamer import SafetensorsStreamer
        import safetensors.torch
        import boto3
        local = os.path.join(a.workdir, f"boto3-{os.getpid()}.safetensors")
        total = [0, 0]  # touch sum, tensor bytes

        def consume(_name, t):
            total[0] += peers.touch_one(t)
            total[1] += t.numel() * t.element_size()
        # The model a load_model fills is built first (every page written),
        # as an inference server builds it before it loads the weights.
        model = peers.built_model(ct, a.url) if kind == "ckptio_model" else None
        peers.await_go()
        base = vm_status("VmRSS")
        t0 = time.monotonic()
        if kind in ("ckptio", "ckptio_alt"):  # the same call; alt: another CKPTIO_LIB
            for k, t in ct.load_file(a.url).items():
                consume(k, t)
        elif kind == "ckptio_model":
            ct.load_model(model, a.url)
            for k, t in model.state_dict().items():
                consume(k, t)
        elif kind == "runai_stream":
            with SafetensorsStreamer() as st:
                st.stream_file(a.url)
                for k, t in st.get_tensors():
                    consume(k, t)
        elif kind == "runai_keep":
            with SafetensorsStreamer() as st:
                st.stream_file(a.url)
                kept = {k: t.clone() for k, t in st.get_tensors()}
            for k, t in kept.items():
                consume(k, t)
        elif kind == "boto3_st":
            try:
                boto3.client("s3").download_file(bucket, key, local)
                for k, t in safetensors.torch.load_file(local).items():
                    consume(k, t)
            finally:
                out["seconds"] = time.monotonic() - t0
                if os.path.exists(local):
                    os.unlink(local)
        else:
            raise SystemExit(f"unknown contender {kind}")
        out.setdefault("seconds", time.monotonic() - t0)
        out["bytes"], out["sum"] = total[1], total[0]
        out["ok"] = total[0] == a.sum and total[1] == a.bytes
    out["rss_base"] = base
    out["peak_rss"] = vm_status("VmHWM")
    print("S3PEERS " + json.dumps(out), flush=True)


def child_save(a, ct, bucket, key, out):
    """One timed save (or the boto3 way of the upload ceiling) in this
    fresh interpreter. The state dict is read from the local model file and
    cloned before the clock (real tensors, not a file's mapped pages), then
    the peak RSS is reset (clear_refs), so the peak above the baseline is
    what the save itself needed."""
    import io
    import torch
    import safetensors.torch
    import boto3
    from boto3.s3.transfer import TransferConfig
    kind = a.child
    # Each saver's client made before the clock, as a program that saves
    # every N steps has it: boto3's client (and a connection, HEAD bucket);
    # for ckptio one whole save of the same state, untimed (the context made,
    # its staging ring touched, which the library does lazily in the first
    # save, the connections open). ckptio_first times a process's first.
    c = boto3.client("s3")
    c.head_bucket(Bucket=bucket)
    if kind.startswith("put_py"):
        threads, part = PUT_CEILINGS[kind][1][1:]
        with open(a.model, "rb") as fh:
            fh.seek(os.path.getsize(a.model) - a.bytes)
            data = fh.read(a.bytes)
        # bytes per part, cut before the clock (boto3 takes no memoryview)
        chunks = [data[i:i + part] for i in range(0, a.bytes, part)]
        del data
    else:
        sd = {k: v.clone() for k, v in safetensors.torch.load_file(a.model).items()}
    if kind in ("ckptio_save", "ckptio_save_alt"):
        # The warm-up's object stays until the parent removes it with the
        # timed one (a delete here would set weed to work just before the
        # clock); and a pause of the few seconds every other contender has
        # between the previous upload and its own (the parent's HEAD and
        # delete, an interpreter's start, the state dict's load): right
        # after an upload weed is still busy with it.
        ct.save_file(sd, a.url + ".warm")
        time.sleep(WARM_PAUSE_S)
    import gc
    gc.collect()
    peers.await_go()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    base = vm_status("VmRSS")
    local = os.path.join(a.workdir, f"save-{os.getpid()}.safetensors")
    import resource
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    if kind in ("ckptio_save", "ckptio_save_alt", "ckptio_first"):  # the same call; alt: another CKPTIO_LIB
        ct.save_file(sd, a.url)
    elif kind == "boto3_file":
        try:
            safetensors.torch.save_file(sd, local)
            c.upload_file(local, bucket, key)
        finally:
            out["seconds"] = time.monotonic() - t0
            if os.path.exists(local):
                os.unlink(local)
    elif kind == "boto3_tuned":
        cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=32)
        c.upload_fileobj(io.BytesIO(safetensors.torch.save(sd)), bucket, key, Config=cfg)
    else:
        from concurrent.futures import ThreadPoolExecutor
        up = c.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

        def put(i):
            return {"PartNumber": i + 1, "ETag": c.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=i + 1,
                                                               Body=chunks[i])["ETag"]}
        with ThreadPoolExecutor(threads) as ex:
            parts = list(ex.map(put, range(len(chunks))))
        c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts})
    out.setdefault("seconds", time.monotonic() - t0)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)  # the client's CPU, every thread
    out["bytes"] = a.bytes
    out["ok"] = True
    out["rss_base"] = base
    out["peak_rss"] = vm_status("VmHWM")
    print("S3PEERS " + json.dumps(out), flush=True)


def run_child(name, url, nbytes, tsum, env, s3_get, workdir, alt_lib=None, wrap=(), model=None, s3_put=None):
    """A contender in a new process; returns its JSON (with "wall").
    wrap: a command the child runs under (strace, for --diagnose)."""
    if name in ("ckptio_alt", "ckptio_save_alt"):
        env = dict(env, CKPTIO_LIB=alt_lib)
    if name.startswith("get_c"):
        threads, chunk = WAYS[name][1][1:]
        sink = {"_fresh": "fresh", "_thp": "thp"}.get(name[name.rfind("_"):], "buffer")
        cmd = [s3_get, *url[len("s3://"):].split("/", 1), str(threads), str(chunk), sink]
    elif name.startswith("put_c"):
        threads, part = PUT_CEILINGS[name][1][1:]
        cmd = [s3_put, *url[len("s3://"):].split("/", 1), str(nbytes), str(threads), str(part)]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--url", url,
               "--bytes", str(nbytes), "--sum", str(tsum), "--workdir", workdir]
        if model:
            cmd += ["--model", model]
    cmd = [*wrap, *cmd]
    # Every contender starts its clock from the same memory state: see
    # peers.settle and peers.run_settled (memory freed 2 s ago has gone back
    # to this VM's host, and whoever allocates after a pause pays a host
    # fault per page).
    #
    # A failure whose cause is the server (weed answers 503 under this VM's
    # load now and then; InternalError once its volumes fill, which
    # run_saves' compaction prevents) is retried (twice at most); a third
    # failure ends the run.
    for attempt in (1, 2, 3):
        t0 = time.monotonic()
        pin = (lambda: os.sched_setaffinity(0, CPUS["client"])) if CPUS["client"] else None
        p = peers.run_settled(cmd, env, preexec_fn=pin, signals=not name.startswith(("get_c", "put_c")))
        wall = time.monotonic() - t0
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("S3PEERS ") or ln.startswith("{")]
        if p.returncode == 0 and lines:
            break
        server = any(w in p.stdout + p.stderr for w in ("InternalError", "HTTP 500", "HTTP 503", "SlowDown",
                                                          "ServiceUnavailable"))
        if attempt == 3 or not server:
            raise SystemExit(f"{name} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        print(f"  {name}: the server failed a request ({p.stderr.strip().splitlines()[-1][:200]}); "
              f"retrying", flush=True)
    r = json.loads(lines[-1].removeprefix("S3PEERS "))
    r["ok"] = r.get("ok", r["bytes"] == nbytes or name.startswith(("get_", "put_")))
    r["wall"] = wall
    r["attempts"] = attempt
    if not r["ok"]:
        raise SystemExit(f"{name} read wrong bytes: {r} (expected {nbytes} tensor bytes, sum {tsum})")
    return r


# ------------------------------------------------------------------ parent

def gbps(r):
    return r["bytes"] / r["seconds"] / 1e9


def prepare(server, size, workdir, log):
    """The state dict built in memory, written by ckptio, uploaded by boto3.
    Returns (url, tensor bytes, object bytes, touch sum, description)."""
    import torch
    import ckptio.torch as ct
    specs, desc = peers.model_specs("llm", size)
    sd = peers.build_state_dict(torch, specs)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    tsum = peers.touch(sd)
    path = os.path.join(workdir, "model.safetensors")
    ct.save_file(sd, path)
    del sd
    key = f"bench/llm-{peers.size_label(size)}.safetensors"
    t0 = time.monotonic()
    server.client().upload_file(path, server.bucket, key)
    obj = os.path.getsize(path)
    log(f"uploaded s3://{server.bucket}/{key}: {obj} bytes ({desc}) in {time.monotonic() - t0:.1f} s")
    return f"s3://{server.bucket}/{key}", nbytes, obj, tsum, desc, path


def run_saves(server, a, env, log, nbytes, model):
    """The save rounds: every saver and every way of the upload ceiling, a
    fresh interpreter (or s3_put) each, order rotated per round; each one's
    object removed after it, untimed."""
    names = a.savers + list(PUT_CEILINGS)
    c = server.client()
    rounds = []
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        res = {}
        for name in order:
            key = f"bench/save-{name}.safetensors"
            url = f"s3://{server.bucket}/{key}"
            res[name] = run_child(name, url, nbytes, 0, env, a.s3_get, a.workdir, a.alt_lib, model=model,
                                  s3_put=a.s3_put)
            size = c.head_object(Bucket=server.bucket, Key=key)["ContentLength"]
            if size < nbytes:
                raise SystemExit(f"{name} stored {size} bytes, fewer than the {nbytes} tensor bytes")
            c.delete_object(Bucket=server.bucket, Key=key)
            c.delete_object(Bucket=server.bucket, Key=key + ".warm")  # ckptio_save's warm-up (absent: no error)
            server.vacuum()  # untimed; without it weed fills up after ~15 GB of uploads
            log(f"  save round {r + 1} {name:12s} {gbps(res[name]):6.3f} GB/s  {res[name]['seconds']:6.2f} s"
                f"  CPU {res[name].get('cpu_s', 0):5.2f} s"
                + (f"  peak RSS above the state dict {(res[name]['peak_rss'] - res[name]['rss_base']) / 2**20:6.0f} MiB"
                   if "peak_rss" in res[name] else ""))
        ceil = max(PUT_CEILINGS, key=lambda n: gbps(res[n]))
        res["put_ceiling"] = dict(res[ceil], way=ceil)
        rounds.append({"order": order, "results": res})
    left = c.list_multipart_uploads(Bucket=server.bucket, Prefix="bench/").get("Uploads", [])
    if left:
        raise SystemExit(f"uploads left open after the save rounds: {[u['Key'] for u in left]}")
    return rounds


def run_size(server, size, a, env, log):
    url, nbytes, obj, tsum, desc, model = prepare(server, size, a.workdir, log)
    try:
        loads = run_loads(server, a, env, log, url, nbytes, obj, tsum) if a.loads else []
        saves = run_saves(server, a, env, log, nbytes, model) if a.savers else []
    finally:
        os.unlink(model)
    diag = {n: diagnose(n, url, nbytes, tsum, env, a) for n in a.contenders
            if a.diagnose and a.loads and n.startswith("ckptio")}
    return {"size": size, "label": peers.size_label(size), "url": url, "tensor_bytes": nbytes,
            "object_bytes": obj, "model": desc, "rounds": loads, "save_rounds": saves, "diagnosis": diag}


def run_loads(server, a, env, log, url, nbytes, obj, tsum):
    names = a.contenders + list(WAYS)
    # One untimed read of the whole object first: right after the upload,
    # the first load of bench/s3/pairs ran at half the speed of the same
    # contender's later rounds (bench/RESULTS_S3.md).
    run_child("get_c32", url, obj, tsum, env, a.s3_get, a.workdir)
    rounds = []
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        res = {}
        for name in order:
            res[name] = run_child(name, url, nbytes if not name.startswith("get_") else obj, tsum, env,
                                  a.s3_get, a.workdir, a.alt_lib)
            log(f"  round {r + 1} {name:13s} {gbps(res[name]):6.3f} GB/s  {res[name]['seconds']:6.2f} s"
                + (f"  peak RSS {res[name]['peak_rss'] / 2**20:6.0f} MiB" if "peak_rss" in res[name] else ""))
        ceil = max(CEILINGS, key=lambda n: gbps(res[n]))
        res["ceiling"] = dict(res[ceil], way=ceil)
        rounds.append({"order": order, "results": res})
    return rounds


def diagnose(name, url, nbytes, tsum, env, a):
    """One more (untimed) ckptio load under strace: the HTTP requests it
    sends, by Range size, and the connections it opens. What the library's
    own S3 client counts (ckptio_s3_client_stats) is not exported, and its
    request size is the question when it trails the ceiling."""
    strace = shutil.which("strace")
    if not strace:
        print(f"s3_peers: --diagnose SKIPPED: strace is not installed (apt-get install strace)", flush=True)
        return {"skipped": "strace is not installed"}
    trace = os.path.join(a.workdir, f"strace-{name}.txt")
    run_child(name, url, nbytes, tsum, env, a.s3_get, a.workdir, a.alt_lib,
              wrap=(strace, "-f", "-qq", "-e", "trace=sendto,sendmsg,write,connect", "-s", "1024", "-o", trace))
    sizes, methods, connects = {}, {}, 0
    with open(trace, errors="replace") as fh:
        for line in fh:
            if " connect(" in line and "sin_port=htons" in line and "127.0.0.1" in line:
                connects += 1
            m = re.search(r'"(GET|HEAD|PUT|POST) /', line)
            if not m:
                continue
            methods[m.group(1)] = methods.get(m.group(1), 0) + 1
            r = re.search(r"[Rr]ange: bytes=(\d+)-(\d+)", line)
            if m.group(1) == "GET":
                n = int(r.group(2)) - int(r.group(1)) + 1 if r else -1
                sizes[n] = sizes.get(n, 0) + 1
    os.unlink(trace)
    return {"requests": methods, "get_sizes": dict(sorted(sizes.items(), key=lambda kv: -kv[1])),
            "connects": connects}


def ratio(rd, other, who="ckptio"):
    return gbps(rd["results"][who]) / gbps(rd["results"][other])


def report(cases, a, command, machine):
    L = [f"# ckptio loads from and saves to S3 next to its peers", "", f"    {command}", "",
         f"Machine: {machine}. Server: SeaweedFS `weed` ({a.weed_version}) on 127.0.0.1, "
         f"data under {a.workdir}. Loopback to a local weed on this machine measures CPU and the "
         f"server, not a network; "
         + (f"weed ran on CPU {sorted(CPUS['server'])} and every contender and ceiling client on CPUs "
            f"{sorted(CPUS['client'])} (--split-cpus), as with a server of its own."
            if CPUS["server"] else "client and server shared every core."),
         f"runai-model-streamer {a.runai_version}, env: "
         + ", ".join(f"{k}={v}" for k, v in RUNAI_ENV.items()) + " (endpoint from AWS_ENDPOINT_URL).",
         f"Every load in a fresh interpreter, imports untimed, the touch pass (sum of every byte) "
         f"inside the time; order rotated each round; GB = 1e9 bytes of tensor data (the ceiling "
         f"counts the whole object). The ceiling of a round is the best of: "
         + "; ".join(f"{n} ({v[0]})" for n, v in CEILINGS.items()) + ". References outside it: "
         + "; ".join(f"{n} ({v[0]})" for n, v in REFERENCES.items()) + ". "
         + (f"Before every contender {peers.PRIME['bytes'] / 2**30:.2f} GiB of memory touched and freed "
            f"(bench/peers' primer: the same, hot, memory state for every contender)."
            if peers.PRIME["bytes"] else "No memory primer (--no-prime)."), ""]
    for c in cases:
        L += [f"## {c['label']}: {c['model']}", ""]
        if c["rounds"]:
            L += report_loads(c, a)
        if c["save_rounds"]:
            L += report_saves(c, a)
    return "\n".join(L) + "\n"


def report_saves(c, a):
    rounds = c["save_rounds"]
    L = [f"### Saves: {c['tensor_bytes']} tensor bytes, {len(rounds)} rounds", "",
         "Each saver in a fresh interpreter holding the state dict (cloned from a local file before the clock; "
         "peak RSS reset after, so the peak above it is what the save needed), its client made before the clock "
         "(boto3's client and a HEAD bucket; for ckptio_save one untimed save of the same state before, then a "
         f"{WARM_PAUSE_S:.0f} s pause as the others have between uploads: its "
         "staging ring is then touched before the peak is reset, so its peak excludes the ring, ckptio_first's "
         "includes it). The ceiling of a round is the "
         "best of: " + "; ".join(f"{n} ({v[0]})" for n, v in PUT_CEILINGS.items()) + ".", "",
         "| saver | median GB/s | min-max | median s | client CPU s (user + sys, all threads) | "
         "peak RSS above the state dict, MiB (max) |",
         "|---|---|---|---|---|---|"]
    for n in a.savers + list(PUT_CEILINGS) + ["put_ceiling"]:
        rs = [rd["results"][n] for rd in rounds]
        g = [gbps(r) for r in rs]
        rss = ""
        if "peak_rss" in rs[0]:
            above = [(r["peak_rss"] - r["rss_base"]) / 2**20 for r in rs]
            rss = f"{statistics.median(above):.0f} ({max(above):.0f})"
        label = SAVERS.get(n) or (PUT_CEILINGS[n][0] if n in PUT_CEILINGS else "ceiling (best way per round)")
        cpu = f"{statistics.median(r['cpu_s'] for r in rs):.2f}" if "cpu_s" in rs[0] else ""
        L.append(f"| {n}: {label} | {statistics.median(g):.3f} | {min(g):.3f}-{max(g):.3f} | "
                 f"{statistics.median(r['seconds'] for r in rs):.2f} | {cpu} | {rss} |")
    L += ["", "Per-round ratios (ckptio's save GB/s over the other's, same round):", "",
          "| ratio | " + " | ".join(f"r{i + 1}" for i in range(len(rounds))) + " | median | goal |",
          "|---|" + "---|" * (len(rounds) + 2)]
    pairs = [(label, other, "ckptio_save") for label, other in SAVE_RATIOS]
    pairs += [(label, other, "ckptio_first") for label, other in FIRST_SAVE_RATIOS]
    pairs += [(label, other, "ckptio_save_alt") for label, other in ALT_SAVE_RATIOS]
    for label, other, who in pairs:
        if other not in rounds[0]["results"] or who not in rounds[0]["results"]:
            continue
        rr = [ratio(rd, other, who) for rd in rounds]
        goal = SAVE_GOALS.get(other)
        med = statistics.median(rr)
        verdict = "" if goal is None else (f">= {goal} {'met' if med >= goal else 'NOT met'}")
        L.append(f"| {label} | " + " | ".join(f"{x:.2f}" for x in rr) + f" | **{med:.2f}** | {verdict} |")
    L += ["", "Ceiling way per round: " + ", ".join(rd["results"]["put_ceiling"]["way"] for rd in rounds), ""]
    retried = [f"{n} r{i + 1}" for i, rd in enumerate(rounds) for n, r in rd["results"].items()
               if n != "put_ceiling" and r.get("attempts", 1) > 1]
    L += [f"Retried after the server failed a request: {', '.join(retried) or 'none'}.", ""]
    return L


def report_loads(c, a):
    L = []
    if True:
        L += [f"### Loads: {c['url']}, {c['object_bytes']} bytes, {len(c['rounds'])} rounds.", ""]
        names = a.contenders + list(WAYS) + ["ceiling"]
        L += ["| contender | median GB/s | min-max | median s | peak RSS MiB (above imports) |",
              "|---|---|---|---|---|"]
        for n in names:
            rs = [rd["results"][n] for rd in c["rounds"]]
            g = [gbps(r) for r in rs]
            rss = ""
            if "peak_rss" in rs[0]:
                rss = (f"{statistics.median(r['peak_rss'] for r in rs) / 2**20:.0f} "
                       f"({statistics.median(r['peak_rss'] - r['rss_base'] for r in rs) / 2**20:.0f})")
            label = LOADERS.get(n) or (WAYS[n][0] if n in WAYS else "ceiling (best way per round)")
            L.append(f"| {n}: {label} | {statistics.median(g):.3f} | {min(g):.3f}-{max(g):.3f} | "
                     f"{statistics.median(r['seconds'] for r in rs):.2f} | {rss} |")
        L += ["", "Per-round ratios (ckptio's GB/s over the other's, same round):", "",
              "| ratio | " + " | ".join(f"r{i + 1}" for i in range(len(c["rounds"]))) + " | median | goal |",
              "|---|" + "---|" * (len(c["rounds"]) + 2)]
        for who in [n for n in ("ckptio", "ckptio_alt", "ckptio_model") if n in a.contenders]:
            for label, other in RATIOS:
                if other not in c["rounds"][0]["results"]:
                    continue
                rr = [ratio(rd, other, who) for rd in c["rounds"]]
                goal = GOALS.get(other)
                med = statistics.median(rr)
                verdict = "" if goal is None else (f">= {goal} {'met' if med >= goal else 'NOT met'}")
                label = label.replace("ckptio", who, 1)
                L.append(f"| {label} | " + " | ".join(f"{x:.2f}" for x in rr)
                         + f" | **{med:.2f}** | {verdict} |")
        L += ["", "Ceiling way per round: " + ", ".join(rd["results"]["ceiling"]["way"] for rd in c["rounds"]),
              ""]
        for who, d in c.get("diagnosis", {}).items():
            if "skipped" in d:
                L += [f"Requests of {who}: not counted ({d['skipped']}).", ""]
                continue
            top = ", ".join(f"{n} x {sz if sz >= 0 else 'whole'} B" for sz, n in list(d["get_sizes"].items())[:6])
            L += [f"Requests of one {who} load (strace, untimed): {d['requests']}, "
                  f"{d['connects']} connections; GETs by range size: {top}.", ""]
    return L


def machine_line():
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem / 2**30:.0f} GiB, Linux {platform.release()}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256MiB,1GiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--contenders", default=",".join(LOADERS), help="the loaders ('' or --no-loads: none)")
    ap.add_argument("--no-loads", dest="loads", action="store_false", help="the save rounds only")
    ap.add_argument("--savers", default=",".join(SAVERS), help="the savers ('': no save rounds)")
    ap.add_argument("--s3-put", dest="s3_put", default=None, help="the built bench/s3/s3_put.c")
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=HERE, help="where results.md and results.json go")
    ap.add_argument("--workdir", default=None, help="weed's data and boto3's downloads (default: a temp dir)")
    ap.add_argument("--alt-lib", dest="alt_lib", default=None,
                    help="also time ckptio_alt (and ckptio_save_alt): the same load (save) with this libckptio.so "
                         "(an experiment)")
    ap.add_argument("--alt-label", dest="alt_label", default="another libckptio.so",
                    help="what --alt-lib is, for the report")
    ap.add_argument("--diagnose", action="store_true",
                    help="after the rounds, count the HTTP requests of one ckptio load (strace)")
    ap.add_argument("--s3-get", dest="s3_get", default=None, help="the built bench/s3/s3_get.c")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sum", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--split-cpus", action="store_true",
                    help="weed on the first CPU, the contenders (and the ceiling's clients) on the "
                         "others, as with a server on a machine of its own; default: all share every CPU")
    ap.add_argument("--no-prime", dest="prime", action="store_false",
                    help="skip the memory primer before each contender (bench/peers' settle())")
    a = ap.parse_args()
    if a.child:
        return child(a)
    a.contenders = [c for c in a.contenders.split(",") if c]
    if a.alt_lib:
        a.alt_lib = os.path.abspath(a.alt_lib)
        LOADERS["ckptio_alt"] = f"as ckptio, with {a.alt_label} ({a.alt_lib})"
        if "ckptio_alt" not in a.contenders and a.loads:
            a.contenders.append("ckptio_alt")
        SAVERS["ckptio_save_alt"] = f"as ckptio_save, with {a.alt_label} ({a.alt_lib})"
    a.savers = [c for c in a.savers.split(",") if c]
    if a.alt_lib and a.savers and "ckptio_save_alt" not in a.savers:
        a.savers.append("ckptio_save_alt")
    a.loads = a.loads and bool(a.contenders)
    if a.loads and "ckptio" not in a.contenders:
        ap.error("the ratios need ckptio among --contenders")
    for c in a.savers:
        if c not in SAVERS:
            ap.error(f"unknown saver {c}: one of {', '.join(SAVERS)}")
    if a.savers and (not a.s3_put or not os.access(a.s3_put, os.X_OK)):
        ap.error("--s3-put: the built s3_put (bench/s3/run.sh builds it)")
    for c in a.contenders:
        if c not in LOADERS:
            ap.error(f"unknown contender {c}: one of {', '.join(LOADERS)}")
    if not a.s3_get or not os.access(a.s3_get, os.X_OK):
        ap.error("--s3-get: the built s3_get (bench/s3/run.sh builds it)")
    sizes = [peers.parse_size(s) for s in a.sizes.split(",") if s]
    if a.prime:  # as bench/peers: twice the largest model and a ring, within half the free memory
        peers.PRIME["bytes"] = max(0, min(2 * max(sizes) + (256 << 20), peers.mem_available() // 2 - (1 << 30)))
    own_tmp = a.workdir is None
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="ckptio-s3bench-")
    os.makedirs(a.workdir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)

    def log(msg):
        print(msg, flush=True)
    import runai_model_streamer  # noqa: F401  (fail early, before the server starts)
    from importlib.metadata import version
    a.runai_version = version("runai-model-streamer")
    if a.split_cpus:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("s3_peers: --split-cpus needs at least 2 CPUs")
        CPUS.update(server={cpus[0]}, client=set(cpus[1:]))
    try:
        server = weed_server.WeedServer(bucket="ckptio-bench", workdir=a.workdir, cpus=CPUS["server"])
    except weed_server.Unavailable as e:
        raise SystemExit(f"s3_peers: {e}")
    a.weed_version = subprocess.run([server.weed, "version"], capture_output=True, text=True).stdout.strip()
    command = a.command or " ".join(sys.argv)
    machine = machine_line()
    cases = []

    # A kill (or a nohup'd run, where SIGINT is ignored) still stops weed:
    # SystemExit unwinds through the `with` below.
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        with server:
            log(f"weed on {server.endpoint} ready in {server.startup_seconds:.1f} s; {machine}")
            env = dict(server.env(), **RUNAI_ENV)
            for size in sizes:
                cases.append(run_size(server, size, a, env, log))
                write_results(cases, a, command, machine)  # each size's as soon as it is done
    finally:
        if own_tmp:
            shutil.rmtree(a.workdir, ignore_errors=True)
    print(write_results(cases, a, command, machine))


def write_results(cases, a, command, machine):
    text = report(cases, a, command, machine)
    with open(os.path.join(a.out, "results.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump({"command": command, "machine": machine, "runai_env": RUNAI_ENV, "cases": cases}, fh,
                  indent=1)
    return text


if __name__ == "__main__":
    sys.exit(main())
