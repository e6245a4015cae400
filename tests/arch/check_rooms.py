#!/usr/bin/env python3
"""The architecture guard (issue 10, item 5): fails when

  (a) two rooms of src/ call each other, directly or around a loop. A room
      is a folder of src/ (files directly in src/ form the room "src";
      cuda/ is the room "cuda"); a call is an object file of one room
      using a global function that an object of another room defines, read
      from the built objects of ckptio_obj and ckptio_cli with nm;
  (b) a file outside cuda/ includes a CUDA header;
  (c) a file of src/ outside src/device/ uses the device table (ops->);
  (e) a room calls a room outside the list ALLOWED gives it, or a room
      other than a library's owner (LIBRARY_OWNER) calls that library
      (libcurl is src/s3's alone);
  (d) an object of ckptio_obj or ckptio_cli calls a C library function
      that is not thread-safe (strerror and kin, UNSAFE_LIBC below): the
      library's workers, commit threads and the manager's closer run
      beside the caller's threads (core/error.h's ckptio_errno_text names
      an errno safely);
  (f) an object of a room held to the public API (PUBLIC_ONLY: the command,
      src/cli, and the manager, src/manage) uses a function another room
      defines that include/ckptio.h does not declare, outside the rooms
      docs/ARCHITECTURE.md lets it call besides (core, for the manager).

Prints the room graph, every cycle with the symbols that make each of its
edges, and every (b) and (c) finding. Exit 1 on any finding, 0 when clean,
2 when it cannot check (no objects: build first). --report prints the same
and exits 0. Python 3 standard library only.

usage: check_rooms.py --build BUILD_DIR [--source SOURCE_DIR] [--nm NM] [--report]
"""
import argparse
import os
import re
import subprocess
import sys

TARGETS = ("ckptio_obj", "ckptio_cli")
SOURCE_EXT = (".c", ".cc", ".cpp")
# Headers of the CUDA toolkit a file may name (cuda.h, cuda_runtime_api.h,
# cuda_fp16.h, cufile.h, cublas_v2.h, driver_types.h, ...).
CUDA_HEADER = re.compile(
    r'^\s*#\s*include\s*[<"]\s*((?:cuda|cufile|cublas|cusparse|cufft|curand|nvml|nvrtc|'
    r'driver_types|vector_types|host_defines|library_types|crt/)[^>"]*)[>"]', re.M)
FUNC_TYPES = set("TWi")  # global text, weak, indirect functions (nm -P)
# Functions whose result lives in a static buffer shared by every thread
# (POSIX lists them as not thread-safe); each has a safe form.
UNSAFE_LIBC = ("strerror", "strsignal", "strtok", "localtime", "gmtime", "ctime", "asctime")
# Rooms held to a list of the rooms they may call (docs/ARCHITECTURE.md's
# table), and libraries (by symbol prefix) only one room may call.
ALLOWED = {"src/s3": ("src/core",), "src/storage": ("src/core", "src/s3")}
LIBRARY_OWNER = {"curl_": "src/s3"}
# Rooms that are users of the library: every function of another room they
# use must be one ckptio.h declares, except in the rooms listed (the "may
# call" column of docs/ARCHITECTURE.md: the manager may also call core).
PUBLIC_ONLY = {"src/cli": (), "src/manage": ("src/core",)}


def room_of(rel):
    """src/device/gpu.c -> src/device; src/ctx.c -> src; cuda/x.c -> cuda."""
    parts = rel.split("/")
    if parts[0] == "src":
        return "src" if len(parts) == 2 else "src/" + parts[1]
    return parts[0]


def find_objects(build, source):
    """(source path relative to the tree, object path) of both targets, for
    sources that still exist (a moved file leaves its old object behind)."""
    out = []
    for target in TARGETS:
        top = os.path.join(build, "CMakeFiles", target + ".dir")
        for d, _, files in os.walk(top):
            for f in files:
                if not f.endswith(".o"):
                    continue
                obj = os.path.join(d, f)
                rel = os.path.relpath(obj, top)[: -len(".o")].replace(os.sep, "/")
                if rel.endswith(SOURCE_EXT) and os.path.isfile(os.path.join(source, rel)):
                    out.append((rel, obj))
    return sorted(out)


def nm_symbols(nm, obj):
    """(defined global functions, undefined symbols) of one object."""
    text = subprocess.run([nm, "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in text.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undefined.add(name)
        elif kind in FUNC_TYPES:
            defined.add(name)
    return defined, undefined


def room_graph(objects, nm):
    """{(from_room, to_room): {symbol: sorted user files}}."""
    where = {}  # symbol -> (room, file)
    uses = []
    for rel, obj in objects:
        defined, undefined = nm_symbols(nm, obj)
        for s in defined:
            where.setdefault(s, (room_of(rel), rel))
        uses.append((rel, undefined))
    edges = {}
    for rel, undefined in uses:
        src_room = room_of(rel)
        for s in undefined:
            if s not in where or where[s][0] == src_room:
                continue
            edges.setdefault((src_room, where[s][0]), {}).setdefault(s, set()).add(rel)
    return edges


def cycles_of(edges, limit=500):
    """Every elementary cycle (as a room list, smallest room first), found
    by depth-first search from each room over rooms greater than it."""
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
    found = []

    def walk(start, node, path, on_path):
        for nxt in sorted(succ.get(node, ())):
            if len(found) >= limit:
                return
            if nxt == start:
                found.append(list(path))
            elif nxt > start and nxt not in on_path:
                on_path.add(nxt)
                path.append(nxt)
                walk(start, nxt, path, on_path)
                path.pop()
                on_path.discard(nxt)

    for start in sorted(succ):
        walk(start, start, [start], {start})
    return found


def strip_comments(text):
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def source_files(source, tops):
    for top in tops:
        for d, dirs, files in os.walk(os.path.join(source, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh")):
                    p = os.path.join(d, f)
                    yield os.path.relpath(p, source).replace(os.sep, "/"), p


def cuda_includes(source):
    """(b): files of the product (src/, include/, examples/, python/) outside
    cuda/ that include a CUDA header. tests/ holds the fake CUDA runtime,
    which is one, and is not checked."""
    hits = []
    for rel, p in source_files(source, ("src", "include", "examples", "python")):
        with open(p, errors="replace") as fh:
            text = strip_comments(fh.read())
        for m in CUDA_HEADER.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append("%s:%d includes <%s>" % (rel, line, m.group(1)))
    return hits


def device_table_regex(source):
    """A call through the device table: ops-> followed by one of the members
    src/device/device.h declares (other tables, such as the load sources',
    use ops-> too), or the table's type or loader by name."""
    with open(os.path.join(source, "src", "device", "device.h")) as fh:
        text = strip_comments(fh.read())
    body = text[text.index("typedef struct ckptio_device_ops"):]
    members = re.findall(r"\(\*(\w+)\)\s*\(", body[:body.index("} ckptio_device_ops;")])
    return re.compile(r"\bops->(?:%s)\b|\bckptio_device_ops\b|\bckptio_cuda_ops\s*\(" % "|".join(members))


def device_table_uses(source):
    """(c): files of src/ outside src/device/ that call the device table."""
    DEVICE_TABLE = device_table_regex(source)
    hits = []
    for rel, p in source_files(source, ("src",)):
        if rel.startswith("src/device/"):
            continue
        with open(p, errors="replace") as fh:
            lines = strip_comments(fh.read()).split("\n")
        for i, line in enumerate(lines, 1):
            if DEVICE_TABLE.search(line):
                hits.append("%s:%d: %s" % (rel, i, line.strip()))
    return hits


def unsafe_libc_uses(objects, nm):
    """(d): objects that use a function of UNSAFE_LIBC."""
    hits = []
    for rel, obj in objects:
        _, undefined = nm_symbols(nm, obj)
        for name in sorted(undefined & set(UNSAFE_LIBC)):
            hits.append("%s calls %s()" % (rel, name))
    return hits


def forbidden_calls(edges, objects, nm):
    """(e): calls outside ALLOWED, and library calls outside their owner."""
    hits = []
    for (a, b), syms in sorted(edges.items()):
        if a in ALLOWED and b not in ALLOWED[a]:
            hits.append("%s calls %s (%s), but may call only %s" % (a, b, " ".join(sorted(syms)[:5]),
                                                                 ", ".join(ALLOWED[a])))
    for rel, obj in objects:
        _, undefined = nm_symbols(nm, obj)
        for prefix, owner in LIBRARY_OWNER.items():
            used = sorted(s for s in undefined if s.startswith(prefix))
            if used and room_of(rel) != owner:
                hits.append("%s calls %s, which only %s may call" % (rel, " ".join(used[:5]), owner))
    return hits


def non_public_uses(edges, public):
    """(f): functions of another room, not declared by include/ckptio.h,
    used by a room of PUBLIC_ONLY outside the rooms it lists."""
    hits = []
    for (a, b), syms in sorted(edges.items()):
        if a not in PUBLIC_ONLY or b in PUBLIC_ONLY[a]:
            continue
        for s in sorted(set(syms) - public):
            hits.append("%s uses %s (defined in %s), which include/ckptio.h does not declare: %s may call "
                        "only the public API%s (docs/ARCHITECTURE.md); used by %s"
                        % (a, s, b, a, "".join(" and " + r for r in PUBLIC_ONLY[a]), ", ".join(sorted(syms[s]))))
    return hits


def public_api(source):
    """Names of the functions include/ckptio.h declares."""
    try:
        with open(os.path.join(source, "include", "ckptio.h")) as fh:
            return set(re.findall(r"\b(ckptio_\w+)\s*\(", strip_comments(fh.read())))
    except OSError:
        return set()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the CMake build directory")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--report", action="store_true", help="print the findings, exit 0")
    ap.add_argument("--verbose", action="store_true", help="also list the files behind each symbol")
    args = ap.parse_args()
    source = os.path.abspath(args.source)

    objects = find_objects(args.build, source)
    cli_objects = [o for o in objects if room_of(o[0]) == "src/cli"]
    if not objects or not cli_objects:
        print("check_rooms: no objects of %s under %s/CMakeFiles: build them first"
              % (" and ".join(TARGETS), args.build))
        return 2
    edges = room_graph(objects, args.nm)

    public = public_api(source)
    rooms = sorted({room_of(rel) for rel, _ in objects})
    print("rooms (%d objects): %s" % (len(objects), ", ".join(rooms)))
    print("\nroom graph (A -> B: an object of A calls functions defined in B; how many, how many of"
          "\nthem public in include/ckptio.h, the first few):")
    for (a, b) in sorted(edges):
        syms = sorted(edges[(a, b)])
        npub = sum(1 for x in syms if x in public)
        print("  %-14s -> %-14s %3d %3d  %s" % (a, b, len(syms), npub,
                                              " ".join(syms[:5]) + (" ..." if len(syms) > 5 else "")))

    cycles = cycles_of(edges)
    print("\n(a) cycles between rooms: %d" % len(cycles))
    for k, cyc in enumerate(cycles, 1):
        print("  cycle %d: %s" % (k, " -> ".join(cyc + [cyc[0]])))
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            syms = edges[(a, b)]
            print("    %s -> %s:" % (a, b))
            for s in sorted(syms):
                print("      %s%s" % (s, "  (used by %s)" % ", ".join(sorted(syms[s])) if args.verbose else ""))

    cuda = cuda_includes(source)
    print("\n(b) CUDA headers included outside cuda/: %d" % len(cuda))
    for h in cuda:
        print("  " + h)
    table = device_table_uses(source)
    print("\n(c) device table (ops->) used outside src/device/: %d" % len(table))
    for h in table:
        print("  " + h)

    unsafe = unsafe_libc_uses(objects, args.nm)
    print("\n(d) C library functions that are not thread-safe (%s): %d" % (", ".join(UNSAFE_LIBC), len(unsafe)))
    for h in unsafe:
        print("  " + h)

    forbidden = forbidden_calls(edges, objects, args.nm)
    print("\n(e) calls a room may not make (ALLOWED, LIBRARY_OWNER): %d" % len(forbidden))
    for h in forbidden:
        print("  " + h)

    internal = non_public_uses(edges, public) if public else ["include/ckptio.h not found: cannot tell the public API"]
    print("\n(f) functions outside include/ckptio.h used by %s: %d"
          % (", ".join(sorted(PUBLIC_ONLY)), len(internal)))
    for h in internal:
        print("  " + h)

    bad = bool(cycles or cuda or table or unsafe or forbidden or internal)
    print("\ncheck_rooms: %s" % ("FAIL" if bad else "ok"))
    return 1 if bad and not args.report else 0


if __name__ == "__main__":
    sys.exit(main())
