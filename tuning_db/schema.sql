-- cc1d tuning DB, schema version 2 (2 added winners.split_blocks).
-- The DB is code: it holds the kernel sources the runtime compiles, addressed
-- by the sha256 of their text. The runtime reads `meta`, `winners` and `sources`;
-- `trials` is the tuner's record of every candidate it tried (and what --resume reads).

CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,          -- schema_version, generator_epoch
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS sources (
    hash   TEXT PRIMARY KEY,         -- sha256 hex of source (utf-8)
    source TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS trials (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,       -- one tuner process (or worker)
    arch        TEXT NOT NULL,       -- sm_90, gfx942, ...
    family_key  TEXT NOT NULL,       -- fwd.cf.bf16wf32.w4
    shape_key   TEXT NOT NULL,       -- b8.d2048.l512.bias.silu
    variant_key TEXT NOT NULL,       -- fwd.cf.bf16wf32.w4.t128.v16.n2.r1.hshfl
    config      TEXT NOT NULL,       -- JSON object of the tunables
    status      TEXT NOT NULL,       -- ok | slow | invalid | compile_error | launch_error | wrong_result | error
    time_us     REAL,                -- median kernel time (ok, slow)
    spread      REAL,                -- relative noise: (p80 - p20) / median of the samples
    error       TEXT,                -- reason for any status but ok
    epoch       INTEGER NOT NULL,    -- generator epoch of the variant
    created_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_problem ON trials (arch, family_key, shape_key);

CREATE TABLE IF NOT EXISTS winners (
    arch         TEXT NOT NULL,
    family_key   TEXT NOT NULL,
    shape_key    TEXT NOT NULL,
    op           TEXT NOT NULL,      -- the shape's fields, so readers can pick the nearest shape
    batch        INTEGER NOT NULL,
    dim          INTEGER NOT NULL,
    seqlen       INTEGER NOT NULL,
    features     TEXT NOT NULL,      -- comma-separated: bias, silu, seqidx, init, final
    variant_key  TEXT NOT NULL,
    config       TEXT NOT NULL,      -- JSON object of the tunables
    source_hash  TEXT NOT NULL REFERENCES sources (hash),
    threads      INTEGER NOT NULL,   -- launch geometry (Variant.geometry()), so the C++ runtime
    tile_l       INTEGER NOT NULL,   -- needs no Python to launch the winner
    tile_d       INTEGER NOT NULL,
    smem_bytes   INTEGER NOT NULL,
    align_bytes  INTEGER NOT NULL,   -- the call's pointers/strides must meet it, else fall back
    split_blocks INTEGER NOT NULL DEFAULT 0,  -- bwd: blocks aimed at (the partial-sum rows); 0 for fwd
    epoch        INTEGER NOT NULL,
    time_us      REAL NOT NULL,
    default_us   REAL,               -- the default variant, re-timed beside the winner
    copy_fraction REAL,              -- bytes moved / time, as a fraction of a device copy's bandwidth
    spread       REAL,               -- relative noise of the winner's timing
    speedup      REAL,               -- default_us / time_us
    environment  TEXT NOT NULL,      -- JSON: device, sm_count, driver, runtime, compiler, cc1d version
    created_at   TEXT NOT NULL,
    PRIMARY KEY (arch, family_key, shape_key)
);
