// The dispatcher shared by the forward (forward.cpp) and backward
// (backward.cpp) entry points: which variant serves a call (tuning DBs along
// the lookup chain, else the default catalog), memoised per (op, arch, family,
// shape, features, alignment class); where x lives; a variant's kernels
// compiled (once) and loaded (once per context).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "cc1d/cc1d.h"
#include "validate.h"

namespace cc1d {

enum class Op : uint8_t { fwd = 0, bwd = 1, vfwd = 2, upd = 3 };

// Everything a decision depends on, whatever the op.
struct Call {
  Op op = Op::fwd;
  Layout layout = Layout::channel_first;
  DType x_dtype = DType::f32, w_dtype = DType::f32;
  int width = 0;
  int64_t batch = 0, dim = 0, seqlen = 0;
  unsigned features = 0;  // Feature bits (tuning_db.h)
  int align = 0;          // the call's alignment class in bytes (a power of two <= 256)
  // Channel-first forward and backward: how alike the rows of the tensors the kernel
  // walks with vectors lie (fwd_row_alignment: x and out; bwd_row_alignment: x, dout and
  // dx), which a realigned twin needs in place of `align`; other calls: 0 (unused).
  int row_align = 0;
};

// A forward call's Call (forward.cpp): its features from which pointers are set, its alignment class.
Call fwd_call(const FwdArgs& a, Layout layout);

// "fwd.cl.bf16wf32.w4" / "bwd.cf.f16wf16.w3" / "vfwd.cf.bf16wbf16.w4" for the call; returns its length.
std::size_t family_of(const Call& c, char (&buf)[kFamilyBufSize]);

// The realigned twin of a channel-first forward or backward variant (fwd_cf_tiles.cuh.j2
// CC1D_FWD_REALIGN, bwd_channel_first.cu.j2 CC1D_BWD_REALIGN): its source led by its op's
// define (kRealignDefine, kBwdRealignDefine), key + ".realign". It serves rows that start
// anywhere against its vectors (an odd seqlen's) where the rows it walks lie alike (x's
// and out's; x's, dout's and dx's): its align_bytes is then what Call::row_align must
// meet. The dispatcher picks a winner through its twin where only the row alignment
// meets it. Null for a variant with no realigned build (another op or layout, or a DB
// source rendered before it).
constexpr const char* kRealignDefine = "#define CC1D_FWD_REALIGN 1\n";
constexpr const char* kBwdRealignDefine = "#define CC1D_BWD_REALIGN 1\n";
std::shared_ptr<const KernelVariant> realigned_twin(const std::shared_ptr<const KernelVariant>& v);
bool is_realigned(const KernelVariant& v);

// The walk-cut build of a walked channel-first backward variant (bwd_channel_first.cu.j2
// CC1D_BWD_WALK_CUT): its source led by kBwdWalkCutDefine, key + ".walkcut". It serves the
// variant's aligned calls whose sequence's end cuts a segment (dispatch.cpp walk_cut): its
// walk takes that segment whole. Null for a variant with none (held segments, another op
// or layout, a DB source rendered before the build).
constexpr const char* kBwdWalkCutDefine = "#define CC1D_BWD_WALK_CUT 1\n";
std::shared_ptr<const KernelVariant> walk_cut_build(const std::shared_ptr<const KernelVariant>& v);
bool is_walk_cut(const KernelVariant& v);

struct Decision {
  std::shared_ptr<const KernelVariant> variant;
  std::string reason, source, matched_shape, arch, call_shape, detail;
  int alignment = 0;
  double distance = -1;
};

// The memoised decision for `c` on the arch `arch_id` (0: unknown, the catalog).
// Touches no compiler: a tuned winner not yet found broken (below) may be named.
std::shared_ptr<const Decision> decide(const Call& c, int arch_id);

// Changes whenever decisions made before may no longer hold (set_tuning_dbs,
// set_package_dir, clear_dispatch_cache, a tuned winner found broken): what a
// plan's remembered launch is checked against.
uint64_t dispatch_generation();

// Arch id to decide for: `arch` if given (checked to be a target), else the
// target of the device owning x, else 0 (unknown).
int arch_id_for(const std::string& arch, const void* x);

// Where x lives: the backend and device ordinal, or device < 0.
struct Location {
  Backend* backend = nullptr;
  int device = -1;
};
Location locate(const void* x);
[[noreturn]] void throw_no_device(const void* x);
int arch_id_of(const Location& l);  // remembered per device

// The variant's kernels in the device's current context: compiled (through
// the compile cache) and loaded on first use there. with_reduce: cc1d_reduce
// too (backward and varlen variants).
Functions functions_on(const Location& l, const KernelVariant& v, bool with_reduce);

// The decision for `c` with its variant's kernels ready: loaded on l's device
// (into *f unless f is null), or only compiled for the decision's arch (no device needed). A
// tuned winner whose source does not compile is broken for the rest of the
// process: warned once (DB file, variant, the compiler's first error), never
// chosen again, the decisions that used it forgotten, and `c` decided again.
// A catalog variant that does not compile throws the CompileError.
std::shared_ptr<const Decision> decide_loaded(const Call& c, const Location& l, bool with_reduce, Functions* f);
std::shared_ptr<const Decision> decide_compiled(const Call& c, int arch_id);

// A plan's last decision and its loaded kernels (FwdPlan, UpdPlan: ops without a
// cc1d_reduce kernel), reused while
// what they followed from holds: the call's features and alignment class, x's
// backend and device, the backend's module scope (CUDA: the current context)
// and the dispatcher's generation. Otherwise decide_loaded decides again and
// this remembers its answer. Thread-safe.
class RememberedLaunch {
 public:
  std::shared_ptr<const Decision> get(const Call& c, const Location& l, Functions* f);

 private:
  struct Launch {
    std::shared_ptr<const Decision> decision;  // null: nothing remembered
    Functions functions;
    uint64_t generation = 0;
    Backend* backend = nullptr;
    int device = -1;
    const void* scope = nullptr;
    unsigned features = 0;
    int align = 0, row_align = 0;
  };
  std::mutex mu_;
  Launch last_;  // guarded by mu_
};

// ---- fixed kernels ----------------------------------------------------------
// A plan's kernel can be its decision's source compiled once more with compiler
// options (-DCC1D_*_FIXED and -DCC1D_FIX_*: the plan's sizes, strides, activation
// and optional inputs as constants; fwd_fixed_options, upd_fixed_options). Its
// index arithmetic then folds and the paths the call cannot take drop out.

// Appends -DCC1D_FIX_<name>=<value> to a fixed kernel's options: any int64 (a
// pad_slot_id may be anything) as a literal of the kernels' cc1d_i64, which the
// templates' CC1D_*_FIXED blocks assign to their params.
void add_fixed_define(std::vector<std::string>& options, const char* name, int64_t value);

// The kernel of variant v built with `options` on l (and its cc1d_reduce with
// `with_reduce`): loaded there already (found), else compiled and loaded when
// `may_load` (counted in dispatch_stats().loads); {} when neither, or when it fails
// (warned once: the variant, the options and the compiler's first line).
Functions fixed_functions(const KernelVariant& v, const Location& l, const std::vector<std::string>& options,
                          bool may_load, bool with_reduce = false);

// fixed_functions that loads whenever it finds none, and throws (InvalidArgument,
// CompileError, BackendError) where fixed_functions warns.
Functions load_fixed_functions(const KernelVariant& v, const Location& l, const std::vector<std::string>& options,
                               bool with_reduce = false);

// A plan's fixed kernel for its last decision, module scope and set of optional
// inputs (bits, one per input the call has). One loaded already (by another plan or
// prepare_*) serves at once. Nothing is compiled or loaded where the caller says
// not yet (`may_load` false) or while the stream is capturing a graph: the generic
// kernel (loaded already) serves, and a later call looks again. The generic kernel
// also serves where the fixed one failed. Thread-safe.
class RememberedFixed {
 public:
  // options: a callable returning the fixed kernel's compiler options, called only
  // when the remembered kernel does not fit (the common call builds no strings).
  template <typename Options>
  Functions get(const std::shared_ptr<const Decision>& d, const Location& l, void* stream, unsigned inputs,
                bool may_load, Options&& options, const Functions& generic, bool with_reduce = false) {
    const void* scope = l.backend->module_scope(l.device);
    std::lock_guard<std::mutex> lock(mu_);
    if (d != decision_ || scope != scope_ || inputs != inputs_) {
      may_load = may_load && !l.backend->stream_capturing(stream);
      const Functions f = fixed_functions(*d->variant, l, options(), may_load, with_reduce);
      if (!f.kernel && !may_load) return generic;
      decision_ = d;
      scope_ = scope;
      inputs_ = inputs;
      fixed_ = f;
    }
    return fixed_.kernel ? fixed_ : generic;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<const Decision> decision_;  // guarded by mu_, as the three below
  const void* scope_ = nullptr;
  unsigned inputs_ = 0;
  Functions fixed_;  // kernel null: none (it failed), the generic one serves
};

unsigned grid_dim(int64_t n, int tile, unsigned max);
// A forward kernel's grid over `rows` positions, dim channels and batch: (chunks of
// tile_l rows, groups of tile_d channels, batch), or (groups, chunks, batch) where
// the module says so (Functions::cl_groups_first_grid). Each side is capped at max;
// the kernels loop over what the grid leaves.
Dim3 fwd_grid(int64_t rows, int64_t dim, int64_t batch, const KernelVariant& v, const Functions& f, Dim3 max);
Explanation explanation_of(const Decision& d);
// The device a prepare_* call loads for: x's, else `device`, else the current one.
Location prepare_location(const void* x, int device);
// A hand-made variant's geometry is sane (threads, tiles >= 1, ...).
void check_variant_shape(const KernelVariant& v);
// v's key starts with the call's family: "<family>.<params>".
void check_variant_serves(const KernelVariant& v, const char* family, std::size_t family_len);
// A forward's or backward's call meets v's alignment: `align` (the call's class, fwd_alignment /
// bwd_alignment) for a plain variant, `row_align` (fwd_row_alignment / bwd_row_alignment) and
// a channel-first layout for a realigned twin.
void check_variant_alignment(const KernelVariant& v, Op op, Layout layout, int align, int row_align);

}  // namespace cc1d
