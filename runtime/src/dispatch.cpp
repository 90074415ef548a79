// The dispatcher (dispatch.h): decide which variant serves a call (tuning DBs
// along the lookup chain, else the default catalog), memoised per (op, arch,
// family, shape, features, alignment class); compile (once) and load (once
// per context) a variant's kernels. The entry points are in forward.cpp and
// backward.cpp.
#include "dispatch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "catalog.h"
#include "compile_cache.h"
#include "env.h"
#include "log.h"
#include "sha256.h"
#include "tuning_db.h"

namespace cc1d {
namespace {

// ---- ops: family prefix (generator/space.py OPS) and the tensors alignment is about ----

const char* op_name(Op op) {
  switch (op) {
    case Op::bwd: return "bwd";
    case Op::vfwd: return "vfwd";
    case Op::upd: return "upd";
    default: return "fwd";
  }
}

const char* op_tensors(Op op) {
  return op == Op::bwd ? "x/dout/dx" : op == Op::upd ? "x/out/conv_state" : "x/out";
}

// The rows a channel-first realigned build walks with vectors, which must lie alike.
const char* op_rows(Op op) { return op == Op::bwd ? "x's, dout's and dx's" : "x's and out's"; }

// ---- the default catalog --------------------------------------------------

const std::vector<KernelVariant>& catalog_variants() {
  static const std::vector<KernelVariant> all = [] {
    std::vector<KernelVariant> v;
    const catalog::Entry* e = catalog::entries();
    for (std::size_t i = 0; i < catalog::num_entries(); ++i)
      v.push_back({e[i].key, e[i].hash, e[i].source, e[i].threads, e[i].tile_l, e[i].tile_d,
                   e[i].smem_bytes, e[i].align_bytes, e[i].split_blocks});
    return v;
  }();
  return all;
}

// The family's first catalog variant whose alignment the call meets (the
// chain ends with a variant needing only the element size, so one always fits).
const KernelVariant& catalog_choice(const char* family, int align, const char* tensors) {
  const catalog::Entry* e = catalog::entries();
  bool family_seen = false;
  for (std::size_t i = 0; i < catalog::num_entries(); ++i) {
    if (std::strcmp(e[i].family, family) != 0) continue;
    family_seen = true;
    if (e[i].align_bytes > 0 && align % e[i].align_bytes == 0) return catalog_variants()[i];
  }
  if (!family_seen)
    throw InvalidArgument(std::string("no kernel in the catalog for ") + family +
                          " (layout, dtypes and width of this call)");
  throw InvalidArgument(std::string("no kernel of ") + family + " accepts " + tensors + " aligned to only " +
                        std::to_string(align) + " bytes (base addresses and batch/outer strides)");
}

// ---- arch names as small ids (the memo key holds an id, not a string) -----

class Archs {
 public:
  int intern(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return int(i);
    names_.push_back(name);
    return int(names_.size() - 1);
  }
  std::string name(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    return names_[std::size_t(id)];
  }

 private:
  std::mutex mu_;
  std::deque<std::string> names_{""};  // id 0: unknown
};

Archs& archs() {
  static Archs a;
  return a;
}

int log2_of(int pow2) {
  int l = 0;
  while ((1 << l) < pow2) ++l;
  return l;
}

std::string shape_key(int64_t b, int64_t d, int64_t l, unsigned features) {
  std::string s = "b" + std::to_string(b) + ".d" + std::to_string(d) + ".l" + std::to_string(l);
  if (features) s += "." + features_string(features, '.');
  return s;
}

// Larger than any shape distance (|ln| of 64-bit sizes stays below 90).
constexpr double kFeatureMismatchRank = 1000.0;

// The documented distance between shapes of one family (log space: a kernel's
// best tiling depends on the scale of the work, not on its absolute size).
// Forward, varlen and decode calls: batch and seqlen multiply (both only scale the grid).
// Backward calls: batch, seqlen and dim apart, weighted 1 / 2 / 0.5, since a backward
// kernel's fit to its sequence (segments, tiles, the split of its reduction) does not
// carry over to a batch of the same work (session 68, H200: against the product rule,
// 39 of 60 moved backward calls over 3 % faster, 10 slower, 1.15x geometric mean;
// moved forward calls 0.97x, so the forward keeps the product; docs/DISPATCH.md).
double shape_distance(const Call& p, const TunedEntry& e) {
  auto apart = [](double a, double b) { return std::fabs(std::log(a) - std::log(b)); };
  if (p.op == Op::bwd)
    return apart(double(p.batch), double(e.batch)) + 2.0 * apart(double(p.seqlen), double(e.seqlen)) +
           0.5 * apart(double(p.dim), double(e.dim));
  return apart(double(p.batch) * double(p.seqlen), double(e.batch) * double(e.seqlen)) +
         apart(double(p.dim), double(e.dim));
}

// A channel-first kernel's fast path takes whole segments: a row's threads (threads /
// tile_d) split into segments of one warp (the row where it is shorter), each over a fixed
// run of positions. A call whose sequence is shorter than one runs no row's segment whole,
// up to 2.5x slower a position (session 59, H200: forward (2, 4096, 1000) on the (1, 4096,
// 2048) winner, 1024-position segments, took 22.6 us, the peer 9.9; session 62, backward
// (2, 4096, 1000) on held 1024-position segments 90.2 us, against 28.8 on walked 2048-position
// ones and 39.3 on held 512). Walked backward segments take it well in their plain build,
// not through their realigned twin ((2, 4096, 1001): 49.2 us against 39.6 on held 512).
// A backward block also runs its tile's segments side by side, so a tile of several
// segments more than twice the sequence leaves most of its warps idle (session 62: (8,
// 5120, 4096) on the (1, 5376, 32768) winner's 16384-position tiles, 430.9 us; on the (8,
// 5120, 2048) winner's 2048, 286.4; the peer 278.4). Such entries rank behind every entry
// that fits the call.
constexpr double kMisfitRank = 500.0;  // above any shape distance, below a feature mismatch

int64_t cf_segment_positions(const KernelVariant& v, const std::string& arch) {
  const int rows = v.tile_d > 0 ? v.tile_d : 1;
  const int per_row = v.threads / rows > 0 ? v.threads / rows : 1;
  const int warp = arch.rfind("gfx9", 0) == 0 ? 64 : 32;  // CDNA wavefronts are 64 lanes
  return int64_t(v.tile_l) * std::min(per_row, warp) / per_row;
}

// Whether v's channel-first backward segments are walked (a row's lanes step through its
// segment together), from the marker its template states (bwd_channel_first.cu.j2).
bool walked_segments(const KernelVariant& v) {
  return v.source.find("#define CC1D_BWD_WALKED 1") != std::string::npos;
}

// Why v's tiling fits the call poorly, for explain's detail; empty where it fits. Channel-last
// forward and backward tiles are misfits too where one is more than twice the sequence.
std::string tiling_misfit(const Call& p, const std::string& arch, const KernelVariant& v) {
  if (p.op != Op::fwd && p.op != Op::bwd) return {};
  if (p.layout == Layout::channel_last) {
    // Session 73 (H200, benchmarks/bench_rule.py --rule cl-tile-misfit): the 11 forward grid
    // calls of length 128 that 512-position tiles served ran 1.8-3.8x faster on the nearest
    // entry whose tile fits (fp16 (8, 5120, 128): 31.2 us, then 11.7).
    if (int64_t(v.tile_l) > 2 * p.seqlen)
      return "its tiles (" + std::to_string(v.tile_l) + " positions a block) are more than twice this call's "
             "sequence, so most of each block idles";
    return {};
  }
  const int64_t seg = cf_segment_positions(v, arch);
  if (seg <= 0) return {};
  // Walked backward segments on aligned rows (the plain build, or the walk-cut build where
  // it serves) take a shorter sequence well; their source marker is looked up only then, not
  // for every ranked entry.
  if (p.seqlen < seg && !(p.op == Op::bwd && p.align % v.align_bytes == 0 && walked_segments(v)))
    return "its kernel's segments (" + std::to_string(seg) + " positions) are longer than this call's sequence, "
           "so no row runs a whole segment on the fast path";
  const int64_t segments = int64_t(v.tile_l) / seg;  // side by side in a block, per row
  if (p.op == Op::bwd && segments > 1 && 2 * p.seqlen < int64_t(v.tile_l))
    return "its tiles (" + std::to_string(v.tile_l) + " positions, " + std::to_string(segments) +
           " segments side by side) are more than twice this call's sequence, so most of each block's warps idle";
  return {};
}

// ---- realigned twins (dispatch.h) --------------------------------------------

// How v's realigned build is made, by its op; null for one that has none (varlen's
// sources include the forward's tiles, but keep their own tiling).
struct RealignBuild {
  const char* family_prefix;  // the variants that have it
  const char* define;         // what leads the twin's source (dispatch.h)
  const char* macro;          // its name, which a source that knows the build holds
};
constexpr RealignBuild kRealignBuilds[] = {{"fwd.cf.", kRealignDefine, "CC1D_FWD_REALIGN"},
                                           {"bwd.cf.", kBwdRealignDefine, "CC1D_BWD_REALIGN"}};

const RealignBuild* realign_build(const KernelVariant& v) {
  for (const RealignBuild& b : kRealignBuilds)
    if (v.key.rfind(b.family_prefix, 0) == 0) return &b;
  return nullptr;
}

// Whether v has a realigned twin: a plain channel-first forward or backward whose source
// comes from templates that know the build.
bool twinnable(const KernelVariant& v) {
  const RealignBuild* build = realign_build(v);
  return build && !is_realigned(v) && v.source.find(build->macro) != std::string::npos;
}

// Whether a channel-first forward's or backward's rows lie alike against v's vectors, so
// that v's realigned twin, if it has one, could serve the call.
bool rows_fit(const Call& p, const KernelVariant& v) {
  return (p.op == Op::fwd || p.op == Op::bwd) && p.layout == Layout::channel_first && p.row_align > 0 &&
         p.row_align % v.align_bytes == 0;
}

// Whether the call can run v: its alignment class meets v's, or v's realigned twin serves it.
bool call_runs(const Call& p, const KernelVariant& v) {
  return p.align % v.align_bytes == 0 || (rows_fit(p, v) && twinnable(v));
}

// One derived build per variant (its realigned twin, its walk-cut build), made once from the
// variant by `make` and kept by the variant's hash; null where the variant has none.
class DerivedBuilds {
 public:
  using Make = std::shared_ptr<const KernelVariant> (*)(const KernelVariant&);
  explicit DerivedBuilds(Make make) : make_(make) {}
  std::shared_ptr<const KernelVariant> of(const std::shared_ptr<const KernelVariant>& v) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = builds_.find(v->hash);
    if (it != builds_.end()) return it->second;
    std::shared_ptr<const KernelVariant> build = make_(*v);
    // Bounded like the memo: DBs hold a few hundred winners.
    if (builds_.size() >= 4096) builds_.clear();
    builds_.emplace(v->hash, build);
    return build;
  }

 private:
  Make make_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const KernelVariant>> builds_;  // null: none
};

// v built with `define` leading its source, key + suffix.
std::shared_ptr<const KernelVariant> build_with(const KernelVariant& v, const char* define, const char* suffix) {
  auto b = std::make_shared<KernelVariant>(v);
  b->key += suffix;
  b->source = define + v.source;
  b->hash = sha256_hex(b->source);
  return b;
}

std::shared_ptr<const KernelVariant> make_twin(const KernelVariant& v) {
  return twinnable(v) ? build_with(v, realign_build(v)->define, ".realign") : nullptr;
}

DerivedBuilds& twins() {
  static DerivedBuilds t(make_twin);
  return t;
}

// ---- builds for a segment the sequence cuts -----------------------------------

// Whether a build that takes a segment the sequence cuts (a held variant's realigned twin,
// cut_twin; a walked one's walk-cut build, walk_cut) may serve the call: a channel-first
// backward without seq_idx or the final states' gradient (with which neither moves the
// segment), on NVIDIA GPUs, where both were measured.
bool cut_segment_call(const Call& p, const std::string& arch) {
  return p.op == Op::bwd && p.layout == Layout::channel_first && arch.rfind("gfx", 0) != 0 &&
         !(p.features & (kSeqIdx | kFinal));
}

// ---- walk-cut builds (dispatch.h) ---------------------------------------------

// Whether v has a walk-cut build: a plain channel-first backward variant whose segments are
// walked, from templates that know the build.
bool walk_cuttable(const KernelVariant& v) {
  return v.key.rfind("bwd.cf.", 0) == 0 && !is_realigned(v) && !is_walk_cut(v) && walked_segments(v) &&
         v.source.find("CC1D_BWD_WALK_CUT") != std::string::npos;
}

std::shared_ptr<const KernelVariant> make_walk_cut(const KernelVariant& v) {
  return walk_cuttable(v) ? build_with(v, kBwdWalkCutDefine, ".walkcut") : nullptr;
}

DerivedBuilds& walk_cut_builds() {
  static DerivedBuilds b(make_walk_cut);
  return b;
}

// Whether an aligned channel-first backward call whose sequence's end cuts one of v's walked
// segments runs v's walk-cut build, whose walk takes the cut segment whole (lanes past the end
// load zeros and store nothing) where the plain build sends its top vector to the edge path,
// one vector at a time. Session 75, H200, fp16 `t128.v16.n16.r4.g96.s2048` at (8, 5120, 3000)
// / (8, 5120, 1000): 230.3 / 87.2 us walk-cut, 260.7 / 143.9 plain (medians of three rounds);
// a whole-segment length, (8, 5120, 4096), ran alike. The kernel walks it so only where the length is a whole number of
// vectors, without seq_idx or dfinal_states (bwd_channel_first.cu.j2); measured on NVIDIA
// GPUs only.
bool walk_cut(const Call& p, const std::string& arch, const KernelVariant& v) {
  if (!cut_segment_call(p, arch) || p.align % v.align_bytes != 0) return false;
  const int64_t seg = cf_segment_positions(v, arch);
  return seg > 0 && p.seqlen % seg != 0 && walk_cuttable(v);  // the source's markers last
}

// Whether an aligned channel-first backward call whose sequence cuts one of v's segments
// runs v's realigned twin: it moves the cut segment back onto the fast path, where v sends
// it to the edge path. Its source says where that pays (CC1D_BWD_CUT_TWIN, generator/render.py
// bwd_twin_takes_cuts: session 62, H200, (8, 5120, 2000) 168.5 us through the twin, 480.3
// plain). The twin moves nothing with seq_idx or dfinal_states, or for a sequence of one
// segment or less; measured on NVIDIA GPUs only.
bool cut_twin(const Call& p, const std::string& arch, const KernelVariant& v) {
  if (!cut_segment_call(p, arch) || !rows_fit(p, v) ||
      v.source.find("#define CC1D_BWD_CUT_TWIN 1") == std::string::npos)
    return false;
  const int64_t seg = cf_segment_positions(v, arch);
  return seg > 0 && p.seqlen > seg && p.seqlen % seg != 0;
}

// The variant that serves the call for an entry `v` it can run (call_runs): v, or its
// realigned twin where only the rows' alignment meets v's or the twin takes v's cut segment.
std::shared_ptr<const KernelVariant> serving(const Call& p, const std::string& arch,
                                             const std::shared_ptr<const KernelVariant>& v) {
  if (p.align % v->align_bytes != 0) return realigned_twin(v);
  if (cut_twin(p, arch, *v))
    if (auto twin = realigned_twin(v)) return twin;
  if (walk_cut(p, arch, *v))
    if (auto build = walk_cut_build(v)) return build;
  return v;
}

// A nearest shape further than a factor of 2 (forward: its work and dim ratios to the
// call's multiply to more than 2; backward, seqlen counted twice: further than a seqlen
// ratio of 2 alone) may have been tuned for a grid that fits the call poorly: session 42
// measured its kernels 1.1-3x slower at a quarter of the tuned sequence length than
// the call's own winners. explain's detail says so.
double far_distance(const Call& p) { return (p.op == Op::bwd ? 2.0 : 1.0) * std::log(2.0) + 1e-9; }

// ---- counters (dispatch_stats): what a warmed-up call must not do again ------

std::atomic<uint64_t> g_decisions{0};  // decisions computed (memo misses)
std::atomic<uint64_t> g_loads{0};      // kernels loaded into a context (compile-cache lookups)

// ---- decisions --------------------------------------------------------------

struct Key {
  int64_t batch, dim, seqlen;
  int32_t arch;
  uint8_t op, layout, x_dtype, w_dtype, width, features, align_log2, row_align_log2;
  bool operator==(const Key& o) const {
    return batch == o.batch && dim == o.dim && seqlen == o.seqlen && arch == o.arch && op == o.op &&
           layout == o.layout && x_dtype == o.x_dtype && w_dtype == o.w_dtype && width == o.width &&
           features == o.features && align_log2 == o.align_log2 && row_align_log2 == o.row_align_log2;
  }
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(uint64_t(k.batch));
    mix(uint64_t(k.dim));
    mix(uint64_t(k.seqlen));
    mix(uint64_t(k.arch) << 48 | uint64_t(k.op) << 44 | uint64_t(k.layout) << 40 | uint64_t(k.x_dtype) << 32 |
        uint64_t(k.w_dtype) << 24 | uint64_t(k.width) << 16 | uint64_t(k.features) << 8 | k.align_log2);
    mix(k.row_align_log2);
    return std::size_t(h);
  }
};

// Settings that decide which DBs are read; copied out of the lock per decision.
struct Chain {
  std::vector<std::string> caller_dbs;
  std::string package_dir;
  // "<arch>:<source hash>" of tuned winners whose source did not compile for that arch.
  std::shared_ptr<const std::set<std::string>> broken;
};

std::shared_ptr<Decision> pick(const Call& p, const std::string& arch, const Chain& chain) {
  char family[kFamilyBufSize];
  family_of(p, family);
  const unsigned features = p.features;
  const int align = p.align;
  auto d = std::make_shared<Decision>();
  d->arch = arch;
  d->alignment = align;
  d->call_shape = shape_key(p.batch, p.dim, p.seqlen, features);

  // The chain, each file once, in order. Files the caller named must exist.
  std::vector<std::pair<std::string, bool>> files;
  auto add = [&files](const std::string& path, bool must_exist) {
    if (path.empty()) return;
    for (const auto& f : files)
      if (f.first == path) return;
    files.emplace_back(path, must_exist);
  };
  if (!arch.empty()) {
    for (const auto& f : chain.caller_dbs) add(f, true);
    for (const auto& f : env().tuning_dbs) add(f, true);
    add(env().user_tuning_db(), false);
    const std::string pkg = chain.package_dir.empty() ? env().package_dir : chain.package_dir;
    if (!pkg.empty()) add(pkg + "/tuning_db/" + arch + ".db", false);
  }
  std::vector<std::shared_ptr<const TunedSet>> sets;
  for (const auto& [path, must_exist] : files) sets.push_back(tuned_set(path, arch, must_exist));

  std::string skipped;
  std::set<const KernelVariant*> noted;
  auto broken = [&](const TunedSet& set, const TunedEntry& e) {
    if (!chain.broken || !chain.broken->count(arch + ":" + e.variant->hash)) return false;
    if (noted.insert(e.variant.get()).second)
      skipped += "; " + e.variant->key + " in " + set.path + " skipped: its source does not compile for " + arch;
    return true;
  };
  // Exact winners, along the chain.
  for (const auto& set : sets)
    for (const TunedEntry& e : set->entries) {
      if (e.family != family || e.features != features || e.batch != p.batch || e.dim != p.dim ||
          e.seqlen != p.seqlen || broken(*set, e))
        continue;
      if (!call_runs(p, *e.variant)) {
        skipped += "; the exact winner in " + set->path + " (" + e.variant->key + ") needs " +
                  std::to_string(e.variant->align_bytes) + "-byte alignment, the call gives " + std::to_string(align);
        if (rows_fit(p, *e.variant))
          skipped += " (its rows would serve its realigned twin, but its stored source predates that build: "
                     "cc1d-tune db rerender)";
        continue;
      }
      d->variant = serving(p, arch, e.variant);
      d->reason = "exact";
      d->source = set->path;
      d->matched_shape = e.shape_key;
      d->distance = 0;
      d->detail = "tuned for this shape" + skipped;
      return d;
    }
  // Nearest tuned shape whose requirement the call meets; ties go to the earlier DB.
  // Features are runtime flags of one kernel, so a winner tuned with other
  // features is a valid kernel too: it is used only when no entry with the
  // call's own features qualifies (each differing feature outweighs any shape distance).
  const TunedEntry* best = nullptr;
  const TunedSet* best_set = nullptr;
  double best_rank = 0, best_distance = 0;
  std::string best_misfit;
  for (const auto& set : sets)
    for (const TunedEntry& e : set->entries) {
      if (e.family != family || !call_runs(p, *e.variant) || broken(*set, e)) continue;
      const double dist = shape_distance(p, e);
      std::string misfit = tiling_misfit(p, arch, *e.variant);
      const double rank = dist + kFeatureMismatchRank * __builtin_popcount(e.features ^ features) +
                          (misfit.empty() ? 0.0 : kMisfitRank);
      if (!best || rank < best_rank) {
        best = &e;
        best_set = set.get();
        best_rank = rank;
        best_distance = dist;
        best_misfit = std::move(misfit);
      }
    }
  if (best) {
    d->variant = serving(p, arch, best->variant);
    d->reason = "nearest";
    d->source = best_set->path;
    d->matched_shape = best->shape_key;
    d->distance = best_distance;
    d->detail = "nearest tuned shape of " + std::string(family);
    if (best->features != features)
      d->detail += " (tuned with features [" + features_string(best->features) + "]; none tuned with [" +
                   features_string(features) + "])";
    if (!best_misfit.empty())
      d->detail += "; " + best_misfit + ", and no tuned entry's kernel fits the call: cc1d-tune this shape";
    if (best_distance > far_distance(p)) {
      char dist[32];
      std::snprintf(dist, sizeof dist, "%.2f", best_distance);
      d->detail += "; it is far from this call (distance " + std::string(dist) +
                   (p.op == Op::bwd ? ", further than a seqlen factor of 2 alone" : ", more than a factor of 2 apart") +
                   "), so its kernel may fit the call poorly: cc1d-tune this shape for one made for it";
    }
    d->detail += skipped;
    return d;
  }
  d->variant = serving(p, arch, std::shared_ptr<const KernelVariant>(std::shared_ptr<void>(),
                                                                      &catalog_choice(family, align, op_tensors(p.op))));
  if (p.row_align > align) {  // the catalog's first choice for aligned rows, through its twin
    auto v = std::shared_ptr<const KernelVariant>(std::shared_ptr<void>(),
                                                  &catalog_choice(family, p.row_align, op_tensors(p.op)));
    if (call_runs(p, *v)) d->variant = serving(p, arch, v);
  }
  d->reason = "default";
  d->source = "catalog";
  if (arch.empty())
    d->detail = "arch unknown (no device owns x and none was given): tuning DBs not consulted";
  else if (files.empty())
    d->detail = "no tuning DB in the lookup chain";
  else {
    std::string where;
    for (const auto& f : files) where += (where.empty() ? "" : ", ") + f.first;
    d->detail = "no usable tuned shape of " + std::string(family) + " with features [" +
                features_string(features) + "] for " + arch + " in " + where + skipped;
  }
  return d;
}

std::shared_ptr<const Decision> compute(const Call& p, const std::string& arch, const Chain& chain) {
  std::shared_ptr<Decision> d = pick(p, arch, chain);
  const KernelVariant& v = *d->variant;
  if (is_walk_cut(v))
    d->detail += "; walk-cut build: its walk takes the segment this call's sequence cuts (" +
                 std::to_string(cf_segment_positions(v, arch)) +
                 " positions) whole, where its plain build sends the top vector to the edge path";
  if (!is_realigned(v)) return d;
  if (p.align % v.align_bytes == 0)  // served for its cut segment (cut_twin)
    d->detail += "; realigned build: it moves the segment this call's sequence cuts (" +
                 std::to_string(cf_segment_positions(v, arch)) +
                 " positions) back onto its fast path, which its plain build runs on the edge path";
  else
    d->detail += std::string("; realigned build: ") + op_rows(p.op) + " rows start off its " +
                 std::to_string(v.align_bytes) + "-byte vectors (alike), the call's alignment is " +
                 std::to_string(p.align) + " bytes";
  return d;
}

class Dispatcher {
 public:
  std::shared_ptr<const Decision> decide(const Call& c, int arch_id) {
    const Key key{c.batch,           c.dim,           c.seqlen,           int32_t(arch_id),
                  uint8_t(c.op),     uint8_t(c.layout), uint8_t(c.x_dtype), uint8_t(c.w_dtype),
                  uint8_t(c.width),  uint8_t(c.features), uint8_t(log2_of(c.align)),
                  uint8_t(log2_of(c.row_align))};
    Chain chain;
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = memo_.find(key);
      if (it != memo_.end()) return it->second;  // the fast path: one lookup, no allocation
      chain = chain_;
      generation = generation_;
    }
    // Outside the lock: a first decision may read DB files.
    std::shared_ptr<const Decision> d = compute(c, archs().name(arch_id), chain);
    g_decisions.fetch_add(1, std::memory_order_relaxed);
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (generation == generation_) {
        // Bounded: shapes seen by a long-lived server (every prompt length) would grow it forever.
        if (memo_.size() >= kMaxMemo) memo_.clear();
        auto [it, inserted] = memo_.emplace(key, d);
        fresh = inserted;
        d = it->second;
      }
    }
    if (fresh && env().log_dispatch) warn(describe(*d, c));
    return d;
  }

  void set_caller_dbs(const std::vector<std::string>& paths) {
    std::lock_guard<std::mutex> lock(mu_);
    chain_.caller_dbs = paths;
    forget_locked();
  }
  void set_package_dir(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    chain_.package_dir = dir;
    forget_locked();
  }
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // Keeps the broken winners: their sources will not compile any better.
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    forget_locked();
  }

  // d's tuned winner did not compile (`error`): never chosen again, the
  // decisions that used it forgotten, one warning. Another thread may have
  // dropped it already.
  void drop_broken(const Decision& d, const std::string& error) {
    const std::string key = d.arch + ":" + d.variant->hash;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (chain_.broken && chain_.broken->count(key)) return;
      auto broken = std::make_shared<std::set<std::string>>();
      if (chain_.broken) *broken = *chain_.broken;
      broken->insert(key);
      chain_.broken = std::move(broken);
      for (auto it = memo_.begin(); it != memo_.end();)
        it = it->second->arch == d.arch && it->second->variant->hash == d.variant->hash ? memo_.erase(it)
                                                                                         : std::next(it);
      ++generation_;  // decisions being computed from the old set are not memoised
    }
    warn("tuning DB " + d.source + ": " + d.variant->key + " (" + d.arch + ", tuned for " + d.matched_shape +
         ") does not compile: " + first_error(error) + "; not used again in this process, falling back");
  }

 private:
  static constexpr std::size_t kMaxMemo = 1 << 16;

  void forget_locked() {
    memo_.clear();
    ++generation_;
  }

  // The message's first line without the options, and the log's first error line.
  static std::string first_error(const std::string& what) {
    std::istringstream in(what);
    std::string head, line;
    std::getline(in, head);
    head = head.substr(0, head.find(", options:"));
    while (std::getline(in, line))
      if (line.find("error") != std::string::npos) return head + ": " + line;
    return head;
  }

  static std::string describe(const Decision& d, const Call& c) {
    char family[kFamilyBufSize];
    family_of(c, family);
    std::string s = "dispatch: " + (d.arch.empty() ? std::string("?") : d.arch) + " " + family + " " +
                    d.call_shape + " align " + std::to_string(d.alignment) + " -> " + d.variant->key + " (" +
                    d.reason;
    if (d.reason == "nearest") {
      char dist[32];
      std::snprintf(dist, sizeof dist, "%.3f", d.distance);
      s += " to " + d.matched_shape + ", distance " + dist;
    }
    s += ", from " + d.source + ")";
    if (d.reason == "default") s += ": " + d.detail;
    return s;
  }

  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Decision>, KeyHash> memo_;
  Chain chain_;
  // Read without the lock by plans (dispatch_generation); changed only under it.
  std::atomic<uint64_t> generation_{0};
};

Dispatcher& dispatcher() {
  static Dispatcher d;
  return d;
}

// decide(), then ready(variant): compile it, or compile and load it. See decide_loaded.
template <class Ready>
std::shared_ptr<const Decision> decide_ready(const Call& c, int arch_id, Ready&& ready) {
  for (;;) {  // ends: each pass drops a tuned winner, and the catalog's errors propagate
    std::shared_ptr<const Decision> d = dispatcher().decide(c, arch_id);
    try {
      ready(*d->variant);
      return d;
    } catch (const CompileError& e) {
      if (d->reason == "default") throw;  // our own catalog's kernel: a bug, not a DB fault
      dispatcher().drop_broken(*d, e.what());
    }
  }
}

}  // namespace

std::shared_ptr<const KernelVariant> realigned_twin(const std::shared_ptr<const KernelVariant>& v) {
  return twins().of(v);
}

std::shared_ptr<const KernelVariant> walk_cut_build(const std::shared_ptr<const KernelVariant>& v) {
  return walk_cut_builds().of(v);
}

bool is_walk_cut(const KernelVariant& v) { return v.source.rfind(kBwdWalkCutDefine, 0) == 0; }

bool is_realigned(const KernelVariant& v) {
  for (const RealignBuild& b : kRealignBuilds)
    if (v.source.rfind(b.define, 0) == 0) return true;
  return false;
}

std::size_t family_of(const Call& c, char (&buf)[kFamilyBufSize]) {
  return family_key(op_name(c.op), c.layout, c.x_dtype, c.w_dtype, c.width, buf);
}

std::shared_ptr<const Decision> decide(const Call& c, int arch_id) { return dispatcher().decide(c, arch_id); }

uint64_t dispatch_generation() { return dispatcher().generation(); }

Location locate(const void* x) {
  Location l{&cuda_backend(), -1};
  l.device = l.backend->device_of_pointer(x);
  if (l.device < 0) {
    l.backend = &hip_backend();
    l.device = l.backend->device_of_pointer(x);
  }
  return l;
}

[[noreturn]] void throw_no_device(const void* x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", x);
  throw BackendError(std::string("no GPU backend owns pointer ") + buf +
                     " (x): not CUDA or HIP device memory, or no driver/device is available");
}

// Remembered per (vendor, ordinal) so the hot path does not build the target string again.
int arch_id_of(const Location& l) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, 2 * kMaxDevices> known{};  // id + 1; 0 = not yet
  const bool cacheable = l.device < kMaxDevices;
  const std::size_t slot = (l.backend == &cuda_backend() ? 0 : kMaxDevices) + std::size_t(l.device);
  if (cacheable) {
    if (int v = known[slot].load(std::memory_order_relaxed)) return v - 1;
  }
  const int id = archs().intern(l.backend->device_target(l.device));
  if (cacheable) known[slot].store(id + 1, std::memory_order_relaxed);
  return id;
}

int arch_id_for(const std::string& arch, const void* x) {
  if (!arch.empty()) {
    backend_for_target(arch);  // rejects what is not a target (the name becomes part of a path)
    return archs().intern(arch);
  }
  if (const Location l = locate(x); l.device >= 0) return arch_id_of(l);
  return 0;
}

unsigned grid_dim(int64_t n, int tile, unsigned max) {
  int64_t g = (n + tile - 1) / tile;
  return g > int64_t(max) ? max : unsigned(g);
}

Dim3 fwd_grid(int64_t rows, int64_t dim, int64_t batch, const KernelVariant& v, const Functions& f, Dim3 max) {
  if (f.cl_groups_first_grid)
    return {grid_dim(dim, v.tile_d, max.x), grid_dim(rows, v.tile_l, max.y), grid_dim(batch, 1, max.z)};
  return {grid_dim(rows, v.tile_l, max.x), grid_dim(dim, v.tile_d, max.y), grid_dim(batch, 1, max.z)};
}

namespace {

void check_source_hash(const KernelVariant& v) {
  const std::string actual = sha256_hex(v.source);
  if (actual != v.hash)
    throw InvalidArgument("variant " + v.key + ": hash " + v.hash + " does not match its source (sha256 " + actual +
                          ")");
}

std::string joined_options(const std::vector<std::string>& options) {
  std::string joined;
  for (const std::string& o : options) joined += o + ' ';
  return joined;
}

// The backend's name for v's module built with these options.
std::string fixed_module_key(const KernelVariant& v, const std::string& joined_options) {
  return v.hash + "+fixed:" + sha256_hex(joined_options);
}

// Compiles v with these options and loads the module as `key` (the slow path of
// load_fixed_functions and fixed_functions, after their lookup missed); throws.
Functions compile_and_load_fixed(const KernelVariant& v, const Location& l, const std::vector<std::string>& options,
                                 const std::string& key, bool with_reduce) {
  check_source_hash(v);
  const CompileResult r = compile_cached(*l.backend, v.source, l.backend->device_target(l.device), options);
  const Functions f = l.backend->load_functions(l.device, key, r.binary, v.smem_bytes, with_reduce);
  g_loads.fetch_add(1, std::memory_order_relaxed);
  return f;
}

}  // namespace

Functions functions_on(const Location& l, const KernelVariant& v, bool with_reduce) {
  Backend* backend = l.backend;
  const int device = l.device;
  Functions f = backend->find_functions(device, v.hash);
  if (!f.kernel || (with_reduce && !f.reduce)) {
    // First use of this variant in this context: the only slow path.
    check_source_hash(v);
    const std::string target = backend->device_target(device);
    CompileResult r = compile_cached(*backend, v.source, target, {});
    f = backend->load_functions(device, v.hash, r.binary, v.smem_bytes, with_reduce);
    g_loads.fetch_add(1, std::memory_order_relaxed);
  }
  return f;
}

void add_fixed_define(std::vector<std::string>& options, const char* name, int64_t value) {
  options.push_back(std::string("-DCC1D_FIX_") + name + "=((long long)" + std::to_string(uint64_t(value)) + "ULL)");
}

Functions load_fixed_functions(const KernelVariant& v, const Location& l, const std::vector<std::string>& options,
                               bool with_reduce) {
  const std::string key = fixed_module_key(v, joined_options(options));
  if (Functions f = l.backend->find_functions(l.device, key); f.kernel && (f.reduce || !with_reduce)) return f;
  return compile_and_load_fixed(v, l, options, key, with_reduce);
}

Functions fixed_functions(const KernelVariant& v, const Location& l, const std::vector<std::string>& options,
                          bool may_load, bool with_reduce) {
  const std::string joined = joined_options(options);
  const std::string key = fixed_module_key(v, joined);
  if (Functions f = l.backend->find_functions(l.device, key); f.kernel && (f.reduce || !with_reduce)) return f;
  if (!may_load) return {};
  try {
    return compile_and_load_fixed(v, l, options, key, with_reduce);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    warn_once("fixed " + key, "the fixed kernel of " + v.key + " (" + joined +
                                  ") did not compile or load, so its generic kernel serves: " + why);
    return {};
  }
}

std::shared_ptr<const Decision> decide_loaded(const Call& c, const Location& l, bool with_reduce, Functions* f) {
  return decide_ready(c, arch_id_of(l), [&](const KernelVariant& v) {
    const Functions loaded = functions_on(l, v, with_reduce);
    if (f) *f = loaded;
  });
}

std::shared_ptr<const Decision> RememberedLaunch::get(const Call& c, const Location& l, Functions* f) {
  // Read first: a change made while this call decides makes the next call decide again.
  const uint64_t generation = dispatch_generation();
  Launch r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = last_;
  }
  if (!r.decision || r.generation != generation || r.backend != l.backend || r.device != l.device ||
      r.features != c.features || r.align != c.align || r.row_align != c.row_align ||
      r.scope != l.backend->module_scope(l.device)) {
    r.decision = decide_loaded(c, l, /*with_reduce=*/false, &r.functions);
    // After loading: a first load makes the device's primary context current.
    r.scope = l.backend->module_scope(l.device);
    r.generation = generation;
    r.backend = l.backend;
    r.device = l.device;
    r.features = c.features;
    r.align = c.align;
    r.row_align = c.row_align;
    std::lock_guard<std::mutex> lock(mu_);
    last_ = r;
  }
  *f = r.functions;
  return r.decision;
}

std::shared_ptr<const Decision> decide_compiled(const Call& c, int arch_id) {
  const std::string target = archs().name(arch_id);
  Backend& backend = backend_for_target(target);
  return decide_ready(c, arch_id, [&](const KernelVariant& v) { compile_cached(backend, v.source, target, {}); });
}

Explanation explanation_of(const Decision& d) {
  Explanation e;
  e.variant = *d.variant;
  e.reason = d.reason;
  e.source = d.source;
  e.matched_shape = d.matched_shape;
  e.arch = d.arch;
  e.call_shape = d.call_shape;
  e.alignment = d.alignment;
  e.distance = d.distance;
  e.detail = d.detail;
  return e;
}

void check_variant_shape(const KernelVariant& v) {
  if (v.threads < 1 || v.tile_l < 1 || v.tile_d < 1 || v.smem_bytes < 0 || v.align_bytes < 1)
    throw InvalidArgument("variant " + v.key + ": threads, tile_l, tile_d, align_bytes must be >= 1 and "
                          "smem_bytes >= 0, got threads=" + std::to_string(v.threads) + " tile_l=" +
                          std::to_string(v.tile_l) + " tile_d=" + std::to_string(v.tile_d) + " smem_bytes=" +
                          std::to_string(v.smem_bytes) + " align_bytes=" + std::to_string(v.align_bytes));
}

void check_variant_serves(const KernelVariant& v, const char* family, std::size_t n) {
  if (v.key.compare(0, n, family) != 0 || (v.key.size() > n && v.key[n] != '.'))
    throw InvalidArgument("variant " + v.key + " does not serve this call, whose family is " + family);
}

void check_variant_alignment(const KernelVariant& v, Op op, Layout layout, int align, int row_align) {
  if (is_realigned(v)) {
    if (layout != Layout::channel_first)
      throw InvalidArgument("variant " + v.key + " is a realigned channel-first build; x is channel-last");
    if (row_align % v.align_bytes != 0)
      throw InvalidArgument("variant " + v.key + " needs " + op_rows(op) + " rows to lie alike against " +
                            std::to_string(v.align_bytes) + "-byte vectors (their base addresses, batch and "
                            "channel strides equal modulo that), the call's agree to " + std::to_string(row_align) +
                            " bytes");
  } else if (align % v.align_bytes != 0) {
    throw InvalidArgument("variant " + v.key + " needs " + op_tensors(op) + " base addresses and batch/outer strides "
                          "aligned to " + std::to_string(v.align_bytes) + " bytes, the call gives " +
                          std::to_string(align));
  }
}

DispatchStats dispatch_stats() {
  return {g_decisions.load(std::memory_order_relaxed), g_loads.load(std::memory_order_relaxed), compile_count(),
          corrupt_cache_files()};
}

void set_tuning_dbs(const std::vector<std::string>& paths) { dispatcher().set_caller_dbs(paths); }

void set_package_dir(const std::string& dir) { dispatcher().set_package_dir(dir); }

void clear_dispatch_cache() {
  dispatcher().clear();
  clear_tuned_sets();
}

// The device prepare_fwd / prepare_bwd load for (see cc1d.h).
Location prepare_location(const void* x, int device) {
  if (device < -1)
    throw InvalidArgument("device must be -1 (x's device, else the current one) or a device ordinal >= 0, got " +
                          std::to_string(device));
  if (device < 0) {
    if (Location l = locate(x); l.device >= 0) return l;
  }
  for (Backend* b : {&cuda_backend(), &hip_backend()}) {
    const int n = b->device_count();
    if (n == 0) continue;
    const int current = b->current_device();
    if (device < 0) return {b, current >= 0 ? current : 0};  // none current: device 0, as the runtime API does
    if (device >= n)
      throw InvalidArgument("device must be a " + std::string(b->vendor()) + " device ordinal in [0, " +
                            std::to_string(n) + "), got " + std::to_string(device));
    // Kernels load into the current context: the calls must find them there.
    if (current >= 0 && current != device)
      throw InvalidArgument("device " + std::to_string(device) + " is not the calling thread's current device (" +
                            std::to_string(current) + "): make it current first (cudaSetDevice, "
                            "torch.cuda.device), so the kernel loads where the calls will look for it");
    return {b, device};
  }
  throw BackendError("prepare: no GPU to prepare for: no CUDA or HIP driver with a device is available");
}


}  // namespace cc1d
