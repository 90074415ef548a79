"""The SQLite tuning DB: schema checks, one transaction per trial and per winner,
export/import as sorted JSON lines, merge, and validation of every entry.

Several tuner processes may write one DB at once (WAL mode, busy timeout); a
winner and its source are written in one transaction, so a killed tuner never
leaves a half-written winner. A DB for shipping is finalized into one
self-contained file (rollback-journal mode, no -wal/-shm beside it); readers
open it read-only, which leaves it as it is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
import urllib.parse
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from ..generator import EPOCH, Family, Variant, arch_info
from ..generator.variant import twin_source, walk_cut_source
from .shapes import Shape

log = logging.getLogger("cc1d")

SCHEMA_VERSION = 2  # 2: winners.split_blocks (the backward's partial-sum layout)
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "tuning_db" / "schema.sql"
BUSY_TIMEOUT_MS = 60_000
TRIAL_STATUSES = ("ok", "slow", "invalid", "compile_error", "launch_error", "wrong_result", "error")
WINNER_COLUMNS = ("arch", "family_key", "shape_key", "op", "batch", "dim", "seqlen", "features",
                  "variant_key", "config", "source_hash", "threads", "tile_l", "tile_d", "smem_bytes",
                  "align_bytes", "split_blocks", "epoch", "time_us", "default_us", "copy_fraction", "spread", "speedup",
                  "environment", "created_at")
TRIAL_COLUMNS = ("run_id", "arch", "family_key", "shape_key", "variant_key", "config", "status",
                 "time_us", "spread", "error", "epoch", "created_at")


class DBError(RuntimeError):
    """The DB cannot be used as asked; the message says why and what to do."""


def default_db_path() -> Path:
    """The user's DB, which the runtime reads: $CC1D_CACHE_DIR | $XDG_CACHE_HOME/cc1d | ~/.cache/cc1d."""
    if os.environ.get("CC1D_CACHE_DIR"):
        base = Path(os.environ["CC1D_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]) / "cc1d"
    else:
        base = Path.home() / ".cache" / "cc1d"
    return base / "tuning.db"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def family_from_key(key: str) -> Family:
    """Inverse of Family.key(): ``fwd.cf.bf16wf32.w4`` -> Family."""
    try:
        op, layout, dtypes, width = key.split(".")
        x, w = dtypes.split("w", 1)
        return Family(op, layout, x, w, int(width.removeprefix("w")))
    except ValueError as exc:
        raise ValueError(f"family key: expected like 'fwd.cf.bf16wf32.w4', got {key!r} ({exc})") from None


def winner_variant(row: dict) -> Variant:
    """The variant a winners-table row names, rebuilt from its family key and config (as
    today's generator renders it). ValueError or KeyError where the config does not fit."""
    return Variant.of(family_from_key(row["family_key"]), **json.loads(row["config"]))


def winner_shape(row: dict) -> Shape:
    """The shape a winners-table row was tuned at: its family, sizes and features."""
    return Shape.of(family_from_key(row["family_key"]), int(row["batch"]), int(row["dim"]), int(row["seqlen"]),
                    [f for f in str(row["features"]).split(",") if f])


def runtime_builds(rt: Any, key: str, source: str) -> list[tuple[str, str, list[str]]]:
    """(name, source, compiler options) of each kernel the runtime may build from a stored
    winner's source whatever the call: the plain source; a backward's seq_idx build; a
    channel-first forward's or backward's realigned twin (and the backward twin's seq_idx
    build); a walked channel-first backward's walk-cut build (never with seq_idx). A plan's
    fixed kernel takes the call's values, so it is not among them. `rt` is the runtime
    module (its bwd_seq_build_options); compile_problems(builds=...) takes them."""
    seq = list(rt.bwd_seq_build_options()) if key.startswith("bwd.") else None
    twin = twin_source(key, source)
    builds = [("plain", source, [])]
    if seq is not None:
        builds.append(("seq_idx", source, seq))
    if twin is not None:
        builds.append(("realigned", twin, []))
        if seq is not None:
            builds.append(("realigned seq_idx", twin, seq))
    cut = walk_cut_source(key, source)
    if cut is not None:
        builds.append(("walk-cut", cut, []))
    return builds


class TuningDB:
    """One open tuning DB. ``TuningDB(path)`` creates it if missing (and switches it
    to WAL mode); ``readonly=True`` opens an existing one for reading and changes
    nothing in it (a finalized, shipped DB stays in rollback-journal mode)."""

    def __init__(self, path: str | Path, *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if not self.path.exists() and (not create or readonly):
            raise DBError(f"tuning DB {self.path} does not exist")
        if readonly:
            uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
            self.conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a writer takes the
            # write lock up front and waits (busy_timeout) instead of failing on upgrade.
            self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000,
                                        isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        try:
            self._check_and_init()
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "TuningDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema ---------------------------------------------------------------

    def _check_and_init(self) -> None:
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # WAL + NORMAL: a killed process loses nothing committed; a power cut may drop the last commits
            self.conn.execute("PRAGMA synchronous = NORMAL")
            ok = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise DBError(f"tuning DB {self.path} is not a readable SQLite DB ({exc}); "
                          f"move it aside or pass another --db") from None
        if ok != "ok":
            raise DBError(f"tuning DB {self.path} fails PRAGMA integrity_check ({ok}); refusing to "
                          f"write to it: restore it from an export, or move it aside")
        if self.readonly:
            self._check_readable()
            return
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "meta" not in tables:
            # Someone else's SQLite file: adding our tables to it would be writing where we cannot trust.
            raise DBError(f"tuning DB {self.path} is an SQLite DB of something else (tables "
                          f"{sorted(tables)[:5]}, no 'meta'): refusing to write to it; pass another --db")
        if "meta" in tables:  # refuse before anything (even the journal mode) changes the file
            self._refuse_newer(int(self.meta().get("schema_version", SCHEMA_VERSION)))
        self._switch_to_wal()
        with self.transaction():
            for stmt in _schema_statements():  # not executescript: it would COMMIT early
                self.conn.execute(stmt)
            meta = self.meta()
            version = int(meta.get("schema_version", SCHEMA_VERSION))
            self._refuse_newer(version)
            if version < SCHEMA_VERSION:
                self._migrate(version)
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                              (str(SCHEMA_VERSION),))
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('generator_epoch', ?)", (str(EPOCH),))

    def _switch_to_wal(self) -> None:
        """Put the DB in WAL mode. Two processes switching a new DB at the same moment
        both hold a shared lock and want an exclusive one; SQLite answers one of them
        SQLITE_BUSY at once (the busy handler would deadlock there), so retry until the
        other has finished the switch or the busy timeout runs out."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay = 0.005
        while True:
            try:
                if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self.conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise DBError(f"tuning DB {self.path}: could not switch it to WAL mode within "
                                  f"{BUSY_TIMEOUT_MS // 1000} s ({exc}); another process holds it") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise DBError(f"tuning DB {self.path} has schema version {version}, newer than this "
                          f"cc1d's {SCHEMA_VERSION}: upgrade cc1d, or pass another --db")

    def _migrate(self, version: int) -> None:
        """Bring an older DB to this schema, in the caller's transaction (all or nothing)."""
        columns = {r["name"] for r in self.conn.execute("PRAGMA table_info(winners)")}
        if "split_blocks" not in columns:
            # Schema 1's backward winners ran with the fixed 2048 that schema 2 made tunable.
            self.conn.execute("ALTER TABLE winners ADD COLUMN split_blocks INTEGER NOT NULL DEFAULT 0")
            self.conn.execute("UPDATE winners SET split_blocks = 2048 WHERE op = 'bwd'")
        log.info("tuning DB %s: schema %d -> %d", self.path, version, SCHEMA_VERSION)

    def _check_readable(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted({"meta", "sources", "winners"} - tables)
        if missing:
            raise DBError(f"tuning DB {self.path} lacks the tables {missing}: not a cc1d tuning DB")
        version = int(self.meta().get("schema_version", 0))
        if version > SCHEMA_VERSION:
            raise DBError(f"tuning DB {self.path} has schema version {version}, newer than this "
                          f"cc1d's {SCHEMA_VERSION}: upgrade cc1d")

    def adopt_timing_method(self, method: int) -> str:
        """Record that trials from now on are timed by `method` and return the time from
        which this DB's trials are that method's ("" for all of them). Switching methods
        (or a DB from before methods were recorded that holds trials) starts it now, so
        --resume replays none of the older trials."""
        with self.transaction():
            meta = self.meta()
            if meta.get("timing_method") == str(method):
                return meta.get("timing_method_since", "")
            had_trials = self.conn.execute("SELECT 1 FROM trials LIMIT 1").fetchone() is not None
            since = now() if had_trials else ""
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('timing_method', ?)", (str(method),))
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('timing_method_since', ?)", (since,))
        if had_trials:
            log.warning("tuning DB %s: its trials were timed by %s; --resume replays only those "
                        "timed from now on (timing method %d)", self.path,
                        f"timing method {meta['timing_method']}" if "timing_method" in meta
                        else "a cc1d that recorded no timing method", method)
        return since

    def meta(self) -> dict[str, str]:
        return {r["key"]: r["value"] for r in self.conn.execute("SELECT key, value FROM meta")}

    def transaction(self) -> "_Transaction":
        return _Transaction(self.conn)

    # ---- writes ---------------------------------------------------------------

    def add_trial(self, **row: Any) -> None:
        row = {"created_at": now(), "epoch": EPOCH, "time_us": None, "spread": None, "error": None, **row}
        if row["status"] not in TRIAL_STATUSES:
            raise ValueError(f"status: expected one of {TRIAL_STATUSES}, got {row['status']!r}")
        if not isinstance(row["config"], str):
            row["config"] = json.dumps(row["config"], sort_keys=True)
        with self.transaction():
            self.conn.execute(f"INSERT INTO trials ({', '.join(TRIAL_COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(TRIAL_COLUMNS))})", [row[c] for c in TRIAL_COLUMNS])

    def put_winner(self, source: str, **row: Any) -> None:
        """Store (replace) one winner and its source, atomically."""
        row = {"created_at": now(), "epoch": EPOCH, "default_us": None, "copy_fraction": None,
               "spread": None, "speedup": None, **row}
        row.setdefault("split_blocks", _schema1_split_blocks(row["op"]))  # rows exported from schema 1
        for k in ("config", "environment"):
            if not isinstance(row[k], str):
                row[k] = json.dumps(row[k], sort_keys=True)
        row["source_hash"] = row.get("source_hash") or sha256(source)
        if sha256(source) != row["source_hash"]:
            raise ValueError(f"winner {row['variant_key']}: source does not match its hash")
        with self.transaction():
            self.conn.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (row["source_hash"], source))
            self.conn.execute(f"INSERT OR REPLACE INTO winners ({', '.join(WINNER_COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(WINNER_COLUMNS))})", [row[c] for c in WINNER_COLUMNS])

    # ---- reads ----------------------------------------------------------------

    def winners(self, arch: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM winners", ()
        if arch:
            q, args = q + " WHERE arch = ?", (arch,)
        return [_normalized(r) for r in self.conn.execute(q + " ORDER BY arch, family_key, shape_key", args)]

    def winner(self, arch: str, family_key: str, shape_key: str) -> dict | None:
        r = self.conn.execute("SELECT * FROM winners WHERE arch = ? AND family_key = ? AND shape_key = ?",
                              (arch, family_key, shape_key)).fetchone()
        return _normalized(r) if r else None

    def trials(self, arch: str, family_key: str, shape_key: str) -> list[dict]:
        """Every stored trial of one problem, oldest first."""
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM trials WHERE arch = ? AND family_key = ? AND shape_key = ? ORDER BY id",
            (arch, family_key, shape_key))]

    def source(self, source_hash: str) -> str | None:
        r = self.conn.execute("SELECT source FROM sources WHERE hash = ?", (source_hash,)).fetchone()
        return r[0] if r else None

    def copy_to(self, dest: str | Path) -> Path:
        """Write this DB to `dest` (a new file) through SQLite's backup API, in
        rollback-journal mode: one self-contained file. A plain file copy of a WAL-mode DB
        misses what its -wal file still holds (a commit of a connection not yet closed)."""
        dest = Path(dest)
        if dest.exists():
            raise DBError(f"cannot copy tuning DB {self.path} to {dest}: it exists")
        try:
            out = sqlite3.connect(str(dest), isolation_level=None)
            try:
                self.conn.backup(out)
                out.execute("PRAGMA journal_mode = DELETE")
            finally:
                out.close()
        except sqlite3.Error as exc:
            for suffix in ("", "-journal", "-wal", "-shm"):  # no half-written copy left behind
                dest.with_name(dest.name + suffix).unlink(missing_ok=True)
            raise DBError(f"cannot copy tuning DB {self.path} to {dest} ({exc})") from None
        return dest

    # ---- text form, merge, validation ----------------------------------------

    def export_lines(self, with_trials: bool = False) -> Iterator[str]:
        """Sorted JSON lines: meta, then winners, their sources, and optionally trials."""
        dump = lambda d: json.dumps(d, sort_keys=True, separators=(",", ":"))  # noqa: E731
        for k, v in sorted(self.meta().items()):
            yield dump({"kind": "meta", "key": k, "value": v})
        hashes = set()
        for w in self.winners():
            hashes.add(w["source_hash"])
            yield dump({"kind": "winner", **w})
        for h in sorted(hashes):
            yield dump({"kind": "source", "hash": h, "source": self.source(h)})
        if with_trials:
            rows = self.conn.execute("SELECT * FROM trials ORDER BY arch, family_key, shape_key, "
                                     "variant_key, created_at, id")
            for r in rows:
                yield dump({"kind": "trial", **{k: r[k] for k in TRIAL_COLUMNS}})

    def import_lines(self, lines: Iterable[str], *, keep_faster: bool = False) -> int:
        """Load exported lines; returns how many winners were stored."""
        sources: dict[str, str] = {}
        winners: list[dict] = []
        trials: list[dict] = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                kind = item.pop("kind")
            except (ValueError, KeyError):
                raise DBError(f"import line {n}: expected a JSON object with a 'kind', got {line[:80]!r}")
            if kind == "source":
                sources[item["hash"]] = item["source"]
            elif kind == "winner":
                winners.append(item)
            elif kind == "trial":
                trials.append(item)
            elif kind == "meta":
                if item["key"] == "schema_version" and int(item["value"]) > SCHEMA_VERSION:
                    raise DBError(f"import: schema version {item['value']} is newer than this cc1d's "
                                  f"{SCHEMA_VERSION}")
            else:
                raise DBError(f"import line {n}: unknown kind {kind!r}")
        for t in trials:
            self.add_trial(**t)
        stored = 0
        for w in winners:
            src = sources.get(w["source_hash"])
            if src is None:
                raise DBError(f"import: winner {w['variant_key']} has no source line (hash {w['source_hash']})")
            old = self.winner(w["arch"], w["family_key"], w["shape_key"])
            if keep_faster and old is not None and old["time_us"] <= w["time_us"]:
                continue
            self.put_winner(src, **w)
            stored += 1
        return stored

    def merge_from(self, other: "TuningDB", *, replace: bool = False) -> int:
        """Take the other DB's trials and its winners where faster (or absent here); with
        ``replace``, all its winners: times from runs that time differently (a re-tune after
        the timing method changed) do not compare, and the newer run is the one to keep."""
        return self.import_lines(other.export_lines(with_trials=True), keep_faster=not replace)

    def drop_winner(self, arch: str, family_key: str, shape_key: str) -> dict:
        """Delete one winner (its source stays until drop_unused_sources) and return its row;
        DBError naming what the DB holds where it has no such winner."""
        row = self.winner(arch, family_key, shape_key)
        if row is None:
            held = [r[0] for r in self.conn.execute(
                "SELECT shape_key FROM winners WHERE arch = ? AND family_key = ? ORDER BY shape_key",
                (arch, family_key))]
            near = f"; its {len(held)} shapes of {family_key} on {arch} include {', '.join(held[:5])}" if held else \
                f"; it holds no winner of {family_key} on {arch}"
            raise DBError(f"tuning DB {self.path}: no winner of {family_key} at {shape_key} on {arch}{near}")
        with self.transaction():
            self.conn.execute("DELETE FROM winners WHERE arch = ? AND family_key = ? AND shape_key = ?",
                              (arch, family_key, shape_key))
        return row

    def drop_unused_sources(self) -> int:
        """Delete the sources no winner uses (a replaced winner leaves its source behind);
        returns how many went."""
        with self.transaction():
            cur = self.conn.execute("DELETE FROM sources WHERE hash NOT IN "
                                    "(SELECT source_hash FROM winners)")
        return cur.rowcount

    def validate(self) -> list[str]:
        """Every problem with the stored winners (empty when all is well)."""
        problems = []
        for w in self.winners():
            name = f"{w['arch']} {w['family_key']} {w['shape_key']}"
            src = self.source(w["source_hash"])
            if src is None:
                problems.append(f"{name}: source {w['source_hash'][:12]} missing")
                continue
            if sha256(src) != w["source_hash"]:
                problems.append(f"{name}: source does not match its hash {w['source_hash'][:12]}")
            if w["epoch"] != EPOCH:
                problems.append(f"{name}: generator epoch {w['epoch']}, this cc1d is at {EPOCH} "
                                f"(the runtime ignores it; re-tune)")
                continue
            try:
                v = winner_variant(w)
            except (ValueError, KeyError) as exc:
                problems.append(f"{name}: config does not fit the generator's space: {exc}")
                continue
            if v.key() != w["variant_key"]:
                problems.append(f"{name}: variant key {w['variant_key']} != re-derived {v.key()}")
            if v.source != src:
                problems.append(f"{name}: re-rendering {v.key()} gives a different source than stored")
            geo = v.geometry()
            bad = [k for k in geo if w.get(k) != geo[k]]
            if bad:
                problems.append(f"{name}: stored geometry {bad} differs from the generator's")
            reason = v.why_invalid(arch_info(w["arch"]))
            if reason:
                problems.append(f"{name}: {v.key()} is invalid for {w['arch']}: {reason}")
        return problems


    def rerender(self, compile: Callable[[str, str, list[str]], bytes], ops: Iterable[str] | None = None,
                 builds: Callable[[dict], list[tuple[str, list[str]]]] = lambda w: [("plain", [])],
                 judge: Callable[[dict, str, Variant], tuple[dict | None, str]] | None = None,
                 workers: int = 1, stop: Callable[[], bool] = lambda: False,
                 progress: Callable[[list], Iterable] = lambda items: items) -> tuple[list[str], list[str]]:
        """Store the current templates' render of each winner (of `ops`; default all) whose
        stored source differs from it, where the binaries ``compile(source, arch, options)``
        makes of the two are byte-identical for each build ``builds(winner)`` names ((name,
        compiler options) of every kernel its time was measured with; default the plain
        source alone): the template changed in a way that does not reach those kernels (a
        comment, code behind a macro none of them sets), so its config, times and dates stay
        true; those replacements in one transaction. Where a kernel changed, ``judge(winner,
        stored source, render)`` (tuner/retime.py: the two timed at the winner's shape)
        gives the row to store the render with, or None, and a line on what it measured;
        each such winner is stored as it is judged (a stopped run keeps what it timed), and
        none is judged once ``stop()`` is true. Without a judge a changed kernel is a
        re-tune's business. Compiles run on `workers` threads. Returns (the winners
        re-rendered, those left and why)."""
        ops = None if ops is None else set(ops)
        todo, done, left = [], [], []
        for w in self.winners():
            if ops is not None and w["op"] not in ops:
                continue
            name = f"{w['arch']} {w['family_key']} {w['shape_key']} ({w['variant_key']})"
            stored = self.source(w["source_hash"])
            if w["epoch"] != EPOCH or stored is None:
                left.append(f"{name}: generator epoch {w['epoch']} or no stored source; re-tune it")
                continue
            try:
                render = winner_variant(w)
            except (ValueError, KeyError) as exc:
                left.append(f"{name}: config does not fit the generator's space: {exc}")
                continue
            if render.source != stored:
                todo.append((w, name, stored, render, builds(w)))

        wanted = {(src, w["arch"], tuple(opts)) for w, _, stored, render, bs in todo
                  for _, opts in bs for src in (stored, render.source)}
        with ThreadPoolExecutor(max(1, workers)) as pool:
            binaries = dict(zip(wanted, pool.map(lambda k: bytes(compile(k[0], k[1], list(k[2]))), wanted)))

        same, changed = [], []
        for w, name, stored, render, bs in todo:
            differ = [b for b, opts in bs if binaries[(stored, w["arch"], tuple(opts))] !=
                      binaries[(render.source, w["arch"], tuple(opts))]]
            (changed if differ else same).append((w, name, stored, render, differ))
        with self.transaction():
            for w, name, _, render, _ in same:
                self.put_winner(render.source, **{**w, "source_hash": None})
                done.append(name)
        for w, name, stored, render, differ in progress(changed):
            what = f"its kernel ({', '.join(differ)} build) changed with the templates"
            if judge is None:
                left.append(f"{name}: {what}; re-tune it")
            elif stop():
                left.append(f"{name}: {what}; not timed (stopped: past the deadline)")
            else:
                row, measured = judge(w, stored, render)
                if row is None:
                    left.append(f"{name}: {what}; {measured}: re-tune it")
                else:
                    self.put_winner(render.source, **row)
                    done.append(f"{name}: {measured}")
        return done, left

    def compile_problems(self, compile: Callable[[str, str, list[str]], object],
                         archs: Iterable[str] | None = None, workers: int = 1,
                         builds: Callable[[str, str], list[tuple[str, str, list[str]]]] | None = None
                         ) -> list[str]:
        """Compile each distinct winner source once per arch (``compile(source, arch,
        options)`` raising on failure), for the archs given (default: all stored); a line per
        failure. ``builds(variant_key, source)`` names every kernel the runtime may build
        from a source ((name, source, options); default the plain source alone): each is
        compiled, and a failure names its build."""
        todo: dict[tuple[str, str, str], list[str]] = {}
        for w in self.winners():
            if archs is None or w["arch"] in archs:
                todo.setdefault((w["arch"], w["source_hash"], w["variant_key"]), []).append(
                    f"{w['arch']} {w['family_key']} {w['shape_key']} ({w['variant_key']})")

        sources = {h: self.source(h) for _, h, _ in todo}  # read here: the connection stays in this thread

        def one(item: tuple[tuple[str, str, str], list[str]]) -> list[str]:
            (arch, source_hash, key), names = item
            src = sources[source_hash]
            if src is None:
                return [f"{names[0]}: source {source_hash[:12]} missing"]
            problems = []
            for build, source, options in (builds(key, src) if builds else [("plain", src, [])]):
                try:
                    compile(source, arch, list(options))
                except Exception as exc:  # the compiler's message is the finding
                    first = next((ln for ln in str(exc).splitlines() if "error" in ln.lower()), str(exc)[:300])
                    what = "" if build == "plain" else f"its {build} build "
                    problems.append(f"{', '.join(names)}: {what}does not compile for {arch}: {first.strip()}")
            return problems

        with ThreadPoolExecutor(max(1, workers)) as pool:
            return [p for found in pool.map(one, sorted(todo.items())) for p in found]

    def finalize(self) -> None:
        """Make the file ready to ship: VACUUM it, fold the WAL into it and switch it to
        rollback-journal mode, so it is one self-contained file that read-only readers
        (the runtime, in a read-only site-packages) open with nothing beside it."""
        if self.readonly:
            raise DBError(f"tuning DB {self.path}: opened read-only, cannot finalize it")
        try:
            self.conn.execute("VACUUM")
            mode = self.conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
        except sqlite3.OperationalError as exc:
            mode = f"error: {exc}"
        if mode != "delete":
            raise DBError(f"tuning DB {self.path}: cannot switch it to journal_mode=DELETE ({mode}); "
                          f"is a tuner or another program still using it? Stop it and run again")


def _schema1_split_blocks(op: str) -> int:
    return 2048 if op == "bwd" else 0


def _normalized(row: sqlite3.Row) -> dict:
    """A winner row as a dict with schema 2's columns (a read-only schema-1 DB lacks split_blocks)."""
    d = dict(row)
    d.setdefault("split_blocks", _schema1_split_blocks(d["op"]))
    return d


def _schema_statements() -> list[str]:
    text = "\n".join(line.split("--", 1)[0] for line in SCHEMA_FILE.read_text().splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error; nested uses join the outer one."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.outer = False

    def __enter__(self) -> sqlite3.Connection:
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN IMMEDIATE")
            self.outer = True
        return self.conn

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if not self.outer:
            return
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
