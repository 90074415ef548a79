"""How the listing scripts end (bench_moves.py, bench_rule.py, cross_serve.py): with main's
exit status, and where stdout's reader left early (`... --list | head`), with one line
on stderr and status 1 instead of a BrokenPipe traceback, as cc1d-tune does."""
from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn


def exit_with(main: Callable[[], int], script: str) -> NoReturn:
    try:
        code = main()
        sys.stdout.flush()  # a pipe closed after the last print fails here, not at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        print(f"{script}: output closed before the end (a pipe's reader left)", file=sys.stderr)
        code = 1
    sys.exit(code)
