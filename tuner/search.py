"""The per-(family, shape) search: an Optuna study over the family's space.

The default variant goes first; invalid configs and failing candidates are
pruned with their reason and recorded; small spaces are enumerated with
BruteForceSampler, larger ones sampled with a seeded TPE. Candidates compile
on worker threads (SearchConfig.compile_workers, side by side) while the device
validates and times earlier ones. At the end the finalists are re-timed
together; near-ties within the noise are timed warm where the timing flushes
the L2 (the decode update), and those that still tie go to the default, then to
the variant closest to it.
"""
from __future__ import annotations

import json
import logging
import math
import time
import uuid
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from ..generator import DTYPES, EPOCH, WIDTHS, Family, Variant, arch_info, default_variant, space_for, variants
from ..generator.space import DTYPE_PAIRS
from .db import TuningDB
from .evaluate import CandidateError, Evaluator
from .measure import TIMING_METHOD, Timing, median_error
from .serving import dispatch_rank, served_winner
from .shapes import Shape

log = logging.getLogger("cc1d")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class SearchConfig:
    trials: int = 64              # cap on candidates that pass the static checks (compiled or not)
    budget_s: float | None = None  # wall-clock cap per shape (the candidate being timed finishes;
                                   # those compiled ahead are dropped, to be tried again by --resume)
    seed: int = 0
    compile_ahead: int = 2        # candidates compiled ahead of the one being timed (at least
                                  # compile_workers, so every compile thread has one)
    compile_workers: int = 1      # threads compiling candidates (NVRTC compiles in parallel; one
                                  # update kernel takes seconds, so one thread left the GPU idle)
    finalists: int = 3            # best candidates re-timed beside the default at the end
    retime_rounds: int = 3
    tie_tolerance: float = 0.005  # near-tie floor when the measured spread is smaller
    resume: bool = False
    finalize: bool = True         # False: workers of a shared study only run trials
    fit_starts: int = 0           # per start config whose tiles the sequence fills poorly, this many
                                  # of its one-knob neighbours that fill it better (--fit-starts)


# A start config whose tiles a row of the shape's sequence fills less than this gets
# --fit-starts neighbours. Session 73's first device run: of 17 shapes whose start filled
# the sequence below it, 7 won with a tile that fills it to 98-100 % (forward at length
# 512-1000, two backward at 3000); at forward length 3000 the 2048-position tile kept
# winning. (Session 72's reason, (8, 5120, 3000) timed as slow as (8, 5120, 4096), was
# another kernel's time, named wrongly at a tie: docs/DISPATCH.md.)
FIT_FILL = 0.9


def tile_fill(v: Variant, seqlen: int) -> float | None:
    """The fraction of the positions a row's tiles span that lie in a sequence of `seqlen`
    (1.0: its last tile ends where the sequence does): forward and backward variants only,
    whose tiles run along the sequence (an update's run along the batch, a varlen prefill's
    along the packed tokens), else None."""
    if v.family.op not in ("fwd", "bwd") or seqlen < 1:
        return None
    tile = int(v.geometry()["tile_l"])
    return seqlen / (-(-seqlen // tile) * tile) if tile > 0 else None


@dataclass
class Outcome:
    variant: Variant
    status: str                   # see db.TRIAL_STATUSES
    time_us: float | None = None
    spread: float | None = None
    error: str | None = None


@dataclass
class ShapeResult:
    shape: Shape
    arch: str
    winner: Variant | None = None
    time_us: float | None = None
    spread: float | None = None
    default: Variant | None = None
    default_us: float | None = None
    speedup: float | None = None
    start: Variant | None = None   # the first start config (--start-from): what the shape's calls ran
    start_us: float | None = None  # its time, re-timed beside the winner
    copy_fraction: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    resumed: bool = False         # the winner was already in the DB
    budget_spent: bool = False    # --budget-s ended the search (not --trials nor the space)
    note: str = ""

    def timed(self) -> int | None:
        """Candidates timed at the shape (those that passed validation and those stopped
        early as slow; with --resume, the resumed run's too); None for a winner read back
        from the DB."""
        return None if self.resumed else self.counts.get("ok", 0) + self.counts.get("slow", 0)


def study_name(arch: str, shape: Shape) -> str:
    return f"cc1d:{arch}:{shape.family().key()}:{shape.key()}"


def distributions(family: Family) -> dict[str, CategoricalDistribution]:
    return {p.name: CategoricalDistribution(p.values) for p in space_for(family).params}


def simplicity(variant: Variant, default: Variant) -> tuple:
    """Sort key for near-ties: the default first, then fewest changes from it, then the key."""
    changed = sum(a != b for a, b in zip(variant.config, default.config))
    return (variant != default, changed, variant.key())


class _BruteForce(optuna.samplers.BruteForceSampler):
    # ask/tell cannot Study.stop(); the search loop detects exhaustion itself
    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def make_sampler(family: Family, arch: str, cfg: SearchConfig) -> optuna.samplers.BaseSampler:
    n_valid = sum(1 for _ in variants(family, arch_info(arch)))
    if n_valid <= cfg.trials:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _BruteForce(seed=cfg.seed)
    return optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=min(10, max(1, cfg.trials // 4)),
                                      constant_liar=True)


class ShapeSearch:
    """One study: run trials (resumable), then pick and store the winner."""

    def __init__(self, shape: Shape, arch: str, evaluator: Evaluator, db: TuningDB, cfg: SearchConfig,
                 *, storage: Any = None, copy_bw: float | None = None, environment: dict | None = None,
                 run_id: str | None = None, on_trial: Callable[[Outcome], None] | None = None,
                 trials_since: str | None = None, start_configs: Sequence[dict] = ()) -> None:
        self.shape, self.arch, self.ev, self.db, self.cfg = shape, arch, evaluator, db, cfg
        self.start_configs = list(start_configs)  # the first tried first, the rest after the default
        self.trials_since = trials_since  # --resume replays only trials stored after this time
        self.family = shape.family()
        self.arch_obj = arch_info(arch)
        self.default = default_variant(self.family, self.arch_obj)
        self.dists = distributions(self.family)
        self.space_size = math.prod(len(d.choices) for d in self.dists.values())
        self.copy_bw, self.environment = copy_bw, environment or {}
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.on_trial = on_trial or (lambda o: None)
        self.known: dict[str, Outcome] = {}
        self.budget_spent = False  # run_trials: --budget-s ended the search
        self.keys = (arch, self.family.key(), shape.key())
        self.study = optuna.create_study(study_name=study_name(arch, shape), storage=storage,
                                         sampler=make_sampler(self.family, arch, cfg),
                                         direction="minimize", load_if_exists=True)
        self.shared = storage is not None

    # ---- bookkeeping ------------------------------------------------------------

    def _variant(self, params: dict) -> Variant:
        return Variant.of(self.family, **params)

    def _load_known(self) -> None:
        """Outcomes already measured: from the shared study, or (--resume) from the DB's trials."""
        for t in self.study.trials:
            st = t.user_attrs.get("status")
            if st and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                v = self._variant(t.params)
                self.known[v.key()] = Outcome(v, st, t.user_attrs.get("time_us"),
                                              t.user_attrs.get("spread"), t.user_attrs.get("error"))
        if self.shared or not self.cfg.resume:
            return
        for row in self.db.trials(*self.keys):  # later rows win
            if self.trials_since is not None and row["created_at"] <= self.trials_since:
                continue
            v = self._variant(json.loads(row["config"]))
            o = Outcome(v, row["status"], row["time_us"], row["spread"], row["error"])
            if v.key() not in self.known:
                self.study.add_trial(optuna.trial.create_trial(
                    params=v.params, distributions=self.dists,
                    value=o.time_us if o.status in ("ok", "slow") else None,
                    state=TrialState.COMPLETE if o.status in ("ok", "slow") else TrialState.PRUNED,
                    user_attrs=_attrs(o)))
            self.known[v.key()] = o

    def _record(self, trial: optuna.trial.Trial | None, o: Outcome) -> None:
        """DB first (one transaction), then the study: a kill in between loses nothing measured."""
        self.db.add_trial(run_id=self.run_id, arch=self.arch, family_key=self.family.key(),
                          shape_key=self.shape.key(), variant_key=o.variant.key(), config=o.variant.params,
                          status=o.status, time_us=o.time_us, spread=o.spread, error=o.error)
        if trial is not None:
            for k, v in _attrs(o).items():
                trial.set_user_attr(k, v)
            if o.status in ("ok", "slow"):
                self.study.tell(trial, o.time_us)
            else:
                self.study.tell(trial, state=TrialState.PRUNED)
        self.known[o.variant.key()] = o
        self.on_trial(o)

    def _attempted(self) -> int:
        """Candidates that count against --trials: all but statically invalid ones, over all workers."""
        if self.shared:
            keys = {self._variant(t.params).key() for t in self.study.get_trials(deepcopy=False)
                    if t.user_attrs.get("status", "running") not in ("invalid", "abandoned")
                    and len(t.params) == len(self.dists)}
            keys |= {k for k, o in self.known.items() if o.status != "invalid"}
            return len(keys)
        return sum(o.status != "invalid" for o in self.known.values())

    def _room(self, in_flight: int) -> bool:
        """Whether --trials and the space leave a candidate to try beyond `in_flight` ones."""
        return self._attempted() + in_flight < self.cfg.trials and len(self.known) + in_flight < self.space_size

    # ---- the trial loop ---------------------------------------------------------

    def run_trials(self) -> None:
        self._load_known()
        if not (self.shared and self.study.trials):  # one process of a shared study enqueues
            queued = set(self.known)
            starts = [self._variant(c) for c in self.start_configs]
            # The first start config (what the shape's calls ran) goes first, then the default:
            # a budget that ends after one trial then keeps what ran (session 75: a 6-second
            # budget at (16, 2048, 16384) timed only the default, 0.64x the kernel it replaced).
            for v in starts[:1] + [self.default] + starts[1:] + self._fitting(starts or [self.default]) + \
                    self._neighbours(starts):
                if v.key() not in queued:
                    self.study.enqueue_trial(v.params)
                    queued.add(v.key())
        start = time.monotonic()
        best = min((o.time_us for o in self.known.values() if o.status == "ok"), default=None)
        pending: deque[tuple[Any, Variant, Future]] = deque()
        pending_keys: set[str] = set()
        asks = 0
        ahead = max(self.cfg.compile_ahead, self.cfg.compile_workers)
        pool = ThreadPoolExecutor(max_workers=self.cfg.compile_workers, thread_name_prefix="cc1d-compile")
        try:
            while True:
                out_of_budget = self.cfg.budget_s is not None and time.monotonic() - start > self.cfg.budget_s
                if out_of_budget and (pending or self._room(0)):
                    self.budget_spent = True  # not where --trials or the space ended it anyway
                if out_of_budget and pending:
                    self._abandon(pending)
                    break
                while (not out_of_budget and len(pending) < 1 + ahead and self._room(len(pending))
                       and asks < 20 * self.space_size):
                    asks += 1
                    trial = self.study.ask(self.dists)
                    v = self._variant(trial.params)
                    if v.key() in pending_keys:  # TPE proposed one in flight: not a new candidate
                        self.study.tell(trial, state=TrialState.FAIL)
                        continue
                    if v.key() in self.known:   # already measured: tell the sampler, measure nothing
                        o = self.known[v.key()]
                        for k, val in _attrs(o).items():
                            trial.set_user_attr(k, val)
                        if o.status in ("ok", "slow"):
                            self.study.tell(trial, o.time_us)
                        else:
                            self.study.tell(trial, state=TrialState.PRUNED)
                        continue
                    reason = v.why_invalid(self.arch_obj)
                    if reason:
                        self._record(trial, Outcome(v, "invalid", error=reason))
                        continue
                    pending.append((trial, v, pool.submit(self.ev.compile, v)))
                    pending_keys.add(v.key())
                if not pending:
                    break
                trial, v, fut = pending.popleft()
                pending_keys.discard(v.key())
                o = self._evaluate(v, fut, best)
                if o.status == "ok" and (best is None or o.time_us < best):
                    best = o.time_us
                self._record(trial, o)
        finally:
            # Compiles already running finish on their own (their binaries land in the
            # compile cache); the search does not wait for them.
            pool.shutdown(wait=False, cancel_futures=True)

    def _neighbours(self, starts: Sequence[Variant]) -> list[Variant]:
        """The start configs with one tunable changed (statically valid ones), tried right
        after them: each other register cap first, then each other value of every other
        tunable, in the space's order. The best cap moves with the device (session 56's
        re-tune on an H200 of winners found on an H100 under a 96 cap picked the same
        configs under a 64 one), and a template change can make another value of one knob
        the better kernel (session 57: walked channel-first backward segments, nvec above
        4); a short search seeded from a winner had not drawn such one-knob neighbours."""
        names = sorted(self.dists, key=lambda n: n != "max_regs")  # stable: the rest keep their order
        out = []
        for v in starts:
            for name in names:
                for value in self.dists[name].choices:
                    if value != v.params[name]:
                        n = self._variant({**v.params, name: value})
                        if n.why_invalid(self.arch_obj) is None:  # run_trials drops repeats
                            out.append(n)
        return out

    def _fitting(self, starts: Sequence[Variant]) -> list[Variant]:
        """--fit-starts N: for each start config whose tiles fill the shape's sequence less
        than FIT_FILL, the N of its one-knob neighbours that fill it best, where better than
        it does; of those that fill it alike (to a percent), the wider vector first (a
        narrower one halves the bytes each load moves), then the longer tile (the fewer
        blocks), then the space's order. Tried right after the starts: otherwise a short
        search's register caps and other neighbours come first. Whether they win is the
        timing's to say: in session 72's backward width-2/3 searches at length 3000, the
        1024-position segments lost to 4096-position ones at 7 of 8 calls."""
        if self.cfg.fit_starts <= 0:
            return []
        out = []
        for v in starts:
            fill = tile_fill(v, self.shape.seqlen)
            if fill is None or fill >= FIT_FILL:
                continue
            ranked = []
            for i, n in enumerate(self._neighbours([v])):
                f = tile_fill(n, self.shape.seqlen)
                if f is not None and round(f, 2) > round(fill, 2):
                    g = n.geometry()
                    ranked.append((-round(f, 2), -g["align_bytes"], -g["tile_l"], i, n))
            out += [n for *_, n in sorted(ranked, key=lambda r: r[:4])][:self.cfg.fit_starts]
        return out

    def _abandon(self, pending: deque) -> None:
        """The budget is spent: candidates compiled ahead are not timed. The study hears
        they failed (nothing measured, nothing in the DB: --resume tries them again)."""
        for trial, _, _ in pending:  # their compiles not yet started are cancelled with the pool
            trial.set_user_attr("status", "abandoned")
            self.study.tell(trial, state=TrialState.FAIL)
        log.info("cc1d-tune: %s %s budget spent; %d candidates compiled ahead not timed",
                 self.family.key(), self.shape.key(), len(pending))
        pending.clear()

    def _evaluate(self, v: Variant, compiled: Future, best: float | None) -> Outcome:
        try:
            compiled.result()
            self.ev.validate(v)
            t = self.ev.time(v, best)
        except CandidateError as exc:
            return Outcome(v, exc.status, error=exc.reason)
        except Exception as exc:  # noqa: BLE001 - a candidate's failure is a value, not the end of the run
            log.warning("cc1d-tune: %s failed unexpectedly: %r", v.key(), exc)
            return Outcome(v, "error", error=repr(exc))
        return Outcome(v, "slow" if t.early_exit else "ok", t.median_us, t.spread,
                       "early exit: clearly slower than the best so far" if t.early_exit else None)

    # ---- the winner ---------------------------------------------------------------

    def _tie_band(self, rounds: dict[Variant, list[Timing]], fastest: Variant, v: Variant) -> float:
        """How far above the fastest's median v's may lie and still tie: two standard errors
        of the medians' difference, or the rounds' own scatter (the median absolute
        deviation of their medians: drift between rounds, robust to one disturbed round),
        at least the floor. Not the samples' spread: flush-timed samples spread by ~10 %
        while the median of 80 of them has a standard error near 1 % (measured on the H100:
        a spread-wide band made a 0.3 us gap at 3.6 us a tie, and the simpler, slower config won)."""
        def err(u: Variant) -> float:
            return _middle([median_error(t) for t in rounds[u]])

        def scatter(u: Variant) -> float:
            ms = [t.median_us for t in rounds[u]]
            mid = _middle(ms)
            return _middle([abs(m - mid) for m in ms]) / mid if mid > 0 else 0.0

        return max(self.cfg.tie_tolerance, 2 * math.hypot(err(fastest), err(v)), scatter(fastest), scatter(v))

    def _ties(self, rounds: dict[Variant, list[Timing]]) -> tuple[dict[Variant, float], list[Variant]]:
        """Each variant's time (the median of its rounds' medians) and those that tie
        with the fastest."""
        med = {v: _middle([t.median_us for t in ts]) for v, ts in rounds.items()}
        fastest = min(med, key=lambda v: (med[v], v.key()))
        return med, [v for v in med if med[v] <= med[fastest] * (1 + self._tie_band(rounds, fastest, v))]

    def _warm_ties(self, tied: list[Variant]) -> list[Variant]:
        """Of finalists that tie under a timing that flushes the L2 before each launch, those
        that also tie timed warm (back to back), re-timed in interleaved rounds like the
        finalists. A tie after a flush is no reason to take a config that is slower warm
        (session 19, H100: the batch-1 dim-contiguous update's flush-timed tie went to the
        default, 2.9 us in a graph loop against 1.8 for the config it replaced)."""
        if len(tied) < 2:
            return tied
        rounds: dict[Variant, list[Timing]] = {v: [] for v in tied}
        for _ in range(self.cfg.retime_rounds):
            for v in list(rounds):
                try:
                    t = self.ev.time_warm(v)
                except CandidateError as exc:
                    log.warning("cc1d-tune: finalist %s failed when timed warm: %s", v.key(), exc)
                    del rounds[v]
                    continue
                if t is None:  # the timing is warm already: nothing to add
                    return tied
                rounds[v].append(t)
        if not rounds:
            return tied
        med, still_tied = self._ties(rounds)
        log.info("cc1d-tune: %s %s flush-timed ties timed warm: %s", self.family.key(), self.shape.key(),
                 ", ".join(f"{v.key()} {med[v]:.3f} us" for v in sorted(med, key=med.get)))
        return still_tied

    def finalize(self) -> ShapeResult:
        res = ShapeResult(self.shape, self.arch, default=self.default, budget_spent=self.budget_spent)
        for o in self.known.values():
            res.counts[o.status] = res.counts.get(o.status, 0) + 1
        ok = sorted((o for o in self.known.values() if o.status == "ok"), key=lambda o: o.time_us)
        if not ok:
            res.note = "no candidate passed validation"
            return res
        finalists = [o.variant for o in ok[: self.cfg.finalists]]
        # The default and the first start config are re-timed beside the winner, for the
        # report's speed-ups (the start config: the kernel the shape's calls ran before).
        start = self._variant(self.start_configs[0]) if self.start_configs else None
        for v in (self.default, start):
            if v is not None and v.key() in self.known and self.known[v.key()].status == "ok" \
                    and v not in finalists:
                finalists.append(v)
        rounds: dict[Variant, list[Timing]] = {v: [] for v in finalists}
        for _ in range(self.cfg.retime_rounds):  # interleaved, so drift hits all alike
            for v in finalists:
                try:
                    rounds[v].append(self.ev.time(v, None))
                except CandidateError as exc:
                    log.warning("cc1d-tune: finalist %s failed when re-timed: %s", v.key(), exc)
                    rounds.pop(v, None)
                    break
            finalists = [v for v in finalists if v in rounds]
        if not rounds:
            res.note = "every finalist failed when re-timed"
            return res
        med, tied = self._ties(rounds)
        noise = {v: _middle([t.spread for t in ts]) for v, ts in rounds.items()}
        # A tie goes to the kernel the shape's calls ran (the first start config), then to the
        # simplest: a re-tune changes nothing it cannot measure (session 44: a flush-timed tie
        # at 1.001x moved the batch-1 HF-state update to a config 3.7 % slower in a graph loop).
        winner = min(self._warm_ties(tied), key=lambda v: (v != start, *simplicity(v, self.default)))
        res.winner, res.time_us, res.spread = winner, med[winner], noise[winner]
        if self.default in med:
            res.default_us = med[self.default]
            res.speedup = res.default_us / res.time_us
        if start in med:
            res.start, res.start_us = start, med[start]
        if self.copy_bw:
            res.copy_fraction = self.ev.bytes_moved / (res.time_us * 1e-6) / self.copy_bw
        self.db.put_winner(winner.source, **winner_row(
            self.shape, self.arch, winner, time_us=res.time_us, default_us=res.default_us,
            copy_fraction=res.copy_fraction, spread=res.spread, speedup=res.speedup,
            environment={**self.environment, "timing_method": TIMING_METHOD}))
        return res


def winner_row(shape: Shape, arch: str, v: Variant, **measured: Any) -> dict:
    """The winners-table row (TuningDB.put_winner's keywords) of variant v as the shape's
    winner; `measured`: time_us, default_us, copy_fraction, spread, speedup, environment."""
    return dict(arch=arch, family_key=shape.family().key(), shape_key=shape.key(), op=shape.op,
                batch=shape.batch, dim=shape.dim, seqlen=shape.seqlen, features=",".join(shape.features()),
                variant_key=v.key(), config=v.params, source_hash=v.hash(), **v.geometry(), **measured)


def _middle(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _attrs(o: Outcome) -> dict:
    return {"status": o.status, "time_us": o.time_us, "spread": o.spread, "error": o.error}


def result_from_db(shape: Shape, arch: str, row: dict) -> ShapeResult:
    v = Variant.of(shape.family(), **json.loads(row["config"]))
    return ShapeResult(shape, arch, winner=v, time_us=row["time_us"], spread=row["spread"],
                       default_us=row["default_us"], speedup=row["speedup"],
                       copy_fraction=row["copy_fraction"], resumed=True)


def is_current(shape: Shape, row: dict) -> bool:
    """A stored winner still names this cc1d's kernel, timed as this cc1d times: same
    epoch and timing method, and its config renders (with the current templates) to
    the source it was timed with."""
    if row["epoch"] != EPOCH or timing_method_of(row) != TIMING_METHOD:
        return False
    try:
        return Variant.of(shape.family(), **json.loads(row["config"])).hash() == row["source_hash"]
    except (TypeError, ValueError, KeyError):
        return False  # the config is no longer in the space


def timing_method_of(row: dict) -> int | None:
    """The timing method a winner row records in its environment (None: none recorded)."""
    try:
        env = json.loads(row["environment"])
    except (TypeError, ValueError):
        return None
    return env.get("timing_method") if isinstance(env, dict) else None


def with_added_params(family: Family, config: dict) -> dict:
    """A stored config from before a tunable was added to its space, with the tunable's
    default (its value in the first preferred config): a tunable is added with the kernel
    it had before as its default (vfwd channel-first's "mend", session 45), so the config
    names the kernel it always did."""
    space = space_for(family)
    preferred = space.preferred[0]
    missing = {p.name: preferred[p.name] for p in space.params if p.name not in config and p.name in preferred}
    return {**config, **missing}


def _usable_config(shape: Shape, arch: str, row: dict) -> dict | None:
    """A winner row's config as this generator builds it for the arch (with_added_params),
    or None: another generator epoch (its params may mean something else), or a config
    no longer in the space or not valid for the arch."""
    if row["epoch"] != EPOCH:
        return None
    cfg = with_added_params(shape.family(), json.loads(row["config"]))
    try:
        usable = Variant.of(shape.family(), **cfg).why_invalid(arch) is None
    except (TypeError, ValueError, KeyError):
        usable = False  # the config is no longer in the space
    return cfg if usable else None


def start_configs(shape: Shape, arch: str, dbs: Sequence[TuningDB], family: int = 0, widths: int = 0,
                  dtypes: int = 0) -> list[dict]:
    """The configs of the winners these DBs serve the shape's calls (served_winner: the
    shape's own, else the nearest, which its calls ran until it is tuned) that this
    generator can still build for the arch: candidates a re-tune tries first, timed like any
    other. A winner found under another timing method (or on another device) then cannot be
    missed by the search, and it is kept only if it wins again; a new shape is measured
    against the kernel its calls ran. A winner whose source the templates have changed
    since counts too (the usual reason to re-tune): its config renders to today's kernel,
    which is what gets timed, a tunable added since taking its default (with_added_params).
    Winners of another generator epoch do not (their params may mean something else).

    Then, with `family` > 0, the configs of that many more winners of the shape's family in
    these DBs, nearest shape first (dispatch_rank), skipping configs already in the list:
    a search that starts only from its own winner explores one knob at a time around it,
    while a config that won at a neighbouring shape may be several knobs away (session 57:
    the walked config faster at (8, 5120, 2048) was four knobs from that shape's winner and
    two from (2, 4096, 2048)'s). The first config stays the shape's served winner: the
    report's "vs start" and the tie rule refer to it.

    Then, with `widths` > 0, the configs of that many winners of the shape's sibling
    families (its op, layout and dtypes at another width), nearest shape first, then nearest
    width: a family with few entries of its own can start from one tuned at many shapes
    (session 71: backward channel-first bf16 had 83 width-4 winners, 2 width-2 and 2 width-3,
    and the peer sweep found half the width-2/3 calls behind the peer). Then, with `dtypes` > 0, likewise that many winners
    of its op, layout and width at the other dtype pairs whose x has the same element size
    (fp16 from bf16, say: the same bytes move), nearest shape first, then most dtypes shared.

    Where some DBs hold the shape's own winner and others only a nearest one, the own
    winners come first (in the DBs' order), then the nearest ones."""
    own = shape.family()
    served = [row for row in (served_winner(db, arch, shape) for db in dbs) if row is not None]
    # A DB's winner of this very shape before any DB's nearest one: the shape's calls ran it
    # (session 82: a winner dropped from the shipped DB for a re-tune after a template change
    # was only in the second start DB, and with two trials of budget the search never timed it).
    served.sort(key=lambda row: row["shape_key"] != shape.key())
    out = []
    for row in served:
        cfg = _usable_config(shape, arch, row)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    if family > 0:
        _add_kin_configs(shape, arch, dbs, family, out, {own.key(): 0})
    if widths > 0:
        _add_kin_configs(shape, arch, dbs, widths, out,
                         {replace(own, width=w).key(): abs(w - own.width) for w in WIDTHS if w != own.width})
    if dtypes > 0:
        same_size = [(x, w) for x, w in DTYPE_PAIRS
                     if DTYPES[x][1] == own.x_bytes and (x, w) != (own.x_dtype, own.w_dtype)]
        _add_kin_configs(shape, arch, dbs, dtypes, out,
                         {replace(own, x_dtype=x, w_dtype=w).key(): (x != own.x_dtype) + (w != own.w_dtype)
                          for x, w in same_size})
    return out


def _add_kin_configs(shape: Shape, arch: str, dbs: Sequence[TuningDB], count: int, out: list[dict],
                     kin: dict[str, int]) -> None:
    """start_configs' `family`, `widths` and `dtypes`: append to `out` the usable configs of up
    to `count` winners of the families keyed in `kin` (family key -> how far from the shape's
    family, 0 for its own), nearest shape (dispatch_rank) first, then nearest family; configs
    already in `out` are skipped."""
    rows = [r for db in dbs for r in db.winners(arch) if r["family_key"] in kin]
    added = 0
    for row in sorted(rows, key=lambda r: (dispatch_rank(shape, r, arch), kin[r["family_key"]])):
        cfg = _usable_config(shape, arch, row)
        if cfg is not None and cfg not in out:
            out.append(cfg)
            added += 1
            if added == count:
                return


def tune_shape(shape: Shape, arch: str, evaluator: Evaluator, db: TuningDB, cfg: SearchConfig = SearchConfig(),
               **kwargs: Any) -> ShapeResult:
    """Search one shape and store its winner (or, with cfg.resume, return the stored one)."""
    # Trials of another timing method are not replayed: "" when every stored trial is this one's.
    since = db.adopt_timing_method(TIMING_METHOD) if cfg.finalize else ""
    if cfg.resume and cfg.finalize:
        row = db.winner(arch, shape.family().key(), shape.key())
        if row is not None:
            if is_current(shape, row):
                return result_from_db(shape, arch, row)
            # Tuned with other templates or timed another way: its trials timed other
            # sources; only those stored since (a killed re-tune of this shape) are replayed.
            since = max(since, row["created_at"])
        if since:
            kwargs["trials_since"] = max(since, kwargs.get("trials_since") or "")
    search = ShapeSearch(shape, arch, evaluator, db, cfg, **kwargs)
    search.run_trials()
    if not cfg.finalize:
        return ShapeResult(shape, arch, note="trials only (worker)")
    return search.finalize()
