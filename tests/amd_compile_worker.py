"""Compiles kernel sources for an AMD target through cc1d's own HIP backend.

Runs in a subprocess under rocm-trixie.sh's loader (see test_compile_amd.py):
reads [{"key", "source"}] as JSON on stdin, writes [{"key", "ok", "log", "resources"}].
hipRTC prints no resource report, so the resources come from the code
object's AMDGPU metadata (msgpack in an ELF note).
"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

RESOURCE_KEYS = (".vgpr_count", ".sgpr_count", ".vgpr_spill_count", ".sgpr_spill_count",
                 ".private_segment_fixed_size")


def _msgpack_uint(buf: bytes, i: int):
    tag = buf[i]
    if tag <= 0x7F:
        return tag
    widths = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
    if tag in widths:
        return int.from_bytes(buf[i + 1:i + 1 + widths[tag]], "big")
    return None


def code_object_resources(binary: bytes) -> dict:
    """Per-kernel resource counts read from the metadata (one kernel per source)."""
    found = {}
    for key in RESOURCE_KEYS:
        packed = bytes([0xA0 | len(key)]) + key.encode()  # msgpack fixstr
        at = binary.find(packed)
        if at >= 0:
            found[key.lstrip(".")] = _msgpack_uint(binary, at + len(packed))
    return found

from cc1d._runtime import runtime


def main() -> None:
    target = sys.argv[1]
    rt = runtime()

    def one(item):
        try:
            binary, log = rt.compile(item["source"], target)
            return dict(key=item["key"], ok=True, log=log, resources=code_object_resources(binary))
        except RuntimeError as exc:
            return dict(key=item["key"], ok=False, log=str(exc), resources={})

    # hipRTC takes a global lock per compile: parallelism comes from several worker
    # processes (test_compile_amd._compile_batch); two threads keep this one busy.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, json.load(sys.stdin)))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
