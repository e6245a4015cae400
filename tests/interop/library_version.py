"""The version of the libckptio a test run loaded, checked to be this source
tree's. The interop tests report which packages a run was judged against;
that report is only worth something if the library in it is the one built
from these sources: CKPTIO_LIB, or ckptio._lib's search (which ends at the
loader path), may find another build or an installed copy. CMakeLists.txt's
project(VERSION) is the one version (the wheel's metadata reads it there:
pyproject.toml), and include/ckptio.h's CKPTIO_VERSION_* are what the
library reports; a bump of one and not the other fails here too."""
import pathlib
import re

import ckptio

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tree_version():
    m = re.search(r"project\(ckptio VERSION ([0-9][0-9.]*)", (ROOT / "CMakeLists.txt").read_text())
    assert m, f"no project(ckptio VERSION ...) in {ROOT / 'CMakeLists.txt'}"
    return m.group(1)


def checked_library_version():
    """The loaded library's version string, after asserting that it says its
    number (major*10000 + minor*100 + patch), that it is this tree's, and
    that the binding reports the same."""
    lib = ckptio._lib.lib()
    number = int(lib.ckptio_version_number())
    text = lib.ckptio_version_string().decode()
    assert text == f"{number // 10000}.{number // 100 % 100}.{number % 100}", (text, number)
    tree = tree_version()
    assert text == tree, f"the loaded {lib._name} is version {text}; this tree (CMakeLists.txt) is {tree}"
    assert ckptio.version() == text
    return text
