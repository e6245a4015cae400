"""The S3 server of a pytest module that drives ckptio through its
environment: attached to under ctest's weed_server.py, else started; its
AWS_* variables set in os.environ while the module runs (ckptio reads them
there), restored after. Skips with the reason when no server can run or the
library was built without S3."""
import os

import pytest

import weed_server


def serve(bucket):
    """The body of a module-scoped fixture: `yield from serve("name")`."""
    import ckptio.torch as ct
    from ckptio.errors import CkptioError
    try:
        server = weed_server.WeedServer.attach_or_start(bucket=bucket)
    except weed_server.Unavailable as e:
        pytest.skip(str(e))
    with server:
        old = {k: os.environ.get(k) for k in server.env({})}
        os.environ.update(server.env({}))
        try:
            try:  # a library built without libcurl says so for any s3:// path
                ct.load_file(f"s3://{server.bucket}/no-such-probe.safetensors")
            except FileNotFoundError:
                pass
            except CkptioError as e:
                if "libcurl" in str(e) or "without S3" in str(e):
                    pytest.skip(f"this library has no S3 support: {e}")
                raise
            yield server
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
