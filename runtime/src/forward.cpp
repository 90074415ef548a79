// Forward entry points (cc1d.h): check, decide (dispatch.h), launch.
#include <atomic>

#include "cc1d/cc1d.h"
#include "dispatch.h"
#include "env.h"
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
  if (layout == Layout::channel_first) c.row_align = fwd_row_alignment(a, layout);
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
  const Dim3 grid = fwd_grid(a.p.seqlen, a.p.dim, a.p.batch, v, f, backend->max_grid(device));
  FwdParams params = a.p;
  backend->launch(f.kernel, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params, f.waits_for_previous);
}

// ---- fixed kernels ---------------------------------------------------------
// Forward plans launch a fixed kernel (dispatch.h; fwd_common.cuh.j2,
// CC1D_FWD_FIXED): dim, the activation, the optional inputs and the strides that
// batch and seqlen do not set, as constants; so one fixed kernel serves every batch
// and seqlen of a layer (a prefill of a new length compiles nothing new). A plan
// compiles it from its second run on, so a signature called once compiles nothing
// more; one loaded already (prepare_fwd loads it) serves from the first run.
// Channel-last plans, channel-first ones from width kCfFixedWidth and those with
// seq_idx (plans_fix); CC1D_FWD_GENERIC=1 turns them off.

// Which calls plans fix, measured on the H100 (fixed against generic in one process).
// Channel-last: 3-9 % faster at every shape tried, widths 4 and 8 (session 26).
// Channel-first: from 9 % slower at (1, 2048, 512) to 4 % faster with width 4, since
// its generic fast path already runs without bounds checks or seq_idx and the
// constants reorder its first loads; 17 % faster with width 8 (session 26), and
// session 28's widths 5-8 at the ANCHORS shapes in docs/DISPATCH.md.
// Channel-first calls with seq_idx too: only the fixed kernel has a full-tile path
// with sequence ids (fwd_cf_tiles.cuh.j2, cf_tile_full_seq); the generic one takes
// every tile through its checked edge path.
constexpr int kCfFixedWidth = 5;
bool plans_fix(Layout layout, const FwdArgs& args) {
  return env().fwd_fixed &&
         (layout == Layout::channel_last || args.width >= kCfFixedWidth || args.p.seq_idx != nullptr);
}

// Which optional inputs a call has: bias, seq_idx, initial_states, final_states.
unsigned optional_inputs(const FwdParams& p) {
  return (p.bias ? 1u : 0u) | (p.seq_idx ? 2u : 0u) | (p.initial_states ? 4u : 0u) | (p.final_states ? 8u : 0u);
}

}  // namespace

std::vector<std::string> fwd_fixed_options(const FwdArgs& args) {
  const Layout layout = validate_fwd(args);
  const FwdParams& p = args.p;
  std::vector<std::string> o{"-DCC1D_FWD_FIXED=1"};
  const auto def = [&o](const char* name, int64_t v) { add_fixed_define(o, name, v); };
  def("DIM", p.dim);
  def("W_DIM_STRIDE", p.w_dim_stride);
  def("W_WIDTH_STRIDE", p.w_width_stride);
  def("BIAS_STRIDE", p.bias_stride);
  def("SILU", p.silu);
  const unsigned inputs = optional_inputs(p);
  def("HAS_BIAS", inputs & 1u ? 1 : 0);
  def("HAS_SEQ_IDX", inputs & 2u ? 1 : 0);
  def("HAS_INITIAL_STATES", inputs & 4u ? 1 : 0);
  def("HAS_FINAL_STATES", inputs & 8u ? 1 : 0);
  // Along seqlen every layout's stride is a per-token pitch; across channels only
  // channel-last's is (channel-first's is a row's length: seqlen, for a contiguous x).
  def("X_L_STRIDE", p.x_l_stride);
  def("OUT_L_STRIDE", p.out_l_stride);
  if (layout == Layout::channel_last) {
    def("X_DIM_STRIDE", p.x_dim_stride);
    def("OUT_DIM_STRIDE", p.out_dim_stride);
  }
  if (p.seq_idx) def("SEQ_L_STRIDE", p.seq_l_stride);
  if (p.initial_states) {
    def("IS_BATCH_STRIDE", p.is_batch_stride);
    def("IS_DIM_STRIDE", p.is_dim_stride);
    def("IS_W_STRIDE", p.is_w_stride);
  }
  if (p.final_states) {
    def("FS_BATCH_STRIDE", p.fs_batch_stride);
    def("FS_DIM_STRIDE", p.fs_dim_stride);
    def("FS_W_STRIDE", p.fs_w_stride);
  }
  return o;
}

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
  const std::shared_ptr<const Decision> d = decide_loaded(fwd_call(args, layout), l, /*with_reduce=*/false, nullptr);
  // A plan's fixed kernel too, so that a graph captured next can record it (plans load
  // nothing while their stream is capturing).
  if (plans_fix(layout, args)) fixed_functions(*d->variant, l, fwd_fixed_options(args), /*may_load=*/true);
  return explanation_of(*d);
}

Explanation precompile_fwd(const FwdArgs& args, const std::string& arch) {
  const Layout layout = validate_fwd(args);
  if (arch.empty())
    throw InvalidArgument("arch must name the target to compile for (sm_90, gfx942, ...), got ''");
  return explanation_of(*decide_compiled(fwd_call(args, layout), arch_id_for(arch, args.p.x)));
}

bool fwd_plan_fixes(const FwdArgs& args) { return plans_fix(validate_fwd(args), args); }

void launch_fwd(const KernelVariant& v, const FwdArgs& args, LaunchAs as) {
  const Layout layout = validate_fwd(args);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  check_variant_serves(v, family, fwd_family(args, layout, family));
  check_variant_alignment(v, Op::fwd, layout, fwd_alignment(args, layout), fwd_row_alignment(args, layout));
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  const bool fixed = as == LaunchAs::plan && plans_fix(layout, args);
  launch_on(l, v, fixed ? load_fixed_functions(v, l, fwd_fixed_options(args)) : functions_on(l, v, false), args);
}

// ---- FwdPlan ---------------------------------------------------------------

// The last decision and its kernels, and the fixed kernel the plan launches for them.
struct FwdPlan::Remembered : RememberedLaunch {
  RememberedFixed fixed;
  std::atomic<bool> ran{false};  // run before: it may compile its fixed kernel
};

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
  if (plans_fix(layout, a)) {
    // A plain load once the plan has run: only its first run writes the flag.
    std::atomic<bool>& ran = remembered_->ran;
    const bool may_load = ran.load(std::memory_order_relaxed) || ran.exchange(true);
    f = remembered_->fixed.get(d, l, a.stream, optional_inputs(a.p), may_load, [&a] { return fwd_fixed_options(a); },
                               f);
  }
  launch_on(l, *d->variant, f, a);
}

}  // namespace cc1d
