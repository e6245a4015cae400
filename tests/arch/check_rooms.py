#!/usr/bin/env python3
"""The architecture guard (issue 10, item 5): fails when

  (a) two rooms of src/ call each other, directly or around a loop. A room
      is a folder of src/ (a file directly in src/ would form the room "src";
      cuda/ is the room "cuda"); a call is an object file of one room
      using a global function that an object of another room defines, read
      from the built objects of ckptio_obj and ckptio_cli with nm;
  (b) a file outside cuda/ includes a CUDA header;
  (c) a file of src/ outside src/device/ uses the device table (ops->);
  (e) a room calls (uses a function of) or includes a header of a room its
      row of docs/ARCHITECTURE.md's table does not name in its "may call"
      column, or a room other than a library's owner (LIBRARY_OWNER) calls
      that library (libcurl is src/s3's alone);
  (d) an object of ckptio_obj or ckptio_cli calls a C library function
      that is not thread-safe (strerror and kin, UNSAFE_LIBC below): the
      library's workers, commit threads and the manager's closer run
      beside the caller's threads (core/error.h's ckptio_errno_text names
      an errno safely);
  (f) an object of a room held to the public API (its "may call" cell
      says "the public API": the command and the manager) uses a function
      another room defines that include/ckptio.h does not declare, outside
      the rooms the cell names besides (core, for the manager);
  (g) the table and the tree disagree: a room with files has no row, or a
      row names a room with none.

The table is the one source of the rules: a "may call" cell names the
rooms it allows as the first column names them, in backticks (`src/core`,
`cuda`); any other text of the cell is for the reader. --self-test shows
every rule biting: for each room it compiles a probe object calling a
function of a room the room may not call, and a probe source including such
a room's header, and fails unless the check reports both.

Prints the room graph, every cycle with the symbols that make each of its
edges, and every (b) and (c) finding. Exit 1 on any finding, 0 when clean,
2 when it cannot check (no objects: build first). --report prints the same
and exits 0. Python 3 standard library only.

usage: check_rooms.py --build BUILD_DIR [--source SOURCE_DIR] [--nm NM] [--cc CC] [--report] [--self-test]
"""
import argparse
import functools
import os
import re
import subprocess
import sys
import tempfile

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
# Libraries (by symbol prefix) only one room may call.
LIBRARY_OWNER = {"curl_": "src/s3"}
TABLE = os.path.join("docs", "ARCHITECTURE.md")
TABLE_ROW = re.compile(r"^\|\s*`([^`]+)`[^|]*\|[^|]*\|(.*)\|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([a-z0-9_]+)/[^"]+"', re.M)


class Room:
    """A row of the table: the rooms it may call, and whether it is held to
    the public API for every other room."""

    def __init__(self, allowed, public_only):
        self.allowed, self.public_only = allowed, public_only


def read_table(source):
    """{room: Room} from docs/ARCHITECTURE.md's table of rooms."""
    rooms = {}
    with open(os.path.join(source, TABLE)) as fh:
        for line in fh:
            m = TABLE_ROW.match(line)
            if not m:
                continue
            name = m.group(1).rstrip("/")
            if not (name.startswith("src/") or name == "cuda"):
                continue
            cell = m.group(2)
            allowed = tuple(t.rstrip("/") for t in re.findall(r"`([^`]+)`", cell)
                            if t.startswith("src/") or t.rstrip("/") == "cuda")
            rooms[name] = Room(allowed, "the public API" in cell)
    return rooms


def room_of(rel):
    """src/device/gpu.c -> src/device; src/ctx/ctx.c -> src/ctx; cuda/x.c -> cuda."""
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


@functools.lru_cache(maxsize=None)
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


def include_edges(files, source):
    """{(from_room, to_room): {header: sorted including files}} of files
    (relative path, text): "X/y.h" names the room src/X."""
    edges = {}
    for rel, text in files:
        a = room_of(rel)
        for m in INCLUDE.finditer(strip_comments(text)):
            b = "src/" + m.group(1)
            if b != a and os.path.isdir(os.path.join(source, b)):
                header = m.group(0).split('"')[1]
                edges.setdefault((a, b), {}).setdefault(header, set()).add(rel)
    return edges


def room_sources(source):
    """(relative path, text) of every C file of src/ and cuda/."""
    out = []
    for rel, p in source_files(source, ("src", "cuda")):
        with open(p, errors="replace") as fh:
            out.append((rel, fh.read()))
    return out


def forbidden(table, calls, includes, objects, nm):
    """(e): calls and includes outside a room's "may call" cell (for a room
    held to the public API, its calls are (f)'s), and library calls outside
    their owner."""
    hits = []
    for what, edges in (("calls", calls), ("includes", includes)):
        for (a, b), names in sorted(edges.items()):
            row = table.get(a)
            if row is None or b in row.allowed or (what == "calls" and row.public_only):
                continue
            hits.append("%s %s %s (%s), but may call only %s (%s)"
                        % (a, what, b, " ".join(sorted(names)[:5]), ", ".join(row.allowed) or "no room", TABLE))
    for rel, obj in objects:
        _, undefined = nm_symbols(nm, obj)
        for prefix, owner in LIBRARY_OWNER.items():
            used = sorted(s for s in undefined if s.startswith(prefix))
            if used and room_of(rel) != owner:
                hits.append("%s calls %s, which only %s may call" % (rel, " ".join(used[:5]), owner))
    return hits


def non_public_uses(table, calls, public):
    """(f): functions of another room, not declared by include/ckptio.h,
    used by a room held to the public API outside the rooms its cell names."""
    hits = []
    for (a, b), syms in sorted(calls.items()):
        row = table.get(a)
        if row is None or not row.public_only or b in row.allowed:
            continue
        for s in sorted(set(syms) - public):
            hits.append("%s uses %s (defined in %s), which include/ckptio.h does not declare: %s may call "
                        "only the public API%s (%s); used by %s"
                        % (a, s, b, a, "".join(" and " + r for r in row.allowed), TABLE, ", ".join(sorted(syms[s]))))
    return hits


def table_drift(table, rooms):
    """(g): rooms without a row, rows without a room."""
    return (["%s has files but no row in %s's table" % (r, TABLE) for r in sorted(set(rooms) - set(table))] +
            ["%s's table has a row for %s, which has no files" % (TABLE, r) for r in sorted(set(table) - set(rooms))] +
            ["%s's row for %s names %s, which is not a room" % (TABLE, r, b)
             for r in sorted(table) for b in table[r].allowed if b not in table])


def public_api(source):
    """Names of the functions include/ckptio.h declares."""
    try:
        with open(os.path.join(source, "include", "ckptio.h")) as fh:
            return set(re.findall(r"\b(ckptio_\w+)\s*\(", strip_comments(fh.read())))
    except OSError:
        return set()


def probe_findings(table, objects, calls, sources, source, public, nm, cc, workdir):
    """--self-test: for each room of the table, a probe object in that room
    calling a function of a room it may not call (a function ckptio.h does
    not declare, for a room held to the public API), and a probe source
    including that room's header. `calls` is the tree's room graph. Returns
    the probes the check missed."""
    owner = {}  # room -> a function it defines outside the public API
    for (_, b), syms in sorted(calls.items()):
        owner.setdefault(b, next((x for x in sorted(syms) if x not in public), None))
    missed = []
    for room in sorted(table):
        target = next((b for b in sorted(table) if b != room and b not in table[room].allowed
                       and b.startswith("src/") and owner.get(b)), None)
        if target is None:
            continue
        sym = owner[target]
        c = os.path.join(workdir, room.replace("/", "_") + "_probe.c")
        with open(c, "w") as fh:
            fh.write("extern void %s(void);\nvoid ckptio_probe(void) { %s(); }\n" % (sym, sym))
        subprocess.run([cc, "-c", c, "-o", c + ".o"], check=True)
        probe = room + "/__probe.c"
        header = target[len("src/"):] + "/probe.h"
        probe_calls = room_graph(objects + [(probe, c + ".o")], nm)
        probe_includes = include_edges(sources + [(probe, '#include "%s"\n' % header)], source)
        said = "\n".join(forbidden(table, probe_calls, probe_includes, [], nm) +
                          non_public_uses(table, probe_calls, public))
        for what, needle in (("a call of %s" % sym, sym), ("an include of %s" % header, header)):
            if needle not in said:
                missed.append("%s: the check missed %s (%s) against the table" % (room, what, target))
            else:
                print("  %-13s -> %-13s %s: reported" % (room, target, what))
    return missed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the CMake build directory")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--cc", default="cc", help="the C compiler of --self-test's probes")
    ap.add_argument("--report", action="store_true", help="print the findings, exit 0")
    ap.add_argument("--self-test", action="store_true", help="also show each room's rules reporting a probe")
    ap.add_argument("--verbose", action="store_true", help="also list the files behind each symbol")
    args = ap.parse_args()
    source = os.path.abspath(args.source)

    objects = find_objects(args.build, source)
    cli_objects = [o for o in objects if room_of(o[0]) == "src/cli"]
    if not objects or not cli_objects:
        print("check_rooms: no objects of %s under %s/CMakeFiles: build them first"
              % (" and ".join(TARGETS), args.build))
        return 2
    table = read_table(source)
    sources = room_sources(source)
    edges = room_graph(objects, args.nm)
    includes = include_edges(sources, source)

    public = public_api(source)
    rooms = sorted({room_of(rel) for rel, _ in objects} | {room_of(rel) for rel, _ in sources})
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

    sections = [
        ("(b) CUDA headers included outside cuda/", cuda_includes(source)),
        ("(c) device table (ops->) used outside src/device/", device_table_uses(source)),
        ("(d) C library functions that are not thread-safe (%s)" % ", ".join(UNSAFE_LIBC),
         unsafe_libc_uses(objects, args.nm)),
        ("(e) calls and includes outside a room's \"may call\" (%s), libraries outside their owner" % TABLE,
         forbidden(table, edges, includes, objects, args.nm)),
        ("(f) functions outside include/ckptio.h used by rooms held to the public API (%s)"
         % ", ".join(r for r in sorted(table) if table[r].public_only),
         non_public_uses(table, edges, public) if public else ["include/ckptio.h not found: cannot tell the public API"]),
        ("(g) rooms and %s's table apart" % TABLE, table_drift(table, rooms)),
    ]
    bad = bool(cycles)
    for title, hits in sections:
        print("\n%s: %d" % (title, len(hits)))
        for h in hits:
            print("  " + h)
        bad = bad or bool(hits)

    if args.self_test:
        print("\nself-test: a probe per room against its row of %s:" % TABLE)
        with tempfile.TemporaryDirectory() as work:
            missed = probe_findings(table, objects, edges, sources, source, public, args.nm, args.cc, work)
        for h in missed:
            print("  " + h)
        bad = bad or bool(missed)

    print("\ncheck_rooms: %s" % ("FAIL" if bad else "ok"))
    return 1 if bad and not args.report else 0


if __name__ == "__main__":
    sys.exit(main())
