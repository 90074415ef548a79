// Backward entry points (cc1d.h): check, decide (dispatch.h, op "bwd"), size
// the workspace, launch cc1d_kernel then (with more than one split) cc1d_reduce on
// the caller's stream.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "cc1d/cc1d.h"
#include "dispatch.h"
#include "env.h"
#include "tuning_db.h"

namespace cc1d {

const std::vector<std::string>& bwd_seq_build_options() {
  static const std::vector<std::string> options{"-DCC1D_BWD_SEQ_TILES=1"};
  return options;
}

namespace {

// The kernels' contract (templates/bwd_*.j2). Constants and the variant's
// split_blocks, not device limits, so that splits (the partials' summation
// order) is the same on every device.
constexpr int64_t kMaxGroups = 65535;    // grid.y of cc1d_kernel; the kernel loops over further groups
constexpr unsigned kReduceThreads = 256; // block of cc1d_reduce: one thread per (channel, tap or bias)

int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

Call bwd_call(const BwdArgs& a, Layout layout) {
  const BwdParams& p = a.p;
  Call c;
  c.op = Op::bwd;
  c.layout = layout;
  c.x_dtype = a.x_dtype;
  c.w_dtype = a.w_dtype;
  c.width = a.width;
  c.batch = p.batch;
  c.dim = p.dim;
  c.seqlen = p.seqlen;
  // The forward's feature names: "final" is dfinal_states (the gradient of final_states).
  c.features = (p.bias ? kBias : 0u) | (p.silu ? kSilu : 0u) | (p.seq_idx ? kSeqIdx : 0u) |
               (p.initial_states ? kInit : 0u) | (p.dfinal_states ? kFinal : 0u);
  c.align = bwd_alignment(a, layout);
  if (layout == Layout::channel_first) c.row_align = bwd_row_alignment(a, layout);
  return c;
}

int64_t channel_groups(const BwdParams& p, const KernelVariant& v) {
  return std::min(ceil_div(p.dim, v.tile_d), kMaxGroups);
}

// Channel-first: max(1, min(items, ceil(split_blocks / groups))), items = batch *
// ceil(seqlen / tile_l) work items. Channel-last: max(1, min(items, floor(split_blocks /
// groups))), items as many blocks as keep a step per thread (tile_l = the block's
// threads along the sequence x step): its kernel cuts the work into equal ranges
// whatever the grid, and split_blocks is a whole number of waves of resident
// blocks, which the grid must not exceed (docs/DISPATCH.md).
int64_t splits_of(const BwdParams& p, const KernelVariant& v, Layout layout) {
  if (v.split_blocks < 1)
    throw InvalidArgument("variant " + v.key + ": split_blocks must be >= 1 for the backward, got " +
                          std::to_string(v.split_blocks));
  int64_t items = 0;
  if (__builtin_mul_overflow(p.batch, ceil_div(p.seqlen, v.tile_l), &items)) items = INT64_MAX;
  const int64_t groups = channel_groups(p, v);
  const int64_t per_group = layout == Layout::channel_last ? v.split_blocks / groups : ceil_div(v.split_blocks, groups);
  return std::max<int64_t>(1, std::min(items, per_group));
}

// splits * dim * (width + 1) fp32 partial sums.
size_t workspace_for(const BwdArgs& a, const KernelVariant& v, Layout layout) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(splits_of(a.p, v, layout)), uint64_t(a.p.dim), &bytes) ||
      __builtin_mul_overflow(bytes, uint64_t(a.width + 1) * 4u, &bytes) || bytes > SIZE_MAX)
    throw InvalidArgument("the backward's workspace (splits x dim x (width + 1) x 4 bytes) overflows for dim=" +
                          std::to_string(a.p.dim));
  return size_t(bytes);
}

void check_workspace(const BwdArgs& a, const KernelVariant& v, Layout layout) {
  const size_t need = workspace_for(a, v, layout);
  if (a.workspace_bytes < need)
    throw InvalidArgument("workspace_bytes must be >= " + std::to_string(need) + " (splits " +
                          std::to_string(splits_of(a.p, v, layout)) + " x dim " + std::to_string(a.p.dim) +
                          " x (width + 1) x 4 bytes, for variant " + v.key + "; see bwd_workspace_bytes), got " +
                          std::to_string(a.workspace_bytes));
}

// ---- seq_idx builds ----------------------------------------------------------
// Calls with seq_idx launch their variant's seq_idx build: the same source compiled
// with -DCC1D_BWD_SEQ_TILES=1, the only one whose full segments (channel-first) or
// steps (channel-last) read sequence ids. The plain build takes every such segment,
// and every channel-last step with a boundary, through its checked edge path, a
// position at a time (channel-first 3.1x the time without seq_idx on the H100,
// session 46; channel-last 3.3x on the H200, session 47), and stays as the tuner
// measured it. CC1D_BWD_GENERIC=1 turns it off; where the seq_idx build does not
// compile, the plain one serves (warned once).
bool seq_build(const BwdArgs& a) {
  return env().bwd_seq_build && a.p.seq_idx != nullptr;
}

// The last decision's seq_idx build, for eager calls (kept per process, like the
// dispatcher's memo; another decision looks its module up again).
RememberedFixed& remembered_seq_build() {
  static RememberedFixed remembered;
  return remembered;
}

std::shared_ptr<const Decision> decide_for(const BwdArgs& args, const std::string& arch) {
  const Layout layout = validate_bwd(args, /*launching=*/false);
  return decide(bwd_call(args, layout), arch_id_for(arch, args.p.x));
}

// ---- plans' fixed kernels ---------------------------------------------------
// A BwdPlan of a channel-last call launches its variant compiled once more with
// bwd_fixed_options (the call's dim, optional inputs and the strides batch and
// seqlen do not set as constants; bwd_common.cuh.j2, cc1d_bwd_fixed): 2-5 % faster
// than the generic kernel at the ANCHORS shapes on the H200 (session 54).
// Channel-first fixed kernels ran 10-25 % slower there, so channel-first plans
// launch what causal_conv1d_bwd does. CC1D_BWD_GENERIC=1 turns fixed kernels off.
bool plans_fix(Layout layout) { return env().bwd_fixed && layout == Layout::channel_last; }

// Which optional inputs and outputs a call has: bias, seq_idx, initial_states,
// dfinal_states, dinitial_states, dbias (the fixed kernel's HAS_* constants).
unsigned optional_buffers(const BwdParams& p) {
  return (p.bias ? 1u : 0u) | (p.seq_idx ? 2u : 0u) | (p.initial_states ? 4u : 0u) | (p.dfinal_states ? 8u : 0u) |
         (p.dinitial_states ? 16u : 0u) | (p.dbias ? 32u : 0u);
}

void launch_on(const Location& l, const KernelVariant& v, const Functions& f, const BwdArgs& a, Layout layout) {
  Backend* backend = l.backend;
  const Dim3 max = backend->max_grid(l.device);
  int64_t sums = 0;  // (channel, tap or bias) pairs: one thread each
  if (__builtin_mul_overflow(a.p.dim, int64_t(a.width + 1), &sums)) sums = INT64_MAX;
  const int64_t reduce_blocks = ceil_div(sums, kReduceThreads);
  if (reduce_blocks > int64_t(max.x))
    throw InvalidArgument("dim " + std::to_string(a.p.dim) + " is too large for cc1d_reduce's grid (" +
                          std::to_string(reduce_blocks) + " blocks > " + std::to_string(max.x) + ")");
  BwdParams params = a.p;
  params.splits = splits_of(a.p, v, layout);
  const Dim3 grid{unsigned(params.splits), unsigned(std::min<int64_t>(channel_groups(a.p, v), max.y)), 1};
  backend->launch(f.kernel, grid, Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), a.stream, &params,
                  sizeof params, f.waits_for_previous);
  // One split: cc1d_kernel wrote dweight/dbias itself where its module says so
  // (bwd_common.cuh.j2, bwd_store_split_sum).
  if (params.splits == 1 && f.writes_one_split_sums) return;
  // Same stream: sums once cc1d_kernel has written every split's partials (launched
  // early where the module's kernels wait for the previous grid on the device).
  backend->launch(f.reduce, Dim3{unsigned(reduce_blocks), 1, 1}, Dim3{kReduceThreads, 1, 1}, 0, a.stream, &params,
                  sizeof params, f.waits_for_previous);
}

}  // namespace

std::vector<std::string> bwd_fixed_options(const BwdArgs& args) {
  const Layout layout = validate_bwd(args, /*launching=*/false);
  if (layout != Layout::channel_last) return {};
  const BwdParams& p = args.p;
  std::vector<std::string> o{"-DCC1D_BWD_FIXED=1"};
  if (p.seq_idx) o.insert(o.end(), bwd_seq_build_options().begin(), bwd_seq_build_options().end());
  const auto def = [&o](const char* name, int64_t v) { add_fixed_define(o, name, v); };
  def("DIM", p.dim);
  def("W_DIM_STRIDE", p.w_dim_stride);
  def("W_WIDTH_STRIDE", p.w_width_stride);
  def("BIAS_STRIDE", p.bias_stride);
  def("DW_DIM_STRIDE", p.dw_dim_stride);
  def("DW_WIDTH_STRIDE", p.dw_width_stride);
  def("DB_STRIDE", p.db_stride);
  const unsigned buffers = optional_buffers(p);
  def("HAS_BIAS", buffers & 1u ? 1 : 0);
  def("HAS_SEQ_IDX", buffers & 2u ? 1 : 0);
  def("HAS_INITIAL_STATES", buffers & 4u ? 1 : 0);
  def("HAS_DFINAL_STATES", buffers & 8u ? 1 : 0);
  def("HAS_DINITIAL_STATES", buffers & 16u ? 1 : 0);
  def("HAS_DBIAS", buffers & 32u ? 1 : 0);
  // Channel-last: a token's pitch along seqlen, and 1 across channels.
  def("X_L_STRIDE", p.x_l_stride);
  def("DOUT_L_STRIDE", p.dout_l_stride);
  def("DX_L_STRIDE", p.dx_l_stride);
  def("X_DIM_STRIDE", p.x_dim_stride);
  def("DOUT_DIM_STRIDE", p.dout_dim_stride);
  def("DX_DIM_STRIDE", p.dx_dim_stride);
  if (p.seq_idx) def("SEQ_L_STRIDE", p.seq_l_stride);
  if (p.initial_states) {
    def("IS_BATCH_STRIDE", p.is_batch_stride);
    def("IS_DIM_STRIDE", p.is_dim_stride);
    def("IS_W_STRIDE", p.is_w_stride);
  }
  if (p.dfinal_states) {
    def("DFS_BATCH_STRIDE", p.dfs_batch_stride);
    def("DFS_DIM_STRIDE", p.dfs_dim_stride);
    def("DFS_W_STRIDE", p.dfs_w_stride);
  }
  if (p.dinitial_states) {
    def("DIS_BATCH_STRIDE", p.dis_batch_stride);
    def("DIS_DIM_STRIDE", p.dis_dim_stride);
    def("DIS_W_STRIDE", p.dis_w_stride);
  }
  return o;
}

bool bwd_plan_fixes(const BwdArgs& args) { return plans_fix(validate_bwd(args, /*launching=*/false)); }

void causal_conv1d_bwd(const BwdArgs& args) {
  const Layout layout = validate_bwd(args, /*launching=*/true);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(bwd_call(args, layout), l, /*with_reduce=*/true, &f);
  check_workspace(args, *d->variant, layout);
  if (seq_build(args))
    f = remembered_seq_build().get(d, l, args.stream, /*inputs=*/1u, /*may_load=*/true, bwd_seq_build_options, f,
                                   /*with_reduce=*/true);
  launch_on(l, *d->variant, f, args, layout);
}

size_t bwd_workspace_bytes(const BwdArgs& args, const std::string& arch) {
  const Call c = bwd_call(args, validate_bwd(args, /*launching=*/false));
  // On x's device, load what the call will: a tuned winner that does not
  // compile is dropped now, so the size is that of the variant that runs.
  if (arch.empty())
    if (const Location l = locate(args.p.x); l.device >= 0)
      return workspace_for(args, *decide_loaded(c, l, /*with_reduce=*/true, nullptr)->variant, c.layout);
  return workspace_for(args, *decide(c, arch_id_for(arch, args.p.x))->variant, c.layout);
}

KernelVariant select_bwd(const BwdArgs& args, const std::string& arch) {
  return *decide_for(args, arch)->variant;
}

Explanation explain_bwd(const BwdArgs& args, const std::string& arch) {
  return explanation_of(*decide_for(args, arch));
}

void launch_bwd(const KernelVariant& v, const BwdArgs& args, LaunchAs as) {
  const Layout layout = validate_bwd(args, /*launching=*/true);
  check_variant_shape(v);
  char family[kFamilyBufSize];
  check_variant_serves(v, family, bwd_family(args, layout, family));
  check_variant_alignment(v, Op::bwd, layout, bwd_alignment(args, layout), bwd_row_alignment(args, layout));
  check_workspace(args, v, layout);
  const Location l = locate(args.p.x);
  if (l.device < 0) throw_no_device(args.p.x);
  const bool fixed = as == LaunchAs::plan && plans_fix(layout);
  const bool seq = as == LaunchAs::plan && seq_build(args);
  launch_on(l, v,
            fixed ? load_fixed_functions(v, l, bwd_fixed_options(args), /*with_reduce=*/true)
            : seq ? load_fixed_functions(v, l, bwd_seq_build_options(), /*with_reduce=*/true)
                  : functions_on(l, v, /*with_reduce=*/true),
            args, layout);
}

Explanation prepare_bwd(const BwdArgs& args, int device) {
  const Layout layout = validate_bwd(args, /*launching=*/false);
  const Location l = prepare_location(args.p.x, device);
  const std::shared_ptr<const Decision> d = decide_loaded(bwd_call(args, layout), l, /*with_reduce=*/true, nullptr);
  // The seq_idx build and a plan's fixed kernel too, so that a graph captured next can
  // record them (plans load nothing while their stream is capturing).
  if (seq_build(args)) fixed_functions(*d->variant, l, bwd_seq_build_options(), /*may_load=*/true, true);
  if (plans_fix(layout)) fixed_functions(*d->variant, l, bwd_fixed_options(args), /*may_load=*/true, true);
  return explanation_of(*d);
}

// ---- BwdPlan ---------------------------------------------------------------

struct BwdPlan::Remembered {
  RememberedFixed fixed;
  std::atomic<bool> ran{false};  // run before: it may compile its fixed kernel
};

BwdPlan::BwdPlan(const BwdArgs& args) : args_(args), remembered_(std::make_unique<Remembered>()) {}
BwdPlan::~BwdPlan() = default;

void BwdPlan::run(const BwdBuffers& b, size_t workspace_bytes, void* stream) const {
  BwdArgs a = args_;
  BwdParams& p = a.p;
  p.x = b.x;
  p.weight = b.weight;
  p.bias = b.bias;
  p.seq_idx = b.seq_idx;
  p.initial_states = b.initial_states;
  p.dout = b.dout;
  p.dfinal_states = b.dfinal_states;
  p.dx = b.dx;
  p.dinitial_states = b.dinitial_states;
  p.dweight = b.dweight;
  p.dbias = b.dbias;
  p.partials = b.partials;
  a.workspace_bytes = workspace_bytes;
  a.stream = stream;
  const Layout layout = validate_bwd(a, /*launching=*/true);
  const Location l = locate(p.x);
  if (l.device < 0) throw_no_device(p.x);
  Functions f;
  const std::shared_ptr<const Decision> d = decide_loaded(bwd_call(a, layout), l, /*with_reduce=*/true, &f);
  check_workspace(a, *d->variant, layout);
  if (plans_fix(layout)) {
    // A plain load once the plan has run: only its first run writes the flag.
    std::atomic<bool>& ran = remembered_->ran;
    const bool may_load = ran.load(std::memory_order_relaxed) || ran.exchange(true);
    // Asked first, with no fallback: once the fixed kernel serves (it holds the seq_idx
    // build's option too), the process-wide seq_idx build below is not looked up.
    const Functions fixed = remembered_->fixed.get(d, l, a.stream, optional_buffers(p), may_load,
                                                   [&a] { return bwd_fixed_options(a); }, Functions{},
                                                   /*with_reduce=*/true);
    if (fixed.kernel) {
      launch_on(l, *d->variant, fixed, a, layout);
      return;
    }
  }
  if (seq_build(a))
    f = remembered_seq_build().get(d, l, a.stream, /*inputs=*/1u, /*may_load=*/true, bwd_seq_build_options, f,
                                   /*with_reduce=*/true);
  launch_on(l, *d->variant, f, a, layout);
}

}  // namespace cc1d
