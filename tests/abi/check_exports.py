#!/usr/bin/env python3
"""The shared library exports exactly the public API: the functions
include/ckptio.h declares (its stable part and its experimental section,
declared where CKPTIO_EXPERIMENTAL is defined), the list in src/ckptio.map,
and the symbols libckptio.so defines are the same three sets, each under the
version node of the map. Catches a function exported by accident (an internal ckptio_*
that lost its `static` or hidden visibility), one declared but not built or
not listed, and a listed one that no longer exists; and that every declared
function has its doc comment, in the header's one form ("/*! name() :"),
and that the library's list of ckptio_options' fields is the struct's.

usage: check_exports.py LIBCKPTIO_SO SOURCE_DIR [CC]
Exit 0 when they agree, 1 with the differences. Python 3 standard library,
nm and a C compiler (for the preprocessor).
"""
import os
import re
import subprocess
import sys


def header_functions(source, cc, program):
    """The functions a translation unit of `program` (C text) sees declared."""
    text = subprocess.run([cc, "-E", "-P", "-I", os.path.join(source, "include"), "-x", "c", "-"], input=program,
                          check=True, capture_output=True, text=True).stdout
    text = re.sub(r"\s+", " ", text)
    # A declaration names the function just before its parameter list; the
    # struct fields of function type are "(*name)(", which this skips.
    return set(re.findall(r"\b(ckptio_[a-z0-9_]+)\s*\(", text))


# Every declaration, stable and experimental: the experimental section is
# exported like the rest (ckptio.h, "experimental").
ALL = "#define CKPTIO_EXPERIMENTAL\n#include \"ckptio.h\"\n"
STABLE = "#include \"ckptio.h\"\n"
# The section's own guard: a file that included the header before defining
# the macro gets the section from a second include.
AGAIN = "#include \"ckptio.h\"\n#define CKPTIO_EXPERIMENTAL\n#include \"ckptio.h\"\n"


def map_functions(source):
    """{function: the version node src/ckptio.map lists it under}: the first
    node ('NODE { global: ... local: *; };') and the later releases' nodes
    ('NODE { global: ... } PREVIOUS;')."""
    text = open(os.path.join(source, "src", "ckptio.map")).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    nodes = re.findall(r"([\w.]+)\s*\{\s*global:(.*?)(?:local:[^}]*)?\}", text, flags=re.S)
    if not nodes:
        sys.exit("src/ckptio.map: no 'NODE { global: ... }' block")
    return {n.strip(): node for node, body in nodes for n in body.split(";") if n.strip()}


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TtWi":
            name, _, version = f[2].partition("@")
            if version.startswith("@") or name not in names:  # the default version: '@@'
                names[name] = version.lstrip("@")
    return names


# ckptio_comm grew in 1.1 (alltoallv). A program built against 1.0 calls
# ckptio_comm_single@CKPTIO_1.0 with 1.0's struct, 40 bytes on LP64: that
# symbol must write those and nothing past them.
COMM_1_0_BYTES = 40


def sanitized(lib):
    """Whether lib needs a sanitizer's runtime, which must come first in a
    process: this script's Python cannot load it."""
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    return any(n in out for n in ("libasan", "libtsan", "libubsan"))


def check_old_comm_single(lib):
    if sanitized(lib):
        print("note: ckptio_comm_single@CKPTIO_1.0 not called: a sanitizer build (the release build's abi_exports calls it)")
        return []
    import ctypes
    libc = ctypes.CDLL(None)
    libc.dlvsym.restype = ctypes.c_void_p
    libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    handle = ctypes.CDLL(os.path.abspath(lib))._handle
    addr = libc.dlvsym(handle, b"ckptio_comm_single", b"CKPTIO_1.0")
    if not addr:
        return ["ckptio_comm_single@CKPTIO_1.0: missing (programs built against 1.0 would not start)"]
    buf = (ctypes.c_ubyte * 128)(*([0xAB] * 128))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr)(ctypes.addressof(buf))
    size = int.from_bytes(bytes(buf[:8]), "little")
    problems = []
    if size != COMM_1_0_BYTES:
        problems.append(f"ckptio_comm_single@CKPTIO_1.0 set size {size}, not 1.0's {COMM_1_0_BYTES}")
    if any(b != 0xAB for b in buf[COMM_1_0_BYTES:]):
        problems.append("ckptio_comm_single@CKPTIO_1.0 wrote past 1.0's struct")
    return problems


DECLARATION = re.compile(r"^(?:const |unsigned )?[a-z_0-9]+\s*\**\s*(ckptio_\w+)\((?!\*)")


def undocumented(source):
    """Public functions without their doc comment in the header's one form:
    "/*! name() :" (or "/*! a(), b() :" over a group declared together)
    directly above the declaration."""
    lines = open(os.path.join(source, "include", "ckptio.h")).read().split("\n")
    problems, i = [], 0
    while i < len(lines):
        if not DECLARATION.match(lines[i]):
            i += 1
            continue
        start, names = i, []
        while i < len(lines) and DECLARATION.match(lines[i]):
            names.append(DECLARATION.match(lines[i]).group(1))
            while not lines[i].rstrip().endswith(";"):
                i += 1
            i += 1
        k = start - 1
        while k >= 0 and lines[start - 1].rstrip().endswith("*/") and "/*" not in lines[k]:
            k -= 1
        head = lines[k] if k >= 0 and lines[start - 1].rstrip().endswith("*/") else ""
        want = "/*! %s :" % ", ".join(n + "()" for n in names)
        if not head.startswith(want):
            problems.append("ckptio.h:%d: %s: no doc comment starting '%s' above it" % (start + 1, names[0], want))
    return problems


def option_fields_apart(source):
    """The fields of ckptio_options (after size), in order, against the
    library's one list of them (src/core/options.h, CKPTIO_OPTION_FIELDS),
    which the per-call check and merge walk."""
    header = open(os.path.join(source, "include", "ckptio.h")).read()
    body = re.search(r"typedef struct ckptio_options \{(.*?)\} ckptio_options;", header, re.S).group(1)
    fields = re.findall(r"^\s+[a-z_0-9 ]+?\s+\**([a-z_0-9]+);", re.sub(r"/\*.*?\*/", "", body, flags=re.S), re.M)
    table = open(os.path.join(source, "src", "core", "options.h")).read().split("#define CKPTIO_OPTION_FIELDS(X)")[1]
    listed = re.findall(r"X\((\w+), (?:CONTEXT|CALL)\)", table.split("\n\n")[0])
    if fields[1:] != listed:
        return ["ckptio_options has the fields %s after size, CKPTIO_OPTION_FIELDS (src/core/options.h) lists %s"
                % (", ".join(fields[1:]), ", ".join(listed))]
    return []


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    lib, source = sys.argv[1], sys.argv[2]
    cc = sys.argv[3] if len(sys.argv) > 3 else "cc"
    header = header_functions(source, cc, ALL)
    stable = header_functions(source, cc, STABLE)
    node_of = map_functions(source)
    listed = set(node_of)
    built = exported(lib)
    problems = []
    for what, program in (("without", STABLE), ("with", ALL)):
        # The stable part must stand alone: none of its declarations may
        # need a type of the experimental section.
        done = subprocess.run([cc, "-fsyntax-only", "-I", os.path.join(source, "include"), "-x", "c", "-"],
                              input=program, capture_output=True, text=True)
        if done.returncode != 0:
            problems.append(f"ckptio.h does not compile {what} CKPTIO_EXPERIMENTAL:\n{done.stderr.strip()}")
    if not stable < header:
        problems.append("ckptio.h: CKPTIO_EXPERIMENTAL declares nothing more: no experimental section, or no guard")
    for name in sorted(header ^ header_functions(source, cc, AGAIN)):
        problems.append(f"{name}: not declared when ckptio.h is included again after defining CKPTIO_EXPERIMENTAL")
    for name in sorted(set(built) - header):
        problems.append(f"{name}: exported by {os.path.basename(lib)} but not declared in ckptio.h")
    for name in sorted(header - set(built)):
        problems.append(f"{name}: declared in ckptio.h but not exported")
    for name in sorted(header ^ listed):
        where = ("listed in src/ckptio.map but not declared in ckptio.h" if name in listed
                 else "declared in ckptio.h but not listed in src/ckptio.map")
        problems.append(f"{name}: {where}")
    for name in sorted(header & set(built) & listed):
        if built[name] != node_of[name]:
            problems.append(f"{name}: exported under version '{built[name]}', not {node_of[name]}")
    problems += check_old_comm_single(lib)
    problems += undocumented(source)
    problems += option_fields_apart(source)
    for p in problems:
        print("FAIL " + p)
    print(f"check_exports: {len(header)} functions declared ({len(stable)} stable, {len(header - stable)} "
          f"experimental), {len(listed)} listed, {len(built)} exported "
          f"(nodes {', '.join(sorted(set(node_of.values())))}): "
          f"{'OK' if not problems else str(len(problems)) + ' problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
