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
// in bytes (the kernels index with 64-bit offsets).
void check_extent(const char* tensor, std::initializer_list<std::pair<int64_t, int64_t>> size_stride,
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

}  // namespace

Layout validate_fwd(const FwdArgs& a) {
  const FwdParams& p = a.p;
  const int xd = int(a.x_dtype), wd = int(a.w_dtype);
  if (xd < 0 || xd > 2) throw TypeMismatch("x_dtype must be 0 (f32), 1 (f16) or 2 (bf16), got " + str(xd));
  if (wd < 0 || wd > 2) throw TypeMismatch("w_dtype must be 0 (f32), 1 (f16) or 2 (bf16), got " + str(wd));
  if (a.w_dtype != a.x_dtype && a.w_dtype != DType::f32)
    throw TypeMismatch(std::string("weight dtype must equal x dtype (") + dtype_name(a.x_dtype) +
                       ") or be f32, got " + dtype_name(a.w_dtype));
  if (a.width < 2 || a.width > 8) throw InvalidArgument("width must be in [2, 8], got " + str(a.width));
  require_positive("batch", p.batch);
  require_positive("dim", p.dim);
  require_positive("seqlen", p.seqlen);
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
  check_extent("x", {{p.batch, p.x_batch_stride}, {p.dim, p.x_dim_stride}, {p.seqlen, p.x_l_stride}}, xs);
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
  if (p.initial_states) {
    require_non_negative("is_batch_stride", p.is_batch_stride);
    require_non_negative("is_dim_stride", p.is_dim_stride);
    require_non_negative("is_w_stride", p.is_w_stride);
    check_aligned("initial_states", p.initial_states, xs);
    check_extent("initial_states", {{p.batch, p.is_batch_stride}, {p.dim, p.is_dim_stride}, {a.width - 1, p.is_w_stride}}, xs);
  }
  if (p.final_states) {
    require_non_negative("fs_batch_stride", p.fs_batch_stride);
    require_non_negative("fs_dim_stride", p.fs_dim_stride);
    require_non_negative("fs_w_stride", p.fs_w_stride);
    check_aligned("final_states", p.final_states, xs);
    check_extent("final_states", {{p.batch, p.fs_batch_stride}, {p.dim, p.fs_dim_stride}, {a.width - 1, p.fs_w_stride}}, xs);
  }
  return layout;
}

std::size_t fwd_family(const FwdArgs& a, Layout layout, char (&buf)[kFamilyBufSize]) {
  int n = std::snprintf(buf, kFamilyBufSize, "fwd.%s.%sw%s.w%d", layout == Layout::channel_first ? "cf" : "cl",
                        dtype_name(a.x_dtype), dtype_name(a.w_dtype), a.width);
  return n < 0 ? 0 : std::size_t(n);
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

}  // namespace cc1d
