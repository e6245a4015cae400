#!/usr/bin/env python3
"""The S3 client's own rates on the test server, next to boto3's on the same
server in the same round (the disk and the 2 cores here drift minute to
minute: compare within a round). Not a test: a check that the client is
not the bottleneck before the S3 backend is built on it.

usage: client_bench.py TEST_S3_BINARY [--mib 256] [--threads 8] [--chunk-mib 8] [--rounds 3]

Each round: test_s3 bench (a multipart upload of CHUNK_MIB parts from
THREADS threads, then
every byte back by ranged GETs of CHUNK_MIB from THREADS threads), then
boto3's upload_fileobj / download_fileobj of the same size with the same
part size and concurrency. Prints MB/s per round, the ratio to boto3 in
that round, and the medians.
"""
import argparse
import io
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "s3"))
import weed_server  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--chunk-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from boto3.s3.transfer import TransferConfig
    print("command: %s" % " ".join(sys.argv))
    print("machine: %d cores, %s" % (os.cpu_count(), os.uname().release))
    rows = []
    with weed_server.WeedServer() as s3:
        print("weed ready in %.1f s at %s" % (s3.startup_seconds, s3.endpoint))
        c = s3.client()
        size = a.mib << 20
        blob = os.urandom(size)
        cfg = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=a.chunk_mib << 20,
                             max_concurrency=a.threads)
        for r in range(a.rounds):
            out = subprocess.run([a.binary, "bench", "bench/ckptio-%d" % r, str(a.mib), str(a.threads),
                                  str(a.chunk_mib)], env=s3.env(), capture_output=True, text=True, timeout=600)
            m = re.search(r"upload_MBps ([0-9.]+) get_MBps ([0-9.]+)", out.stdout)
            if out.returncode or not m:
                sys.exit("test_s3 bench failed: %s %s" % (out.stdout, out.stderr))
            ck_up, ck_get = float(m.group(1)), float(m.group(2))
            t0 = time.monotonic()
            c.upload_fileobj(io.BytesIO(blob), s3.bucket, "bench/boto3-%d" % r, Config=cfg)
            b_up = size / (time.monotonic() - t0) / 1e6
            sink = io.BytesIO()
            t0 = time.monotonic()
            c.download_fileobj(s3.bucket, "bench/boto3-%d" % r, sink, Config=cfg)
            b_get = size / (time.monotonic() - t0) / 1e6
            assert sink.getvalue() == blob
            rows.append((ck_up, b_up, ck_get, b_get))
            print("round %d: upload ckptio %.0f MB/s boto3 %.0f MB/s (x%.2f) | get ckptio %.0f MB/s boto3 %.0f MB/s "
                  "(x%.2f)" % (r + 1, ck_up, b_up, ck_up / b_up, ck_get, b_get, ck_get / b_get))
            c.delete_object(Bucket=s3.bucket, Key="bench/boto3-%d" % r)
            c.delete_object(Bucket=s3.bucket, Key="bench/ckptio-%d" % r)
    med = [statistics.median(x) for x in zip(*rows)]
    print("median: upload ckptio %.0f boto3 %.0f MB/s, ratio per round median x%.2f (min %.2f max %.2f) | "
          "get ckptio %.0f boto3 %.0f MB/s, ratio median x%.2f (min %.2f max %.2f)"
          % (med[0], med[1], statistics.median(r[0] / r[1] for r in rows), min(r[0] / r[1] for r in rows),
             max(r[0] / r[1] for r in rows), med[2], med[3], statistics.median(r[2] / r[3] for r in rows),
             min(r[2] / r[3] for r in rows), max(r[2] / r[3] for r in rows)))


if __name__ == "__main__":
    main()
