"""Where a test's ranks meet: a file in a fresh directory (torch's
file:// init method), not a TCP port. A port found free by the parent and
bound later by rank 0 can be taken in between by a test running beside this
one (CI saw EADDRINUSE on interop_dcp); a fresh file cannot."""
import atexit
import os
import shutil
import tempfile


def init_method():
    directory = tempfile.mkdtemp(prefix="ckptio-group-")
    atexit.register(shutil.rmtree, directory, True)
    return "file://" + os.path.join(directory, "store")
