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

}  // namespace cc1d
