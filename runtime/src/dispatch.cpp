// Forward entry points: pick a catalog variant for a call (memoised per family
// and alignment class), then compile (once), load (once per context) and launch.
#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "backend.h"
#include "catalog.h"
#include "compile_cache.h"
#include "sha256.h"
#include "validate.h"

namespace cc1d {
namespace {

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

int log2_of(int pow2) {
  int l = 0;
  while ((1 << l) < pow2) ++l;
  return l;
}

// Memo of the catalog index chosen per (layout, x dtype, w dtype, width,
// log2 alignment); -1 = not chosen yet.
constexpr int kAlignClasses = 9;  // 1 .. 256 bytes
class Choices {
 public:
  Choices() { table_.fill(-1); }
  const KernelVariant& get(const FwdArgs& a, Layout layout, int align) {
    const std::size_t slot =
        ((((std::size_t(layout) * 3 + std::size_t(a.x_dtype)) * 3 + std::size_t(a.w_dtype)) * 7 +
          std::size_t(a.width - 2)) * kAlignClasses) + std::size_t(log2_of(align));
    std::lock_guard<std::mutex> lock(mu_);
    if (table_[slot] < 0) table_[slot] = choose(a, layout, align);
    return catalog_variants()[std::size_t(table_[slot])];
  }

 private:
  static int choose(const FwdArgs& a, Layout layout, int align) {
    char family[kFamilyBufSize];
    fwd_family(a, layout, family);
    const catalog::Entry* e = catalog::entries();
    bool family_seen = false;
    for (std::size_t i = 0; i < catalog::num_entries(); ++i) {
      if (std::strcmp(e[i].family, family) != 0) continue;
      family_seen = true;
      if (e[i].align_bytes > 0 && align % e[i].align_bytes == 0) return int(i);
    }
    if (!family_seen)
      throw InvalidArgument(std::string("no kernel in the catalog for ") + family +
                            " (layout, dtypes and width of this call)");
    throw InvalidArgument(std::string("no kernel of ") + family + " accepts x/out aligned to only " +
                          std::to_string(align) + " bytes (base addresses and batch/outer strides)");
  }
  std::mutex mu_;
  std::array<int, 2 * 3 * 3 * 7 * kAlignClasses> table_;
};

Choices& choices() {
  static Choices c;
  return c;
}

unsigned grid_dim(int64_t n, int tile, unsigned max) {
  int64_t g = (n + tile - 1) / tile;
  return g > int64_t(max) ? max : unsigned(g);
}

void launch_checked(const KernelVariant& v, const FwdArgs& a) {
  const void* x = a.p.x;
  Backend* backend = &cuda_backend();
  int device = backend->device_of_pointer(x);
  if (device < 0) {
    backend = &hip_backend();
    device = backend->device_of_pointer(x);
  }
  if (device < 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", x);
    throw BackendError(std::string("no GPU backend owns pointer ") + buf +
                       " (x): not CUDA or HIP device memory, or no driver/device is available");
  }
  void* function = backend->find_function(device, v.hash);
  if (!function) {
    // First launch of this variant in this context: the only slow path.
    const std::string actual = sha256_hex(v.source);
    if (actual != v.hash)
      throw InvalidArgument("variant " + v.key + ": hash " + v.hash + " does not match its source (sha256 " +
                            actual + ")");
    const std::string target = backend->device_target(device);
    CompileResult r = compile_cached(*backend, v.source, target, {});
    function = backend->load_function(device, v.hash, r.binary, v.smem_bytes);
  }
  const Dim3 max = backend->max_grid(device);
  const Dim3 grid{grid_dim(a.p.seqlen, v.tile_l, max.x), grid_dim(a.p.dim, v.tile_d, max.y),
                  grid_dim(a.p.batch, 1, max.z)};
  FwdParams params = a.p;
  backend->launch(function, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params);
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
  const KernelVariant& v = choices().get(args, layout, fwd_alignment(args, layout));
  launch_checked(v, args);
}

KernelVariant select_fwd(const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  return choices().get(args, layout, fwd_alignment(args, layout));
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
  launch_checked(v, args);
}

}  // namespace cc1d
