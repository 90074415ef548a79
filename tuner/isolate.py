"""Measurements in a restartable worker process, so that a candidate that hangs
or takes its process down (a GPU fault poisons the CUDA context for good) costs
one trial, not the run.

`IsolatedEvaluator` is an Evaluator: validate() and time() run in a child
process that builds the real evaluator itself (`factory`, called in the child);
each call waits at most `timeout_s`. A call that times out, or whose child dies,
kills the child and raises CandidateError("error", why): the search records it
like any failed candidate and the next call starts a fresh child. compile()
runs in the parent when `compile_fn` is given (compilation needs no device, and
the search overlaps it with measuring), else in the child too. The parent's
compile_fn(variant, plan_options) gets the child evaluator's plan_options (the
options of the kernel its launches run, evaluate.compile_variant), so that the
child finds that kernel in the disk compile cache.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from typing import Any, Callable, Optional

from ..generator import Variant
from .evaluate import CandidateError
from .measure import Timing

log = logging.getLogger("cc1d")

START_TIMEOUT_S = 300.0  # the child imports torch and builds its inputs


def _serve(conn: Any, factory: Callable[[], Any]) -> None:
    """The child: build the evaluator, then answer (method, args) until told to stop."""
    ev = factory()
    conn.send(("ready", getattr(ev, "bytes_moved", 0), getattr(ev, "plan_options", None)))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        method, args = msg
        try:
            conn.send(("ok", getattr(ev, method)(*args)))
        except CandidateError as exc:
            conn.send(("candidate", exc.status, exc.reason))
        except Exception as exc:  # noqa: BLE001 - the parent records it as the candidate's failure
            conn.send(("candidate", "error", repr(exc)))


class IsolatedEvaluator:
    def __init__(self, factory: Callable[[], Any], *, timeout_s: float = 120.0,
                 compile_fn: Optional[Callable[[Variant, Optional[list]], None]] = None,
                 context: str = "spawn") -> None:
        self.factory, self.timeout_s, self.compile_fn = factory, timeout_s, compile_fn
        self.ctx = mp.get_context(context)
        self.lock = threading.Lock()
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0  # children replaced after a timeout or a death
        self.plan_options: Optional[list] = None  # the child's, set by _start
        self.bytes_moved = self._start()

    # ---- the child's life ---------------------------------------------------------

    def _start(self) -> int:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_serve, args=(child, self.factory), daemon=True,
                                     name="cc1d-measure")
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(START_TIMEOUT_S):
            self._kill()
            raise RuntimeError(f"cc1d-tune: the measuring worker did not start within {START_TIMEOUT_S:g} s")
        try:
            tag, bytes_moved, self.plan_options = parent.recv()
        except EOFError:
            code = self._kill()
            raise RuntimeError(f"cc1d-tune: the measuring worker died while starting (exit code {code})") from None
        assert tag == "ready", tag
        return bytes_moved

    def _kill(self) -> Optional[int]:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
            code = self.proc.exitcode
        else:
            code = None
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        return code

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.send(None)
                    self.proc.join(10)
                except (OSError, BrokenPipeError):
                    pass
            self._kill()

    def __enter__(self) -> "IsolatedEvaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one call -----------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        with self.lock:
            if self.proc is None:
                self._start()
            try:
                self.conn.send((method, args))
                if not self.conn.poll(self.timeout_s):
                    self._replace()
                    raise CandidateError("error", f"{method} timed out after {self.timeout_s:g} s "
                                                  f"(hang?); measuring worker restarted")
                msg = self.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = self._replace()
                raise CandidateError("error", f"the measuring worker died during {method} (exit code {code}: "
                                              f"crash or GPU fault?); restarted") from None
        if msg[0] == "ok":
            return msg[1]
        raise CandidateError(msg[1], msg[2])

    def _replace(self) -> Optional[int]:
        code = self._kill()
        self.restarts += 1
        log.warning("cc1d-tune: measuring worker replaced (exit code %s)", code)
        return code

    # ---- the Evaluator protocol --------------------------------------------------

    def compile(self, variant: Variant) -> None:
        if self.compile_fn is not None:
            self.compile_fn(variant, self.plan_options)
        else:
            self._call("compile", variant)

    def validate(self, variant: Variant) -> None:
        self._call("validate", variant)

    def time(self, variant: Variant, best_us: float | None) -> Timing:
        return self._call("time", variant, best_us)

    def time_warm(self, variant: Variant) -> Optional[Timing]:
        return self._call("time_warm", variant)


def gpu_evaluator(shape: Any, target: str) -> Any:
    """Factory for the child (picklable: a module-level function of plain data)."""
    from .._runtime import runtime
    from .evaluate import GpuEvaluator
    return GpuEvaluator(runtime(), shape, target)
