// Kernel parameter blocks shared by the host runtime and the generated kernels.
//
// The same field order is spelled out in templates/prelude.cuh.j2; every field
// is 8 bytes wide so the layout is identical on both sides without padding
// rules to reason about. Sizes and strides are in elements, not bytes.
#pragma once
#include <cstdint>

namespace cc1d {

struct FwdParams {
  const void* x;               // (batch, dim, seqlen) viewed; one of the inner strides is 1
  const void* weight;          // (dim, width)
  const void* bias;            // (dim,) or nullptr
  const int32_t* seq_idx;      // (batch, seqlen) or nullptr; negative = padding token
  const void* initial_states;  // (batch, dim, width-1) or nullptr
  void* out;                   // same logical shape as x
  void* final_states;          // (batch, dim, width-1) or nullptr
  int64_t batch, dim, seqlen;
  int64_t x_batch_stride, x_dim_stride, x_l_stride;
  int64_t w_dim_stride, w_width_stride;
  int64_t bias_stride;
  int64_t out_batch_stride, out_dim_stride, out_l_stride;
  int64_t seq_batch_stride, seq_l_stride;
  int64_t is_batch_stride, is_dim_stride, is_w_stride;
  int64_t fs_batch_stride, fs_dim_stride, fs_w_stride;
  int64_t silu;                // 0 or 1
};

static_assert(sizeof(FwdParams) == 28 * 8, "FwdParams must stay 8-byte fields only");

// Backward: gradients of the forward above. Two kernels per variant share it:
// `cc1d_kernel` (grid: `splits` x channel groups) writes dx, dinitial_states and
// per-split fp32 partial sums of dweight/dbias; `cc1d_reduce` (one thread per
// (channel, tap)) sums the partials in split order into dweight/dbias, so the
// result is bitwise reproducible (no float atomics). With one split, on CUDA,
// cc1d_kernel writes dweight/dbias itself and cc1d_reduce is not launched.
struct BwdParams {
  const void* x;               // forward input, (batch, dim, seqlen) viewed
  const void* weight;          // (dim, width)
  const void* bias;            // (dim,) or nullptr (the pre-activation needs it with SiLU)
  const int32_t* seq_idx;      // (batch, seqlen) or nullptr
  const void* initial_states;  // (batch, dim, width-1) or nullptr
  const void* dout;            // gradient of out, x's logical shape, x's dtype
  const void* dfinal_states;   // (batch, dim, width-1) or nullptr
  void* dx;                    // x's logical shape and dtype
  void* dinitial_states;       // (batch, dim, width-1), x's dtype, or nullptr
  void* dweight;               // (dim, width), weight's dtype
  void* dbias;                 // (dim,), weight's dtype, or nullptr
  float* partials;             // workspace: [splits][dim][width + 1] fp32 (taps, then bias)
  int64_t batch, dim, seqlen;
  int64_t x_batch_stride, x_dim_stride, x_l_stride;
  int64_t w_dim_stride, w_width_stride;
  int64_t bias_stride;
  int64_t dout_batch_stride, dout_dim_stride, dout_l_stride;
  int64_t dx_batch_stride, dx_dim_stride, dx_l_stride;
  int64_t seq_batch_stride, seq_l_stride;
  int64_t is_batch_stride, is_dim_stride, is_w_stride;
  int64_t dfs_batch_stride, dfs_dim_stride, dfs_w_stride;
  int64_t dis_batch_stride, dis_dim_stride, dis_w_stride;
  int64_t dw_dim_stride, dw_width_stride;
  int64_t db_stride;
  int64_t silu;                // 0 or 1
  int64_t splits;              // gridDim.x of cc1d_kernel: rows of `partials`
};

static_assert(sizeof(BwdParams) == 43 * 8, "BwdParams must stay 8-byte fields only");

// Varlen prefill (causal_conv1d_varlen): packed sequences of one (dim, total_tokens)
// tensor, sequence i at tokens [cu_seqlens[i], cu_seqlens[i+1]). Two kernels
// (runtime/src/varlen.cpp): `cc1d_kernel` convolves the packed stream as one
// sequence (the forward's tiles; channel-last: the forward's kernel, launched with
// FwdParams; channel-first: takes VarlenParams and runs the forward's tiles, and
// with the tunable mend "tile" rewrites the first outputs of the sequences starting in
// them), then `cc1d_reduce`, grid (channel blocks, sequences), mends each sequence; no device
// value sizes a grid. max_seqlen is a host bound the kernels no longer need.
// Sequence i starts from the last width-1 columns of its state-pool row
// when has_initial_state[i] (zeros otherwise) and writes the last state_len inputs
// of (its old window, its tokens) back to that row. out == nullptr: states only
// (causal_conv1d_varlen_states: conv_states is then the (num_seqs, dim, state_len)
// result, cache_indices and has_initial_state null, weight unused).
struct VarlenParams {
  const void* x;                  // (dim, total_tokens) viewed; one of the two strides is 1
  const void* weight;             // (dim, width); unused when out is null
  const void* bias;               // (dim,) or nullptr
  const int32_t* cu_seqlens;      // (num_seqs + 1,)
  const int32_t* cache_indices;   // (num_seqs,) pool rows, or nullptr: sequence i uses row i
  const void* has_initial_state;  // (num_seqs,), his_bytes wide (1: bool/uint8, 4: int32), or nullptr: none
  void* conv_states;              // (pool, dim, state_len) in x's dtype, or nullptr
  void* out;                      // x's logical shape and layout, or nullptr (states only)
  int64_t num_seqs, dim, total_tokens, max_seqlen, state_len, pool, pad_slot_id, his_bytes;
  int64_t x_dim_stride, x_l_stride;
  int64_t w_dim_stride, w_width_stride;
  int64_t bias_stride;
  int64_t out_dim_stride, out_l_stride;
  int64_t cs_pool_stride, cs_dim_stride, cs_l_stride;
  int64_t cu_stride, ci_stride, his_stride;
  int64_t silu;                   // 0 or 1
};

static_assert(sizeof(VarlenParams) == 30 * 8, "VarlenParams must stay 8-byte fields only");
// Decode update (causal_conv1d_update): new tokens x against a state pool,
// the state updated in place. The kernels' copy of this struct is in
// templates/upd.cu.j2. Grid: (channel groups, batch row groups).
struct UpdParams {
  const void* x;                        // (batch, dim, seqlen) viewed, any strides
  const void* weight;                   // (dim, width)
  const void* bias;                     // (dim,) or nullptr
  void* conv_state;                     // (pool, dim, state_len), x's dtype, any strides; updated in place
  const int32_t* cache_seqlens;         // (batch,) or nullptr: circular buffer, written at cache_seqlens % state_len
  const int32_t* conv_state_indices;    // (batch,) or nullptr: the pool row of each batch row
  const int32_t* num_accepted_tokens;   // (batch,) or nullptr: speculative decoding (vLLM)
  void* out;                            // x's logical shape and dtype
  int64_t batch, dim, seqlen, state_len, pool;
  int64_t x_batch_stride, x_dim_stride, x_l_stride;
  int64_t w_dim_stride, w_width_stride;
  int64_t bias_stride;
  int64_t st_batch_stride, st_dim_stride, st_l_stride;
  int64_t out_batch_stride, out_dim_stride, out_l_stride;
  int64_t seqlens_stride, indices_stride, accepted_stride;
  int64_t pad_slot_id;                  // an index equal to it (or negative, or >= pool) is a padded row
  int64_t silu;                         // 0 or 1
};

static_assert(sizeof(UpdParams) == 30 * 8, "UpdParams must stay 8-byte fields only");

}  // namespace cc1d
