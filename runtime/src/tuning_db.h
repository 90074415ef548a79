// Reader of the tuner's SQLite tuning DB (schema: tuning_db/schema.sql). The
// winners of one arch in one file are loaded into memory once, checked entry by
// entry (generator epoch, sha256 of the source, geometry), and kept; a file or
// an entry that fails a check is skipped with one warning. Never writes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc1d/cc1d.h"

namespace cc1d {

constexpr int kSchemaVersion = 2;  // tuner/db.py SCHEMA_VERSION

// The `features` column: comma-separated names, as tuner/shapes.py Shape.features() writes them.
// kPool: the decode update reads its states through conv_state_indices (a state pool).
// kWidthState: the decode update's conv_state keeps width entries (state_len = width, HF
// transformers' Mamba caches), not width-1 (vLLM's).
enum Feature : unsigned { kBias = 1, kSilu = 2, kSeqIdx = 4, kInit = 8, kFinal = 16, kPool = 32, kWidthState = 64 };
constexpr unsigned kFeatureCount = 7;
// false if a name is unknown (the entry is then skipped: it was tuned for something we cannot match).
bool parse_features(const std::string& text, unsigned* mask);
std::string features_string(unsigned mask, char sep = ',');

struct TunedEntry {
  std::string family;     // fwd.cf.bf16wf32.w4
  std::string shape_key;  // b8.d2048.l512.bias.silu (for messages only; matching uses the numbers)
  int64_t batch = 0, dim = 0, seqlen = 0;
  unsigned features = 0;
  std::shared_ptr<const KernelVariant> variant;
};

// The checked winners of one arch from one file, ordered by (family, features, batch, dim, seqlen).
struct TunedSet {
  std::string path;
  std::vector<TunedEntry> entries;
};

// Loaded once per (path, arch) and then served from memory. A missing file
// gives an empty set, with a warning only if `warn_if_missing` (DBs the caller
// named; the user's and the shipped DB are optional).
std::shared_ptr<const TunedSet> tuned_set(const std::string& path, const std::string& arch, bool warn_if_missing);

// Forgets every loaded set (the next lookup reads the files again).
void clear_tuned_sets();

}  // namespace cc1d
