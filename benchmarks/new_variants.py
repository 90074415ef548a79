"""The winners' variants one tuning DB holds that another does not: after a merge, the
variants whose gpu tests have not run yet (the test modules parametrize over the shipped
DB's winners, tests/variant_sets.py, with each variant's key as its id). Prints them as one
pytest -k expression, or nothing where there are none. No GPU needed.

    python benchmarks/new_variants.py BEFORE.db AFTER.db
    pytest -m gpu tests/test_backward_gpu.py ... -k "$(python benchmarks/new_variants.py OLD.db NEW.db)"
"""
from __future__ import annotations

import argparse
from pathlib import Path


def new_keys(before: Path, after: Path) -> list[str]:
    """The variant keys of `after`'s winners that none of `before`'s winners has, sorted."""
    from cc1d.tuner.db import TuningDB

    def keys(path: Path) -> set[str]:
        with TuningDB(path, readonly=True) as db:
            return {w["variant_key"] for w in db.winners()}
    return sorted(keys(after) - keys(before))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the tuning DB before the change")
    ap.add_argument("after", type=Path, help="the tuning DB after it")
    args = ap.parse_args(argv)
    for name, path in (("before", args.before), ("after", args.after)):
        if not path.is_file():
            ap.error(f"{name}: no such file '{path}'")
    keys = new_keys(args.before, args.after)  # an unreadable DB: script_exit says so, status 2
    if keys:
        print(" or ".join(keys))
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "new_variants.py")
