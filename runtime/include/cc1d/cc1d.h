// cc1d public C++ API: causal depthwise conv1d kernels compiled at run time
// (NVRTC on NVIDIA, hipRTC on AMD) and launched on the caller's stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc1d/params.h"

namespace cc1d {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
const char* dtype_name(DType t);   // "f32", "f16", "bf16"
int dtype_size(DType t);           // 4, 2, 2

// ---- errors -------------------------------------------------------------
// Every failure is one of these; the Python layer maps them to
// ValueError / TypeError / RuntimeError.
struct Error : std::runtime_error { using std::runtime_error::runtime_error; };
struct InvalidArgument : Error { using Error::Error; };   // bad shape, stride, range  -> ValueError
struct TypeMismatch : Error { using Error::Error; };      // unsupported dtype combo    -> TypeError
struct CompileError : Error { using Error::Error; };      // message carries the compiler log
struct BackendError : Error { using Error::Error; };      // driver / library failure, no GPU, ...

// ---- kernel variants ----------------------------------------------------
// What the runtime needs to compile and launch one generated kernel. The
// generator (Python) produces these; the default catalog and the tuning DB
// store them. Forward grid = (ceil(seqlen/tile_l), ceil(dim/tile_d), batch),
// each clamped to the device limit (kernels loop over the remainder); the
// backward's two grids are described at causal_conv1d_bwd.
struct KernelVariant {
  std::string key;      // readable: fwd.cf.bf16wf32.w4.t128.v16.n2.r1.hreload, bwd.cl.f16wf32.w3...
  std::string hash;     // sha256 hex of `source`
  std::string source;   // complete translation unit, entry point `cc1d_kernel` (bwd: and `cc1d_reduce`)
  int threads = 0;      // threads per block (of cc1d_kernel)
  int tile_l = 0;       // sequence positions per block (bwd channel-first: per work item;
                        // channel-last: the block's threads along the sequence x step)
  int tile_d = 0;       // channels per block
  int smem_bytes = 0;   // dynamic shared memory per block
  int align_bytes = 1;  // x/out (bwd: x/dout/dx) base pointers and outer strides must be multiples of this (bytes)
  int split_blocks = 0; // bwd: cc1d_kernel blocks aimed at, which sets the split count (see
                        // causal_conv1d_bwd); >= 1 for the backward, 0 for other ops
};

// ---- forward ------------------------------------------------------------
struct FwdArgs {
  FwdParams p{};               // pointers, sizes, strides (elements), silu flag
  DType x_dtype = DType::f32;  // x, out, initial/final states
  DType w_dtype = DType::f32;  // weight and bias
  int width = 0;               // 2..8
  void* stream = nullptr;      // CUstream / hipStream_t; nullptr = default stream
};

// Checks the arguments (throws InvalidArgument / TypeMismatch naming the field),
// picks a kernel and launches it. No allocation or synchronisation once the
// kernel is compiled.
void causal_conv1d_fwd(const FwdArgs& args);

// The variant causal_conv1d_fwd would launch for these arguments. `arch`
// ("sm_90", "gfx942"): the device target to pick for; "" = the target of the
// device owning x (no device found: the default catalog). Needs no GPU when
// `arch` is given: no memory is touched.
KernelVariant select_fwd(const FwdArgs& args, const std::string& arch = "");

// ---- dispatch: which kernel, and why -------------------------------------
// Lookup chain (first hit wins): the DBs named by set_tuning_dbs, then those in
// CC1D_TUNING_DB (colon-separated), then the user's DB <cache dir>/tuning.db,
// then the shipped <package dir>/tuning_db/<arch>.db, then the default catalog.
// Exact (family, batch, dim, seqlen, features) winners are searched along the
// whole chain first; else the nearest tuned shape of the same family and
// features (smallest |ln(b*l) - ln(b'*l')| + |ln(d) - ln(d')|; ties go to the
// earlier DB) among entries whose align_bytes the call meets; else the catalog.
struct Explanation {
  KernelVariant variant;
  std::string reason;         // "exact" | "nearest" | "default"
  std::string source;         // DB file path, or "catalog"
  std::string matched_shape;  // the DB entry's shape key ("" for default)
  std::string arch;           // the target decided for ("" if unknown)
  std::string call_shape;     // the call as a shape key: b8.d2048.l512.bias.silu
  int alignment = 0;          // bytes the call's x/out pointers and strides are aligned to
  double distance = 0;        // nearest: the distance above; exact 0; default -1
  std::string detail;         // one line for humans: why not tuned, what was skipped
};
Explanation explain_fwd(const FwdArgs& args, const std::string& arch = "");

// Gets calls ready without running one (warm-up before CUDA-graph capture or
// a latency-bound loop): checks `args`, makes and memoises the dispatch
// decision a causal_conv1d_fwd call with these arguments makes, compiles the
// kernel (compile cache) and loads it into the device's current context.
// Launches nothing and never touches the memory `args` points to: only the
// pointers' and strides' alignment matters, so stand-in addresses with the
// alignment of the real buffers do (a fresh cudaMalloc is 256-byte aligned).
// `device`: the ordinal to load for; -1 = the device owning args.p.x if it is
// device memory, else the calling thread's current device (device 0 if none).
// An explicit device must be the current one if a context is current (kernels
// load into the current context). Afterwards, calls with the same sizes,
// dtypes, width, features (bias, silu, seq_idx, states) and alignment class
// compile, load, allocate and synchronise nothing: they can be captured (until
// set_tuning_dbs, set_package_dir or clear_dispatch_cache forget decisions).
// Returns the decision, as explain_fwd does. Throws BackendError without a GPU.
//
// A tuned winner whose source does not compile (the DB's fault) is not used
// for the rest of the process: one warning names the DB file, the variant and
// the compiler's first error, and the call (this one, or causal_conv1d_fwd's)
// takes the next choice (another tuned entry, else the catalog), which
// explain_fwd reports from then on. A catalog kernel that does not compile
// throws CompileError.
// It loads the decision's fixed kernel for FwdPlan too (channel-last calls,
// channel-first ones of width 5-8 or with seq_idx;
// fwd_fixed_options; not with CC1D_FWD_GENERIC=1).
Explanation prepare_fwd(const FwdArgs& args, int device = -1);

// prepare_fwd for a target instead of a device: decides for `arch` (required)
// and compiles the kernel into the compile cache (memory and disk), loading
// nothing and needing no GPU, e.g. to fill the disk cache ahead of time.
// Tuned winners that do not compile are handled as in prepare_fwd.
Explanation precompile_fwd(const FwdArgs& args, const std::string& arch);

// Process-wide counters, for checking that a warm-up covered what followed:
// a call that adds to either did work a CUDA-graph capture cannot hold.
struct DispatchStats {
  uint64_t decisions = 0;  // dispatch decisions computed (memo misses, explain_fwd included)
  uint64_t loads = 0;      // kernels loaded into a context (each after a compile-cache lookup; fixed ones too)
  uint64_t compiles = 0;   // compiler invocations (compile-cache misses in memory and on disk)
  uint64_t corrupt_cache_files = 0;  // disk-cache files that failed their hash check (then rebuilt)
};
DispatchStats dispatch_stats();

// DBs searched before CC1D_TUNING_DB and the user's DB; replaces the previous list.
void set_tuning_dbs(const std::vector<std::string>& paths);
// Folder holding tuning_db/<arch>.db (the Python package sets its own; C++
// users may set it, or CC1D_PACKAGE_DIR).
void set_package_dir(const std::string& dir);
// Forgets memoised decisions and loaded DBs (tests; after rewriting a DB file).
// Tuned winners found not to compile stay excluded (by arch and source hash:
// the same source will not compile any better).
void clear_dispatch_cache();

// Which of a variant's kernels launch_fwd and launch_upd run: the generic one (the
// one causal_conv1d_fwd / causal_conv1d_update launch), or the one a plan (FwdPlan,
// UpdPlan) for such calls launches: its fixed kernel where the plan fixes
// (fwd_plan_fixes, upd_plan_fixes), else the generic one. The tuner times the plan's,
// so that it ranks what users' calls run.
enum class LaunchAs { generic, plan };

// Launches exactly this variant (the tuner and the tests use it; same compile
// cache and launch path as causal_conv1d_fwd). Throws InvalidArgument if the
// call breaks the variant's stated requirements; as a plan, throws CompileError
// where the fixed kernel does not compile (a plan would warn and launch the
// generic one).
void launch_fwd(const KernelVariant& v, const FwdArgs& args, LaunchAs as = LaunchAs::generic);
// Whether a FwdPlan for calls like `args` launches fixed kernels: channel-last
// calls, channel-first ones of width 5-8 and channel-first ones with seq_idx,
// unless CC1D_FWD_GENERIC=1.
bool fwd_plan_fixes(const FwdArgs& args);
// The compiler options (-D...) of a forward plan's fixed kernel for calls like `args`:
// dim, the activation, which optional inputs (bias, seq_idx, initial_states,
// final_states) it has, and the strides batch and seqlen do not set (along seqlen;
// across channels too in the channel-last layout), as constants.
std::vector<std::string> fwd_fixed_options(const FwdArgs& args);

// The per-call part of a forward call: its buffers (FwdParams' pointers).
struct FwdBuffers {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const int32_t* seq_idx = nullptr;
  const void* initial_states = nullptr;
  void* out = nullptr;
  void* final_states = nullptr;
};

// Repeated forward calls of one kind (sizes, strides, dtypes, width, silu),
// for latency-bound loops: run(buffers, stream) is causal_conv1d_fwd with
// `args`' non-pointer fields and these buffers, same checks, same kernel.
// It remembers its last decision and loaded kernel and reuses them while the
// buffers' features (which are null) and alignment class, the backend's
// module scope (CUDA: the current context) and the dispatcher's state (tuning
// DBs, clear_dispatch_cache) are unchanged: a repeated call checks its
// arguments, locates x and launches, skipping the dispatcher's memo and the
// module lookup. A channel-last plan (a channel-first one from width 5) launches
// the variant's fixed kernel
// (fwd_fixed_options: dim and the strides batch and seqlen do not set, compiled
// in), compiled and loaded from its second run on, outside stream capture
// (prepare_fwd loads it too); the generic kernel on its first run, while none is
// loaded, if it fails, for channel-first calls of width 2-4, or with
// CC1D_FWD_GENERIC=1.
// Thread-safe; not copyable.
class FwdPlan {
 public:
  explicit FwdPlan(const FwdArgs& args);  // args.p's pointers and args.stream are not used
  ~FwdPlan();
  FwdPlan(const FwdPlan&) = delete;
  FwdPlan& operator=(const FwdPlan&) = delete;
  void run(const FwdBuffers& buffers, void* stream) const;

 private:
  struct Remembered;
  FwdArgs args_;
  std::unique_ptr<Remembered> remembered_;
};

// ---- backward -----------------------------------------------------------
// Gradients of causal_conv1d_fwd: dx (and dinitial_states) from dout, plus
// dweight (and dbias). Variants are of family bwd.<cf|cl>.<x>w<w>.w<width>
// and come from the same catalog and tuning-DB chain as the forward's.
struct BwdArgs {
  BwdParams p{};               // pointers, sizes, strides (elements), silu; p.splits is set by the runtime
  DType x_dtype = DType::f32;  // x, dout, dx, initial_states, dfinal_states, dinitial_states
  DType w_dtype = DType::f32;  // weight, bias, dweight, dbias
  int width = 0;               // 2..8
  size_t workspace_bytes = 0;  // bytes at p.partials (caller-allocated device memory, 16-byte aligned)
  void* stream = nullptr;      // CUstream / hipStream_t; nullptr = default stream
};

// Checks the arguments (InvalidArgument / TypeMismatch naming the field), picks
// a variant as causal_conv1d_fwd does (memoised; features: bias, silu, seqidx,
// init = initial_states given, final = dfinal_states given; alignment of x,
// dout and dx) and launches, on `stream`, its kernels:
//   cc1d_kernel: grid (splits, min(ceil(dim/tile_d), 65535)), `threads` threads;
//     writes dx, dinitial_states and per-split fp32 partial sums of dweight/dbias
//     into p.partials ([splits][dim][width + 1]);
//   cc1d_reduce: grid ceil(dim*(width+1)/256) of 256 threads; sums the partials
//     in split order into dweight (and dbias if given). With splits == 1 on
//     CUDA it is not launched: cc1d_kernel writes dweight and dbias itself (the
//     workspace is required all the same).
// splits = max(1, min(batch*ceil(seqlen/tile_l), ceil(split_blocks/min(ceil(dim/tile_d), 65535))))
// (channel-last: floor instead of ceil, so the grid stays within split_blocks)
// (split_blocks: the variant's tunable partial-sum layout) depends on the variant only, never on the device, and there are no float
// atomics: for one variant the results are bitwise reproducible.
// Requirements beyond the forward's: x, dout and dx share one layout; dx
// overlaps neither x nor dout (the kernel reads their neighbours after writing
// dx); dinitial_states only with initial_states, dbias only with bias; p.partials
// non-null, 16-byte aligned, workspace_bytes >= bwd_workspace_bytes(args).
// Allocates and synchronises nothing once the kernels are loaded.
void causal_conv1d_bwd(const BwdArgs& args);

// Bytes of p.partials the call needs: splits * dim * (width + 1) * 4 for the
// variant causal_conv1d_bwd would pick (the same memoised decision; `arch` as
// in select_fwd). p.partials and workspace_bytes are not looked at, so call it
// before allocating the workspace; pass the real x, dout and dx (their
// alignment picks the variant). Needs no GPU when `arch` is given. With arch
// "" and x in device memory it also compiles and loads the kernels, as
// prepare_bwd does, so a tuned winner that does not compile is replaced before
// its workspace is sized.
size_t bwd_workspace_bytes(const BwdArgs& args, const std::string& arch = "");

// The variant causal_conv1d_bwd would launch, and why (as select_fwd and
// explain_fwd; p.partials and workspace_bytes are not looked at).
KernelVariant select_bwd(const BwdArgs& args, const std::string& arch = "");
Explanation explain_bwd(const BwdArgs& args, const std::string& arch = "");

// The backward's prepare_fwd: decide, compile and load both kernels without
// launching or touching memory (the workspace is not needed), so that later
// causal_conv1d_bwd calls of this kind can be captured in a CUDA graph.
Explanation prepare_bwd(const BwdArgs& args, int device = -1);

// Launches exactly this variant's kernels (tests, tuner). Its workspace
// need is splits * dim * (width + 1) * 4 bytes with this variant's tiles.
// LaunchAs::plan launches what a BwdPlan would for this variant (CompileError
// where that does not compile), unless CC1D_BWD_GENERIC=1: for channel-last calls
// its fixed kernel (bwd_fixed_options); for channel-first calls with seq_idx its
// seq_idx build (the source compiled with -DCC1D_BWD_SEQ_TILES=1: full segments
// that read sequence ids); else the plain build.
void launch_bwd(const KernelVariant& v, const BwdArgs& args, LaunchAs as = LaunchAs::generic);

// The compiler options of a variant's seq_idx build ({"-DCC1D_BWD_SEQ_TILES=1"}):
// what calls with seq_idx run, and so what the tuner timed for shapes with seq_idx.
const std::vector<std::string>& bwd_seq_build_options();

// The compiler options of a backward plan's fixed kernel for such calls: for a
// channel-last call -DCC1D_BWD_FIXED=1 (with seq_idx also the seq_idx build's)
// and dim, the optional inputs and outputs and the strides batch and seqlen do
// not set as constants; empty for a channel-first call, whose plans launch no
// fixed kernel. Checks the arguments as select_bwd does.
std::vector<std::string> bwd_fixed_options(const BwdArgs& args);

// Whether backward plans for such calls launch fixed kernels (channel-last; not
// with CC1D_BWD_GENERIC=1).
bool bwd_plan_fixes(const BwdArgs& args);

// A backward call's buffers (BwdParams' pointers, in its order).
struct BwdBuffers {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const int32_t* seq_idx = nullptr;
  const void* initial_states = nullptr;
  const void* dout = nullptr;
  const void* dfinal_states = nullptr;
  void* dx = nullptr;
  void* dinitial_states = nullptr;
  void* dweight = nullptr;
  void* dbias = nullptr;
  float* partials = nullptr;
};

// Repeated backward calls of one kind (sizes, strides, dtypes, width, silu), as
// in training steps: run(buffers, workspace_bytes, stream) is causal_conv1d_bwd
// with `args`' non-pointer fields and these buffers, same checks, same variant.
// A channel-last plan launches the variant's fixed kernel (bwd_fixed_options),
// compiled and loaded from its second run on, outside stream capture
// (prepare_bwd loads it too); the generic kernel on its first run, while none is
// loaded, if it fails, for channel-first calls, or with CC1D_BWD_GENERIC=1. Both
// give the same bits. Thread-safe; not copyable.
class BwdPlan {
 public:
  explicit BwdPlan(const BwdArgs& args);  // args.p's pointers, workspace_bytes and stream are not used
  ~BwdPlan();
  BwdPlan(const BwdPlan&) = delete;
  BwdPlan& operator=(const BwdPlan&) = delete;
  void run(const BwdBuffers& buffers, size_t workspace_bytes, void* stream) const;

 private:
  struct Remembered;
  BwdArgs args_;
  std::unique_ptr<Remembered> remembered_;
};

// ---- varlen prefill (serving engines: packed sequences and a state pool) ----
// x (dim, total_tokens) packs num_seqs sequences, sequence i at tokens
// [cu_seqlens[i], cu_seqlens[i+1]) (cu_seqlens[0] = 0, non-decreasing, last =
// total_tokens). Each is convolved alone: its inputs before its first token are
// the last width-1 columns of conv_states[row] when has_initial_state[i] (zeros
// otherwise), row = cache_indices[i] (or i without cache_indices); afterwards
// conv_states[row] holds the last state_len inputs of (the old state_len columns,
// or zeros without an initial state, then the sequence's tokens): a sequence
// shorter than state_len keeps the newest old columns in front. A row equal to
// pad_slot_id, negative or >= pool marks a padded sequence: its output is zero
// and no state is read or written. Variants are of family vfwd.<cf|cl>.<x>w<w>.w<width>.
//
// Device values (cu_seqlens, cache_indices, has_initial_state) are never read
// on the host: the grid is (chunks, min(ceil(dim/tile_d), 65535),
// min(num_seqs, 65535)) with chunks from the host bound p.max_seqlen (> 0: the
// caller's bound on the longest sequence; 0: total_tokens), so calls allocate and
// synchronise nothing and can be captured in a CUDA graph. cu_seqlens values
// are clamped into [0, total_tokens]; a sequence longer than max_seqlen has its
// tail left unwritten; two sequences sharing a pool row race (as in every engine).
// p.out == nullptr: states only (causal_conv1d_varlen_states): conv_states is the
// (num_seqs, dim, state_len) result, cache_indices and has_initial_state must be
// null and weight is not read (width only names the family).
struct VarlenArgs {
  VarlenParams p{};            // pointers, sizes, strides (elements), silu
  DType x_dtype = DType::f32;  // x, out, conv_states
  DType w_dtype = DType::f32;  // weight and bias
  int width = 0;               // 2..8
  void* stream = nullptr;      // CUstream / hipStream_t; nullptr = default stream
};

// Checks (InvalidArgument / TypeMismatch naming the field), decides as
// causal_conv1d_fwd does (memoised; shape: batch = num_seqs, seqlen =
// total_tokens; features bias, silu, init = has_initial_state given, final =
// conv_states given) and launches cc1d_kernel on `stream`.
void causal_conv1d_varlen(const VarlenArgs& args);
KernelVariant select_varlen(const VarlenArgs& args, const std::string& arch = "");
Explanation explain_varlen(const VarlenArgs& args, const std::string& arch = "");
// As prepare_fwd: decide, compile and load, launching nothing (graph capture warm-up).
Explanation prepare_varlen(const VarlenArgs& args, int device = -1);
// Launches exactly this variant (tests, tuner).
void launch_varlen(const KernelVariant& v, const VarlenArgs& args);
// ---- decode update ----------------------------------------------------------
// causal_conv1d_update: for each batch row b (its state: pool row
// conv_state_indices[b], else b), the outputs of x's seqlen new tokens given the
// width-1 previous inputs held in the state, and the state moved on in place:
//   default (the peer's): the window is the state's last width-1 entries; the
//     state becomes the last state_len entries of cat(state, x).
//   cache_seqlens: a circular buffer; the window ends just before position
//     cache_seqlens[b] % state_len and token t is written at (cache_seqlens[b] + t) % state_len.
//   num_accepted_tokens (vLLM's speculative decoding; a = num_accepted_tokens[b],
//     clamped to [1, min(seqlen, state_len - width + 2)]): the window is
//     state[a-1 .. a+width-3]; the state becomes state[a .. a+state_len-seqlen-1] then x.
// A row whose index equals pad_slot_id, is negative or is >= pool is padding:
// its outputs are 0 and no state is read or written. Rows naming one slot run
// one after another in batch order (each sees the state the previous left).
// Variants: family upd.<cf|cl>.<x>w<w>.w<width>; the layout is conv_state's
// (cl: st_dim_stride == 1). Dispatch features: bias, silu, pool (conv_state_indices),
// wstate (state_len == width).
struct UpdArgs {
  UpdParams p{};               // pointers, sizes, strides (elements), pad_slot_id, silu
  DType x_dtype = DType::f32;  // x, out, conv_state
  DType w_dtype = DType::f32;  // weight and bias
  int width = 0;               // 2..8
  void* stream = nullptr;
};

// Checks (InvalidArgument / TypeMismatch naming the field), decides (memoised)
// and launches one kernel: the variant's generic kernel, except for a one-token step
// on states of width entries (state_len == width, no cache_seqlens or
// num_accepted_tokens), which takes the fixed kernel an UpdPlan launches (its batched
// step; compiled on the first such call of a signature). Allocates and synchronises
// nothing once loaded. cache_seqlens and num_accepted_tokens exclude each other; out
// must not overlap x or conv_state.
void causal_conv1d_update(const UpdArgs& args);
KernelVariant select_upd(const UpdArgs& args, const std::string& arch = "");
Explanation explain_upd(const UpdArgs& args, const std::string& arch = "");
Explanation prepare_upd(const UpdArgs& args, int device = -1);
// launch_fwd's counterpart (LaunchAs::plan: the plan's fixed kernel, upd_fixed_options).
void launch_upd(const KernelVariant& v, const UpdArgs& args, LaunchAs as = LaunchAs::generic);
// Whether an UpdPlan launches fixed kernels: always, unless CC1D_UPD_GENERIC=1.
bool upd_plan_fixes(const UpdArgs& args);
// The compiler options (-D...) of an update plan's fixed kernel for calls like `args`:
// every size and stride but batch and pool, the activation, and which optional inputs
// (bias, cache_seqlens, conv_state_indices, num_accepted_tokens) it has, as constants.
std::vector<std::string> upd_fixed_options(const UpdArgs& args);

// The per-call part of an update call: its buffers (UpdParams' pointers).
struct UpdBuffers {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* conv_state = nullptr;
  const int32_t* cache_seqlens = nullptr;
  const int32_t* conv_state_indices = nullptr;
  const int32_t* num_accepted_tokens = nullptr;
  void* out = nullptr;
};

// Repeated update calls of one kind, as FwdPlan is for the forward: run(buffers,
// stream) is causal_conv1d_update with `args`' non-pointer fields and these
// buffers, same checks, same variant, reusing its last decision and loaded
// kernel while the buffers' features (bias, conv_state_indices present) and
// alignment class, the module scope and the dispatcher's state are unchanged.
// It launches the variant's fixed kernel (upd_fixed_options: these sizes and
// strides compiled in), compiled and loaded on first use outside stream capture
// (prepare_upd loads it too); the generic kernel while none is loaded, if it
// fails, or with CC1D_UPD_GENERIC=1. Thread-safe; not copyable.
class UpdPlan {
 public:
  explicit UpdPlan(const UpdArgs& args);  // args.p's pointers and args.stream are not used
  ~UpdPlan();
  UpdPlan(const UpdPlan&) = delete;
  UpdPlan& operator=(const UpdPlan&) = delete;
  void run(const UpdBuffers& buffers, void* stream) const;

 private:
  struct Remembered;
  UpdArgs args_;
  std::unique_ptr<Remembered> remembered_;
};

// ---- compilation without a GPU -------------------------------------------
struct CompileResult {
  std::vector<uint8_t> binary;  // CUBIN (NVIDIA) or code object (AMD)
  std::string log;              // compiler log (warnings, resource usage)
};
// target: "sm_90", "sm_80", ... (NVRTC) or "gfx942", "gfx90a", ... (hipRTC).
// Goes through the memory + disk compile cache. Throws CompileError with the log.
CompileResult compile(const std::string& source, const std::string& target,
                      const std::vector<std::string>& extra_options = {});

// Version string of the compiler for a target's vendor, e.g. "nvrtc 13.0".
std::string compiler_version(const std::string& target);

// Target of a visible device, e.g. "sm_90" or "gfx942"; throws BackendError
// when that vendor or device is absent.
std::string device_target(const std::string& vendor, int device);

// ---- diagnostics ----------------------------------------------------------
// Warnings (corrupt cache file, unwritable cache dir, ...) go to this handler;
// default: stderr with a "cc1d: " prefix. An empty function restores it.
void set_log_handler(std::function<void(const std::string&)> handler);

}  // namespace cc1d
