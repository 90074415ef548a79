// Host cost of one eager forward call in C++, piece by piece: the argument
// checks, locating x's device, the dispatcher's memo, the module lookup, the
// grid limits, the launch itself, and the whole call (cc1d::causal_conv1d_fwd
// and a cc1d::FwdPlan). Each figure is the median over rounds of `calls`
// back-to-back calls, timed up to the last call and synchronised outside the
// timing, so a launch queue never fills and the GPU's speed does not show.
//
//   cc1d_host_pieces [--calls N] [--rounds R]
//
// Exit status: 0 measured, 1 an error, 77 no CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cc1d/cc1d.h"
#include "dispatch.h"

namespace {

constexpr int kNoDevice = 77;

void cuda_check(cudaError_t r, const char* what) {
  if (r != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(r));
    std::exit(1);
  }
}

// Median µs per call of `piece` over `rounds` rounds of `calls` calls.
double per_call_us(const std::function<void()>& piece, int calls, int rounds) {
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) piece();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
  }
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct Buffers {
  void *x = nullptr, *w = nullptr, *bias = nullptr, *out = nullptr;
  Buffers(std::size_t x_bytes, std::size_t w_bytes, std::size_t b_bytes) {
    cuda_check(cudaMalloc(&x, x_bytes), "cudaMalloc x");
    cuda_check(cudaMalloc(&w, w_bytes), "cudaMalloc weight");
    cuda_check(cudaMalloc(&bias, b_bytes), "cudaMalloc bias");
    cuda_check(cudaMalloc(&out, x_bytes), "cudaMalloc out");
    cuda_check(cudaMemset(x, 0, x_bytes), "cudaMemset x");
    cuda_check(cudaMemset(w, 0, w_bytes), "cudaMemset weight");
    cuda_check(cudaMemset(bias, 0, b_bytes), "cudaMemset bias");
  }
  ~Buffers() {
    cudaFree(x);
    cudaFree(w);
    cudaFree(bias);
    cudaFree(out);
  }
};

// The (1, 64, 128) bf16 width-4 bias+SiLU call the Python overhead benchmarks time.
cc1d::FwdArgs small_call(const Buffers& b, bool channel_last) {
  const int64_t batch = 1, dim = 64, seqlen = 128;
  cc1d::FwdArgs a;
  cc1d::FwdParams& p = a.p;
  p.x = b.x;
  p.weight = b.w;
  p.bias = b.bias;
  p.out = b.out;
  p.batch = batch;
  p.dim = dim;
  p.seqlen = seqlen;
  p.x_batch_stride = p.out_batch_stride = dim * seqlen;
  p.x_dim_stride = p.out_dim_stride = channel_last ? 1 : seqlen;
  p.x_l_stride = p.out_l_stride = channel_last ? dim : 1;
  p.w_dim_stride = 4;
  p.w_width_stride = 1;
  p.bias_stride = 1;
  p.silu = 1;
  a.x_dtype = a.w_dtype = cc1d::DType::bf16;
  a.width = 4;
  return a;
}

void run_layout(bool channel_last, int calls, int rounds) {
  Buffers buf(64 * 128 * 2, 64 * 4 * 2, 64 * 2);
  const cc1d::FwdArgs a = small_call(buf, channel_last);
  cc1d::causal_conv1d_fwd(a);  // decide, compile, load: nothing of that is timed
  cuda_check(cudaDeviceSynchronize(), "the first call");

  const cc1d::Layout layout = cc1d::validate_fwd(a);
  const cc1d::Location l = cc1d::locate(a.p.x);
  const int arch = cc1d::arch_id_of(l);
  const cc1d::Call c = cc1d::fwd_call(a, layout);
  const auto d = cc1d::decide(c, arch);
  const cc1d::KernelVariant& v = *d->variant;
  const cc1d::Functions f = cc1d::functions_on(l, v, false);
  const cc1d::Dim3 max = l.backend->max_grid(l.device);
  const cc1d::Dim3 grid{cc1d::grid_dim(a.p.seqlen, v.tile_l, max.x), cc1d::grid_dim(a.p.dim, v.tile_d, max.y),
                        cc1d::grid_dim(a.p.batch, 1, max.z)};
  cc1d::FwdParams params = a.p;
  const cc1d::FwdPlan plan(a);
  cc1d::FwdBuffers buffers;
  buffers.x = a.p.x;
  buffers.weight = a.p.weight;
  buffers.bias = a.p.bias;
  buffers.out = a.p.out;
  plan.run(buffers, nullptr);

  struct Row {
    const char* piece;
    std::function<void()> fn;
  };
  volatile int sink = 0;
  const std::vector<Row> rows = {
      {"validate_fwd (argument checks)", [&] { sink = int(cc1d::validate_fwd(a)); }},
      {"fwd_alignment", [&] { sink = cc1d::fwd_alignment(a, layout); }},
      {"locate (cuPointerGetAttribute)", [&] { sink = cc1d::locate(a.p.x).device; }},
      {"arch_id_of (remembered per device)", [&] { sink = cc1d::arch_id_of(l); }},
      {"current_device (cuCtxGetCurrent + cuCtxGetDevice)", [&] { sink = l.backend->current_device(); }},
      {"decide (dispatcher memo hit)", [&] { sink = cc1d::decide(c, arch)->alignment; }},
      {"functions_on (module lookup in the current context)",
       [&] { sink = cc1d::functions_on(l, v, false).kernel != nullptr; }},
      {"max_grid", [&] { sink = int(l.backend->max_grid(l.device).x); }},
      {"launch (cuLaunchKernel, all else precomputed)",
       [&] {
         l.backend->launch(f.kernel, grid, cc1d::Dim3{unsigned(v.threads), 1, 1}, unsigned(v.smem_bytes), nullptr,
                           &params, sizeof params, f.waits_for_previous);
       }},
      {"cc1d::causal_conv1d_fwd (whole call)", [&] { cc1d::causal_conv1d_fwd(a); }},
      {"cc1d::FwdPlan (whole call, pointers per call)",
       [&] { plan.run(buffers, nullptr); }},
  };
  std::printf("\n%s: %s\n", channel_last ? "channel-last" : "channel-first", v.key.c_str());
  std::printf("| piece | us per call |\n|---|---|\n");
  for (const Row& r : rows) std::printf("| %s | %.3f |\n", r.piece, per_call_us(r.fn, calls, rounds));
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 200, rounds = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int n = std::atoi(argv[i + 1]);
    if ((flag != "--calls" && flag != "--rounds") || n < 1) {
      std::fprintf(stderr, "usage: cc1d_host_pieces [--calls N] [--rounds R] (positive integers), got %s %s\n",
                   argv[i], argv[i + 1]);
      return 2;
    }
    (flag == "--calls" ? calls : rounds) = n;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cc1d_host_pieces: no CUDA device; nothing to measure\n");
    return kNoDevice;
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s: host cost per call of a (1, 64, 128) bf16 width-4 forward with bias and SiLU; "
              "median of %d rounds of %d calls\n", prop.name, rounds, calls);
  try {
    run_layout(false, calls, rounds);
    run_layout(true, calls, rounds);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cc1d_host_pieces: %s\n", e.what());
    return 1;
  }
  return 0;
}
