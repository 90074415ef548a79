#include "validate.h"

#include <cstdio>
#include <cstring>

namespace cc1d {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

void require_positive(const char* name, int64_t v) {
  if (v < 1) throw InvalidArgument(std::string(name) + " must be >= 1, got " + str(v));
}

void require_non_negative(const char* name, int64_t v) {
  if (v < 0) throw InvalidArgument(std::string(name) + " must be >= 0 (negative strides are not supported), got " + str(v));
}

// Largest element offset reached by a tensor, checked against int64 overflow
// in bytes (the kernels index with 64-bit offsets). Returns the bytes from the
// base address to the end of the last element.
int64_t check_extent(const char* tensor, std::initializer_list<std::pair<int64_t, int64_t>> size_stride,
                     int esize) {
  int64_t last = 0;
  for (auto [size, stride] : size_stride) {
    int64_t t = 0;
    if (__builtin_mul_overflow(size - 1, stride, &t) || __builtin_add_overflow(last, t, &last))
      throw InvalidArgument(std::string(tensor) + ": offset of the last element overflows int64");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(last + 1, int64_t(esize), &bytes))
    throw InvalidArgument(std::string(tensor) + ": extent in bytes overflows int64");
  return bytes;
}

void check_aligned(const char* name, const void* p, int esize) {
  if (reinterpret_cast<uintptr_t>(p) % uintptr_t(esize) != 0)
    throw InvalidArgument(std::string(name) + " must be aligned to its element size (" + str(esize) +
                          " bytes), got address " + ptr_str(p));
}

int low_bit_cap(uint64_t v, int cap) {
  if (v == 0) return cap;
  uint64_t b = v & (~v + 1);
  return b >= uint64_t(cap) ? cap : int(b);
}

// The checks every op shares: the dtype pair and the width.
void check_dtypes_width(DType x_dtype, DType w_dtype, int width) {
  const int xd = int(x_dtype), wd = int(w_dtype);
  if (xd < 0 || xd > 2) throw TypeMismatch("x_dtype must be 0 (f32), 1 (f16) or 2 (bf16), got " + str(xd));
  if (wd < 0 || wd > 2) throw TypeMismatch("w_dtype must be 0 (f32), 1 (f16) or 2 (bf16), got " + str(wd));
  if (w_dtype != x_dtype && w_dtype != DType::f32)
    throw TypeMismatch(std::string("weight dtype must equal x dtype (") + dtype_name(x_dtype) +
                       ") or be f32, got " + dtype_name(w_dtype));
  if (width < 2 || width > 8) throw InvalidArgument("width must be in [2, 8], got " + str(width));
}

// ... and, for the ops over (batch, dim, seqlen), the sizes.
void check_dtypes_sizes(DType x_dtype, DType w_dtype, int width, int64_t batch, int64_t dim, int64_t seqlen) {
  check_dtypes_width(x_dtype, w_dtype, width);
  require_positive("batch", batch);
  require_positive("dim", dim);
  require_positive("seqlen", seqlen);
}

// Byte ranges [base, base + bytes) that intersect. Conservative for strided
// tensors (interleaved ones that share no element are refused too).
void check_disjoint(const char* a, const void* pa, int64_t a_bytes, const char* b, const void* pb,
                    int64_t b_bytes, const char* why) {
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(pa), b0 = reinterpret_cast<uintptr_t>(pb);
  const uintptr_t a1 = a0 + uintptr_t(a_bytes), b1 = b0 + uintptr_t(b_bytes);
  if (a0 < b1 && b0 < a1)
    throw InvalidArgument(std::string(a) + " must not overlap " + b + " (" + why + "): " + a + " spans [" +
                          ptr_str(pa) + ", " + ptr_str(reinterpret_cast<const void*>(a1)) + "), " + b + " [" +
                          ptr_str(pb) + ", " + ptr_str(reinterpret_cast<const void*>(b1)) + ")");
}

}  // namespace

Layout validate_fwd(const FwdArgs& a) {
  const FwdParams& p = a.p;
  check_dtypes_sizes(a.x_dtype, a.w_dtype, a.width, p.batch, p.dim, p.seqlen);
  if (!p.x) throw InvalidArgument("x must not be null");
  if (!p.weight) throw InvalidArgument("weight must not be null");
  if (!p.out) throw InvalidArgument("out must not be null");
  if (p.silu != 0 && p.silu != 1) throw InvalidArgument("silu must be 0 or 1, got " + str(p.silu));

  const int xs = dtype_size(a.x_dtype), ws = dtype_size(a.w_dtype);
  Layout layout;
  if (p.x_l_stride == 1) {
    layout = Layout::channel_first;
    if (p.out_l_stride != 1)
      throw InvalidArgument("out_l_stride must be 1 like x_l_stride (channel-first layout), got " + str(p.out_l_stride));
  } else if (p.x_dim_stride == 1) {
    layout = Layout::channel_last;
    if (p.out_dim_stride != 1)
      throw InvalidArgument("out_dim_stride must be 1 like x_dim_stride (channel-last layout), got " +
                            str(p.out_dim_stride));
  } else {
    throw InvalidArgument("x must have x_l_stride == 1 (channel-first) or x_dim_stride == 1 (channel-last), got "
                          "x_dim_stride=" + str(p.x_dim_stride) + ", x_l_stride=" + str(p.x_l_stride));
  }
  require_non_negative("x_batch_stride", p.x_batch_stride);
  require_non_negative("x_dim_stride", p.x_dim_stride);
  require_non_negative("x_l_stride", p.x_l_stride);
  require_non_negative("out_batch_stride", p.out_batch_stride);
  require_non_negative("out_dim_stride", p.out_dim_stride);
  require_non_negative("out_l_stride", p.out_l_stride);
  require_non_negative("w_dim_stride", p.w_dim_stride);
  require_non_negative("w_width_stride", p.w_width_stride);
  check_aligned("x", p.x, xs);
  check_aligned("out", p.out, xs);
  check_aligned("weight", p.weight, ws);
  const int64_t x_bytes =
      check_extent("x", {{p.batch, p.x_batch_stride}, {p.dim, p.x_dim_stride}, {p.seqlen, p.x_l_stride}}, xs);
  const int64_t out_bytes =
      check_extent("out", {{p.batch, p.out_batch_stride}, {p.dim, p.out_dim_stride}, {p.seqlen, p.out_l_stride}}, xs);
  check_extent("weight", {{p.dim, p.w_dim_stride}, {a.width, p.w_width_stride}}, ws);
  if (p.bias) {
    require_non_negative("bias_stride", p.bias_stride);
    check_aligned("bias", p.bias, ws);
    check_extent("bias", {{p.dim, p.bias_stride}}, ws);
  }
  if (p.seq_idx) {
    require_non_negative("seq_batch_stride", p.seq_batch_stride);
    require_non_negative("seq_l_stride", p.seq_l_stride);
    check_aligned("seq_idx", p.seq_idx, 4);
    check_extent("seq_idx", {{p.batch, p.seq_batch_stride}, {p.seqlen, p.seq_l_stride}}, 4);
  }
  int64_t is_bytes = 0, fs_bytes = 0;
  if (p.initial_states) {
    require_non_negative("is_batch_stride", p.is_batch_stride);
    require_non_negative("is_dim_stride", p.is_dim_stride);
    require_non_negative("is_w_stride", p.is_w_stride);
    check_aligned("initial_states", p.initial_states, xs);
    is_bytes = check_extent("initial_states",
                            {{p.batch, p.is_batch_stride}, {p.dim, p.is_dim_stride}, {a.width - 1, p.is_w_stride}}, xs);
  }
  if (p.final_states) {
    require_non_negative("fs_batch_stride", p.fs_batch_stride);
    require_non_negative("fs_dim_stride", p.fs_dim_stride);
    require_non_negative("fs_w_stride", p.fs_w_stride);
    check_aligned("final_states", p.final_states, xs);
    fs_bytes = check_extent("final_states",
                            {{p.batch, p.fs_batch_stride}, {p.dim, p.fs_dim_stride}, {a.width - 1, p.fs_w_stride}}, xs);
  }
  // A row's chunks run in different blocks: each reads the width-1 inputs before
  // its chunk while another block writes out there, and final_states are copied
  // from x (or initial_states) while other blocks read them. In-place is not supported.
  check_disjoint("out", p.out, out_bytes, "x", p.x, x_bytes,
                 "blocks read x's neighbours while others write out; in-place is not supported");
  if (p.initial_states)
    check_disjoint("out", p.out, out_bytes, "initial_states", p.initial_states, is_bytes,
                   "initial_states are read while out is written");
  if (p.final_states) {
    check_disjoint("final_states", p.final_states, fs_bytes, "x", p.x, x_bytes,
                   "final_states are written while x is read");
    check_disjoint("final_states", p.final_states, fs_bytes, "out", p.out, out_bytes,
                   "both are written by the kernel");
    if (p.initial_states)
      check_disjoint("final_states", p.final_states, fs_bytes, "initial_states", p.initial_states, is_bytes,
                     "final_states may be copied from initial_states while they are read");
  }
  return layout;
}

std::size_t family_key(const char* op, Layout layout, DType x_dtype, DType w_dtype, int width,
                       char (&buf)[kFamilyBufSize]) {
  int n = std::snprintf(buf, kFamilyBufSize, "%s.%s.%sw%s.w%d", op, layout == Layout::channel_first ? "cf" : "cl",
                        dtype_name(x_dtype), dtype_name(w_dtype), width);
  return n < 0 ? 0 : std::size_t(n);
}

std::size_t fwd_family(const FwdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]) {
  return family_key("fwd", layout, a.x_dtype, a.w_dtype, a.width, buf);
}

int fwd_alignment(const FwdArgs& a, Layout layout) {
  const FwdParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  const bool cf = layout == Layout::channel_first;
  uint64_t bits = reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.out) |
                  uint64_t(p.x_batch_stride) * es | uint64_t(p.out_batch_stride) * es |
                  uint64_t(cf ? p.x_dim_stride : p.x_l_stride) * es |
                  uint64_t(cf ? p.out_dim_stride : p.out_l_stride) * es;
  return low_bit_cap(bits, 256);
}

int fwd_row_alignment(const FwdArgs& a, Layout layout) {
  if (layout != Layout::channel_first) return fwd_alignment(a, layout);
  const FwdParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  const uint64_t bits = (uint64_t(reinterpret_cast<uintptr_t>(p.x)) - uint64_t(reinterpret_cast<uintptr_t>(p.out))) |
                        uint64_t(p.x_batch_stride - p.out_batch_stride) * es |
                        uint64_t(p.x_dim_stride - p.out_dim_stride) * es;
  return low_bit_cap(bits, 256);
}

// ---- backward -------------------------------------------------------------

Layout validate_bwd(const BwdArgs& a, bool launching) {
  const BwdParams& p = a.p;
  check_dtypes_sizes(a.x_dtype, a.w_dtype, a.width, p.batch, p.dim, p.seqlen);
  if (!p.x) throw InvalidArgument("x must not be null");
  if (!p.weight) throw InvalidArgument("weight must not be null");
  if (!p.dout) throw InvalidArgument("dout must not be null");
  if (!p.dx) throw InvalidArgument("dx must not be null");
  if (!p.dweight) throw InvalidArgument("dweight must not be null");
  if (p.silu != 0 && p.silu != 1) throw InvalidArgument("silu must be 0 or 1, got " + str(p.silu));
  if (p.dinitial_states && !p.initial_states)
    throw InvalidArgument("dinitial_states is given but initial_states is null: its gradient exists only "
                          "when the forward had initial states");
  if (p.dbias && !p.bias)
    throw InvalidArgument("dbias is given but bias is null: pass the forward's bias (it is also part of the "
                          "pre-activation the gradient needs), or no dbias");
  if (launching) {
    if (!p.partials)
      throw InvalidArgument("partials (the workspace) must not be null: allocate bwd_workspace_bytes() bytes");
    if (reinterpret_cast<uintptr_t>(p.partials) % 16 != 0)
      throw InvalidArgument("partials (the workspace) must be 16-byte aligned, got address " + ptr_str(p.partials));
  }

  const int xs = dtype_size(a.x_dtype), ws = dtype_size(a.w_dtype);
  Layout layout;
  if (p.x_l_stride == 1) {
    layout = Layout::channel_first;
    if (p.dout_l_stride != 1)
      throw InvalidArgument("dout_l_stride must be 1 like x_l_stride (channel-first layout: x, dout and dx share "
                            "one layout), got " + str(p.dout_l_stride));
    if (p.dx_l_stride != 1)
      throw InvalidArgument("dx_l_stride must be 1 like x_l_stride (channel-first layout: x, dout and dx share "
                            "one layout), got " + str(p.dx_l_stride));
  } else if (p.x_dim_stride == 1) {
    layout = Layout::channel_last;
    if (p.dout_dim_stride != 1)
      throw InvalidArgument("dout_dim_stride must be 1 like x_dim_stride (channel-last layout: x, dout and dx "
                            "share one layout), got " + str(p.dout_dim_stride));
    if (p.dx_dim_stride != 1)
      throw InvalidArgument("dx_dim_stride must be 1 like x_dim_stride (channel-last layout: x, dout and dx "
                            "share one layout), got " + str(p.dx_dim_stride));
  } else {
    throw InvalidArgument("x must have x_l_stride == 1 (channel-first) or x_dim_stride == 1 (channel-last), got "
                          "x_dim_stride=" + str(p.x_dim_stride) + ", x_l_stride=" + str(p.x_l_stride));
  }
  require_non_negative("x_batch_stride", p.x_batch_stride);
  require_non_negative("x_dim_stride", p.x_dim_stride);
  require_non_negative("x_l_stride", p.x_l_stride);
  require_non_negative("dout_batch_stride", p.dout_batch_stride);
  require_non_negative("dout_dim_stride", p.dout_dim_stride);
  require_non_negative("dout_l_stride", p.dout_l_stride);
  require_non_negative("dx_batch_stride", p.dx_batch_stride);
  require_non_negative("dx_dim_stride", p.dx_dim_stride);
  require_non_negative("dx_l_stride", p.dx_l_stride);
  require_non_negative("w_dim_stride", p.w_dim_stride);
  require_non_negative("w_width_stride", p.w_width_stride);
  require_non_negative("dw_dim_stride", p.dw_dim_stride);
  require_non_negative("dw_width_stride", p.dw_width_stride);
  check_aligned("x", p.x, xs);
  check_aligned("dout", p.dout, xs);
  check_aligned("dx", p.dx, xs);
  check_aligned("weight", p.weight, ws);
  check_aligned("dweight", p.dweight, ws);
  const int64_t x_bytes =
      check_extent("x", {{p.batch, p.x_batch_stride}, {p.dim, p.x_dim_stride}, {p.seqlen, p.x_l_stride}}, xs);
  const int64_t dout_bytes = check_extent(
      "dout", {{p.batch, p.dout_batch_stride}, {p.dim, p.dout_dim_stride}, {p.seqlen, p.dout_l_stride}}, xs);
  const int64_t dx_bytes =
      check_extent("dx", {{p.batch, p.dx_batch_stride}, {p.dim, p.dx_dim_stride}, {p.seqlen, p.dx_l_stride}}, xs);
  check_extent("weight", {{p.dim, p.w_dim_stride}, {a.width, p.w_width_stride}}, ws);
  check_extent("dweight", {{p.dim, p.dw_dim_stride}, {a.width, p.dw_width_stride}}, ws);
  // Blocks read x and dout windows around their tile (halo) while others write dx.
  check_disjoint("dx", p.dx, dx_bytes, "dout", p.dout, dout_bytes,
                 "the kernel reads dout's neighbours after writing dx; in-place is not supported");
  check_disjoint("dx", p.dx, dx_bytes, "x", p.x, x_bytes,
                 "the kernel reads x's neighbours after writing dx; in-place is not supported");
  if (p.bias) {
    require_non_negative("bias_stride", p.bias_stride);
    check_aligned("bias", p.bias, ws);
    check_extent("bias", {{p.dim, p.bias_stride}}, ws);
  }
  if (p.dbias) {
    require_non_negative("db_stride", p.db_stride);
    check_aligned("dbias", p.dbias, ws);
    check_extent("dbias", {{p.dim, p.db_stride}}, ws);
  }
  if (p.seq_idx) {
    require_non_negative("seq_batch_stride", p.seq_batch_stride);
    require_non_negative("seq_l_stride", p.seq_l_stride);
    check_aligned("seq_idx", p.seq_idx, 4);
    check_extent("seq_idx", {{p.batch, p.seq_batch_stride}, {p.seqlen, p.seq_l_stride}}, 4);
  }
  const int64_t w1 = a.width - 1;
  if (p.initial_states) {
    require_non_negative("is_batch_stride", p.is_batch_stride);
    require_non_negative("is_dim_stride", p.is_dim_stride);
    require_non_negative("is_w_stride", p.is_w_stride);
    check_aligned("initial_states", p.initial_states, xs);
    check_extent("initial_states", {{p.batch, p.is_batch_stride}, {p.dim, p.is_dim_stride}, {w1, p.is_w_stride}}, xs);
  }
  if (p.dfinal_states) {
    require_non_negative("dfs_batch_stride", p.dfs_batch_stride);
    require_non_negative("dfs_dim_stride", p.dfs_dim_stride);
    require_non_negative("dfs_w_stride", p.dfs_w_stride);
    check_aligned("dfinal_states", p.dfinal_states, xs);
    check_extent("dfinal_states", {{p.batch, p.dfs_batch_stride}, {p.dim, p.dfs_dim_stride}, {w1, p.dfs_w_stride}},
                 xs);
  }
  if (p.dinitial_states) {
    require_non_negative("dis_batch_stride", p.dis_batch_stride);
    require_non_negative("dis_dim_stride", p.dis_dim_stride);
    require_non_negative("dis_w_stride", p.dis_w_stride);
    check_aligned("dinitial_states", p.dinitial_states, xs);
    check_extent("dinitial_states",
                 {{p.batch, p.dis_batch_stride}, {p.dim, p.dis_dim_stride}, {w1, p.dis_w_stride}}, xs);
  }
  return layout;
}

std::size_t bwd_family(const BwdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]) {
  return family_key("bwd", layout, a.x_dtype, a.w_dtype, a.width, buf);
}

int bwd_alignment(const BwdArgs& a, Layout layout) {
  const BwdParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  const bool cf = layout == Layout::channel_first;
  uint64_t bits = reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.dout) |
                  reinterpret_cast<uintptr_t>(p.dx) | uint64_t(p.x_batch_stride) * es |
                  uint64_t(p.dout_batch_stride) * es | uint64_t(p.dx_batch_stride) * es |
                  uint64_t(cf ? p.x_dim_stride : p.x_l_stride) * es |
                  uint64_t(cf ? p.dout_dim_stride : p.dout_l_stride) * es |
                  uint64_t(cf ? p.dx_dim_stride : p.dx_l_stride) * es;
  return low_bit_cap(bits, 256);
}

int bwd_row_alignment(const BwdArgs& a, Layout layout) {
  if (layout != Layout::channel_first) return bwd_alignment(a, layout);
  const BwdParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  const uint64_t x = uint64_t(reinterpret_cast<uintptr_t>(p.x));
  const uint64_t bits = (x - uint64_t(reinterpret_cast<uintptr_t>(p.dout))) |
                        (x - uint64_t(reinterpret_cast<uintptr_t>(p.dx))) |
                        uint64_t(p.x_batch_stride - p.dout_batch_stride) * es |
                        uint64_t(p.x_batch_stride - p.dx_batch_stride) * es |
                        uint64_t(p.x_dim_stride - p.dout_dim_stride) * es |
                        uint64_t(p.x_dim_stride - p.dx_dim_stride) * es;
  return low_bit_cap(bits, 256);
}

// ---- varlen prefill ---------------------------------------------------------

Layout validate_varlen(const VarlenArgs& a) {
  const VarlenParams& p = a.p;
  check_dtypes_width(a.x_dtype, a.w_dtype, a.width);
  require_positive("num_seqs", p.num_seqs);
  require_positive("dim", p.dim);
  require_positive("total_tokens", p.total_tokens);
  if (p.max_seqlen < 0 || p.max_seqlen > p.total_tokens)
    throw InvalidArgument("max_seqlen must be in [0, total_tokens=" + str(p.total_tokens) +
                          "] (0: bounded by total_tokens), got " + str(p.max_seqlen));
  if (!p.x) throw InvalidArgument("x must not be null");
  if (!p.cu_seqlens) throw InvalidArgument("cu_seqlens must not be null");
  const bool states_only = p.out == nullptr;
  if (!states_only && !p.weight) throw InvalidArgument("weight must not be null");
  if (p.silu != 0 && p.silu != 1) throw InvalidArgument("silu must be 0 or 1, got " + str(p.silu));
  if (states_only) {
    if (!p.conv_states)
      throw InvalidArgument("out is null (states only) but conv_states is null too: nothing to write");
    if (p.cache_indices || p.has_initial_state)
      throw InvalidArgument("out is null (states only): cache_indices and has_initial_state must be null");
  }
  if (!p.conv_states && (p.cache_indices || p.has_initial_state))
    throw InvalidArgument(std::string(p.cache_indices ? "cache_indices" : "has_initial_state") +
                          " is given but conv_states is null: it selects or reads rows of the state pool");

  const int xs = dtype_size(a.x_dtype), ws = dtype_size(a.w_dtype);
  Layout layout;
  if (p.x_l_stride == 1) {
    layout = Layout::channel_first;
    if (!states_only && p.out_l_stride != 1)
      throw InvalidArgument("out_l_stride must be 1 like x_l_stride (channel-first layout), got " + str(p.out_l_stride));
  } else if (p.x_dim_stride == 1) {
    layout = Layout::channel_last;
    if (!states_only && p.out_dim_stride != 1)
      throw InvalidArgument("out_dim_stride must be 1 like x_dim_stride (channel-last layout), got " +
                            str(p.out_dim_stride));
  } else {
    throw InvalidArgument("x must have x_l_stride == 1 (channel-first) or x_dim_stride == 1 (channel-last), got "
                          "x_dim_stride=" + str(p.x_dim_stride) + ", x_l_stride=" + str(p.x_l_stride));
  }
  require_non_negative("x_dim_stride", p.x_dim_stride);
  require_non_negative("x_l_stride", p.x_l_stride);
  check_aligned("x", p.x, xs);
  const int64_t x_bytes = check_extent("x", {{p.dim, p.x_dim_stride}, {p.total_tokens, p.x_l_stride}}, xs);
  require_non_negative("cu_stride", p.cu_stride);
  check_aligned("cu_seqlens", p.cu_seqlens, 4);
  check_extent("cu_seqlens", {{p.num_seqs + 1, p.cu_stride}}, 4);
  int64_t out_bytes = 0, cs_bytes = 0;
  if (!states_only) {
    require_non_negative("out_dim_stride", p.out_dim_stride);
    require_non_negative("out_l_stride", p.out_l_stride);
    require_non_negative("w_dim_stride", p.w_dim_stride);
    require_non_negative("w_width_stride", p.w_width_stride);
    check_aligned("out", p.out, xs);
    check_aligned("weight", p.weight, ws);
    out_bytes = check_extent("out", {{p.dim, p.out_dim_stride}, {p.total_tokens, p.out_l_stride}}, xs);
    check_extent("weight", {{p.dim, p.w_dim_stride}, {a.width, p.w_width_stride}}, ws);
    if (p.bias) {
      require_non_negative("bias_stride", p.bias_stride);
      check_aligned("bias", p.bias, ws);
      check_extent("bias", {{p.dim, p.bias_stride}}, ws);
    }
  }
  if (p.conv_states) {
    require_positive("pool", p.pool);
    if (p.state_len < a.width - 1)
      throw InvalidArgument("state_len must be >= width - 1 = " + str(a.width - 1) + ", got " + str(p.state_len));
    if (!p.cache_indices && p.pool < p.num_seqs)
      throw InvalidArgument("conv_states has " + str(p.pool) + " rows (pool) but num_seqs is " + str(p.num_seqs) +
                            ": without cache_indices sequence i uses row i");
    require_non_negative("cs_pool_stride", p.cs_pool_stride);
    require_non_negative("cs_dim_stride", p.cs_dim_stride);
    require_non_negative("cs_l_stride", p.cs_l_stride);
    check_aligned("conv_states", p.conv_states, xs);
    cs_bytes = check_extent("conv_states",
                            {{p.pool, p.cs_pool_stride}, {p.dim, p.cs_dim_stride}, {p.state_len, p.cs_l_stride}}, xs);
  }
  // Chunks of one sequence run in different blocks: each reads the width-1
  // tokens before its chunk while another writes out there, and chunk 0 writes
  // the states while later chunks still read x. In-place is not supported.
  if (!states_only)
    check_disjoint("out", p.out, out_bytes, "x", p.x, x_bytes,
                   "blocks read x's neighbours while others write out; in-place is not supported");
  if (p.conv_states) {
    if (!states_only)
      check_disjoint("out", p.out, out_bytes, "conv_states", p.conv_states, cs_bytes,
                     "the states are read and written while out is written");
    check_disjoint("conv_states", p.conv_states, cs_bytes, "x", p.x, x_bytes,
                   "x's last tokens are copied into the states while other blocks read x");
  }
  if (p.cache_indices) {
    require_non_negative("ci_stride", p.ci_stride);
    check_aligned("cache_indices", p.cache_indices, 4);
    check_extent("cache_indices", {{p.num_seqs, p.ci_stride}}, 4);
  }
  if (p.has_initial_state) {
    if (p.his_bytes != 1 && p.his_bytes != 4)
      throw InvalidArgument("his_bytes (has_initial_state's element size) must be 1 (bool/uint8) or 4 (int32), got " +
                            str(p.his_bytes));
    require_non_negative("his_stride", p.his_stride);
    check_aligned("has_initial_state", p.has_initial_state, int(p.his_bytes));
    check_extent("has_initial_state", {{p.num_seqs, p.his_stride}}, int(p.his_bytes));
  }
  return layout;
}

std::size_t varlen_family(const VarlenArgs& a, Layout layout, char (&buf)[kFamilyBufSize]) {
  return family_key("vfwd", layout, a.x_dtype, a.w_dtype, a.width, buf);
}

int varlen_alignment(const VarlenArgs& a, Layout layout) {
  const VarlenParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  const bool cf = layout == Layout::channel_first;
  uint64_t bits = reinterpret_cast<uintptr_t>(p.x) | uint64_t(cf ? p.x_dim_stride : p.x_l_stride) * es;
  if (p.out)
    bits |= reinterpret_cast<uintptr_t>(p.out) | uint64_t(cf ? p.out_dim_stride : p.out_l_stride) * es;
  return low_bit_cap(bits, 256);
}

// ---- decode update ----------------------------------------------------------

namespace {

void check_index_array(const char* name, const int32_t* ptr, int64_t stride, int64_t batch) {
  if (!ptr) return;
  const std::string s = std::string(name) + "_stride";
  require_non_negative(s.c_str(), stride);
  check_aligned(name, ptr, 4);
  check_extent(name, {{batch, stride}}, 4);
}

}  // namespace

Layout validate_upd(const UpdArgs& a) {
  const UpdParams& p = a.p;
  check_dtypes_sizes(a.x_dtype, a.w_dtype, a.width, p.batch, p.dim, p.seqlen);
  if (!p.x) throw InvalidArgument("x must not be null");
  if (!p.weight) throw InvalidArgument("weight must not be null");
  if (!p.conv_state) throw InvalidArgument("conv_state must not be null");
  if (!p.out) throw InvalidArgument("out must not be null");
  if (p.silu != 0 && p.silu != 1) throw InvalidArgument("silu must be 0 or 1, got " + str(p.silu));
  if (p.state_len < a.width - 1)
    throw InvalidArgument("conv_state: state_len must be >= width - 1 = " + str(a.width - 1) +
                          " (the window of previous inputs), got " + str(p.state_len));
  require_positive("pool (conv_state's first dimension)", p.pool);
  if (!p.conv_state_indices && p.pool < p.batch)
    throw InvalidArgument("conv_state: without conv_state_indices its first dimension (pool) must be >= batch = " +
                          str(p.batch) + ", got " + str(p.pool));
  if (p.cache_seqlens && p.num_accepted_tokens)
    throw InvalidArgument("cache_seqlens and num_accepted_tokens exclude each other: a circular buffer "
                          "(cache_seqlens) or vLLM's speculative window (num_accepted_tokens), not both");
  require_non_negative("x_batch_stride", p.x_batch_stride);
  require_non_negative("x_dim_stride", p.x_dim_stride);
  require_non_negative("x_l_stride", p.x_l_stride);
  require_non_negative("out_batch_stride", p.out_batch_stride);
  require_non_negative("out_dim_stride", p.out_dim_stride);
  require_non_negative("out_l_stride", p.out_l_stride);
  require_non_negative("st_batch_stride", p.st_batch_stride);
  require_non_negative("st_dim_stride", p.st_dim_stride);
  require_non_negative("st_l_stride", p.st_l_stride);
  require_non_negative("w_dim_stride", p.w_dim_stride);
  require_non_negative("w_width_stride", p.w_width_stride);
  const int xs = dtype_size(a.x_dtype), ws = dtype_size(a.w_dtype);
  check_aligned("x", p.x, xs);
  check_aligned("out", p.out, xs);
  check_aligned("conv_state", p.conv_state, xs);
  check_aligned("weight", p.weight, ws);
  const int64_t x_bytes =
      check_extent("x", {{p.batch, p.x_batch_stride}, {p.dim, p.x_dim_stride}, {p.seqlen, p.x_l_stride}}, xs);
  const int64_t out_bytes = check_extent(
      "out", {{p.batch, p.out_batch_stride}, {p.dim, p.out_dim_stride}, {p.seqlen, p.out_l_stride}}, xs);
  const int64_t st_bytes = check_extent(
      "conv_state", {{p.pool, p.st_batch_stride}, {p.dim, p.st_dim_stride}, {p.state_len, p.st_l_stride}}, xs);
  check_extent("weight", {{p.dim, p.w_dim_stride}, {a.width, p.w_width_stride}}, ws);
  check_disjoint("out", p.out, out_bytes, "x", p.x, x_bytes, "x is read while out is written");
  check_disjoint("out", p.out, out_bytes, "conv_state", p.conv_state, st_bytes,
                 "the state is read and written while out is written");
  check_disjoint("conv_state", p.conv_state, st_bytes, "x", p.x, x_bytes,
                 "x is copied into the state while it is read");
  if (p.bias) {
    require_non_negative("bias_stride", p.bias_stride);
    check_aligned("bias", p.bias, ws);
    check_extent("bias", {{p.dim, p.bias_stride}}, ws);
  }
  check_index_array("cache_seqlens", p.cache_seqlens, p.seqlens_stride, p.batch);
  check_index_array("conv_state_indices", p.conv_state_indices, p.indices_stride, p.batch);
  check_index_array("num_accepted_tokens", p.num_accepted_tokens, p.accepted_stride, p.batch);
  return p.st_dim_stride == 1 ? Layout::channel_last : Layout::channel_first;
}

std::size_t upd_family(const UpdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]) {
  return family_key("upd", layout, a.x_dtype, a.w_dtype, a.width, buf);
}

int upd_alignment(const UpdArgs& a) {
  const UpdParams& p = a.p;
  const uint64_t es = uint64_t(dtype_size(a.x_dtype));
  // Strides of size-1 axes are never stepped over: they do not count. x and out
  // take part only where the kernels move them as vectors (dim stride 1). The
  // state's vectors run along dim ("cl": one per window entry, so its state_len
  // stride counts) or, state_len contiguous ("cf"), over a thread's packed
  // channels, whose offsets within a slot the kernel keeps whole vectors.
  auto step = [es](int64_t size, int64_t stride) { return size > 1 ? uint64_t(stride) * es : 0u; };
  uint64_t bits = reinterpret_cast<uintptr_t>(p.conv_state) | step(p.pool, p.st_batch_stride);
  if (p.st_dim_stride == 1) bits |= step(p.state_len, p.st_l_stride);
  if (p.x_dim_stride == 1)
    bits |= reinterpret_cast<uintptr_t>(p.x) | step(p.batch, p.x_batch_stride) | step(p.seqlen, p.x_l_stride);
  if (p.out_dim_stride == 1)
    bits |= reinterpret_cast<uintptr_t>(p.out) | step(p.batch, p.out_batch_stride) | step(p.seqlen, p.out_l_stride);
  return low_bit_cap(bits, 256);
}

}  // namespace cc1d
