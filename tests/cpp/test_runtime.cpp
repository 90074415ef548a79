// C++ runtime tests that need no GPU: SHA-256 vectors, validation messages
// (forward and backward), the backward's workspace rule,
// an NVRTC compile for sm_90 and precompile_fwd (skipped when NVRTC is absent) and the no-driver
// error path. (The disk cache's multi-process behaviour is tested from Python.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "dynlib.h"
#include "cc1d/cc1d.h"
#include "sha256.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <class E>
void check_throws(const std::function<void()>& f, const std::string& needle, const std::string& what) {
  try {
    f();
    check(false, what + " (no exception)");
  } catch (const E& e) {
    bool has = std::string(e.what()).find(needle) != std::string::npos;
    check(has, what + (has ? "" : std::string(" (message: ") + e.what() + ")"));
  } catch (const std::exception& e) {
    check(false, what + " (wrong exception: " + e.what() + ")");
  }
}

void test_sha256() {
  using cc1d::sha256_hex;
  check(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256('')");
  check(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256('abc')");
  check(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        "sha256(448-bit message)");
  check(sha256_hex(std::string(1000000, 'a')) ==
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
        "sha256(one million 'a')");
  // Streaming in odd pieces gives the same digest.
  std::string s(1000, 'x');
  cc1d::Sha256 h;
  for (std::size_t i = 0; i < s.size(); i += 7) h.update(s.data() + i, std::min<std::size_t>(7, s.size() - i));
  check(h.hex_digest() == sha256_hex(s), "sha256 streaming");
}

cc1d::FwdArgs good_args() {
  static float xbuf[1024], wbuf[64], obuf[1024];  // apart: out may overlap neither x nor the states
  cc1d::FwdArgs a;
  a.p.x = xbuf;
  a.p.weight = wbuf;
  a.p.out = obuf;
  a.p.batch = 2; a.p.dim = 8; a.p.seqlen = 16;
  a.p.x_batch_stride = 128; a.p.x_dim_stride = 16; a.p.x_l_stride = 1;
  a.p.out_batch_stride = 128; a.p.out_dim_stride = 16; a.p.out_l_stride = 1;
  a.p.w_dim_stride = 4; a.p.w_width_stride = 1;
  a.width = 4;
  return a;
}

// a's pointers, for FwdPlan::run.
cc1d::FwdBuffers buffers_of(const cc1d::FwdArgs& a) {
  cc1d::FwdBuffers b;
  b.x = a.p.x;
  b.weight = a.p.weight;
  b.bias = a.p.bias;
  b.seq_idx = a.p.seq_idx;
  b.initial_states = a.p.initial_states;
  b.out = a.p.out;
  b.final_states = a.p.final_states;
  return b;
}

void test_validation() {
  using cc1d::InvalidArgument;
  using cc1d::TypeMismatch;
  auto run = [](cc1d::FwdArgs a) { return [a] { cc1d::causal_conv1d_fwd(a); }; };
  { auto a = good_args(); a.width = 9; check_throws<InvalidArgument>(run(a), "width must be in [2, 8], got 9", "width range"); }
  { auto a = good_args(); a.p.seqlen = 0; check_throws<InvalidArgument>(run(a), "seqlen must be >= 1, got 0", "seqlen >= 1"); }
  { auto a = good_args(); a.p.x = nullptr; check_throws<InvalidArgument>(run(a), "x must not be null", "x null"); }
  { auto a = good_args(); a.x_dtype = cc1d::DType::f16; a.w_dtype = cc1d::DType::bf16;
    check_throws<TypeMismatch>(run(a), "weight dtype must equal x dtype (f16) or be f32, got bf16", "dtype combo"); }
  { auto a = good_args(); a.p.x_l_stride = 2;
    check_throws<InvalidArgument>(run(a), "x_dim_stride=16, x_l_stride=2", "layout"); }
  { auto a = good_args(); a.p.out_l_stride = 8;
    check_throws<InvalidArgument>(run(a), "out_l_stride must be 1 like x_l_stride", "out layout"); }
  { auto a = good_args(); a.p.x_batch_stride = int64_t(1) << 62;
    check_throws<InvalidArgument>(run(a), "x: ", "offset overflow"); }
  { auto a = good_args(); a.p.final_states = const_cast<void*>(a.p.x); a.p.fs_dim_stride = -3;
    check_throws<InvalidArgument>(run(a), "fs_dim_stride must be >= 0", "final_states stride"); }
  { auto a = good_args(); a.p.out = const_cast<void*>(a.p.x);
    check_throws<InvalidArgument>(run(a), "out must not overlap x (blocks read x's neighbours", "in-place refused"); }
  { auto a = good_args(); a.p.final_states = static_cast<float*>(const_cast<void*>(a.p.x)) + 200;
    a.p.fs_batch_stride = 24; a.p.fs_dim_stride = 3; a.p.fs_w_stride = 1;
    check_throws<InvalidArgument>(run(a), "final_states must not overlap x", "final_states over x refused"); }
  { auto a = good_args(); a.p.initial_states = static_cast<float*>(a.p.out) + 8;
    a.p.is_batch_stride = 24; a.p.is_dim_stride = 3; a.p.is_w_stride = 1;
    check_throws<InvalidArgument>(run(a), "out must not overlap initial_states", "initial_states under out refused"); }
  { auto a = good_args(); a.p.x = reinterpret_cast<const char*>(a.p.x) + 1;
    check_throws<InvalidArgument>(run(a), "x must be aligned to its element size (4 bytes)", "x alignment"); }
}

// A valid channel-first f32 backward call, 2 x 8 x 16, width 4, bias: every
// tensor in its own 256-byte aligned buffer.
cc1d::BwdArgs good_bwd_args() {
  alignas(256) static float x[512], dout[512], dx[512], w[32], bias[8], dw[32], db[8], partials[1 << 14];
  cc1d::BwdArgs a;
  a.p.x = x; a.p.dout = dout; a.p.dx = dx;
  a.p.weight = w; a.p.bias = bias; a.p.dweight = dw; a.p.dbias = db; a.p.partials = partials;
  a.p.batch = 2; a.p.dim = 8; a.p.seqlen = 16;
  a.p.x_batch_stride = a.p.dout_batch_stride = a.p.dx_batch_stride = 128;
  a.p.x_dim_stride = a.p.dout_dim_stride = a.p.dx_dim_stride = 16;
  a.p.x_l_stride = a.p.dout_l_stride = a.p.dx_l_stride = 1;
  a.p.w_dim_stride = a.p.dw_dim_stride = 4; a.p.w_width_stride = a.p.dw_width_stride = 1;
  a.p.bias_stride = a.p.db_stride = 1;
  a.p.silu = 1;
  a.width = 4;
  a.workspace_bytes = sizeof partials;
  return a;
}

// a's pointers, for BwdPlan::run.
cc1d::BwdBuffers bwd_buffers_of(const cc1d::BwdArgs& a) {
  const cc1d::BwdParams& p = a.p;
  return {p.x, p.weight, p.bias, p.seq_idx, p.initial_states, p.dout, p.dfinal_states, p.dx, p.dinitial_states,
          p.dweight, p.dbias, p.partials};
}

// The bad-input matrix (issue 8) as a table: one mutation of a valid call per
// row, run through every forward entry point (launching, deciding, preparing).
struct FwdRow {
  const char* name;
  std::function<void(cc1d::FwdArgs&)> mutate;
  bool type_error;      // TypeMismatch, else InvalidArgument
  const char* needle;   // names the argument
};

void test_fwd_matrix() {
  alignas(256) static float x[256], w[32], out[256], bias[8];
  auto base = [] {
    cc1d::FwdArgs a = good_args();
    a.p.x = x; a.p.weight = w; a.p.out = out;
    return a;
  };
  const std::vector<FwdRow> rows = {
      {"width 0", [](cc1d::FwdArgs& a) { a.width = 0; }, false, "width must be in [2, 8], got 0"},
      {"width 1", [](cc1d::FwdArgs& a) { a.width = 1; }, false, "width must be in [2, 8], got 1"},
      {"width 9", [](cc1d::FwdArgs& a) { a.width = 9; }, false, "width must be in [2, 8], got 9"},
      {"batch 0", [](cc1d::FwdArgs& a) { a.p.batch = 0; }, false, "batch must be >= 1, got 0"},
      {"dim -1", [](cc1d::FwdArgs& a) { a.p.dim = -1; }, false, "dim must be >= 1, got -1"},
      {"seqlen 0", [](cc1d::FwdArgs& a) { a.p.seqlen = 0; }, false, "seqlen must be >= 1, got 0"},
      {"x null", [](cc1d::FwdArgs& a) { a.p.x = nullptr; }, false, "x must not be null"},
      {"weight null", [](cc1d::FwdArgs& a) { a.p.weight = nullptr; }, false, "weight must not be null"},
      {"out null", [](cc1d::FwdArgs& a) { a.p.out = nullptr; }, false, "out must not be null"},
      {"x dtype out of range", [](cc1d::FwdArgs& a) { a.x_dtype = static_cast<cc1d::DType>(7); }, true,
       "x_dtype must be 0 (f32), 1 (f16) or 2 (bf16), got 7"},
      {"w dtype out of range", [](cc1d::FwdArgs& a) { a.w_dtype = static_cast<cc1d::DType>(-1); }, true,
       "w_dtype must be"},
      {"dtype mismatch", [](cc1d::FwdArgs& a) { a.x_dtype = cc1d::DType::bf16; a.w_dtype = cc1d::DType::f16; },
       true, "weight dtype must equal x dtype (bf16) or be f32, got f16"},
      {"silu 2", [](cc1d::FwdArgs& a) { a.p.silu = 2; }, false, "silu must be 0 or 1, got 2"},
      {"no unit stride", [](cc1d::FwdArgs& a) { a.p.x_l_stride = 2; }, false, "x must have x_l_stride == 1"},
      {"negative batch stride", [](cc1d::FwdArgs& a) { a.p.x_batch_stride = -128; }, false,
       "x_batch_stride must be >= 0"},
      {"negative weight stride", [](cc1d::FwdArgs& a) { a.p.w_width_stride = -1; }, false,
       "w_width_stride must be >= 0"},
      {"bias misaligned", [](cc1d::FwdArgs& a) { a.p.bias = reinterpret_cast<char*>(bias) + 2; }, false,
       "bias must be aligned to its element size (4 bytes)"},
      {"seq_idx misaligned", [](cc1d::FwdArgs& a) { a.p.seq_idx = reinterpret_cast<const int32_t*>(reinterpret_cast<char*>(bias) + 2);
                                                   a.p.seq_batch_stride = 16; a.p.seq_l_stride = 1; }, false,
       "seq_idx must be aligned to its element size (4 bytes)"},
      {"initial_states negative stride", [](cc1d::FwdArgs& a) { a.p.initial_states = bias; a.p.is_w_stride = -1; },
       false, "is_w_stride must be >= 0"},
      {"out extent overflow", [](cc1d::FwdArgs& a) { a.p.out_batch_stride = int64_t(1) << 62; }, false,
       "out: extent in bytes overflows int64"},
  };
  const cc1d::KernelVariant v = cc1d::select_fwd(base(), "sm_999");
  const std::vector<std::pair<const char*, std::function<void(const cc1d::FwdArgs&)>>> entries = {
      {"causal_conv1d_fwd", [](const cc1d::FwdArgs& a) { cc1d::causal_conv1d_fwd(a); }},
      {"select_fwd", [](const cc1d::FwdArgs& a) { cc1d::select_fwd(a, "sm_999"); }},
      {"explain_fwd", [](const cc1d::FwdArgs& a) { cc1d::explain_fwd(a, "sm_999"); }},
      {"prepare_fwd", [](const cc1d::FwdArgs& a) { cc1d::prepare_fwd(a); }},
      {"launch_fwd", [v](const cc1d::FwdArgs& a) { cc1d::launch_fwd(v, a); }},
      {"FwdPlan::run", [](const cc1d::FwdArgs& a) { cc1d::FwdPlan(a).run(buffers_of(a), a.stream); }},
  };
  for (const auto& row : rows)
    for (const auto& [entry, call] : entries) {
      cc1d::FwdArgs a = base();
      row.mutate(a);
      const std::string what = std::string("matrix: ") + entry + ": " + row.name;
      if (row.type_error)
        check_throws<cc1d::TypeMismatch>([&] { call(a); }, row.needle, what);
      else
        check_throws<cc1d::InvalidArgument>([&] { call(a); }, row.needle, what);
    }
  // The bwd entry points share the checks; their own rows (null outputs, overlap,
  // workspace) are in test_bwd_validation; widths 0 and 9 and a bad dtype code here.
  for (int width : {0, 9}) {
    auto a = good_bwd_args();
    a.width = width;
    check_throws<cc1d::InvalidArgument>([&] { cc1d::bwd_workspace_bytes(a, "sm_999"); }, "width must be in [2, 8]",
                                        "matrix: bwd_workspace_bytes: width " + std::to_string(width));
    check_throws<cc1d::InvalidArgument>([&] { cc1d::prepare_bwd(a); }, "width must be in [2, 8]",
                                        "matrix: prepare_bwd: width " + std::to_string(width));
  }
  { auto a = good_bwd_args(); a.x_dtype = static_cast<cc1d::DType>(3);
    check_throws<cc1d::TypeMismatch>([&] { cc1d::select_bwd(a, "sm_999"); }, "x_dtype must be 0 (f32)",
                                     "matrix: select_bwd: dtype code 3"); }
}

// A valid f32 decode update, batch 2, dim 8, width 4, state (2, 8, 3) channel-first.
cc1d::UpdArgs good_upd_args() {
  alignas(256) static float x[16], w[32], bias[8], state[48], out[16];
  cc1d::UpdArgs a;
  a.p.x = x; a.p.weight = w; a.p.bias = bias; a.p.conv_state = state; a.p.out = out;
  a.p.batch = 2; a.p.dim = 8; a.p.seqlen = 1; a.p.state_len = 3; a.p.pool = 2;
  a.p.x_batch_stride = a.p.out_batch_stride = 8; a.p.x_dim_stride = a.p.out_dim_stride = 1;
  a.p.w_dim_stride = 4; a.p.w_width_stride = 1; a.p.bias_stride = 1;
  a.p.st_batch_stride = 24; a.p.st_dim_stride = 3; a.p.st_l_stride = 1;
  a.p.pad_slot_id = -1;
  a.width = 4;
  return a;
}

cc1d::UpdBuffers upd_buffers_of(const cc1d::UpdArgs& a) {
  cc1d::UpdBuffers b;
  b.x = a.p.x;
  b.weight = a.p.weight;
  b.bias = a.p.bias;
  b.conv_state = a.p.conv_state;
  b.cache_seqlens = a.p.cache_seqlens;
  b.conv_state_indices = a.p.conv_state_indices;
  b.num_accepted_tokens = a.p.num_accepted_tokens;
  b.out = a.p.out;
  return b;
}

// UpdPlan::run checks each call as causal_conv1d_update does: the same errors for
// bad sizes and for bad buffers given to a plan made from good sizes.
void test_upd_plan_validation() {
  struct Row {
    const char* name;
    std::function<void(cc1d::UpdArgs&)> mutate;
    bool type_error;
    const char* needle;
  };
  const std::vector<Row> rows = {
      {"width 9", [](cc1d::UpdArgs& a) { a.width = 9; }, false, "width must be in [2, 8], got 9"},
      {"dtype mismatch", [](cc1d::UpdArgs& a) { a.x_dtype = cc1d::DType::bf16; a.w_dtype = cc1d::DType::f16; },
       true, "weight dtype must equal x dtype (bf16) or be f32, got f16"},
      {"state_len", [](cc1d::UpdArgs& a) { a.p.state_len = 2; }, false, "state_len must be >= width - 1 = 3"},
      {"pool < batch", [](cc1d::UpdArgs& a) { a.p.pool = 1; }, false, "its first dimension (pool) must be >= batch"},
      {"silu 2", [](cc1d::UpdArgs& a) { a.p.silu = 2; }, false, "silu must be 0 or 1, got 2"},
      {"negative state stride", [](cc1d::UpdArgs& a) { a.p.st_l_stride = -1; }, false, "st_l_stride must be >= 0"},
  };
  for (const auto& row : rows) {
    cc1d::UpdArgs a = good_upd_args();
    row.mutate(a);
    for (int entry = 0; entry < 2; ++entry) {
      const std::string what = std::string(entry ? "UpdPlan::run: " : "causal_conv1d_update: ") + row.name;
      auto call = [&] {
        if (entry) cc1d::UpdPlan(a).run(upd_buffers_of(a), nullptr);
        else cc1d::causal_conv1d_update(a);
      };
      if (row.type_error) check_throws<cc1d::TypeMismatch>(call, row.needle, what);
      else check_throws<cc1d::InvalidArgument>(call, row.needle, what);
    }
  }
  // Buffers checked per run: a plan of good sizes refuses bad pointers.
  const cc1d::UpdArgs a = good_upd_args();
  const cc1d::UpdPlan plan(a);
  {
    cc1d::UpdBuffers b = upd_buffers_of(a);
    b.conv_state = nullptr;
    check_throws<cc1d::InvalidArgument>([&] { plan.run(b, nullptr); }, "conv_state must not be null",
                                        "UpdPlan::run: null conv_state");
  }
  {
    cc1d::UpdBuffers b = upd_buffers_of(a);
    b.out = const_cast<void*>(b.x);
    check_throws<cc1d::InvalidArgument>([&] { plan.run(b, nullptr); }, "overlap", "UpdPlan::run: out over x");
  }
  {
    cc1d::UpdBuffers b = upd_buffers_of(a);
    b.x = reinterpret_cast<const char*>(b.x) + 2;
    check_throws<cc1d::InvalidArgument>([&] { plan.run(b, nullptr); }, "x must be aligned",
                                        "UpdPlan::run: misaligned x");
  }
  {
    cc1d::UpdBuffers b = upd_buffers_of(a);
    static int32_t seqlens[2], accepted[2];
    b.cache_seqlens = seqlens;
    b.num_accepted_tokens = accepted;
    check_throws<cc1d::InvalidArgument>([&] { plan.run(b, nullptr); }, "exclude each other",
                                        "UpdPlan::run: cache_seqlens with num_accepted_tokens");
  }
}

int64_t ceil_div(int64_t n, int64_t d) { return (n + d - 1) / d; }

// The documented rule (cc1d.h, causal_conv1d_bwd), written out again.
int64_t expected_splits(int64_t b, int64_t d, int64_t l, int tile_l, int tile_d, int split_blocks) {
  const int64_t items = b * ceil_div(l, tile_l), groups = std::min<int64_t>(ceil_div(d, tile_d), 65535);
  return std::max<int64_t>(1, std::min(items, ceil_div(split_blocks, groups)));
}

void test_bwd_validation() {
  using cc1d::InvalidArgument;
  using cc1d::TypeMismatch;
  auto run = [](cc1d::BwdArgs a) { return [a] { cc1d::causal_conv1d_bwd(a); }; };
  auto size = [](cc1d::BwdArgs a) { return [a] { cc1d::bwd_workspace_bytes(a, "sm_999"); }; };
  // A plan checks each run's buffers as causal_conv1d_bwd checks its call.
  auto planned = [](cc1d::BwdArgs a) {
    return [a] { cc1d::BwdPlan(a).run(bwd_buffers_of(a), a.workspace_bytes, a.stream); };
  };
  { auto a = good_bwd_args(); a.p.dout = nullptr;
    check_throws<InvalidArgument>(planned(a), "dout must not be null", "BwdPlan::run: dout null"); }
  { auto a = good_bwd_args(); a.p.partials += 2;
    check_throws<InvalidArgument>(planned(a), "partials (the workspace) must be 16-byte aligned",
                                  "BwdPlan::run: partials alignment"); }
  check(cc1d::bwd_fixed_options(good_bwd_args()).empty() && !cc1d::bwd_plan_fixes(good_bwd_args()),
        "channel-first backward plans fix nothing");
  { auto a = good_bwd_args();
    a.p.x_dim_stride = a.p.dout_dim_stride = a.p.dx_dim_stride = 1;
    a.p.x_l_stride = a.p.dout_l_stride = a.p.dx_l_stride = 8;
    const std::vector<std::string> o = cc1d::bwd_fixed_options(a);
    check(cc1d::bwd_plan_fixes(a) && !o.empty() && o[0] == "-DCC1D_BWD_FIXED=1",
          "channel-last backward plans compile a fixed kernel");
    check(std::find(o.begin(), o.end(), "-DCC1D_FIX_X_L_STRIDE=((long long)8ULL)") != o.end(),
          "the fixed kernel's token pitch");
    a.width = 9;
    check_throws<InvalidArgument>([a] { cc1d::bwd_fixed_options(a); }, "width must be in [2, 8], got 9",
                                  "bwd_fixed_options checks the call"); }
  { auto a = good_bwd_args(); a.width = 1; check_throws<InvalidArgument>(run(a), "width must be in [2, 8], got 1", "bwd: width range"); }
  { auto a = good_bwd_args(); a.p.batch = 0; check_throws<InvalidArgument>(run(a), "batch must be >= 1, got 0", "bwd: batch >= 1"); }
  { auto a = good_bwd_args(); a.x_dtype = cc1d::DType::bf16; a.w_dtype = cc1d::DType::f16;
    check_throws<TypeMismatch>(run(a), "weight dtype must equal x dtype (bf16) or be f32, got f16", "bwd: dtype combo"); }
  { auto a = good_bwd_args(); a.p.dout = nullptr; check_throws<InvalidArgument>(run(a), "dout must not be null", "bwd: dout null"); }
  { auto a = good_bwd_args(); a.p.dx = nullptr; check_throws<InvalidArgument>(run(a), "dx must not be null", "bwd: dx null"); }
  { auto a = good_bwd_args(); a.p.dweight = nullptr; check_throws<InvalidArgument>(run(a), "dweight must not be null", "bwd: dweight null"); }
  { auto a = good_bwd_args(); a.p.partials = nullptr;
    check_throws<InvalidArgument>(run(a), "partials (the workspace) must not be null", "bwd: partials null");
    check(cc1d::bwd_workspace_bytes(a, "sm_999") > 0, "bwd_workspace_bytes needs no workspace"); }
  { auto a = good_bwd_args(); a.p.partials += 2;
    check_throws<InvalidArgument>(run(a), "partials (the workspace) must be 16-byte aligned", "bwd: partials alignment"); }
  { auto a = good_bwd_args(); a.p.silu = 2; check_throws<InvalidArgument>(run(a), "silu must be 0 or 1, got 2", "bwd: silu"); }
  { auto a = good_bwd_args(); a.p.dinitial_states = a.p.dx;
    check_throws<InvalidArgument>(run(a), "dinitial_states is given but initial_states is null", "bwd: dinitial_states alone"); }
  { auto a = good_bwd_args(); a.p.bias = nullptr;
    check_throws<InvalidArgument>(size(a), "dbias is given but bias is null", "bwd: dbias without bias"); }
  { auto a = good_bwd_args(); a.p.dx_l_stride = 2;
    check_throws<InvalidArgument>(run(a), "dx_l_stride must be 1 like x_l_stride (channel-first layout", "bwd: dx layout"); }
  { auto a = good_bwd_args(); a.p.x_dim_stride = 1; a.p.x_l_stride = 8; a.p.dx_dim_stride = 1; a.p.dx_l_stride = 8;
    check_throws<InvalidArgument>(run(a), "dout_dim_stride must be 1 like x_dim_stride (channel-last layout", "bwd: dout layout"); }
  { auto a = good_bwd_args(); a.p.x_l_stride = 3;
    check_throws<InvalidArgument>(run(a), "x must have x_l_stride == 1 (channel-first) or x_dim_stride == 1", "bwd: x layout"); }
  { auto a = good_bwd_args(); a.p.dw_width_stride = -1;
    check_throws<InvalidArgument>(run(a), "dw_width_stride must be >= 0", "bwd: dweight stride"); }
  { auto a = good_bwd_args(); a.p.initial_states = a.p.x; a.p.is_dim_stride = -3;
    check_throws<InvalidArgument>(run(a), "is_dim_stride must be >= 0", "bwd: initial_states stride"); }
  { auto a = good_bwd_args(); a.p.dfinal_states = a.p.x; a.p.dfs_w_stride = -1;
    check_throws<InvalidArgument>(run(a), "dfs_w_stride must be >= 0", "bwd: dfinal_states stride"); }
  { auto a = good_bwd_args(); a.p.dx = const_cast<void*>(a.p.dout);
    check_throws<InvalidArgument>(run(a), "dx must not overlap dout (the kernel reads dout's neighbours", "bwd: dx == dout"); }
  { auto a = good_bwd_args(); a.p.dx = const_cast<float*>(static_cast<const float*>(a.p.x)) + 100;
    check_throws<InvalidArgument>(run(a), "dx must not overlap x", "bwd: dx overlaps x"); }
  { auto a = good_bwd_args(); a.p.dout = static_cast<const char*>(a.p.dout) + 2;
    check_throws<InvalidArgument>(run(a), "dout must be aligned to its element size (4 bytes)", "bwd: dout alignment"); }
  { auto a = good_bwd_args(); a.p.dx_batch_stride = int64_t(1) << 62;
    check_throws<InvalidArgument>(run(a), "dx: extent in bytes overflows int64", "bwd: dx extent"); }
}

void test_bwd_workspace() {
  using cc1d::InvalidArgument;
  auto a = good_bwd_args();
  const cc1d::KernelVariant v = cc1d::select_bwd(a, "sm_999");
  check(v.key.rfind("bwd.cf.f32wf32.w4.", 0) == 0, "select_bwd picks a bwd variant of the family: " + v.key);
  check(cc1d::explain_bwd(a, "sm_999").variant.key == v.key, "explain_bwd agrees with select_bwd");
  const size_t want = size_t(expected_splits(2, 8, 16, v.tile_l, v.tile_d, v.split_blocks)) * 8 * 5 * 4;
  check(cc1d::bwd_workspace_bytes(a, "sm_999") == want,
        "bwd_workspace_bytes = splits * dim * (width + 1) * 4 = " + std::to_string(want));
  // A hand-made variant states the rule with known tiles: 4 items of 2 x 2, 2 groups -> 4 splits.
  cc1d::KernelVariant t{"bwd.cf.f32wf32.w4.test", std::string(64, '0'), "", 128, 8, 4, 0, 4, 2048};
  a.workspace_bytes = 4 * 8 * 5 * 4 - 1;
  check_throws<InvalidArgument>([&] { cc1d::launch_bwd(t, a); },
                                "workspace_bytes must be >= 640 (splits 4 x dim 8 x (width + 1) x 4 bytes",
                                "launch_bwd: workspace too small");
  // split_blocks is the variant's: aiming at one block gives one split, and 160 bytes of partials.
  t.split_blocks = 1;
  a.workspace_bytes = 159;
  check_throws<InvalidArgument>([&] { cc1d::launch_bwd(t, a); }, "workspace_bytes must be >= 160 (splits 1 x",
                                "launch_bwd: split_blocks sets the splits");
  t.split_blocks = 0;
  check_throws<InvalidArgument>([&] { cc1d::launch_bwd(t, a); }, "split_blocks must be >= 1 for the backward, got 0",
                                "launch_bwd: split_blocks >= 1");
  t.split_blocks = 2048;
  a.workspace_bytes = 4 * 8 * 5 * 4 - 1;
  // 70000 channel groups clamp to 65535: one split.
  auto big = good_bwd_args();
  big.p.dim = 70000;
  big.p.x_batch_stride = big.p.dout_batch_stride = big.p.dx_batch_stride = 0;  // sizes only; nothing is read
  big.p.x_dim_stride = big.p.dout_dim_stride = big.p.dx_dim_stride = 0;
  big.p.dx = static_cast<float*>(big.p.dx) + 128;  // keep dx clear of x and dout (their spans shrank)
  big.p.w_dim_stride = big.p.dw_dim_stride = 0;
  big.p.bias_stride = big.p.db_stride = 0;
  big.workspace_bytes = 0;
  cc1d::KernelVariant one{"bwd.cf.f32wf32.w4.test", std::string(64, '0'), "", 128, 8, 1, 0, 4, 2048};
  check_throws<InvalidArgument>([&] { cc1d::launch_bwd(one, big); }, "workspace_bytes must be >= 1400000 (splits 1 x",
                                "launch_bwd: 65535 groups at most");
  // The alignment of dout alone moves the choice to a variant needing less.
  auto odd = good_bwd_args();
  odd.p.dout = static_cast<const float*>(odd.p.dout) + 1;
  const cc1d::Explanation e = cc1d::explain_bwd(odd, "sm_999");
  check(e.alignment == 4 && e.variant.align_bytes == 4 && e.variant.key.rfind("bwd.", 0) == 0,
        "explain_bwd: dout at a 4-byte offset -> " + e.variant.key);
  check_throws<InvalidArgument>([&] { auto b = odd; b.workspace_bytes = 1 << 20;
                                      cc1d::launch_bwd(v, b); }, "needs x/dout/dx base addresses",
                                "launch_bwd: variant alignment");
}

const char* kTinyKernel = R"(
extern "C" __global__ void cc1d_kernel(const float* x, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
)";

void test_nvrtc() {
  std::string version;
  try {
    version = cc1d::compiler_version("sm_90");
  } catch (const cc1d::BackendError& e) {
    std::printf("skip NVRTC tests: %s\n", e.what());
    return;
  }
  check(version.rfind("nvrtc ", 0) == 0, "compiler_version: " + version);
  auto r = cc1d::compile(kTinyKernel, "sm_90", {"--ptxas-options=-v"});
  check(r.binary.size() > 4 && r.binary[0] == 0x7f && r.binary[1] == 'E', "sm_90 CUBIN is an ELF");
  check(r.log.find("cc1d_kernel") != std::string::npos, "ptxas -v output in the log: [" + r.log + "]");
  check_throws<cc1d::CompileError>([] { cc1d::compile("this is not C++", "sm_90"); }, "error",
                                   "compile error carries the log");
  check_throws<cc1d::InvalidArgument>([] { cc1d::compile(kTinyKernel, "sm_9x"); }, "target must look like",
                                      "bad target rejected before any compiler");

}


// Many threads deciding and compiling at once: one compilation per source
// (dispatch_stats().compiles), and every thread gets the same decision.
void test_threads_compile_once() {
  try {
    cc1d::compiler_version("sm_90");
  } catch (const cc1d::BackendError&) {
    std::printf("skip thread compile test: no NVRTC\n");
    return;
  }
  const std::string src = std::string("// threads ") + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) +
                          "\n" + kTinyKernel;
  const uint64_t before = cc1d::dispatch_stats().compiles;
  std::vector<std::thread> threads;
  std::vector<std::string> keys(8), bins(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto a = good_args();
      a.p.seqlen = 16 + (t % 2);
      cc1d::clear_dispatch_cache();
      keys[t] = cc1d::explain_fwd(a, "sm_999").variant.key + "/" + std::to_string(a.p.seqlen);
      auto r = cc1d::compile(src, "sm_90");
      bins[t].assign(r.binary.begin(), r.binary.end());
    });
  for (auto& th : threads) th.join();
  check(cc1d::dispatch_stats().compiles - before == 1, "8 threads, one source: compiled once (" +
                                                          std::to_string(cc1d::dispatch_stats().compiles - before) + ")");
  bool same = true;
  for (int t = 2; t < 8; ++t) same = same && keys[t] == keys[t % 2] && bins[t] == bins[0];
  check(same, "threads agree on decisions and binaries");
}

void test_no_driver() {
  // No libcuda here (build machines): launching must fail with a clear error.
  auto a = good_args();
  try {
    cc1d::launch_fwd({"fwd.cf.f32wf32.w4.test", cc1d::sha256_hex(kTinyKernel), kTinyKernel, 128, 64, 1, 0, 4}, a);
    check(false, "launch without a GPU must throw");
  } catch (const cc1d::BackendError& e) {
    check(std::string(e.what()).find("no GPU backend owns pointer") != std::string::npos,
          std::string("no-driver launch error: ") + e.what());
  }
  check_throws<cc1d::BackendError>([] { cc1d::causal_conv1d_bwd(good_bwd_args()); }, "no GPU backend owns pointer",
                                   "causal_conv1d_bwd without a GPU");
  check_throws<cc1d::BackendError>(
      [] {
        const cc1d::BwdArgs b = good_bwd_args();
        cc1d::BwdPlan(b).run(bwd_buffers_of(b), b.workspace_bytes, nullptr);
      },
      "no GPU backend owns pointer", "BwdPlan::run without a GPU");
  check_throws<cc1d::BackendError>([&a] { cc1d::FwdPlan(a).run(buffers_of(a), nullptr); },
                                   "no GPU backend owns pointer", "FwdPlan::run without a GPU");
  check_throws<cc1d::BackendError>([] { cc1d::UpdPlan(good_upd_args()).run(upd_buffers_of(good_upd_args()), nullptr); },
                                   "no GPU backend owns pointer", "UpdPlan::run without a GPU");
  check_throws<cc1d::BackendError>([&a] { cc1d::prepare_fwd(a); }, "no GPU to prepare for",
                                   "prepare_fwd without a GPU");
  check_throws<cc1d::InvalidArgument>([&a] { auto b = a; b.width = 1; cc1d::prepare_fwd(b); },
                                      "width must be in [2, 8], got 1", "prepare_fwd checks the arguments first");
  check_throws<cc1d::InvalidArgument>([&a] { cc1d::prepare_fwd(a, -2); }, "device must be -1", "prepare_fwd device");
  try {
    cc1d::device_target("cuda", 0);
    check(false, "device_target without a driver must throw");
  } catch (const cc1d::BackendError& e) {
    check(std::string(e.what()).find("libcuda.so.1") != std::string::npos,
          std::string("device_target error names the library: ") + e.what());
  }
}

// End-to-end on a GPU when libcuda is present: channel-first and
// channel-last f32 forward (width 4, bias, SiLU) against a CPU reference.
void test_gpu_forward() {
  cc1d::DynLib cuda;
  try {
    cuda = cc1d::DynLib::open_first({"libcuda.so.1"}, "the CUDA driver");
  } catch (const cc1d::BackendError&) {
    std::printf("skip GPU forward test: no libcuda.so.1\n");
    return;
  }
  using CU = int;
  CU (*cuInit)(unsigned), (*cuDevicePrimaryCtxRetain)(void**, int), (*cuCtxSetCurrent)(void*),
      (*cuMemAlloc)(unsigned long long*, size_t), (*cuMemcpyHtoD)(unsigned long long, const void*, size_t),
      (*cuMemcpyDtoH)(void*, unsigned long long, size_t), (*cuCtxSynchronize)();
  cuda.get(cuInit, "cuInit");
  cuda.get(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  cuda.get(cuCtxSetCurrent, "cuCtxSetCurrent");
  cuda.get(cuMemAlloc, "cuMemAlloc_v2");
  cuda.get(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  cuda.get(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  cuda.get(cuCtxSynchronize, "cuCtxSynchronize");
  void* ctx = nullptr;
  if (cuInit(0) != 0 || cuDevicePrimaryCtxRetain(&ctx, 0) != 0 || cuCtxSetCurrent(ctx) != 0) {
    std::printf("skip GPU forward test: no usable device\n");
    return;
  }
  check(cc1d::device_target("cuda", 0).rfind("sm_", 0) == 0, "device_target cuda 0 = " + cc1d::device_target("cuda", 0));
  const int B = 2, D = 96, L = 1000, W = 4;
  std::vector<float> x(B * D * L), w(D * W), bias(D), ref(B * D * L);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 37) % 101) / 50.0f - 1.0f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float((i * 13) % 17) / 8.0f - 1.0f;
  for (int c = 0; c < D; ++c) bias[c] = 0.1f * float(c % 5);
  for (int layout = 0; layout < 2; ++layout) {
    // cf: x[b][c][t]; cl: x[b][t][c]
    const int64_t sb = int64_t(D) * L, sd = layout == 0 ? L : 1, sl = layout == 0 ? 1 : D;
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < D; ++c)
        for (int t = 0; t < L; ++t) {
          float acc = bias[c];
          for (int k = 0; k < W; ++k) {
            int tt = t - (W - 1) + k;
            if (tt >= 0) acc += w[c * W + k] * x[b * sb + c * sd + tt * sl];
          }
          ref[b * sb + c * sd + t * sl] = acc / (1.0f + std::exp(-acc));
        }
    unsigned long long dx = 0, dw = 0, dbias = 0, dout = 0;
    cuMemAlloc(&dx, x.size() * 4); cuMemAlloc(&dout, x.size() * 4);
    cuMemAlloc(&dw, w.size() * 4); cuMemAlloc(&dbias, bias.size() * 4);
    cuMemcpyHtoD(dx, x.data(), x.size() * 4);
    cuMemcpyHtoD(dw, w.data(), w.size() * 4);
    cuMemcpyHtoD(dbias, bias.data(), bias.size() * 4);
    cc1d::FwdArgs a;
    a.p.x = reinterpret_cast<void*>(dx); a.p.weight = reinterpret_cast<void*>(dw);
    a.p.bias = reinterpret_cast<void*>(dbias); a.p.out = reinterpret_cast<void*>(dout);
    a.p.batch = B; a.p.dim = D; a.p.seqlen = L;
    a.p.x_batch_stride = a.p.out_batch_stride = sb;
    a.p.x_dim_stride = a.p.out_dim_stride = sd;
    a.p.x_l_stride = a.p.out_l_stride = sl;
    a.p.w_dim_stride = W; a.p.w_width_stride = 1; a.p.bias_stride = 1; a.p.silu = 1;
    a.width = W;
    const std::string key = cc1d::select_fwd(a).key;
    check(cc1d::prepare_fwd(a).variant.key == key, "prepare_fwd loads the kernel select_fwd names");
    const cc1d::DispatchStats before = cc1d::dispatch_stats();
    cc1d::causal_conv1d_fwd(a);
    cc1d::causal_conv1d_fwd(a);  // second call: cache hits only
    const cc1d::DispatchStats after = cc1d::dispatch_stats();
    check(after.decisions == before.decisions && after.loads == before.loads,
          "calls after prepare_fwd decide, compile and load nothing");
    std::vector<float> out(x.size());
    check(cuCtxSynchronize() == 0, "kernel ran: " + key);
    cuMemcpyDtoH(out.data(), dout, out.size() * 4);
    double err = 0;
    for (std::size_t i = 0; i < out.size(); ++i) err = std::max(err, double(std::fabs(out[i] - ref[i])));
    check(err < 1e-4, key + " max abs error " + std::to_string(err));
    // FwdPlan: the same kernel; its second run reuses the remembered launch, and a
    // cleared dispatcher makes it decide again. Out is poisoned (NaN) before each check.
    const std::vector<float> nan_out(x.size(), std::nanf(""));
    const cc1d::FwdPlan plan(a);
    auto plan_error = [&] {
      cuMemcpyHtoD(dout, nan_out.data(), nan_out.size() * 4);
      plan.run(buffers_of(a), nullptr);
      check(cuCtxSynchronize() == 0, "FwdPlan kernel ran: " + key);
      cuMemcpyDtoH(out.data(), dout, out.size() * 4);
      double e = 0;
      for (std::size_t i = 0; i < out.size(); ++i)
        e = std::isnan(out[i]) ? INFINITY : std::max(e, double(std::fabs(out[i] - ref[i])));
      return e;
    };
    check(plan_error() < 1e-4, "FwdPlan first run matches the reference");
    const cc1d::DispatchStats plan_before = cc1d::dispatch_stats();
    check(plan_error() < 1e-4, "FwdPlan remembered run matches the reference");
    check(cc1d::dispatch_stats().decisions == plan_before.decisions, "FwdPlan's second run decides nothing");
    cc1d::clear_dispatch_cache();
    check(plan_error() < 1e-4, "FwdPlan run after clear_dispatch_cache matches the reference");
    check(cc1d::dispatch_stats().decisions == plan_before.decisions + 1,
          "FwdPlan decides again after clear_dispatch_cache");
    // Host cost of a launch once compiled (reported, not checked).
    const int n = 20000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) cc1d::causal_conv1d_fwd(a);
    auto t1 = std::chrono::steady_clock::now();
    cuCtxSynchronize();
    std::printf("info host time per causal_conv1d_fwd call: %.2f us\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) plan.run(buffers_of(a), nullptr);
    t1 = std::chrono::steady_clock::now();
    cuCtxSynchronize();
    std::printf("info host time per FwdPlan::run call: %.2f us\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
  }
}

}  // namespace

// The dispatcher without Python or a GPU: no DB -> the catalog; a missing DB
// the caller named -> one warning, then the catalog.
void test_dispatch_without_db() {
  std::vector<std::string> warnings;
  cc1d::set_log_handler([&](const std::string& m) { warnings.push_back(m); });
  cc1d::set_tuning_dbs({"/nonexistent/cc1d-test.db"});
  auto a = good_args();
  const cc1d::Explanation e = cc1d::explain_fwd(a, "sm_999");
  check(e.reason == "default" && e.source == "catalog", "no tuned shape: default from the catalog");
  check(e.variant.key == cc1d::select_fwd(a, "sm_999").key, "select_fwd agrees with explain_fwd");
  check(warnings.size() == 1 && warnings[0].find("cc1d-test.db") != std::string::npos,
        "a missing DB named by the caller warns once");
  cc1d::explain_fwd(a, "sm_999");
  check(warnings.size() == 1, "the second call is memoised (no new warning)");
  const cc1d::Explanation u = cc1d::explain_fwd(a);
  check(u.reason == "default" && u.arch.empty(), "no device and no arch: default, arch unknown");
  cc1d::set_tuning_dbs({});
  cc1d::set_log_handler({});
}

// precompile_fwd: decide and compile for a target, no GPU. Without a DB the
// catalog serves; a catalog kernel that does not compile (NVRTC knows no
// sm_20) throws rather than falling back.
void test_precompile() {
  try {
    cc1d::compiler_version("sm_90");
  } catch (const cc1d::BackendError&) {
    std::printf("skip precompile test: no NVRTC\n");
    return;
  }
  const auto a = good_args();
  const cc1d::Explanation e = cc1d::precompile_fwd(a, "sm_90");
  check(e.reason == "default" && e.arch == "sm_90" && e.variant.key == cc1d::select_fwd(a, "sm_90").key,
        "precompile_fwd compiles the catalog's choice for sm_90");
  check_throws<cc1d::CompileError>([&a] { cc1d::precompile_fwd(a, "sm_20"); }, "sm_20",
                                   "a catalog kernel that does not compile raises");
  check_throws<cc1d::InvalidArgument>([&a] { cc1d::precompile_fwd(a, ""); }, "arch must name the target",
                                      "precompile_fwd needs an arch");
}

int main() {
  test_sha256();
  test_validation();
  test_bwd_validation();
  test_bwd_workspace();
  test_fwd_matrix();
  test_upd_plan_validation();
  test_nvrtc();
  test_threads_compile_once();
  test_dispatch_without_db();
  test_precompile();
  if (std::getenv("CC1D_TEST_HAS_GPU") == nullptr) test_no_driver();
  else test_gpu_forward();
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
