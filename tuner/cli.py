"""``cc1d-tune``: tune shapes on the local GPU into the tuning DB, compile-check a
target without a GPU, and inspect / ship / merge / validate tuning DBs."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from ..generator import arch_info, variants
from .db import DBError, TuningDB, default_db_path, runtime_builds, winner_shape
from .device import DeviceInfo, environment, probe_device
from .moves import report_moves, snapshot
from .retime import DEFAULT_ROUNDS as DEFAULT_RETIME_ROUNDS, DEFAULT_TOLERANCE as DEFAULT_RETIME_TOLERANCE
from .shapes import Shape, ShapesError, load_shapes

log = logging.getLogger("cc1d")
DEFAULT_TRIALS = 64
DEFAULT_FAMILY_STARTS = 2  # --start-from: winners of the nearest other shapes of a family tried too


class UsageError(Exception):
    """A user error: printed as one message, exit status 2."""


def tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cc1d-tune", description="Search per-shape kernel configs on the local GPU and store the "
        "winners in the cc1d tuning DB. Also: cc1d-tune db show|export|import|merge|validate|finalize, "
        "cc1d-tune report --db PATH --out DIR.")
    p.add_argument("--arch", default="auto", help="target (sm_90, gfx942, ...) or 'auto' = the visible "
                   "device's (default); must match the device unless --compile-only")
    p.add_argument("--shapes", required=True, help="shapes.yaml (see examples/shapes.yaml)")
    p.add_argument("--db", help=f"tuning DB to write (default: {default_db_path()})")
    p.add_argument("--ops", default=None, help="comma-separated ops to tune (default: all in the file)")
    p.add_argument("--trials", type=int, default=None,
                   help=f"candidates per shape (default {DEFAULT_TRIALS}; --compile-only: all)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock seconds per shape")
    p.add_argument("--resume", action="store_true", help="keep stored winners and trials, continue the rest")
    p.add_argument("--start-from", nargs="+", default=[], metavar="DB",
                   help="tuning DBs whose winners for each shape are tried first (the first DB's before the "
                        "default, the others right after it; DBs holding the shape's own winner before those "
                        "holding only a neighbour's), "
                        "then with one tunable changed, register caps first (timed like any candidate; e.g. "
                        "the shipped DB when re-tuning: the search then cannot miss a config it already knew)")
    p.add_argument("--family-starts", type=int, default=None, metavar="N",
                   help="with --start-from: also try the winners of the N nearest other shapes of the "
                        "shape's family in those DBs, after its own, and their one-knob neighbours after "
                        f"its own neighbours (default {DEFAULT_FAMILY_STARTS}; 0: only the shape's own winner)")
    p.add_argument("--width-starts", type=int, default=0, metavar="N",
                   help="with --start-from: also try the winners of the N nearest shapes of the shape's op, "
                        "layout and dtypes at other widths in those DBs, after the family's (default 0; e.g. "
                        "for a width tuned at few shapes while width 4 was tuned at many)")
    p.add_argument("--dtype-starts", type=int, default=0, metavar="N",
                   help="with --start-from: also try the winners of the N nearest shapes of the shape's op, "
                        "layout and width at the other dtype pairs whose x has the same element size (fp16 "
                        "from bf16, say), after the other widths' (default 0)")
    p.add_argument("--fit-starts", type=int, default=0, metavar="N",
                   help="for each start config (the default without --start-from) whose tiles fill the "
                        "shape's sequence less than 90 %%, try right after the starts N of its one-knob "
                        "neighbours that fill it best (default 0; e.g. for lengths such as 3000 between "
                        "the tuned ones)")
    p.add_argument("--compile-workers", type=int, default=None, metavar="N",
                   help="threads compiling candidates ahead of the one being timed (default: half the "
                        "CPUs, at most 8, shared among --workers)")
    dist = p.add_mutually_exclusive_group()
    dist.add_argument("--workers", type=int, default=1, help="processes, one per local GPU, on one study")
    dist.add_argument("--storage", help="Optuna storage shared by several hosts: a journal file path "
                      "(journal:PATH, on a shared file system) or an RDB URL")
    p.add_argument("--compile-only", action="store_true",
                   help="only compile every candidate for --arch (no GPU needed) and report failures")
    p.add_argument("--report", help="write a JSON report of the results here (rewritten after every shape; "
                   "'complete' is false until the last)")
    p.add_argument("--isolate", action="store_true",
                   help="measure in a worker process that is restarted when a candidate hangs or crashes it "
                        "(the candidate is recorded as an error); see --candidate-timeout")
    p.add_argument("--candidate-timeout", type=float, default=120.0,
                   help="with --isolate: seconds one validation or timing may take (default 120)")
    p.add_argument("--guard", metavar="DB", default=None,
                   help="the tuning DB this run's winners are for (the shipped one, say; not written): "
                        "after the shapes, the untuned calls of a grid that merging the winners into it "
                        "would move to another variant are timed under both, and those slowed by more than "
                        "3 %% are tuned as shapes of their own, stored in --db like the others (docs/TUNING.md)")
    p.add_argument("--guard-rounds", type=int, default=2, metavar="N",
                   help="with --guard: check again after tuning slowed calls, at most N rounds (default 2)")
    p.add_argument("--guard-max-calls", type=int, default=64, metavar="N",
                   help="with --guard: time at most N moved calls a round, taken from each family in turn; "
                        "the rest listed (default 64)")
    p.add_argument("--deadline-s", type=float, default=None, metavar="S",
                   help="start no shape and no guard check after S seconds of the run (the shape being "
                        "tuned then runs on, up to its --budget-s); what was left is listed and the exit "
                        "status is 1. To fit a time limit T: S = T - budget - a margin")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a --workers child
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def db_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cc1d-tune db", description="Inspect and ship tuning DBs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, doc in (("show", "list the winners"), ("export", "write sorted JSON lines"),
                      ("import", "load JSON lines"), ("merge", "take winners (where faster) and trials "
                                                      "from other DBs"),
                      ("import-report", "store a run's winners from its --report JSON (where the run's "
                                        "DB was lost), each source checked against the hash the run timed"),
                      ("validate", "check every winner: source hash, epoch, re-rendered source"),
                      ("rerender", "store the templates' render of each winner whose stored source differs "
                                   "from it but compiles to the same binaries: the plain build and the one the tuner "
                                   "timed (a forward's or update's fixed kernel, a backward's seq_idx build; "
                                   "configs and times kept)"),
                      ("finalize", "validate, then make the DB one self-contained file for shipping "
                                   "(VACUUM, WAL folded in, journal_mode=DELETE)"),
                      ("drop", "delete one winner (an entry that slows the calls it took over) and list the "
                                "calls that go back to another entry")):
        s = sub.add_parser(name, help=doc)
        s.add_argument("--db", default=None, help=f"tuning DB (default: {default_db_path()})")
        if name == "rerender":
            s.add_argument("--ops", help="only winners of these ops (comma-separated: fwd,bwd,vfwd,upd)")
            s.add_argument("--timed", action="store_true",
                           help="on the GPU: where a winner's kernel changed, time its stored source and the "
                                "render at its shape (validated, alternating rounds) and store the render where "
                                "it is not slower, its times scaled by the ratio measured")
            s.add_argument("--rounds", type=int, default=None,
                           help=f"--timed: rounds of timing per winner (default {DEFAULT_RETIME_ROUNDS})")
            s.add_argument("--tolerance", type=float, default=None,
                           help="--timed: the render is stored where it takes at most 1 + this times the "
                                f"stored source's time (default {DEFAULT_RETIME_TOLERANCE:g})")
            s.add_argument("--deadline-s", type=float, default=None,
                           help="--timed: time no winner after this many seconds; those left are listed "
                                "(run again to continue: re-rendered winners match today's render)")
        if name == "validate":
            s.add_argument("--compile", action="store_true",
                           help="also compile every winner for its arch (NVRTC / hipRTC, no GPU needed), "
                                "with the builds the runtime makes from it: a backward's seq_idx "
                                "build, a channel-first realigned twin")
        if name == "finalize":
            s.add_argument("--drop-trials", action="store_true",
                           help="delete the trials table's rows first (the runtime reads only winners and "
                                "sources; keep the tuning run's own DB or an export as its record)")
        if name == "show":
            s.add_argument("--arch")
        if name == "export":
            s.add_argument("-o", "--output", help="file (default: stdout)")
            s.add_argument("--with-trials", action="store_true")
        if name == "import-report":
            s.add_argument("report", help="the run's --report JSON")
            s.add_argument("--shapes", required=True, help="the shapes file the run used")
        if name == "drop":
            s.add_argument("--family", required=True, help="family key, e.g. bwd.cf.bf16wbf16.w4")
            s.add_argument("--shape", required=True, help="shape key, e.g. b2.d4096.l2048.bias.silu")
            s.add_argument("--arch", default=None, help="the winner's arch (default: the one arch holding it)")
        if name in ("import", "merge"):
            s.add_argument("inputs", nargs="+", help="exported .jsonl files" if name == "import" else "DB files")
        if name == "merge":
            s.add_argument("--replace", action="store_true",
                           help="take every winner of the inputs, slower or not (a re-tune whose timing "
                                "method changed: its times do not compare with the old ones)")
    return p


# ---- shared helpers ---------------------------------------------------------------

def _shapes(args: argparse.Namespace) -> list[Shape]:
    shapes = load_shapes(args.shapes)
    if args.ops:
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        shapes = [s for s in shapes if s.op in ops]
        if not shapes:
            raise UsageError(f"--ops {args.ops}: no shape in {args.shapes} has one of these ops")
    return shapes


def default_compile_workers(processes: int) -> int:
    """Compile threads per tuning process: half the CPUs over the processes, 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 1) // (2 * processes)))


def resolve_arch(arch: str, device: DeviceInfo | None, compile_only: bool) -> str:
    """The target to tune for; a clear error when it is not the device's."""
    if arch == "auto":
        if device is None:
            raise UsageError("--arch auto: no GPU is visible (torch with CUDA/ROCm and a device are needed "
                             "to tune). Run on the GPU machine, or pass --arch TARGET --compile-only to "
                             "only check that every candidate compiles for TARGET.")
        return device.target
    arch_info(arch)  # a name check: raises ValueError naming the expected forms
    if compile_only or (device is not None and device.target == arch):
        return arch
    present = f"the visible device is {device.describe()}" if device else "no GPU is visible here"
    hint = f" or --arch auto (= {device.target} here)" if device else ""
    raise UsageError(f"--arch {arch}: {present}. Tuning must run on the target GPU: run cc1d-tune on a "
                     f"{arch} machine{hint}; to only check that every candidate compiles for {arch}, "
                     f"add --compile-only.")


def _runtime() -> Any:
    from .._runtime import runtime
    return runtime()


def _timed_builds(rt: Any, winner: dict) -> list[tuple[str, list[str]]]:
    """(name, compiler options) of each kernel a winner's time was measured with: the plain
    source; for a shape whose plans launch a fixed kernel (forward, update, channel-last
    backward), that kernel's (the tuner timed it); for another backward shape with
    seq_idx, its seq_idx build (what such calls run)."""
    shape = winner_shape(winner)
    builds: list[tuple[str, list[str]]] = [("plain", [])]
    if shape.op in ("fwd", "upd", "bwd"):
        from .problems import problem_for
        fixed = problem_for(shape.op).shape_plan_options(rt, shape)
        if fixed is not None:
            builds.append(("fixed", list(fixed)))
        elif shape.op == "bwd" and shape.seq_idx:
            builds.append(("seq_idx", list(rt.bwd_seq_build_options())))
    return builds


# ---- --compile-only ---------------------------------------------------------------

def compile_only(args: argparse.Namespace, shapes: list[Shape], arch: str, rt: Any) -> int:
    from .evaluate import CandidateError, compile_variant
    families = list(dict.fromkeys(s.family() for s in shapes))
    todo = []
    for fam in families:
        vs = list(variants(fam, arch_info(arch)))
        todo += vs[: args.trials] if args.trials else vs
    failures: list[tuple[str, str]] = []

    def one(v: Any) -> None:
        try:
            compile_variant(rt, v, arch)
        except CandidateError as exc:
            failures.append((v.key(), exc.reason))

    from tqdm import tqdm
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(tqdm(pool.map(one, todo), total=len(todo), desc=f"compile {arch}", unit="variant",
                  disable=None))
    for key, reason in sorted(failures):
        first = next((ln for ln in reason.splitlines() if "error" in ln.lower()), reason.splitlines()[0])
        print(f"FAILED {key}: {first.strip()}")
    print(f"compiled {len(todo)} variants of {len(families)} families for {arch}: "
          f"{len(todo) - len(failures)} ok, {len(failures)} failed")
    if args.report:
        Path(args.report).write_text(json.dumps(dict(arch=arch, compiled=len(todo), failures=[
            dict(variant=k, log=r) for k, r in sorted(failures)]), indent=2) + "\n")
    return 1 if failures else 0


# ---- tuning -----------------------------------------------------------------------

def _storage(url: str | None) -> Any:
    if url is None:
        return None
    if url.startswith("journal:") or "://" not in url:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return url


def _spawn_workers(args: argparse.Namespace, argv: Sequence[str], n: int, db_path: Path) -> str:
    """One child per local GPU on a shared journal; returns the storage URL the parent finalizes with."""
    journal = db_path.with_name(db_path.name + f".{uuid.uuid4().hex[:8]}.journal")
    storage = f"journal:{journal}"
    rest = [a for a in argv]
    i = 0
    cleaned: list[str] = []
    while i < len(rest):  # drop --workers N / --workers=N
        if rest[i] == "--workers":
            i += 2
            continue
        if not rest[i].startswith("--workers="):
            cleaned.append(rest[i])
        i += 1
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [d for d in visible.split(",") if d.strip()]
    else:
        import torch
        ids = [str(k) for k in range(torch.cuda.device_count())]
    if n > len(ids):  # two workers on one GPU would time trials concurrently
        raise UsageError(f"--workers: expected at most the {len(ids)} visible GPU(s), got {n}; "
                         "trials are never timed concurrently on one GPU")
    procs = []
    for k in range(n):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=ids[k], HIP_VISIBLE_DEVICES=ids[k])
        # -P: a cc1d/ folder in the working directory must not shadow the installed package
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        cmd = [sys.executable, *safe_path, "-m", "cc1d.tuner", *cleaned, "--storage", storage, "--worker",
               "--db", str(db_path), "--seed", str(args.seed + k),
               "--compile-workers", str(args.compile_workers)]  # the parent's share, not the child's own
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        log.warning("cc1d-tune: worker exit codes %s", codes)
    return storage


def check_guard_options(args: argparse.Namespace) -> None:
    for name in ("guard_rounds", "guard_max_calls"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if args.guard is None:
        return
    if not Path(args.guard).is_file():
        raise UsageError(f"--guard: expected a tuning DB file, got {args.guard!r} (no such file)")
    if args.compile_only:
        raise UsageError("--guard times calls on the GPU: not with --compile-only")
    if args.workers > 1 or args.storage:
        raise UsageError("--guard runs in one process: not with --workers or --storage")
    if (Path(args.db) if args.db else default_db_path()).resolve() == Path(args.guard).resolve():
        raise UsageError("--guard: expected another DB than --db (the run's winners are checked against it "
                         f"before they are merged into it), got {args.guard!r} for both")


def tune(args: argparse.Namespace, argv: Sequence[str], probe: Callable[[], DeviceInfo | None]) -> int:
    deadline = Deadline(args.deadline_s)  # setting up (the copy measurement, say) counts too
    shapes = _shapes(args)
    device = probe()
    arch = resolve_arch(args.arch, device, args.compile_only)
    rt = _runtime()
    if args.compile_only:
        return compile_only(args, shapes, arch, rt)
    db_path = Path(args.db) if args.db else default_db_path()
    from .evaluate import GpuEvaluator, compile_variant
    from .isolate import IsolatedEvaluator, gpu_evaluator
    from .measure import copy_bandwidth
    from .report import table, unsearched, write_report
    from .search import SearchConfig, start_configs, tune_shape
    from tqdm import tqdm

    if args.compile_workers is None:
        args.compile_workers = default_compile_workers(args.workers)
    from .measure import TIMING_METHOD
    with TuningDB(db_path) as db:  # before this run's first trial: older trials of another method stay apart
        db.adopt_timing_method(TIMING_METHOD)
    if args.workers > 1 and not args.worker:
        args.storage = _spawn_workers(args, argv, args.workers, db_path)
        args.resume = True  # the parent picks up what the workers measured and finalizes
    cfg = SearchConfig(trials=args.trials or DEFAULT_TRIALS, budget_s=args.budget_s, seed=args.seed,
                       resume=args.resume, finalize=not args.worker, compile_workers=args.compile_workers,
                       fit_starts=args.fit_starts)
    storage = _storage(args.storage)
    env = environment(device, rt, arch)
    copy_bw = copy_bandwidth()
    env["copy_gbps"] = round(copy_bw / 1e9, 1)
    run_id = uuid.uuid4().hex[:12]
    results = []
    with contextlib.ExitStack() as stack, TuningDB(db_path) as db:
        starts = [stack.enter_context(TuningDB(p, readonly=True)) for p in args.start_from]
        family = DEFAULT_FAMILY_STARTS if args.family_starts is None else args.family_starts

        def new_evaluator(shape: Shape) -> Any:
            if args.isolate:
                return IsolatedEvaluator(functools.partial(gpu_evaluator, shape, arch),
                                         timeout_s=args.candidate_timeout,
                                         compile_fn=lambda v, options: compile_variant(rt, v, arch, options))
            return GpuEvaluator(rt, shape, arch)

        def run_shape(shape: Shape, more_starts: Sequence[TuningDB] = ()) -> bool:
            """Tune one shape, unless past --deadline-s (then False, the shape listed as left)."""
            if deadline.passed():
                deadline.left.append(shape)
                return False
            tbar = tqdm(total=cfg.trials, desc="trials", unit="trial", leave=False, disable=None)

            def on_trial(o: Any) -> None:
                if o.status != "invalid":
                    tbar.update(1)

            evaluator = new_evaluator(shape)
            try:
                results.append(tune_shape(shape, arch, evaluator, db, cfg, storage=storage, copy_bw=copy_bw,
                                          environment=env, run_id=run_id, on_trial=on_trial,
                                          start_configs=start_configs(shape, arch, [*more_starts, *starts],
                                                                      family, args.width_starts, args.dtype_starts)))
            finally:
                if args.isolate:
                    evaluator.close()
                tbar.close()
            if args.report and not args.worker:
                # After every shape: a run that is stopped keeps the report of what it finished.
                write_report(args.report, results, arch=arch, environment=env, db=str(db_path),
                             shapes=len(shapes), complete=len(results) == len(shapes))
            return True

        bar = tqdm(shapes, desc="shapes", unit="shape", disable=None)
        for shape in bar:
            bar.set_postfix_str(shape.describe())
            run_shape(shape)
        if args.guard and not args.worker:
            guard_rounds(args, arch, db_path, shapes, new_evaluator, run_shape, deadline)
    if args.worker:
        return 0
    print(table(results))
    print(f"copy ceiling: {copy_bw / 1e9:.0f} GB/s on {env.get('device', arch)}; DB: {db_path}")
    warning = unsearched(results)
    if warning:
        print(warning)
    stopped = deadline.summary()
    if stopped:
        print(f"stopped by --deadline-s {args.deadline_s:g}: {stopped}")
    return 0 if all(r.winner for r in results) and not stopped else 1


class Deadline:
    """--deadline-s: no shape nor guard check starts after `seconds` from the run's start;
    what it stopped is collected: the shapes in `left`, the guard's moved calls in `untimed`."""

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds
        self.left: list[Shape] = []
        self.untimed: list[Any] = []

    def summary(self) -> str | None:
        """What the deadline stopped, or None where it stopped nothing."""
        parts = []
        if self.left:
            parts.append(f"{len(self.left)} shapes not tuned: " + ", ".join(
                f"{s.family().key()} ({s.batch}, {s.dim}, {s.seqlen})" for s in self.left))
        if self.untimed:
            parts.append(f"{len(self.untimed)} moved calls not timed by the guard")
        return "; ".join(parts) or None

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


def guard_rounds(args: argparse.Namespace, arch: str, db_path: Path, shapes: list[Shape],
                 new_evaluator: Callable[[Shape], Any], run_shape: Callable[..., bool],
                 deadline: Deadline) -> list[Shape]:
    """--guard: the calls the run's winners would take over in the guard DB, timed under the
    variant it serves them now and the new one; those slowed are tuned (run_shape), then
    the check repeats for the new winners. The shapes it tunes are appended to `shapes` (the
    report counts them) and returned."""
    from tqdm import tqdm

    from .guard import check_moves, pending_moves, shapes_entry
    from .moves import round_robin
    families = {s.family().key() for s in shapes}
    known: dict = {}
    added: list[Shape] = []
    for rnd in range(1, args.guard_rounds + 1):
        moves, variants = pending_moves(Path(args.guard), db_path, arch, families)
        checked, unchecked = round_robin(moves, args.guard_max_calls)  # a cap still reaches every family
        print(f"guard round {rnd}: the run's winners move {len(moves)} untuned calls in {args.guard}"
              + (f"; timing {len(checked)}, each family in turn" if unchecked else ""))
        bar = tqdm(total=len(checked), desc="guard", unit="call", disable=None)

        def on_check(c: Any) -> None:
            bar.update(1)
            tqdm.write(f"  {c.describe()}")

        try:
            checks = check_moves(checked, variants, new_evaluator, known, on_check, stop=deadline.passed)
        finally:
            bar.close()
        cut = len(checks) < len(checked)
        if cut:
            late = checked[len(checks):]
            deadline.untimed.extend(late)
            print(f"  not timed (past --deadline-s): {len(late)} calls, {_first_calls(late)}")
        if unchecked:
            print(f"  not timed (past --guard-max-calls {args.guard_max_calls}): {len(unchecked)} calls, "
                  f"{_first_calls(unchecked)}")
        slowed = [dataclasses.replace(c.shape, name=f"guard-round-{rnd}") for c in checks if c.slowed]
        if not slowed:
            print(f"guard round {rnd}: no call {'timed ' if cut else ''}slowed by more than 3 %")
            break
        print(f"guard round {rnd}: tuning {len(slowed)} slowed calls as shapes of their own: "
              + ", ".join(f"({s.batch}, {s.dim}, {s.seqlen})" for s in slowed))
        shapes.extend(slowed)
        with TuningDB(Path(args.guard), readonly=True) as guard_db:  # its served winner is tried first
            for shape in tqdm(slowed, desc="guard shapes", unit="shape", disable=None):
                if run_shape(shape, (guard_db,)):
                    added.append(shape)
        if deadline.passed():
            print(f"guard round {rnd}: stopped by --deadline-s; its tuned calls' own moves are not checked")
            break
    else:
        print(f"guard: stopped after {args.guard_rounds} rounds; the last round's new winners are not checked")
    if added:
        print("guard: add the tuned calls to the shapes file, so a re-tune keeps them:")
        for s in added:
            print(f"  - {shapes_entry(s)}")
    return added


def _first_calls(moves: list, n: int = 10) -> str:
    """The first n moved calls, named for the guard's "not timed" lines."""
    return ", ".join(f"{m.family_key} {m.call}" for m in moves[:n]) + (", ..." if len(moves) > n else "")


# ---- db subcommands -----------------------------------------------------------------

def rerender_timing(args: argparse.Namespace, rt: Any, probe: Callable[[], DeviceInfo | None]) -> dict:
    """`db rerender --timed`: TuningDB.rerender's judge (tuner/retime.py) on the visible
    GPU, its deadline and progress bar. Winners of another arch than the GPU's are left."""
    from tqdm import tqdm

    from .evaluate import GpuEvaluator
    from .retime import judge_with
    rounds = DEFAULT_RETIME_ROUNDS if args.rounds is None else args.rounds
    tolerance = DEFAULT_RETIME_TOLERANCE if args.tolerance is None else args.tolerance
    if rounds < 1:
        raise UsageError(f"--rounds: expected a positive number, got {rounds}")
    if not tolerance >= 0:
        raise UsageError(f"--tolerance: expected 0 or a positive fraction (0.01: 1 %), got {tolerance}")
    if args.deadline_s is not None and not args.deadline_s > 0:
        raise UsageError(f"--deadline-s: expected a positive number of seconds, got {args.deadline_s}")
    device = probe()
    if device is None:
        raise UsageError("rerender --timed: no GPU is visible (torch with CUDA/ROCm and a device are needed to "
                         "time the kernels). Run it on the GPU machine of the DB's arch, or leave out --timed "
                         "to re-render only the winners whose binaries are unchanged.")
    inner = judge_with(lambda w: GpuEvaluator(rt, winner_shape(w), device.target), rounds, tolerance)

    def judge(winner: dict, stored: str, render: Any) -> tuple[dict | None, str]:
        if winner["arch"] != device.target:
            return None, f"not timed: the visible device is {device.describe()}"
        return inner(winner, stored, render)

    deadline = Deadline(args.deadline_s)
    return dict(judge=judge, stop=deadline.passed,
                progress=lambda items: tqdm(items, desc="timed", unit="winner", disable=None))


def db_main(argv: Sequence[str], probe: Callable[[], DeviceInfo | None] = probe_device) -> int:
    args = db_parser().parse_args(argv)
    path = Path(args.db) if args.db else default_db_path()
    if args.cmd == "import-report":  # checked in full before the DB is opened (or created)
        from .report import winners_from_report
        try:
            report = json.loads(Path(args.report).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"import-report: cannot read {args.report}: {exc}") from None
        winners = winners_from_report(report, load_shapes(args.shapes), where=args.report)
    # Readers never change the file: a finalized DB stays in rollback-journal mode.
    with TuningDB(path, create=args.cmd in ("import", "import-report", "merge"),
                  readonly=args.cmd in ("show", "export", "validate")) as db:
        if args.cmd == "show":
            rows = db.winners(args.arch)
            for w in rows:
                print(f"{w['arch']:8} {w['family_key']:22} {w['shape_key']:28} {w['variant_key']:48} "
                      f"{w['time_us']:9.2f} us  " + (f"{100 * w['copy_fraction']:5.1f}% copy  "
                                                      if w["copy_fraction"] else "")
                      + (f"{w['speedup']:.3f}x" if w["speedup"] else ""))
            print(f"{len(rows)} winners in {path}")
        elif args.cmd == "export":
            text = "".join(line + "\n" for line in db.export_lines(with_trials=args.with_trials))
            if args.output:
                Path(args.output).write_text(text)
            else:
                sys.stdout.write(text)
        elif args.cmd == "import":
            before, n = snapshot(db), 0
            for f in args.inputs:
                with open(f) as fh:
                    n += db.import_lines(fh)
            print(f"imported {n} winners into {path}")
            report_moves(db, before, sys.stdout)
        elif args.cmd == "import-report":
            before = snapshot(db)
            with db.transaction():  # all of them or none
                for source, row in winners:
                    db.put_winner(source, **row)
            print(f"stored {len(winners)} winners from {args.report} into {path}")
            report_moves(db, before, sys.stdout)
        elif args.cmd == "merge":
            before, n = snapshot(db), 0
            for f in args.inputs:
                with TuningDB(f, readonly=True) as other:
                    n += db.merge_from(other, replace=args.replace)
            print(f"merged {n} winners into {path}")
            report_moves(db, before, sys.stdout)
        elif args.cmd == "drop":
            archs = [args.arch] if args.arch else sorted(
                {w["arch"] for w in db.winners() if (w["family_key"], w["shape_key"]) == (args.family, args.shape)})
            if len(archs) != 1:
                raise UsageError(f"drop: {args.family} {args.shape} is held for {', '.join(archs)} in {path}: "
                                 "name one with --arch" if archs else
                                 f"drop: no winner of {args.family} at {args.shape} in {path}")
            before = snapshot(db)
            row = db.drop_winner(archs[0], args.family, args.shape)
            print(f"dropped {archs[0]} {args.family} {args.shape} ({row['variant_key']}) from {path}; remove the "
                  "shape from its shapes file too, or a re-tune brings it back")
            if any(w["family_key"] == args.family for w in db.winners(archs[0])):
                report_moves(db, before, sys.stdout, lead="dropping it moves")
            else:  # moves are counted within a family's winners: there are none left to count
                print(f"{path} holds no other winner of {args.family} on {archs[0]}: its calls take the next "
                      "DB's winners along the lookup chain, or the catalog's default")
        elif args.cmd == "rerender":
            rt = _runtime()
            ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
            timed = rerender_timing(args, rt, probe) if args.timed else {}
            done, left = db.rerender(lambda src, arch, opts: rt.compile(src, arch, opts)[0], ops,
                                     builds=lambda w: _timed_builds(rt, w), workers=os.cpu_count() or 1,
                                     **timed)
            for name in done:
                print(f"re-rendered {name}")
            for why in left:
                print(f"LEFT {why}")
            how = "binaries identical or, timed, not slower" if args.timed else \
                "binaries identical: the plain build, the fixed kernel of forwards and updates, the " \
                "backward's seq_idx build"
            print(f"{len(done)} winners re-rendered in {path} ({how}), {len(left)} left")
            return 1 if left else 0
        elif args.cmd == "validate":
            problems = db.validate()
            if args.compile:
                rt = _runtime()
                problems += db.compile_problems(lambda src, arch, opts: rt.compile(src, arch, opts),
                                                workers=os.cpu_count() or 1,
                                                builds=functools.partial(runtime_builds, rt))
            for p in problems:
                print(f"INVALID {p}")
            print(f"{len(db.winners())} winners checked in {path}{' (and compiled)' if args.compile else ''}: "
                  f"{len(problems)} problems")
            return 1 if problems else 0
        elif args.cmd == "finalize":
            problems = db.validate()
            for p in problems:
                print(f"INVALID {p}")
            if problems:
                print(f"not finalized: {len(problems)} problems in {path} (a shipped DB must validate)")
                return 1
            if args.drop_trials:
                with db.transaction():
                    db.conn.execute("DELETE FROM trials")
            dropped = db.drop_unused_sources()
            if dropped:
                print(f"dropped {dropped} sources no winner uses")
            db.finalize()
            n = len(db.winners())
            kept_trials = db.conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    if args.cmd == "finalize":
        left = [p.name for p in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
                if p.exists()]
        if left:  # another connection kept them; the file may still miss its last commits
            print(f"cc1d-tune: error: {', '.join(left)} still beside {path}: close every other user of it "
                  f"and run finalize again", file=sys.stderr)
            return 1
        print(f"finalized {path}: {n} winners, journal_mode=delete, {path.stat().st_size // 1024} KiB, "
              f"nothing beside it")
        if kept_trials:  # the runtime reads only winners: a DB to ship wants --drop-trials
            print(f"kept {kept_trials} trials (for reports); to ship this DB, finalize it with --drop-trials")
    return 0


def report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cc1d-tune report", description="Write an HTML page with PNG plots of a "
                                "tuning DB: % of copy (default vs tuned), speedup and search convergence per shape.")
    p.add_argument("--db", default=None, help=f"tuning DB to read, never written (default: {default_db_path()})")
    p.add_argument("--out", required=True, help="folder for index.html and the PNGs (created if missing)")
    return p


def report_main(argv: Sequence[str]) -> int:
    args = report_parser().parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("cc1d-tune report needs matplotlib: pip install matplotlib") from None
    from .report_html import write_html_report
    index = write_html_report(Path(args.db) if args.db else default_db_path(), args.out)
    print(f"wrote {index}")
    return 0


def main(argv: Sequence[str] | None = None, *,
         probe: Callable[[], DeviceInfo | None] = probe_device) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if "-v" in argv or "--verbose" in argv else logging.WARNING,
                        format="%(message)s")
    try:
        if argv[:1] == ["db"]:
            return db_main(argv[1:], probe)
        if argv[:1] == ["report"]:
            return report_main(argv[1:])
        args = tune_parser().parse_args(argv)
        if args.trials is not None and args.trials < 1:
            raise UsageError(f"--trials: expected a positive number, got {args.trials}")
        if args.workers < 1:
            raise UsageError(f"--workers: expected a positive number, got {args.workers}")
        if args.compile_workers is not None and args.compile_workers < 1:
            raise UsageError(f"--compile-workers: expected a positive number, got {args.compile_workers}")
        if args.family_starts is not None and args.family_starts < 0:
            raise UsageError(f"--family-starts: expected 0 or a positive number, got {args.family_starts}")
        if args.family_starts is not None and not args.start_from:
            raise UsageError("--family-starts: needs --start-from (the DBs whose winners it tries)")
        for flag, count in (("--width-starts", args.width_starts), ("--dtype-starts", args.dtype_starts)):
            if count < 0:
                raise UsageError(f"{flag}: expected 0 or a positive number, got {count}")
            if count and not args.start_from:
                raise UsageError(f"{flag}: needs --start-from (the DBs whose winners it tries)")
        if args.fit_starts < 0:
            raise UsageError(f"--fit-starts: expected 0 or a positive number, got {args.fit_starts}")
        for path in args.start_from:
            if not Path(path).is_file():
                raise UsageError(f"--start-from: expected tuning DB files, got {path!r} (no such file)")
        if args.deadline_s is not None and not args.deadline_s > 0:
            raise UsageError(f"--deadline-s: expected a positive number of seconds, got {args.deadline_s}")
        check_guard_options(args)
        return tune(args, argv, probe)
    except (UsageError, ShapesError, DBError, ValueError) as exc:
        print(f"cc1d-tune: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"cc1d-tune: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cc1d-tune: interrupted; what was measured is in the DB (continue with --resume)",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # `cc1d-tune db merge ... | head`: the reader left; the DB is written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        print("cc1d-tune: output closed before the end (a pipe's reader left); what was stored in "
              "the DB stays", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
