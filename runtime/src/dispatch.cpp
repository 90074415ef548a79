// Forward entry points: decide which variant serves a call (tuning DBs along
// the lookup chain, else the default catalog), memoised per (arch, family,
// shape, features, alignment class); then compile (once), load (once per
// context) and launch.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend.h"
#include "catalog.h"
#include "compile_cache.h"
#include "env.h"
#include "log.h"
#include "sha256.h"
#include "tuning_db.h"
#include "validate.h"

namespace cc1d {
namespace {

// ---- the default catalog --------------------------------------------------

const std::vector<KernelVariant>& catalog_variants() {
  static const std::vector<KernelVariant> all = [] {
    std::vector<KernelVariant> v;
    const catalog::Entry* e = catalog::entries();
    for (std::size_t i = 0; i < catalog::num_entries(); ++i)
      v.push_back({e[i].key, e[i].hash, e[i].source, e[i].threads, e[i].tile_l, e[i].tile_d,
                   e[i].smem_bytes, e[i].align_bytes});
    return v;
  }();
  return all;
}

// The family's first catalog variant whose alignment the call meets (the
// chain ends with a variant needing only the element size, so one always fits).
const KernelVariant& catalog_choice(const char* family, int align) {
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
  throw InvalidArgument(std::string("no kernel of ") + family + " accepts x/out aligned to only " +
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

// Where x lives: the backend and device ordinal, or device < 0.
struct Location {
  Backend* backend = nullptr;
  int device = -1;
};

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

// Arch id of a device, remembered per (vendor, ordinal) so the hot path does
// not build the target string again.
constexpr int kMaxDevices = 64;
int arch_id_of(const Location& l) {
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

int log2_of(int pow2) {
  int l = 0;
  while ((1 << l) < pow2) ++l;
  return l;
}

unsigned call_features(const FwdParams& p) {
  return (p.bias ? kBias : 0u) | (p.silu ? kSilu : 0u) | (p.seq_idx ? kSeqIdx : 0u) |
         (p.initial_states ? kInit : 0u) | (p.final_states ? kFinal : 0u);
}

std::string shape_key(int64_t b, int64_t d, int64_t l, unsigned features) {
  std::string s = "b" + std::to_string(b) + ".d" + std::to_string(d) + ".l" + std::to_string(l);
  if (features) s += "." + features_string(features, '.');
  return s;
}

// The documented distance between shapes of one family (log space: a kernel's
// best tiling depends on the scale of the work, not on its absolute size).
// Larger than any shape distance (|ln| of 64-bit sizes stays below 90).
constexpr double kFeatureMismatchRank = 1000.0;

double shape_distance(int64_t b, int64_t d, int64_t l, const TunedEntry& e) {
  return std::fabs(std::log(double(b) * double(l)) - std::log(double(e.batch) * double(e.seqlen))) +
         std::fabs(std::log(double(d)) - std::log(double(e.dim)));
}

// ---- counters (dispatch_stats): what a warmed-up call must not do again ------

std::atomic<uint64_t> g_decisions{0};  // decisions computed (memo misses)
std::atomic<uint64_t> g_loads{0};      // kernels loaded into a context (compile-cache lookups)

// ---- decisions --------------------------------------------------------------

struct Decision {
  std::shared_ptr<const KernelVariant> variant;
  std::string reason, source, matched_shape, arch, call_shape, detail;
  int alignment = 0;
  double distance = -1;
};

struct Key {
  int64_t batch, dim, seqlen;
  int32_t arch;
  uint8_t layout, x_dtype, w_dtype, width, features, align_log2;
  bool operator==(const Key& o) const {
    return batch == o.batch && dim == o.dim && seqlen == o.seqlen && arch == o.arch && layout == o.layout &&
           x_dtype == o.x_dtype && w_dtype == o.w_dtype && width == o.width && features == o.features &&
           align_log2 == o.align_log2;
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
    mix(uint64_t(k.arch) << 48 | uint64_t(k.layout) << 40 | uint64_t(k.x_dtype) << 32 | uint64_t(k.w_dtype) << 24 |
        uint64_t(k.width) << 16 | uint64_t(k.features) << 8 | k.align_log2);
    return std::size_t(h);
  }
};

// Settings that decide which DBs are read; copied out of the lock per decision.
struct Chain {
  std::vector<std::string> caller_dbs;
  std::string package_dir;
};

std::shared_ptr<const Decision> compute(const FwdArgs& a, Layout layout, int align, const std::string& arch,
                                        const Chain& chain) {
  char family[kFamilyBufSize];
  fwd_family(a, layout, family);
  const FwdParams& p = a.p;
  const unsigned features = call_features(p);
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

  // Exact winners, along the chain.
  std::string skipped;
  for (const auto& set : sets)
    for (const TunedEntry& e : set->entries) {
      if (e.family != family || e.features != features || e.batch != p.batch || e.dim != p.dim ||
          e.seqlen != p.seqlen)
        continue;
      if (align % e.variant->align_bytes != 0) {
        skipped = "; the exact winner in " + set->path + " (" + e.variant->key + ") needs " +
                  std::to_string(e.variant->align_bytes) + "-byte alignment, the call gives " + std::to_string(align);
        continue;
      }
      d->variant = e.variant;
      d->reason = "exact";
      d->source = set->path;
      d->matched_shape = e.shape_key;
      d->distance = 0;
      d->detail = "tuned for this shape";
      return d;
    }
  // Nearest tuned shape whose requirement the call meets; ties go to the earlier DB.
  // Features are runtime flags of one kernel, so a winner tuned with other
  // features is a valid kernel too: it is used only when no entry with the
  // call's own features qualifies (each differing feature outweighs any shape distance).
  const TunedEntry* best = nullptr;
  const TunedSet* best_set = nullptr;
  double best_rank = 0, best_distance = 0;
  for (const auto& set : sets)
    for (const TunedEntry& e : set->entries) {
      if (e.family != family || align % e.variant->align_bytes != 0) continue;
      const double dist = shape_distance(p.batch, p.dim, p.seqlen, e);
      const double rank = dist + kFeatureMismatchRank * __builtin_popcount(e.features ^ features);
      if (!best || rank < best_rank) {
        best = &e;
        best_set = set.get();
        best_rank = rank;
        best_distance = dist;
      }
    }
  if (best) {
    d->variant = best->variant;
    d->reason = "nearest";
    d->source = best_set->path;
    d->matched_shape = best->shape_key;
    d->distance = best_distance;
    d->detail = "nearest tuned shape of " + std::string(family);
    if (best->features != features)
      d->detail += " (tuned with features [" + features_string(best->features) + "]; none tuned with [" +
                   features_string(features) + "])";
    d->detail += skipped;
    return d;
  }
  d->variant = std::shared_ptr<const KernelVariant>(std::shared_ptr<void>(), &catalog_choice(family, align));
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

class Dispatcher {
 public:
  std::shared_ptr<const Decision> decide(const FwdArgs& a, Layout layout, int align, int arch_id) {
    const Key key{a.p.batch,        a.p.dim,      a.p.seqlen,
                  int32_t(arch_id), uint8_t(layout), uint8_t(a.x_dtype),
                  uint8_t(a.w_dtype), uint8_t(a.width), uint8_t(call_features(a.p)),
                  uint8_t(log2_of(align))};
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
    std::shared_ptr<const Decision> d = compute(a, layout, align, archs().name(arch_id), chain);
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
    if (fresh && env().log_dispatch) warn(describe(*d, a, layout));
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
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    forget_locked();
  }

 private:
  static constexpr std::size_t kMaxMemo = 1 << 16;

  void forget_locked() {
    memo_.clear();
    ++generation_;
  }

  static std::string describe(const Decision& d, const FwdArgs& a, Layout layout) {
    char family[kFamilyBufSize];
    fwd_family(a, layout, family);
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
  uint64_t generation_ = 0;
};

Dispatcher& dispatcher() {
  static Dispatcher d;
  return d;
}

std::shared_ptr<const Decision> decide_for(const FwdArgs& args, const std::string& arch) {
  const Layout layout = validate_fwd(args);
  int arch_id = 0;
  if (!arch.empty()) {
    backend_for_target(arch);  // rejects what is not a target (the name becomes part of a path)
    arch_id = archs().intern(arch);
  } else if (const Location l = locate(args.p.x); l.device >= 0) {
    arch_id = arch_id_of(l);
  }
  return dispatcher().decide(args, layout, fwd_alignment(args, layout), arch_id);
}

unsigned grid_dim(int64_t n, int tile, unsigned max) {
  int64_t g = (n + tile - 1) / tile;
  return g > int64_t(max) ? max : unsigned(g);
}

// The variant's kernel in the device's current context: compiled (through the
// compile cache) and loaded on first use there.
void* function_on(const Location& l, const KernelVariant& v) {
  Backend* backend = l.backend;
  const int device = l.device;
  void* function = backend->find_function(device, v.hash);
  if (!function) {
    // First use of this variant in this context: the only slow path.
    const std::string actual = sha256_hex(v.source);
    if (actual != v.hash)
      throw InvalidArgument("variant " + v.key + ": hash " + v.hash + " does not match its source (sha256 " +
                            actual + ")");
    const std::string target = backend->device_target(device);
    CompileResult r = compile_cached(*backend, v.source, target, {});
    function = backend->load_function(device, v.hash, r.binary, v.smem_bytes);
    g_loads.fetch_add(1, std::memory_order_relaxed);
  }
  return function;
}

void launch_on(const Location& l, const KernelVariant& v, const FwdArgs& a) {
  Backend* backend = l.backend;
  const int device = l.device;
  void* function = function_on(l, v);
  const Dim3 max = backend->max_grid(device);
  const Dim3 grid{grid_dim(a.p.seqlen, v.tile_l, max.x), grid_dim(a.p.dim, v.tile_d, max.y),
                  grid_dim(a.p.batch, 1, max.z)};
  FwdParams params = a.p;
  backend->launch(function, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params);
}

// The device prepare_fwd loads for (see cc1d.h).
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
  throw BackendError("prepare_fwd: no GPU to prepare for: no CUDA or HIP driver with a device is available");
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

}  // namespace

void causal_conv1d_fwd(const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  const std::shared_ptr<const Decision> d =
      dispatcher().decide(args, layout, fwd_alignment(args, layout), arch_id_of(l));
  launch_on(l, *d->variant, args);
}

KernelVariant select_fwd(const FwdArgs& args, const std::string& arch) {
  return *decide_for(args, arch)->variant;
}

Explanation explain_fwd(const FwdArgs& args, const std::string& arch) {
  return explanation_of(*decide_for(args, arch));
}

Explanation prepare_fwd(const FwdArgs& args, int device) {
  const Layout layout = validate_fwd(args);
  const Location l = prepare_location(args.p.x, device);
  const std::shared_ptr<const Decision> d =
      dispatcher().decide(args, layout, fwd_alignment(args, layout), arch_id_of(l));
  function_on(l, *d->variant);
  return explanation_of(*d);
}

DispatchStats dispatch_stats() {
  return {g_decisions.load(std::memory_order_relaxed), g_loads.load(std::memory_order_relaxed)};
}

void set_tuning_dbs(const std::vector<std::string>& paths) { dispatcher().set_caller_dbs(paths); }

void set_package_dir(const std::string& dir) { dispatcher().set_package_dir(dir); }

void clear_dispatch_cache() {
  dispatcher().clear();
  clear_tuned_sets();
}

void launch_fwd(const KernelVariant& v, const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  const std::size_t n = fwd_family(args, layout, family);
  if (v.key.compare(0, n, family) != 0 || (v.key.size() > n && v.key[n] != '.'))
    throw InvalidArgument("variant " + v.key + " does not serve this call, whose family is " + family);
  const int align = fwd_alignment(args, layout);
  if (align % v.align_bytes != 0)
    throw InvalidArgument("variant " + v.key + " needs x/out base addresses and batch/outer strides aligned to " +
                          std::to_string(v.align_bytes) + " bytes, the call gives " + std::to_string(align));
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  launch_on(l, v, args);
}

}  // namespace cc1d
