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

// Both layouts convolve the packed token stream as one sequence (cc1d_kernel), then
// a second kernel (cc1d_reduce) mends each sequence's first outputs, the padded
// ones and the states: every varlen variant loads both (with_reduce).
constexpr unsigned kMendThreads = 256;  // block of cc1d_reduce (MEND_THREADS in the templates)

// Channel-last's cc1d_kernel is the channel-last forward: its parameters over the
// stream, batch 1, no states and no sequence ids.
FwdParams stream_as_fwd(const VarlenParams& v) {
  FwdParams f{};
  f.x = v.x;
  f.weight = v.weight;
  f.bias = v.bias;
  f.out = v.out;
  f.batch = 1;
  f.dim = v.dim;
  f.seqlen = v.total_tokens;
  f.x_dim_stride = v.x_dim_stride;
  f.x_l_stride = v.x_l_stride;
  f.w_dim_stride = v.w_dim_stride;
  f.w_width_stride = v.w_width_stride;
  f.bias_stride = v.bias_stride;
  f.out_dim_stride = v.out_dim_stride;
  f.out_l_stride = v.out_l_stride;
  f.silu = v.silu;
  return f;
}

void launch_on(const Location& l, const KernelVariant& v, const Functions& f, const VarlenArgs& a,
               Layout layout) {
  Backend* backend = l.backend;
  const Dim3 max = backend->max_grid(l.device);
  const VarlenParams& p = a.p;
  if (p.out != nullptr && p.total_tokens > 0) {  // else states only: the mend writes them
    const Dim3 capped{max.x, unsigned(std::min<int64_t>(max.y, kMaxGridYZ)), 1};
    const Dim3 grid = fwd_grid(p.total_tokens, p.dim, 1, v, f, capped);
    const Dim3 block{unsigned(v.threads), 1, 1};
    if (layout == Layout::channel_last) {
      FwdParams params = stream_as_fwd(p);
      backend->launch(f.kernel, grid, block, unsigned(v.smem_bytes), a.stream, &params, sizeof params,
                      f.waits_for_previous);
    } else {
      VarlenParams params = p;
      backend->launch(f.kernel, grid, block, unsigned(v.smem_bytes), a.stream, &params, sizeof params,
                      f.waits_for_previous);
    }
  }
  if (p.num_seqs > 0) {
    // Same stream, after cc1d_kernel. Launched early behind it where the mend says it
    // waits (Functions::mend_waits): its loads read nothing cc1d_kernel writes and come
    // before its wait for the grid ahead, its stores after (varlen_common.cuh.j2), so
    // the loads overlap the forward's last wave. Without a cc1d_kernel ahead (states
    // only) the grid ahead may be the one writing x: plainly.
    const bool after_forward = p.out != nullptr && p.total_tokens > 0;
    const Dim3 mend{grid_dim(p.dim, int(kMendThreads), max.x),
                    grid_dim(p.num_seqs, 1, unsigned(std::min<int64_t>(max.y, kMaxGridYZ))), 1};
    VarlenParams params = p;
    backend->launch(f.reduce, mend, Dim3{kMendThreads, 1, 1}, 0, a.stream, &params, sizeof params,
                    after_forward && f.mend_waits);
  }
}

}  // namespace

void causal_conv1d_varlen(const VarlenArgs& args) {
  const Layout layout = validate_varlen(args);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(varlen_call(args, layout), l, /*with_reduce=*/true, &f);
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
  return explanation_of(*decide_loaded(varlen_call(args, layout), l, /*with_reduce=*/true, nullptr));
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
  launch_on(l, v, functions_on(l, v, /*with_reduce=*/true), args, layout);
}

}  // namespace cc1d
