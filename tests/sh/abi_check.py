#!/usr/bin/env python3
"""abi_check.py — compares the Python package's copies of C definitions with the compiler's.

Usage: abi_check.py FACTS.json   (written by tests/unit/abi_test.c; WB_LIBRARY names the build's
libweightbridge.so). Checks, printing one line per problem and exiting 1 if any:
  - every ctypes.Structure the package passes to C has C's size, and the same fields in the same
    order at the same offsets with the same sizes; and C's field list in FACTS is the struct's
    whole field list as its public header declares it (a field C gained is not missed);
  - every project error code (WB_E_*) has a constant of the same name and value in _lib.py,
    and _lib.py has none C lacks;
  - the other constants the package copies (WB_PUSH_*, the FP8 block edge) equal C's;
  - the mode names plan() accepts are the ones the library parses, with the same values.
"""

import ctypes
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import weightbridge  # noqa: E402
from weightbridge import _adapter, _lib  # noqa: E402

# C struct name -> the ctypes class that mirrors it
STRUCTS = {"wb_plan_opts": weightbridge._PlanOpts, "wb_model_src": weightbridge._ModelSrc,
           "wb_push_stats": _lib.PushStats}


def header_fields(header, name):
    """The member names of `struct name { ... };` in a header, in order (comments removed)."""
    text = open(os.path.join(ROOT, header)).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    m = re.search(r"\bstruct\s+%s\s*\{(.*?)\};" % re.escape(name), text, flags=re.S)
    if not m:
        return None
    names = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        for part in decl.split(","):
            ident = re.findall(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?::\s*\d+)?\s*$", part.strip())
            if ident:
                names.append(ident[0])
    return names


def main():
    facts = json.load(open(sys.argv[1]))
    bad = []
    for cname, c in facts["structs"].items():
        py = STRUCTS.get(cname)
        if py is None:
            bad.append(f"struct {cname}: no ctypes class listed in abi_check.py")
            continue
        declared = header_fields(c["header"], cname)
        listed = [f[0] for f in c["fields"]]
        if declared != listed:
            bad.append(f"struct {cname}: {c['header']} declares {declared}, abi_test.c lists {listed}")
        pyfields = [(n, getattr(py, n).offset, getattr(py, n).size) for n, *_ in py._fields_]
        cfields = [tuple(f) for f in c["fields"]]
        if pyfields != cfields:
            bad.append(f"struct {cname}: Python {py.__name__} has fields (name, offset, size) {pyfields}, "
                       f"C has {cfields}")
        if ctypes.sizeof(py) != c["size"]:
            bad.append(f"struct {cname}: sizeof is {c['size']} in C, {ctypes.sizeof(py)} in Python")
    pyerr = {k: v for k, v in vars(_lib).items() if k.startswith("WB_E_")}
    for name, value in facts["errors"].items():
        if pyerr.get(name) != value:
            bad.append(f"{name}: {value} in C, {pyerr.get(name, 'missing')} in _lib.py")
    for name in sorted(set(pyerr) - set(facts["errors"])):
        bad.append(f"{name}: in _lib.py, not a C error code")
    copies = {"WB_PUSH_SOURCES": _lib.WB_PUSH_SOURCES, "WB_PUSH_DONE": _lib.WB_PUSH_DONE,
              "WB_PUSH_SKIPPED": _lib.WB_PUSH_SKIPPED, "WB_PUSH_LATEST": _lib.WB_PUSH_LATEST,
              "WB_PUSH_QUEUE": _lib.WB_PUSH_QUEUE, "WB_PUSH_SKIPPED_MAX": _lib.WB_PUSH_SKIPPED_MAX,
              "WB_STAGE_COUNT": len(_lib.WB_STAGE_NAMES), "WB_FP8_BLOCK": _adapter.BLOCK[0]}
    for name, value in facts["consts"].items():
        if copies.get(name) != value:
            bad.append(f"{name}: {value} in C, {copies.get(name, 'not compared')} in Python")
    if _adapter.BLOCK != [facts["consts"]["WB_FP8_BLOCK"]] * 2:
        bad.append(f"_adapter.BLOCK: {_adapter.BLOCK}, C's block is {facts['consts']['WB_FP8_BLOCK']}")
    want = {n: v for n, (v, accepted) in facts["modes"].items() if accepted}
    if dict(weightbridge._MODES) != want:
        bad.append(f"plan() modes: Python {dict(weightbridge._MODES)}, the library parses {want}")
    for b in bad:
        print(b)
    n = sum(len(c["fields"]) for c in facts["structs"].values())
    print(f"{len(facts['structs'])} structs ({n} fields), {len(facts['errors'])} error codes, "
          f"{len(facts['consts'])} constants, {len(want)} modes compared: {len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
