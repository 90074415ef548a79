// Varlen prefill entry points (cc1d.h): check, decide (dispatch.h, op "vfwd"),
// launch. The grid comes from host sizes only (no device value is read), so a
// call can be captured in a CUDA graph.
#include <algorithm>
#include <cstdint>

#include "cc1d/cc1d.h"
#include "dispatch.h"
#include "tuning_db.h"

namespace cc1d {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // the kernels loop over further channel groups and sequences

Call varlen_call(const VarlenArgs& a, Layout layout) {
  const VarlenParams& p = a.p;
  Call c;
  c.op = Op::vfwd;
  c.layout = layout;
  c.x_dtype = a.x_dtype;
  c.w_dtype = a.w_dtype;
  c.width = a.width;
  c.batch = p.num_seqs;
  c.dim = p.dim;
  c.seqlen = p.total_tokens;
  c.features = (p.bias ? kBias : 0u) | (p.silu ? kSilu : 0u) | (p.has_initial_state ? kInit : 0u) |
               (p.conv_states ? kFinal : 0u);
  c.align = varlen_alignment(a, layout);
  return c;
}

std::shared_ptr<const Decision> decide_for(const VarlenArgs& args, const std::string& arch) {
  const Layout layout = validate_varlen(args);
  return decide(varlen_call(args, layout), arch_id_for(arch, args.p.x));
}

constexpr unsigned kMendThreads = 256;  // block of the channel-first cc1d_reduce

// Channel-first kernels convolve the packed token stream as one sequence, then a
// second kernel (cc1d_reduce) mends each sequence's first outputs, the padded
// ones and the states; channel-last kernels take one sequence per grid.z and do
// it all themselves.
bool has_mend_pass(Layout layout) { return layout == Layout::channel_first; }

// Chunks of tile_l tokens: channel-first over the whole stream; channel-last per
// sequence, enough for the longest one the host can bound.
unsigned chunks_for(const VarlenParams& p, Layout layout, const KernelVariant& v, unsigned max) {
  if (p.out == nullptr) return 1;  // states only
  const int64_t span = layout == Layout::channel_first ? p.total_tokens
                       : p.max_seqlen > 0             ? p.max_seqlen
                                                      : p.total_tokens;
  return std::max(1u, grid_dim(span, v.tile_l, max));
}

void launch_on(const Location& l, const KernelVariant& v, const Functions& f, const VarlenArgs& a,
               Layout layout) {
  Backend* backend = l.backend;
  const Dim3 max = backend->max_grid(l.device);
  const unsigned seqs = grid_dim(a.p.num_seqs, 1, unsigned(std::min<int64_t>(max.z, kMaxGridYZ)));
  const Dim3 grid{chunks_for(a.p, layout, v, max.x),
                  grid_dim(a.p.dim, v.tile_d, unsigned(std::min<int64_t>(max.y, kMaxGridYZ))),
                  has_mend_pass(layout) ? 1u : seqs};
  VarlenParams params = a.p;
  backend->launch(f.kernel, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params);
  if (has_mend_pass(layout) && a.p.num_seqs > 0) {
    // Same stream: runs after cc1d_kernel has written every output it mends.
    const Dim3 mend{grid_dim(a.p.dim, int(kMendThreads), max.x),
                    grid_dim(a.p.num_seqs, 1, unsigned(std::min<int64_t>(max.y, kMaxGridYZ))), 1};
    backend->launch(f.reduce, mend, Dim3{kMendThreads, 1, 1}, 0, a.stream, &params, sizeof params);
  }
}

}  // namespace

void causal_conv1d_varlen(const VarlenArgs& args) {
  const Layout layout = validate_varlen(args);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(varlen_call(args, layout), l, has_mend_pass(layout), &f);
  launch_on(l, *d->variant, f, args, layout);
}

KernelVariant select_varlen(const VarlenArgs& args, const std::string& arch) {
  return *decide_for(args, arch)->variant;
}

Explanation explain_varlen(const VarlenArgs& args, const std::string& arch) {
  return explanation_of(*decide_for(args, arch));
}

Explanation prepare_varlen(const VarlenArgs& args, int device) {
  const Layout layout = validate_varlen(args);
  const Location l = prepare_location(args.p.x, device);
  return explanation_of(*decide_loaded(varlen_call(args, layout), l, has_mend_pass(layout), nullptr));
}

void launch_varlen(const KernelVariant& v, const VarlenArgs& args) {
  const Layout layout = validate_varlen(args);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  check_variant_serves(v, family, varlen_family(args, layout, family));
  const int align = varlen_alignment(args, layout);
  if (align % v.align_bytes != 0)
    throw InvalidArgument("variant " + v.key + " needs x/out base addresses and outer strides aligned to " +
                          std::to_string(v.align_bytes) + " bytes, the call gives " + std::to_string(align));
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  launch_on(l, v, functions_on(l, v, has_mend_pass(layout)), args, layout);
}

}  // namespace cc1d
