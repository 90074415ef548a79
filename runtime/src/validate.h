// Argument checks of the public entry points and the few facts derived from
// the arguments that dispatch needs (layout, family key, alignment).
#pragma once
#include <cstdint>
#include <string>

#include "cc1d/cc1d.h"

namespace cc1d {

enum class Layout : int { channel_first = 0, channel_last = 1 };

// Throws InvalidArgument / TypeMismatch naming the field, what was expected
// and what was given. Returns the layout the call uses.
Layout validate_fwd(const FwdArgs& a);

// "fwd.cl.bf16wf32.w4" written into `buf` (no allocation); returns its length.
constexpr std::size_t kFamilyBufSize = 32;
std::size_t family_key(const char* op, Layout layout, DType x_dtype, DType w_dtype, int width,
                       char (&buf)[kFamilyBufSize]);
std::size_t fwd_family(const FwdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]);

// Largest power of two (capped at 256) dividing the x and out base addresses
// and their batch and outer strides in bytes: the alignment a variant may assume.
int fwd_alignment(const FwdArgs& a, Layout layout);
// Channel-first: the largest power of two (capped at 256) dividing the byte offsets
// between each x row and its out row (base addresses, batch and channel strides): rows
// that lie alike against a vector of that many bytes, which a realigned build serves
// wherever they start (dispatch.h). Channel-last: fwd_alignment.
int fwd_row_alignment(const FwdArgs& a, Layout layout);

// The backward's checks (cc1d.h, causal_conv1d_bwd). `launching`: also check
// p.partials (non-null, 16-byte aligned); its size needs the variant and is
// checked where the variant is known. Returns the layout of x, dout and dx.
Layout validate_bwd(const BwdArgs& a, bool launching);
std::size_t bwd_family(const BwdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]);
// As fwd_alignment, over x, dout and dx.
int bwd_alignment(const BwdArgs& a, Layout layout);
// As fwd_row_alignment, over the offsets of dout's and dx's rows from x's.
int bwd_row_alignment(const BwdArgs& a, Layout layout);

// The varlen prefill's checks (cc1d.h, causal_conv1d_varlen). Returns x's layout.
Layout validate_varlen(const VarlenArgs& a);
std::size_t varlen_family(const VarlenArgs& a, Layout layout, char (&buf)[kFamilyBufSize]);
// As fwd_alignment, over x and out (out may be null).
int varlen_alignment(const VarlenArgs& a, Layout layout);
// The decode update's checks (cc1d.h, causal_conv1d_update). Returns conv_state's
// layout: channel_last when its dim stride is 1, else channel_first (any strides).
Layout validate_upd(const UpdArgs& a);
std::size_t upd_family(const UpdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]);
// As fwd_alignment, over conv_state, and x and out where their dim stride is 1
// (bases, batch and token strides of axes longer than 1).
int upd_alignment(const UpdArgs& a);

}  // namespace cc1d
