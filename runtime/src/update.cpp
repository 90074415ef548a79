// Decode-update entry points (cc1d.h, causal_conv1d_update): check, decide
// (dispatch.h, op "upd"), launch one kernel on the caller's stream.
#include "cc1d/cc1d.h"
#include "dispatch.h"
#include "env.h"
#include "tuning_db.h"

namespace cc1d {
namespace {

Call upd_call(const UpdArgs& a, Layout layout) {
  const UpdParams& p = a.p;
  Call c;
  c.op = Op::upd;
  c.layout = layout;
  c.x_dtype = a.x_dtype;
  c.w_dtype = a.w_dtype;
  c.width = a.width;
  c.batch = p.batch;
  c.dim = p.dim;
  c.seqlen = p.seqlen;
  // cache_seqlens and num_accepted_tokens are run-time branches of every kernel,
  // not part of the tuned shape. conv_state_indices is one too, but a tuned
  // feature ("pool"): the indices add a round trip and the duplicate-slot scan,
  // which may favour another config. So is a state of width entries ("wstate", HF
  // transformers' caches): it moves a quarter more bytes per step at width 4, and only
  // plans' fixed kernels compile its batched step. Without a winner tuned with the
  // call's features the shape's other winners serve (the dispatcher ranks a feature
  // mismatch below a shape match).
  c.features = (p.bias ? kBias : 0u) | (p.silu ? kSilu : 0u) | (p.conv_state_indices ? kPool : 0u) |
               (p.state_len == a.width ? kWidthState : 0u);
  c.align = upd_alignment(a);
  return c;
}

std::shared_ptr<const Decision> decide_for(const UpdArgs& args, const std::string& arch) {
  const Layout layout = validate_upd(args);
  return decide(upd_call(args, layout), arch_id_for(arch, args.p.x));
}

// The update kernel copies conv_state_indices into dynamic shared memory when there are
// 2 to kUpdIndexCopy of them (upd.cu.j2: UPD_IDX_COPY, the same number): the launch
// gives it 4 bytes per index then, and none otherwise.
constexpr int64_t kUpdIndexCopy = 1024;

unsigned upd_index_copy_bytes(const UpdParams& p) {
  const bool copied = p.conv_state_indices != nullptr && p.batch > 1 && p.batch <= kUpdIndexCopy;
  return copied ? unsigned(p.batch) * unsigned(sizeof(int32_t)) : 0u;
}

void launch_on(const Location& l, const KernelVariant& v, const Functions& f, const UpdArgs& a) {
  Backend* backend = l.backend;
  const Dim3 max = backend->max_grid(l.device);
  // tile_d channels and tile_l batch rows per block.
  const Dim3 grid{grid_dim(a.p.dim, v.tile_d, max.x), grid_dim(a.p.batch, v.tile_l, max.y), 1};
  UpdParams params = a.p;
  backend->launch(f.kernel, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes) + upd_index_copy_bytes(a.p),
                  a.stream, &params, sizeof params, f.waits_for_previous);
}

// ---- fixed kernels ---------------------------------------------------------
// Update plans launch a fixed kernel (dispatch.h; upd.cu.j2, CC1D_UPD_FIXED): every
// size and stride but batch and pool as constants, which at decode sizes saves much
// of a launch's time; batch and pool stay run-time values, so one fixed kernel
// serves every batch size of a layer. Plans launch it (and prepare_upd loads it), and so
// do one-shot steps on width-entry states (width_state_step), unless CC1D_UPD_GENERIC=1.

// Which optional inputs a call has: bias, cache_seqlens, conv_state_indices, num_accepted_tokens.
unsigned optional_inputs(const UpdParams& p) {
  return (p.bias ? 1u : 0u) | (p.cache_seqlens ? 2u : 0u) | (p.conv_state_indices ? 4u : 0u) |
         (p.num_accepted_tokens ? 8u : 0u);
}

// A decode step on states of width entries (HF transformers' caches): the generic kernels
// compile the batched step for width-1 states only (upd.cu.j2, CC1D_UPD_FAST_STATE_LEN) and
// take such rows one by one (H100, batch 256: 68 against 10 us).
bool width_state_step(const UpdArgs& a) {
  const UpdParams& p = a.p;
  return p.seqlen == 1 && p.state_len == a.width && p.cache_seqlens == nullptr && p.num_accepted_tokens == nullptr;
}

}  // namespace

std::vector<std::string> upd_fixed_options(const UpdArgs& args) {
  const UpdParams& p = args.p;
  std::vector<std::string> o{"-DCC1D_UPD_FIXED=1"};
  const auto def = [&o](const char* name, int64_t v) { add_fixed_define(o, name, v); };
  def("DIM", p.dim);
  def("SEQLEN", p.seqlen);
  def("STATE_LEN", p.state_len);
  def("X_BATCH_STRIDE", p.x_batch_stride);
  def("X_DIM_STRIDE", p.x_dim_stride);
  def("X_L_STRIDE", p.x_l_stride);
  def("W_DIM_STRIDE", p.w_dim_stride);
  def("W_WIDTH_STRIDE", p.w_width_stride);
  def("BIAS_STRIDE", p.bias_stride);
  def("ST_BATCH_STRIDE", p.st_batch_stride);
  def("ST_DIM_STRIDE", p.st_dim_stride);
  def("ST_L_STRIDE", p.st_l_stride);
  def("OUT_BATCH_STRIDE", p.out_batch_stride);
  def("OUT_DIM_STRIDE", p.out_dim_stride);
  def("OUT_L_STRIDE", p.out_l_stride);
  def("SEQLENS_STRIDE", p.seqlens_stride);
  def("INDICES_STRIDE", p.indices_stride);
  def("ACCEPTED_STRIDE", p.accepted_stride);
  def("PAD_SLOT_ID", p.pad_slot_id);
  def("SILU", p.silu);
  const unsigned inputs = optional_inputs(p);
  def("HAS_BIAS", inputs & 1u ? 1 : 0);
  def("HAS_CACHE_SEQLENS", inputs & 2u ? 1 : 0);
  def("HAS_INDICES", inputs & 4u ? 1 : 0);
  def("HAS_ACCEPTED", inputs & 8u ? 1 : 0);
  return o;
}

void causal_conv1d_update(const UpdArgs& args) {
  const Layout layout = validate_upd(args);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(upd_call(args, layout), l, /*with_reduce=*/false, &f);
  // A step on width-entry states takes the fixed kernel an UpdPlan would (compiled once per
  // layer's signature, then found loaded), which has that batched step; the generic kernel
  // serves where plans launch none (CC1D_UPD_GENERIC=1), where it failed to build, and
  // during a capture that would have to load it (nothing is loaded then).
  if (env().upd_fixed && width_state_step(args)) {
    const Functions fixed =
        fixed_functions(*d->variant, l, upd_fixed_options(args), !l.backend->stream_capturing(args.stream));
    if (fixed.kernel) f = fixed;
  }
  launch_on(l, *d->variant, f, args);
}

KernelVariant select_upd(const UpdArgs& args, const std::string& arch) {
  return *decide_for(args, arch)->variant;
}

Explanation explain_upd(const UpdArgs& args, const std::string& arch) {
  return explanation_of(*decide_for(args, arch));
}

Explanation prepare_upd(const UpdArgs& args, int device) {
  const Layout layout = validate_upd(args);
  const Location l = prepare_location(args.p.x, device);
  const std::shared_ptr<const Decision> d = decide_loaded(upd_call(args, layout), l, /*with_reduce=*/false, nullptr);
  // A plan's fixed kernel too, so that a graph captured next can record it (plans load
  // nothing while their stream is capturing).
  if (env().upd_fixed) fixed_functions(*d->variant, l, upd_fixed_options(args), /*may_load=*/true);
  return explanation_of(*d);
}

bool upd_plan_fixes(const UpdArgs& args) {
  validate_upd(args);
  return env().upd_fixed;
}

void launch_upd(const KernelVariant& v, const UpdArgs& args, LaunchAs as) {
  const Layout layout = validate_upd(args);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  check_variant_serves(v, family, upd_family(args, layout, family));
  const int align = upd_alignment(args);
  if (align % v.align_bytes != 0)
    throw InvalidArgument("variant " + v.key + " needs x/out/conv_state base addresses and batch/token strides "
                          "aligned to " + std::to_string(v.align_bytes) + " bytes, the call gives " +
                          std::to_string(align));
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  const bool fixed = as == LaunchAs::plan && env().upd_fixed;
  launch_on(l, v, fixed ? load_fixed_functions(v, l, upd_fixed_options(args)) : functions_on(l, v, false), args);
}

// ---- UpdPlan ---------------------------------------------------------------

// The last decision and its kernels, and the fixed kernel the plan launches for them.
struct UpdPlan::Remembered : RememberedLaunch {
  RememberedFixed fixed;
};

UpdPlan::UpdPlan(const UpdArgs& args) : args_(args), remembered_(std::make_unique<Remembered>()) {}
UpdPlan::~UpdPlan() = default;

void UpdPlan::run(const UpdBuffers& b, void* stream) const {
  UpdArgs a = args_;
  a.p.x = b.x;
  a.p.weight = b.weight;
  a.p.bias = b.bias;
  a.p.conv_state = b.conv_state;
  a.p.cache_seqlens = b.cache_seqlens;
  a.p.conv_state_indices = b.conv_state_indices;
  a.p.num_accepted_tokens = b.num_accepted_tokens;
  a.p.out = b.out;
  a.stream = stream;
  const Layout layout = validate_upd(a);
  const Location l = locate(a.p.x);
  if (l.device < 0) throw_no_device(a.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = remembered_->get(upd_call(a, layout), l, &f);
  if (env().upd_fixed)
    f = remembered_->fixed.get(d, l, a.stream, optional_inputs(a.p), /*may_load=*/true, [&a] { return upd_fixed_options(a); }, f);
  launch_on(l, *d->variant, f, a);
}

}  // namespace cc1d
