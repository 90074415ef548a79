// cc1d public C++ API: causal depthwise conv1d kernels compiled at run time
// (NVRTC on NVIDIA, hipRTC on AMD) and launched on the caller's stream.
#pragma once
#include <cstdint>
#include <functional>
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
// store them. Grid = (ceil(seqlen/tile_l), ceil(dim/tile_d), batch), each
// clamped to the device limit (kernels loop over the remainder).
struct KernelVariant {
  std::string key;      // readable: fwd.cf.bf16wf32.w4.t128.v16.n2.r1.hreload
  std::string hash;     // sha256 hex of `source`
  std::string source;   // complete translation unit, entry point `cc1d_kernel`
  int threads = 0;      // threads per block
  int tile_l = 0;       // sequence positions per block
  int tile_d = 0;       // channels per block
  int smem_bytes = 0;   // dynamic shared memory per block
  int align_bytes = 1;  // x/out base pointers and outer strides must be multiples of this (bytes)
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

// The variant causal_conv1d_fwd would launch for these arguments.
KernelVariant select_fwd(const FwdArgs& args);

// Launches exactly this variant (the tuner and the tests use it; same compile
// cache and launch path as causal_conv1d_fwd). Throws InvalidArgument if the
// call breaks the variant's stated requirements.
void launch_fwd(const KernelVariant& v, const FwdArgs& args);

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
