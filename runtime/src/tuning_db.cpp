#include "tuning_db.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "catalog.h"
#include "log.h"
#include "sha256.h"
#include "sqlite_lib.h"

namespace cc1d {
namespace {

constexpr int kBusyTimeoutMs = 5000;  // a tuner may be committing to the user's DB
constexpr const char* kFeatureNames[kFeatureCount] = {"bias", "silu", "seqidx", "init",
                                                      "final", "pool", "wstate"};

// Column order of kWinnersSql.
enum Col { kFamily, kShape, kBatch, kDim, kSeqlen, kFeatures, kVariantKey, kHash, kThreads, kTileL,
           kTileD, kSmem, kAlign, kEpoch, kSource, kSplitBlocks, kNumCols };
constexpr const char* kColNames[] = {"family_key", "shape_key", "batch", "dim", "seqlen", "features",
                                     "variant_key", "source_hash", "threads", "tile_l", "tile_d",
                                     "smem_bytes", "align_bytes", "epoch", "source", "split_blocks"};
static_assert(sizeof(kColNames) / sizeof(kColNames[0]) == kNumCols);
// Schema 1 had no split_blocks: its backward winners were tuned, and ran,
// with the fixed 2048 that schema 2 made a tunable.
std::string winners_sql(int64_t version) {
  return std::string(
             "SELECT w.family_key, w.shape_key, w.batch, w.dim, w.seqlen, w.features, w.variant_key, "
             "w.source_hash, w.threads, w.tile_l, w.tile_d, w.smem_bytes, w.align_bytes, w.epoch, s.source, ") +
         (version >= 2 ? "w.split_blocks" : "CASE WHEN w.op = 'bwd' THEN 2048 ELSE 0 END") +
         " FROM winners AS w LEFT JOIN sources AS s ON s.hash = w.source_hash WHERE w.arch = ?";
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Why a row cannot be used, or "" with `out` filled.
std::string check_row(const sqlite::Stmt& s, std::map<std::string, bool>& hash_ok,
                      std::map<std::string, std::shared_ptr<const KernelVariant>>& variants, TunedEntry& out) {
  for (int c : {kFamily, kShape, kFeatures, kVariantKey, kHash})
    if (s.is_null(c)) return std::string("column ") + kColNames[c] + " is NULL";
  for (int c : {kBatch, kDim, kSeqlen, kThreads, kTileL, kTileD, kSmem, kAlign, kEpoch, kSplitBlocks})
    if (!s.is_integer(c)) return std::string("column ") + kColNames[c] + " is NULL or not an integer";
  const int64_t epoch = s.int64(kEpoch);
  if (epoch != catalog::generator_epoch())
    return "generator epoch " + std::to_string(epoch) + ", this cc1d is at " +
           std::to_string(catalog::generator_epoch()) + " (re-tune)";
  out.family = s.text(kFamily);
  out.shape_key = s.text(kShape);
  out.batch = s.int64(kBatch);
  out.dim = s.int64(kDim);
  out.seqlen = s.int64(kSeqlen);
  if (out.batch < 1 || out.dim < 1 || out.seqlen < 1) return "batch, dim and seqlen must be >= 1";
  if (!parse_features(s.text(kFeatures), &out.features))
    return "unknown feature in '" + s.text(kFeatures) + "' (known: " + features_string(~0u) + ")";
  KernelVariant v;
  v.key = s.text(kVariantKey);
  if (v.key.size() <= out.family.size() || v.key.compare(0, out.family.size(), out.family) != 0 ||
      v.key[out.family.size()] != '.')
    return "variant " + v.key + " is not of family " + out.family;
  const int64_t threads = s.int64(kThreads), tile_l = s.int64(kTileL), tile_d = s.int64(kTileD),
                smem = s.int64(kSmem), align = s.int64(kAlign), split_blocks = s.int64(kSplitBlocks);
  const bool bwd = out.family.compare(0, 4, "bwd.") == 0;
  if (bwd ? split_blocks < 1 || split_blocks > (1 << 24) : split_blocks != 0)
    return "split_blocks " + std::to_string(split_blocks) + " out of range (the backward needs 1.." +
           std::to_string(1 << 24) + ", other ops 0)";
  if (threads < 1 || threads > 4096 || tile_l < 1 || tile_l > (1 << 20) || tile_d < 1 || tile_d > (1 << 20) ||
      smem < 0 || smem > (1 << 24) || !is_pow2(align) || align > 256)
    return "launch geometry out of range (threads, tile_l, tile_d >= 1, smem_bytes >= 0, align_bytes a power of "
           "two <= 256)";
  v.hash = s.text(kHash);
  v.threads = int(threads);
  v.tile_l = int(tile_l);
  v.tile_d = int(tile_d);
  v.smem_bytes = int(smem);
  v.align_bytes = int(align);
  v.split_blocks = int(split_blocks);
  if (auto it = variants.find(v.key); it != variants.end()) {
    const KernelVariant& o = *it->second;
    if (o.hash != v.hash || o.threads != v.threads || o.tile_l != v.tile_l || o.tile_d != v.tile_d ||
        o.smem_bytes != v.smem_bytes || o.align_bytes != v.align_bytes ||
        o.split_blocks != v.split_blocks)
      return "variant " + v.key + " is stored twice with different hashes or geometry";
    out.variant = it->second;
    return "";
  }
  if (s.is_null(kSource)) return "its source (hash " + v.hash.substr(0, 12) + ") is missing from the sources table";
  v.source = s.text(kSource);
  auto ok = hash_ok.find(v.hash);
  if (ok == hash_ok.end()) ok = hash_ok.emplace(v.hash, sha256_hex(v.source) == v.hash).first;
  if (!ok->second) return "source does not match its hash " + v.hash.substr(0, 12);
  std::string key = v.key;
  out.variant = variants.emplace(std::move(key), std::make_shared<const KernelVariant>(std::move(v))).first->second;
  return "";
}

using Warnings = std::vector<std::pair<std::string, std::string>>;  // (warn_once key, message)

std::shared_ptr<const TunedSet> load(const std::string& path, const std::string& arch, bool warn_if_missing,
                                     Warnings& warnings) {
  auto warn_once = [&](std::string key, std::string message) {
    warnings.emplace_back(std::move(key), std::move(message));
  };
  auto set = std::make_shared<TunedSet>();
  set->path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (warn_if_missing)
      warn_once("tuning-db-missing:" + path,
                "tuning DB " + path + " cannot be read (" + std::strerror(errno) + "); not used");
    return set;
  }
  const std::string ctx = "tuning DB " + path;
  try {
    auto read_version = [](sqlite::Db& db) {
      sqlite::Stmt s = db.prepare("SELECT value FROM meta WHERE key = 'schema_version'");
      return s.step() ? std::strtoll(s.text(0).c_str(), nullptr, 10) : int64_t(-1);
    };
    std::unique_ptr<sqlite::Db> dbp = std::make_unique<sqlite::Db>(path, kBusyTimeoutMs);
    int64_t version = -1;
    try {
      version = read_version(*dbp);
    } catch (const Error&) {
      // A WAL-mode DB in a folder we cannot write (no -shm can be made) fails
      // here; with no -wal file beside it, the main file alone is the whole DB.
      // Only then: a DB that is busy (a writer holds a rollback-journal lock) must
      // not be read as immutable, which would ignore the lock and could see a
      // half-written transaction; it waits its busy timeout and is skipped instead.
      struct stat wal {};
      if (::stat((path + "-wal").c_str(), &wal) == 0) throw;
      const std::size_t slash = path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
      if (::access(dir.c_str(), W_OK) == 0) throw;
      dbp = std::make_unique<sqlite::Db>(path, kBusyTimeoutMs, /*immutable=*/true);
      version = read_version(*dbp);
    }
    sqlite::Db& db = *dbp;
    if (version < 1) {
      warn_once("tuning-db-schema:" + path, ctx + " has no schema_version in its meta table; not used");
      return set;
    }
    if (version > kSchemaVersion) {
      warn_once("tuning-db-schema:" + path, ctx + " has schema version " + std::to_string(version) +
                                                ", newer than this cc1d's " + std::to_string(kSchemaVersion) +
                                                "; not used (upgrade cc1d)");
      return set;
    }
    sqlite::Stmt s = db.prepare(winners_sql(version).c_str());
    s.bind_text(1, arch);
    std::map<std::string, bool> hash_ok;
    std::map<std::string, std::shared_ptr<const KernelVariant>> variants;
    std::vector<TunedEntry> entries;
    while (s.step()) {
      TunedEntry e;
      const std::string why = check_row(s, hash_ok, variants, e);
      if (why.empty()) {
        entries.push_back(std::move(e));
        continue;
      }
      const std::string name = arch + " " + s.text(kFamily) + " " + s.text(kShape);
      warn_once("tuning-db-entry:" + path + ":" + name + ":" + why,
                ctx + ": entry " + name + " (" + s.text(kVariantKey) + ") skipped: " + why);
    }
    std::sort(entries.begin(), entries.end(), [](const TunedEntry& a, const TunedEntry& b) {
      return std::tie(a.family, a.features, a.batch, a.dim, a.seqlen) <
             std::tie(b.family, b.features, b.batch, b.dim, b.seqlen);
    });
    set->entries = std::move(entries);
  } catch (const std::exception& e) {
    // Not SQLite, corrupt, unreadable, or lacking our tables/columns: the whole file is out.
    warn_once("tuning-db-unreadable:" + path, ctx + " cannot be read (" + e.what() + "); not used");
    set->entries.clear();
  }
  return set;
}

struct Sets {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<const TunedSet>> loaded;
};

Sets& sets() {
  static Sets s;
  return s;
}

}  // namespace

bool parse_features(const std::string& text, unsigned* mask) {
  unsigned m = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(pos, end - pos);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) {
      unsigned bit = 0;
      for (unsigned i = 0; i < kFeatureCount; ++i)
        if (name == kFeatureNames[i]) bit = 1u << i;
      if (!bit) return false;
      m |= bit;
    }
    pos = end + 1;
  }
  *mask = m;
  return true;
}

std::string features_string(unsigned mask, char sep) {
  std::string s;
  for (unsigned i = 0; i < kFeatureCount; ++i)
    if (mask & (1u << i)) {
      if (!s.empty()) s += sep;
      s += kFeatureNames[i];
    }
  return s;
}

std::shared_ptr<const TunedSet> tuned_set(const std::string& path, const std::string& arch, bool warn_if_missing) {
  Sets& s = sets();
  // Held while loading: loads are rare (once per file and arch), and a second
  // thread asking for the same file must not read it again.
  Warnings warnings;
  std::shared_ptr<const TunedSet> set;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto& slot = s.loaded[{path, arch}];
    if (!slot) slot = load(path, arch, warn_if_missing, warnings);
    set = slot;
  }
  // Outside the lock: a handler may call back into Python (and take its GIL).
  for (auto& [key, message] : warnings) warn_once(key, message);
  return set;
}

void clear_tuned_sets() {
  std::map<std::pair<std::string, std::string>, std::shared_ptr<const TunedSet>> old;
  std::lock_guard<std::mutex> lock(sets().mu);
  old.swap(sets().loaded);
}

}  // namespace cc1d
