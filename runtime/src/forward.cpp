// Forward entry points (cc1d.h): check, decide (dispatch.h), launch.
#include "cc1d/cc1d.h"
#include "dispatch.h"
#include "tuning_db.h"

namespace cc1d {

Call fwd_call(const FwdArgs& a, Layout layout) {
  const FwdParams& p = a.p;
  Call c;
  c.op = Op::fwd;
  c.layout = layout;
  c.x_dtype = a.x_dtype;
  c.w_dtype = a.w_dtype;
  c.width = a.width;
  c.batch = p.batch;
  c.dim = p.dim;
  c.seqlen = p.seqlen;
  c.features = (p.bias ? kBias : 0u) | (p.silu ? kSilu : 0u) | (p.seq_idx ? kSeqIdx : 0u) |
               (p.initial_states ? kInit : 0u) | (p.final_states ? kFinal : 0u);
  c.align = fwd_alignment(a, layout);
  return c;
}

namespace {

std::shared_ptr<const Decision> decide_for(const FwdArgs& args, const std::string& arch) {
  const Layout layout = validate_fwd(args);
  return decide(fwd_call(args, layout), arch_id_for(arch, args.p.x));
}

void launch_on(const Location& l, const KernelVariant& v, const Functions& f, const FwdArgs& a) {
  Backend* backend = l.backend;
  const int device = l.device;
  const Dim3 max = backend->max_grid(device);
  const Dim3 grid{grid_dim(a.p.seqlen, v.tile_l, max.x), grid_dim(a.p.dim, v.tile_d, max.y),
                  grid_dim(a.p.batch, 1, max.z)};
  FwdParams params = a.p;
  backend->launch(f.kernel, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params, f.waits_for_previous);
}

}  // namespace

void causal_conv1d_fwd(const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(fwd_call(args, layout), l, /*with_reduce=*/false, &f);
  launch_on(l, *d->variant, f, args);
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
  return explanation_of(*decide_loaded(fwd_call(args, layout), l, /*with_reduce=*/false, nullptr));
}

Explanation precompile_fwd(const FwdArgs& args, const std::string& arch) {
  const Layout layout = validate_fwd(args);
  if (arch.empty())
    throw InvalidArgument("arch must name the target to compile for (sm_90, gfx942, ...), got ''");
  return explanation_of(*decide_compiled(fwd_call(args, layout), arch_id_for(arch, args.p.x)));
}

void launch_fwd(const KernelVariant& v, const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  check_variant_serves(v, family, fwd_family(args, layout, family));
  const int align = fwd_alignment(args, layout);
  if (align % v.align_bytes != 0)
    throw InvalidArgument("variant " + v.key + " needs x/out base addresses and batch/outer strides aligned to " +
                          std::to_string(v.align_bytes) + " bytes, the call gives " + std::to_string(align));
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  launch_on(l, v, functions_on(l, v, /*with_reduce=*/false), args);
}

// ---- FwdPlan ---------------------------------------------------------------

struct FwdPlan::Remembered : RememberedLaunch {};

FwdPlan::FwdPlan(const FwdArgs& args) : args_(args), remembered_(std::make_unique<Remembered>()) {}
FwdPlan::~FwdPlan() = default;

void FwdPlan::run(const FwdBuffers& b, void* stream) const {
  FwdArgs a = args_;
  a.p.x = b.x;
  a.p.weight = b.weight;
  a.p.bias = b.bias;
  a.p.seq_idx = b.seq_idx;
  a.p.initial_states = b.initial_states;
  a.p.out = b.out;
  a.p.final_states = b.final_states;
  a.stream = stream;
  const Layout layout = validate_fwd(a);
  const Location l = locate(a.p.x);
  if (l.device < 0) throw_no_device(a.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = remembered_->get(fwd_call(a, layout), l, &f);
  launch_on(l, *d->variant, f, a);
}

}  // namespace cc1d
