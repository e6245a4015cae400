"""The wheel's `ckptio` console command: runs the C program that the wheel
ships inside the package (ckptio/_bin/ckptio, see pyproject.toml), so that
pip puts `ckptio` on PATH. In a source tree the program is build/ckptio."""

from __future__ import annotations

import os
import pathlib
import sys


def main() -> int:
    """Runs the packaged program with this command's arguments (it replaces
    the process); 2 when the program is missing."""
    exe = pathlib.Path(__file__).resolve().parent / "_bin" / "ckptio"
    if not exe.is_file():
        sys.stderr.write(f"ckptio: {exe} is missing: this ckptio package was not installed "
                         "from the wheel (pip install . at the repository root); "
                         "in a source tree run build/ckptio\n")
        return 2
    os.execv(exe, ["ckptio", *sys.argv[1:]])
