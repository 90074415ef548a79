// cc1d from C++, no Python: a causal depthwise conv1d forward on the GPU through
// cc1d::causal_conv1d_fwd (tuning-DB lookup, run-time compile, launch), checked
// against a double-precision host reference, then the host cost of a call.
//
//   cc1d_forward [--batch B] [--dim D] [--seqlen L] [--layout cf|cl] [--calls N]
//
// Exit status: 0 right result, 1 wrong result or an error, 2 bad arguments,
// 77 no CUDA device (ctest counts that as skipped).
// The shipped tuning DBs are found through CC1D_PACKAGE_DIR (a folder holding
// tuning_db/<arch>.db, e.g. the repository root); the user's DB and
// CC1D_TUNING_DB are read as in Python (docs/DISPATCH.md).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc1d/cc1d.h"

namespace {

constexpr int kNoDevice = 77;

struct Options {
  int64_t batch = 2, dim = 1024, seqlen = 4096;
  bool channel_last = false;
  int calls = 20000;  // timed calls for the host-overhead figure
};

struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void cuda_check(cudaError_t r, const char* what) {
  if (r != cudaSuccess)
    throw CudaFailure(std::string(what) + " failed: " + cudaGetErrorName(r) + " (" + cudaGetErrorString(r) + ")");
}

// A device buffer, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { cuda_check(cudaMalloc(&p_, bytes), "cudaMalloc"); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// One f32 problem: host data, device copies, the call's arguments.
struct Problem {
  int64_t batch, dim, seqlen;
  bool channel_last;
  static constexpr int kWidth = 4;
  std::vector<float> x, weight, bias;
  DeviceBuffer dx, dweight, dbias, dout;
  cc1d::FwdArgs args;

  Problem(int64_t b, int64_t d, int64_t l, bool cl, unsigned seed)
      : batch(b), dim(d), seqlen(l), channel_last(cl), x(std::size_t(b * d * l)), weight(std::size_t(d * kWidth)),
        bias(std::size_t(d)), dx(x.size() * 4), dweight(weight.size() * 4), dbias(bias.size() * 4),
        dout(x.size() * 4) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
    for (float& v : weight) v = normal(rng) / 2.0f;  // 1/sqrt(width): outputs of order 1
    for (float& v : bias) v = normal(rng);
    cuda_check(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy x");
    cuda_check(cudaMemcpy(dweight.get(), weight.data(), weight.size() * 4, cudaMemcpyHostToDevice),
               "cudaMemcpy weight");
    cuda_check(cudaMemcpy(dbias.get(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy bias");
    poison_output();

    cc1d::FwdParams& p = args.p;
    p.x = dx.get();
    p.weight = dweight.get();
    p.bias = dbias.get();
    p.out = dout.get();
    p.batch = b;
    p.dim = d;
    p.seqlen = l;
    // channel-first: x[b][c][t]; channel-last: x[b][t][c]. out has x's layout.
    p.x_batch_stride = p.out_batch_stride = d * l;
    p.x_dim_stride = p.out_dim_stride = cl ? 1 : l;
    p.x_l_stride = p.out_l_stride = cl ? d : 1;
    p.w_dim_stride = kWidth;
    p.w_width_stride = 1;
    p.bias_stride = 1;
    p.silu = 1;
    args.x_dtype = args.w_dtype = cc1d::DType::f32;
    args.width = kWidth;
    args.stream = nullptr;  // the default stream
  }

  // All bits set is a NaN in f32: an element the kernel does not write fails the check.
  void poison_output() { cuda_check(cudaMemset(dout.get(), 0xff, x.size() * 4), "cudaMemset out"); }

  int64_t at(int64_t b, int64_t c, int64_t t) const {
    return b * args.p.x_batch_stride + c * args.p.x_dim_stride + t * args.p.x_l_stride;
  }

  // Relative L2 error of the device output against a double-precision
  // reference; NaN if any element is NaN.
  double relative_error() const {
    std::vector<float> out(x.size());
    cuda_check(cudaMemcpy(out.data(), dout.get(), out.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy out");
    double diff2 = 0, ref2 = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t c = 0; c < dim; ++c)
        for (int64_t t = 0; t < seqlen; ++t) {
          double acc = bias[std::size_t(c)];
          for (int k = 0; k < kWidth; ++k) {
            const int64_t tt = t - (kWidth - 1) + k;
            if (tt >= 0) acc += double(weight[std::size_t(c * kWidth + k)]) * x[std::size_t(at(b, c, tt))];
          }
          const double ref = acc / (1.0 + std::exp(-acc));
          const double got = out[std::size_t(at(b, c, t))];
          if (std::isnan(got)) return NAN;
          diff2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
        }
    return std::sqrt(diff2 / (ref2 > 0 ? ref2 : 1e-300));
  }
};

void print_explanation(const cc1d::Explanation& e) {
  std::printf("dispatch: %s %s align %d -> %s\n", e.arch.c_str(), e.call_shape.c_str(), e.alignment,
              e.variant.key.c_str());
  std::printf("  reason: %s, from %s", e.reason.c_str(), e.source.c_str());
  if (e.reason == "nearest") std::printf(" (tuned shape %s, distance %.3f)", e.matched_shape.c_str(), e.distance);
  std::printf("\n  detail: %s\n", e.detail.c_str());
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Wall time per call of `calls` back-to-back causal_conv1d_fwd calls on a
// small shape, after a warm-up: the dispatcher's memo lookup, the argument
// checks and the launch. Timed before the final synchronize, so it is the
// host's cost (or the GPU's, if the GPU is the slower of the two).
double host_overhead_us(int calls, bool channel_last) {
  Problem small(1, 64, 128, channel_last, 7);
  cc1d::prepare_fwd(small.args);  // decide, compile, load: nothing of that is timed
  for (int i = 0; i < 100; ++i) cc1d::causal_conv1d_fwd(small.args);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) cc1d::causal_conv1d_fwd(small.args);
  const double ms = ms_since(t0);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return ms * 1000.0 / calls;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cc1d_forward: %s: expected a value after it\n", a.c_str());
      return false;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    const bool is_int = !v.empty() && *end == '\0';
    if (a == "--layout") {
      if (v != "cf" && v != "cl") {
        std::fprintf(stderr, "cc1d_forward: --layout: expected cf or cl, got %s\n", v.c_str());
        return false;
      }
      o.channel_last = v == "cl";
    } else if (a == "--batch" || a == "--dim" || a == "--seqlen" || a == "--calls") {
      if (!is_int || n < 1 || n > (int64_t(1) << 30)) {
        std::fprintf(stderr, "cc1d_forward: %s: expected an integer in [1, 2^30], got %s\n", a.c_str(), v.c_str());
        return false;
      }
      if (a == "--calls") o.calls = int(n);
      else (a == "--batch" ? o.batch : a == "--dim" ? o.dim : o.seqlen) = n;
    } else {
      std::fprintf(stderr,
                   "cc1d_forward: unknown option %s\n"
                   "usage: cc1d_forward [--batch B] [--dim D] [--seqlen L] [--layout cf|cl] [--calls N]\n",
                   a.c_str());
      return false;
    }
  }
  return true;
}

int run(const Options& o) {
  int devices = 0;
  if (cudaError_t r = cudaGetDeviceCount(&devices); r != cudaSuccess || devices == 0) {
    std::printf("cc1d_forward: no CUDA device (%s); nothing to run\n",
                r != cudaSuccess ? cudaGetErrorString(r) : "the driver sees none");
    return kNoDevice;
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device 0: %s (%s)\n", prop.name, cc1d::device_target("cuda", 0).c_str());

  Problem pb(o.batch, o.dim, o.seqlen, o.channel_last, 1);
  std::printf("problem: f32 x (%lld, %lld, %lld) %s, f32 weight width %d, bias, SiLU\n", (long long)o.batch,
              (long long)o.dim, (long long)o.seqlen, o.channel_last ? "channel-last" : "channel-first",
              Problem::kWidth);
  print_explanation(cc1d::explain_fwd(pb.args));

  const auto t0 = std::chrono::steady_clock::now();
  cc1d::causal_conv1d_fwd(pb.args);  // the first call compiles (or reads the compile cache) and loads
  cuda_check(cudaDeviceSynchronize(), "the forward kernel");
  std::printf("first call (compile or cache read, load, run): %.1f ms\n", ms_since(t0));
  const double err = pb.relative_error();
  const double tolerance = 2e-5;  // f32, as the tuner's validation
  const bool ok = err <= tolerance;  // false for NaN
  std::printf("relative L2 error vs float64 reference: %.3e (tolerance %.0e): %s\n", err, tolerance,
              ok ? "ok" : std::isnan(err) ? "FAILED (NaN: unwritten or invalid elements)" : "FAILED");

  const double us = host_overhead_us(o.calls, o.channel_last);
  std::printf("host overhead: %.2f us per call (%d calls of (1, 64, 128), dispatch + launch; target < 5 us)\n", us,
              o.calls);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  try {
    return run(o);
  } catch (const cc1d::Error& e) {
    std::fprintf(stderr, "cc1d_forward: cc1d error: %s\n", e.what());
  } catch (const CudaFailure& e) {
    std::fprintf(stderr, "cc1d_forward: CUDA error: %s\n", e.what());
  }
  return 1;
}
