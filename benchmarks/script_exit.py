"""How the listing scripts end (bench_moves.py, bench_rule.py, cross_serve.py,
new_variants.py): with main's exit status; where stdout's reader left early (`... --list |
head`), with one line on stderr and status 1 instead of a BrokenPipe traceback, as cc1d-tune
does; and where a tuning DB cannot be read (not SQLite, corrupt, a newer schema), with the
DB's own message on one line and status 2, as for a bad option."""
from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn


def exit_with(main: Callable[[], int], script: str) -> NoReturn:
    from cc1d.tuner.db import DBError
    try:
        code = main()
        sys.stdout.flush()  # a pipe closed after the last print fails here, not at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        print(f"{script}: output closed before the end (a pipe's reader left)", file=sys.stderr)
        code = 1
    except DBError as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
