// One GPU vendor as the runtime sees it: a run-time compiler (NVRTC / hipRTC)
// and a driver (CUDA driver API / HIP module API), both dlopen()ed lazily.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cc1d/cc1d.h"

namespace cc1d {

struct Dim3 { unsigned x = 1, y = 1, z = 1; };

// Entry points of one loaded kernel module.
struct Functions {
  void* kernel = nullptr;  // cc1d_kernel (every variant)
  // cc1d_reduce, a variant's second kernel: backward variants sum the dweight/dbias
  // partials; varlen variants mend each sequence's start and states.
  void* reduce = nullptr;
  // cc1d_kernel waits for the previous kernel in the stream itself (CUDA
  // griddepcontrol.wait; the module exports cc1d_waits_for_previous_grid), so it
  // may be launched before that kernel ends. Every op passes it to its cc1d_kernel
  // launch, and the backward to its cc1d_reduce too (which waits as well).
  bool waits_for_previous = false;
  // With one split the backward's cc1d_kernel writes dweight/dbias itself, and no
  // cc1d_reduce is to run (the module exports cc1d_writes_one_split_sums).
  bool writes_one_split_sums = false;
  // The channel-last forward's grid is (channel groups, chunks of rows, batch), not
  // (chunks, groups, batch) (the module exports cc1d_cl_groups_first_grid).
  bool cl_groups_first_grid = false;
  // Varlen's cc1d_reduce (the mend) loads before it waits for cc1d_kernel and stores
  // after, so it may be launched before cc1d_kernel ends (the module exports
  // cc1d_mend_waits_for_previous_grid). A mend without the marker (HIP, or a source
  // from an older tuning DB) stores without waiting: launched plainly.
  bool mend_waits = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* vendor() const = 0;  // "cuda" | "hip"

  // ---- compiler: usable without a GPU or driver -------------------------
  virtual std::string compiler_version() = 0;
  // Throws CompileError carrying the full log; BackendError if no compiler.
  virtual CompileResult compile(const std::string& source, const std::string& target,
                                const std::vector<std::string>& options) = 0;

  // ---- driver -----------------------------------------------------------
  virtual std::string device_target(int device) = 0;   // "sm_90", "gfx942"
  // Device ordinal owning `ptr`, or -1 (not ours, host memory, or no driver).
  // Never throws and never loads a compiler.
  virtual int device_of_pointer(const void* ptr) noexcept = 0;
  // Devices this vendor's driver sees; 0 when there is no driver. Never throws.
  virtual int device_count() noexcept = 0;
  // Ordinal of the calling thread's current device, or -1 when none is current
  // (CUDA: no context current on this thread; no driver). Never throws.
  virtual int current_device() noexcept = 0;
  virtual Dim3 max_grid(int device) = 0;
  // The module of `hash` in the device's current context: its entry points,
  // or {} if it is not loaded there. Cheap: a lookup, no allocation once loaded.
  virtual Functions find_functions(int device, const std::string& hash) = 0;
  // What find_functions looks modules up by, as an opaque handle: CUDA the
  // calling thread's current context (nullptr when none is current), HIP the
  // device. Equal handles find the same modules. Cheap; never throws.
  virtual const void* module_scope(int device) noexcept = 0;
  // Loads `binary` as a module, caches it under `hash`, returns its entry points.
  // smem_bytes: dynamic shared memory cc1d_kernel's launches will ask for (opt-in > 48 KB).
  // with_reduce: look up cc1d_reduce too (backward, varlen); never probed otherwise, as
  // a failed lookup would leave HIP's last-error set for the caller's next check.
  virtual Functions load_functions(int device, const std::string& hash, const std::vector<uint8_t>& binary,
                                   int smem_bytes, bool with_reduce) = 0;
  // Whether `stream` is being captured into a graph (loading a module then could break
  // the capture). Never throws; true when it cannot tell.
  virtual bool stream_capturing(void* stream) noexcept = 0;
  // Whether an early launch onto `stream` may gain: CUDA, while the stream is captured
  // into a graph, only where the node the launch follows is one of cc1d's kernels (they
  // let the next grid launch at their start); true outside captures and where the driver
  // cannot say. Never throws.
  virtual bool early_launch_helps(void* /*stream*/) noexcept { return true; }
  // early: the kernel waits for the previous one itself (Functions::waits_for_previous),
  // so the launch may overlap that kernel's tail (CUDA programmatic dependent launch,
  // unless CC1D_DISABLE_PDL=1, the driver lacks it or early_launch_helps says no; HIP
  // ignores it).
  virtual void launch(void* function, Dim3 grid, Dim3 block, unsigned smem_bytes,
                      void* stream, void* params, std::size_t params_size, bool early) = 0;
};

// Process-wide backends; constructing one loads nothing.
Backend& cuda_backend();
Backend& hip_backend();
// "sm_*" -> CUDA, "gfx*" -> HIP; InvalidArgument otherwise.
Backend& backend_for_target(const std::string& target);
Backend& backend_for_vendor(const std::string& vendor);  // "cuda"/"nvidia", "hip"/"amd"/"rocm"

}  // namespace cc1d
