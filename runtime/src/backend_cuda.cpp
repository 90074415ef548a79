// NVIDIA backend: NVRTC (compile to CUBIN, no driver needed) and the CUDA
// driver API (libcuda.so.1), both dlopen()ed on first use. The few types and
// prototypes we need are declared here so no CUDA header is needed to build.
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend.h"
#include "dynlib.h"
#include "env.h"

namespace cc1d {
namespace {

// ---- declarations (cuda.h / nvrtc.h subset) ------------------------------
enum CUresult : int { CUDA_SUCCESS = 0 };
enum nvrtcResult : int { NVRTC_SUCCESS = 0 };
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphNode = struct CUgraphNode_st*;
struct CUgraphEdgeData { unsigned char from_port, to_port, type, reserved[5]; };
using nvrtcProgram = struct _nvrtcProgram*;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int kDefaultSmemLimit = 48 * 1024;
constexpr int CUDA_ERROR_NOT_FOUND = 500;
constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr int CU_GRAPH_NODE_TYPE_KERNEL = 0;
// cuGraphKernelNodeGetParams_v2's CUDA_KERNEL_NODE_PARAMS_v2 (72 bytes), read only for
// its first field; room to spare should a driver write more.
struct KernelNodeParams {
  CUfunction func;
  unsigned char rest[248];
};

// cuLaunchKernelEx's configuration (cuda.h, CUDA 12.0+), only what cc1d sets.
using CUdeviceptr = unsigned long long;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
    void* align;
  } value;
};
struct CUlaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem_bytes;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "cuda.h's CUlaunchAttribute is 72 bytes");

struct Driver {
  DynLib lib;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuPointerGetAttribute)(void*, int, unsigned long long);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuModuleGetGlobal)(CUdeviceptr*, size_t*, CUmodule, const char*);
  // CUDA 12.0+ drivers; nullptr before, and kernels are then launched plainly.
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, int*) = nullptr;  // CUDA 10+; the status: 0 = none
  // What a launch under capture follows (early_launch_helps): CUDA 12.3+ (v3), 11.3+ (v2).
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                        const CUgraphEdgeData**, size_t*) = nullptr;
  CUresult (*cuStreamGetCaptureInfo_v2)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                        size_t*) = nullptr;
  CUresult (*cuGraphNodeGetType)(CUgraphNode, int*) = nullptr;
  CUresult (*cuGraphKernelNodeGetParams_v2)(CUgraphNode, KernelNodeParams*) = nullptr;
};

struct Nvrtc {
  DynLib lib;
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcVersion)(int*, int*);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int,
                                    const char* const*, const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
};

const Driver* g_driver = nullptr;  // set once the driver is loaded (for error names)
const Nvrtc* g_nvrtc = nullptr;

[[noreturn]] void throw_error(CUresult r, const char* call, const std::string& context) {
  const char* name = nullptr;
  if (!g_driver || g_driver->cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "CUDA_ERROR_?";
  throw BackendError(std::string(call) + " failed: " + name + " (" + std::to_string(int(r)) +
                     ")" + (context.empty() ? "" : "; " + context));
}
[[noreturn]] void throw_error(nvrtcResult r, const char* call, const std::string& context) {
  const char* name = g_nvrtc ? g_nvrtc->nvrtcGetErrorString(r) : "NVRTC_ERROR_?";
  throw BackendError(std::string(call) + " failed: " + name + " (" + std::to_string(int(r)) +
                     ")" + (context.empty() ? "" : "; " + context));
}

// The context expression is evaluated only on failure.
#define CC1D_CUDA_CHECK(call, context)                          \
  do {                                                          \
    auto cc1d_r_ = (call);                                      \
    if (cc1d_r_ != 0) throw_error(cc1d_r_, #call, (context));   \
  } while (0)

std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> names;
  if (!env().nvrtc_path.empty()) names.push_back(env().nvrtc_path);
  const char* sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
  for (const char* s : sonames) names.push_back(s);
  for (const char* dir : {"/usr/local/cuda/lib64/", "/usr/local/cuda/targets/x86_64-linux/lib/"})
    for (const char* s : sonames) names.push_back(std::string(dir) + s);
  return names;
}

// RAII for an NVRTC program.
struct Program {
  nvrtcProgram p = nullptr;
  ~Program() { if (p) g_nvrtc->nvrtcDestroyProgram(&p); }
};

// RAII for a loaded module; unload errors at process exit are ignored.
struct Module {
  CUmodule m = nullptr;
  explicit Module(CUmodule mod) : m(mod) {}
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module() { if (m && g_driver) g_driver->cuModuleUnload(m); }
};

// Whether the module exports a marker (a global the templates define to say what its
// kernels do, Functions): cc1d_waits_for_previous_grid, cc1d_writes_one_split_sums,
// cc1d_cl_groups_first_grid, cc1d_mend_waits_for_previous_grid.
bool exports(const Driver& d, CUmodule mod, const char* marker) {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  const CUresult r = d.cuModuleGetGlobal(&address, &bytes, mod, marker);
  if (r == CUDA_ERROR_NOT_FOUND) return false;
  CC1D_CUDA_CHECK(r, std::string("looking up ") + marker);
  return true;
}

struct Loaded {
  std::unique_ptr<Module> module;
  Functions functions;
};

class CudaBackend final : public Backend {
 public:
  const char* vendor() const override { return "cuda"; }

  std::string compiler_version() override {
    const Nvrtc& n = nvrtc();
    int major = 0, minor = 0;
    CC1D_CUDA_CHECK(n.nvrtcVersion(&major, &minor), "");
    // The file name carries the patch release (libnvrtc.so.13.0.88), which
    // nvrtcVersion does not; cache keys must change when the compiler does.
    std::string path = n.lib.real_path();
    return "nvrtc " + std::to_string(major) + "." + std::to_string(minor) + " (" +
           path.substr(path.find_last_of('/') + 1) + ")";
  }

  CompileResult compile(const std::string& source, const std::string& target,
                        const std::vector<std::string>& options) override {
    const Nvrtc& n = nvrtc();
    Program prog;
    CC1D_CUDA_CHECK(n.nvrtcCreateProgram(&prog.p, source.c_str(), "cc1d_kernel.cu", 0, nullptr, nullptr),
                    "target " + target);
    std::vector<std::string> opts = {"--gpu-architecture=" + target, "-std=c++17"};
    // NVRTC 13 keeps its own compute cache (~/.nv/ComputeCache when a driver is
    // present) and returns an EMPTY log on its hits, which hides ptxas -v
    // output; our cache already does that job.
    if (nvrtc_major_ >= 13) opts.push_back("--no-cache");
    opts.insert(opts.end(), options.begin(), options.end());
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    nvrtcResult rc = n.nvrtcCompileProgram(prog.p, int(argv.size()), argv.data());
    CompileResult out;
    size_t log_size = 0;
    if (n.nvrtcGetProgramLogSize(prog.p, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      out.log.resize(log_size);
      n.nvrtcGetProgramLog(prog.p, &out.log[0]);
      out.log.resize(log_size - 1);  // drop the terminating NUL
    }
    if (rc != NVRTC_SUCCESS) {
      std::string cmd;
      for (const auto& o : opts) cmd += " " + o;
      throw CompileError("NVRTC failed to compile for " + target + " (" + n.nvrtcGetErrorString(rc) +
                         "), options:" + cmd + "\n" + out.log);
    }
    size_t size = 0;
    CC1D_CUDA_CHECK(n.nvrtcGetCUBINSize(prog.p, &size), "target " + target);
    out.binary.resize(size);
    CC1D_CUDA_CHECK(n.nvrtcGetCUBIN(prog.p, reinterpret_cast<char*>(out.binary.data())), "target " + target);
    return out;
  }

  std::string device_target(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    return device_info(device).target;
  }

  int device_of_pointer(const void* ptr) noexcept override {
    const Driver* d = driver_or_null();
    if (!d || !ptr) return -1;
    int ordinal = -1;
    // Fails (CUDA_ERROR_INVALID_VALUE) for memory the driver does not know.
    if (d->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 reinterpret_cast<unsigned long long>(ptr)) != CUDA_SUCCESS)
      return -1;
    return ordinal;
  }

  int device_count() noexcept override {
    const Driver* d = driver_or_null();
    int n = 0;
    return d && d->cuDeviceGetCount(&n) == CUDA_SUCCESS ? n : 0;
  }

  int current_device() noexcept override {
    const Driver* d = driver_or_null();
    CUcontext ctx = nullptr;
    CUdevice dev = 0;
    if (!d || d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || d->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
      return -1;
    return dev;  // a CUdevice is the device's ordinal
  }

  Dim3 max_grid(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    return device_info(device).max_grid;
  }

  Functions find_functions(int device, const std::string& hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    CUcontext ctx = current_context(device);
    auto c = modules_.find(ctx);
    if (c == modules_.end()) return {};
    auto f = c->second.find(hash);
    return f == c->second.end() ? Functions{} : f->second.functions;
  }

  bool stream_capturing(void* stream) noexcept override {
    const Driver* d = driver_or_null();
    int status = 0;
    if (!d || !d->cuStreamIsCapturing) return true;
    return d->cuStreamIsCapturing(static_cast<CUstream>(stream), &status) != CUDA_SUCCESS || status != 0;
  }

  const void* module_scope(int /*device: modules are per context*/) noexcept override {
    const Driver* d = driver_or_null();
    CUcontext ctx = nullptr;
    return d && d->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS ? ctx : nullptr;
  }

  Functions load_functions(int device, const std::string& hash, const std::vector<uint8_t>& binary,
                           int smem_bytes, bool with_reduce) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Driver& d = driver();
    CUcontext ctx = current_context(device);
    auto& per_ctx = modules_[ctx];
    if (auto f = per_ctx.find(hash); f != per_ctx.end()) {
      Functions& fs = f->second.functions;
      if (with_reduce && !fs.reduce) {  // loaded before by a path that did not need it
        CUfunction reduce = nullptr;
        CC1D_CUDA_CHECK(d.cuModuleGetFunction(&reduce, f->second.module->m, "cc1d_reduce"), "kernel " + hash);
        fs.reduce = reduce;
        if (fs.waits_for_previous) early_kernels_.insert(reduce);
      }
      return fs;
    }
    CUmodule mod = nullptr;
    CC1D_CUDA_CHECK(d.cuModuleLoadData(&mod, binary.data()), "kernel " + hash + " on device " + std::to_string(device));
    Loaded l;
    l.module = std::make_unique<Module>(mod);
    CUfunction kernel = nullptr, reduce = nullptr;
    CC1D_CUDA_CHECK(d.cuModuleGetFunction(&kernel, mod, "cc1d_kernel"), "kernel " + hash);
    if (smem_bytes > kDefaultSmemLimit)
      CC1D_CUDA_CHECK(d.cuFuncSetAttribute(kernel, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                      "kernel " + hash + " asks for " + std::to_string(smem_bytes) + " bytes of shared memory");
    if (with_reduce) CC1D_CUDA_CHECK(d.cuModuleGetFunction(&reduce, mod, "cc1d_reduce"), "kernel " + hash);
    // By name: a positional initialiser silently shifts the markers when a field is added.
    l.functions.kernel = kernel;
    l.functions.reduce = reduce;
    l.functions.waits_for_previous = exports(d, mod, "cc1d_waits_for_previous_grid");
    l.functions.writes_one_split_sums = exports(d, mod, "cc1d_writes_one_split_sums");
    l.functions.cl_groups_first_grid = exports(d, mod, "cc1d_cl_groups_first_grid");
    l.functions.mend_waits = exports(d, mod, "cc1d_mend_waits_for_previous_grid");
    if (l.functions.waits_for_previous) {
      early_kernels_.insert(kernel);
      if (reduce) early_kernels_.insert(reduce);
    }
    const Functions f = l.functions;
    per_ctx.emplace(hash, std::move(l));
    return f;
  }

  // In a graph, an early launch after another library's kernel (a GEMM, typically) measured
  // slower than a plain one (H100, decode update after a GEMM: 0.3-0.4 us per call), while
  // after cc1d's own kernels, which let the next grid launch at their start, it gains
  // (docs/PERFORMANCE.md, session 41). Outside captures the stream's last kernel is not
  // known: early, as before. CC1D_PDL_AFTER_ANY=1: early after any kernel (the old rule).
  bool early_launch_helps(void* stream) noexcept override {
    const Driver* d = driver_or_null();
    if (env().pdl_after_any || !d || !d->cuGraphNodeGetType || !d->cuGraphKernelNodeGetParams_v2) return true;
    int status = 0;
    const CUgraphNode* deps = nullptr;
    const CUgraphEdgeData* edges = nullptr;
    size_t n = 0;
    const CUstream s = static_cast<CUstream>(stream);
    CUresult r;
    if (d->cuStreamGetCaptureInfo_v3) r = d->cuStreamGetCaptureInfo_v3(s, &status, nullptr, nullptr, &deps, &edges, &n);
    else if (d->cuStreamGetCaptureInfo_v2) r = d->cuStreamGetCaptureInfo_v2(s, &status, nullptr, nullptr, &deps, &n);
    else return true;
    if (r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return true;
    if (n != 1 || deps == nullptr) return false;  // the graph's first node, or a join
    int type = -1;
    KernelNodeParams kp{};
    if (d->cuGraphNodeGetType(deps[0], &type) != CUDA_SUCCESS || type != CU_GRAPH_NODE_TYPE_KERNEL ||
        d->cuGraphKernelNodeGetParams_v2(deps[0], &kp) != CUDA_SUCCESS)
      return false;
    std::lock_guard<std::mutex> lock(mu_);
    return early_kernels_.count(kp.func) != 0;
  }

  void launch(void* function, Dim3 g, Dim3 b, unsigned smem, void* stream, void* params,
              std::size_t params_size, bool early) override {
    void* args[] = {params};
    const Driver& d = driver();
    CUresult r;
    if (early && d.cuLaunchKernelEx && early_launch_helps(stream)) {
      CUlaunchAttribute overlap{};
      overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      overlap.value.programmatic_stream_serialization_allowed = 1;
      const CUlaunchConfig config{g.x, g.y, g.z, b.x, b.y, b.z, smem, static_cast<CUstream>(stream), &overlap, 1};
      r = d.cuLaunchKernelEx(&config, static_cast<CUfunction>(function), args, nullptr);
    } else {
      r = d.cuLaunchKernel(static_cast<CUfunction>(function), g.x, g.y, g.z, b.x, b.y, b.z, smem,
                           static_cast<CUstream>(stream), args, nullptr);
    }
    CC1D_CUDA_CHECK(r,
                    "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) +
                        ") block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                        std::to_string(b.z) + ") smem " + std::to_string(smem) + " params " +
                        std::to_string(params_size) + " bytes");
  }

 private:
  struct DeviceInfo {
    bool ready = false;
    std::string target;
    Dim3 max_grid;
    CUcontext primary = nullptr;
  };

  const Nvrtc& nvrtc() {
    std::call_once(nvrtc_once_, [this] {
      try {
        nvrtc_.lib = DynLib::open_first(nvrtc_candidates(), "NVRTC (set CC1D_NVRTC to its path)");
        auto& n = nvrtc_;
        n.lib.get(n.nvrtcGetErrorString, "nvrtcGetErrorString");
        n.lib.get(n.nvrtcVersion, "nvrtcVersion");
        n.lib.get(n.nvrtcCreateProgram, "nvrtcCreateProgram");
        n.lib.get(n.nvrtcDestroyProgram, "nvrtcDestroyProgram");
        n.lib.get(n.nvrtcCompileProgram, "nvrtcCompileProgram");
        n.lib.get(n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
        n.lib.get(n.nvrtcGetProgramLog, "nvrtcGetProgramLog");
        n.lib.get(n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
        n.lib.get(n.nvrtcGetCUBIN, "nvrtcGetCUBIN");
        int minor = 0;
        if (n.nvrtcVersion(&nvrtc_major_, &minor) != NVRTC_SUCCESS) nvrtc_major_ = 0;
        g_nvrtc = &nvrtc_;
      } catch (const Error& e) {
        nvrtc_error_ = e.what();
      }
    });
    if (!g_nvrtc) throw BackendError(nvrtc_error_);
    return nvrtc_;
  }

  // Loads libcuda.so.1 and runs cuInit once; nullptr (and the reason kept) if
  // there is no driver or no device.
  const Driver* driver_or_null() noexcept {
    std::call_once(driver_once_, [this] {
      try {
        driver_.lib = DynLib::open_first({"libcuda.so.1", "libcuda.so"}, "the CUDA driver");
        auto& d = driver_;
        d.lib.get(d.cuInit, "cuInit");
        d.lib.get(d.cuGetErrorName, "cuGetErrorName");
        d.lib.get(d.cuDeviceGet, "cuDeviceGet");
        d.lib.get(d.cuDeviceGetCount, "cuDeviceGetCount");
        d.lib.get(d.cuDeviceGetAttribute, "cuDeviceGetAttribute");
        d.lib.get(d.cuPointerGetAttribute, "cuPointerGetAttribute");
        d.lib.get(d.cuCtxGetCurrent, "cuCtxGetCurrent");
        d.lib.get(d.cuCtxGetDevice, "cuCtxGetDevice");
        d.lib.get(d.cuCtxSetCurrent, "cuCtxSetCurrent");
        d.lib.get(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        d.lib.get(d.cuModuleLoadData, "cuModuleLoadData");
        d.lib.get(d.cuModuleUnload, "cuModuleUnload");
        d.lib.get(d.cuModuleGetFunction, "cuModuleGetFunction");
        d.lib.get(d.cuFuncSetAttribute, "cuFuncSetAttribute");
        d.lib.get(d.cuLaunchKernel, "cuLaunchKernel");
        d.lib.get(d.cuModuleGetGlobal, "cuModuleGetGlobal_v2");
        if (env().pdl) d.lib.try_get(d.cuLaunchKernelEx, "cuLaunchKernelEx");
        d.lib.try_get(d.cuStreamIsCapturing, "cuStreamIsCapturing");
        d.lib.try_get(d.cuStreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo_v3");
        d.lib.try_get(d.cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo_v2");
        d.lib.try_get(d.cuGraphNodeGetType, "cuGraphNodeGetType");
        d.lib.try_get(d.cuGraphKernelNodeGetParams_v2, "cuGraphKernelNodeGetParams_v2");
        g_driver = &driver_;  // error names available from here on
        CC1D_CUDA_CHECK(d.cuInit(0), "");
        driver_ok_ = true;
      } catch (const std::exception& e) {
        driver_error_ = e.what();
      } catch (...) {
        driver_error_ = "unknown error loading the CUDA driver";
      }
    });
    return driver_ok_ ? &driver_ : nullptr;
  }

  const Driver& driver() {
    if (const Driver* d = driver_or_null()) return *d;
    throw BackendError("CUDA driver unavailable: " + driver_error_);
  }

  // Caller holds mu_.
  DeviceInfo& device_info(int device) {
    const Driver& d = driver();
    if (device < 0) throw BackendError("invalid CUDA device " + std::to_string(device));
    if (size_t(device) >= devices_.size()) devices_.resize(device + 1);
    DeviceInfo& info = devices_[device];
    if (info.ready) return info;
    CUdevice dev = 0;
    const std::string where = "device " + std::to_string(device);
    CC1D_CUDA_CHECK(d.cuDeviceGet(&dev, device), where);
    int major = 0, minor = 0, gx = 0, gy = 0, gz = 0;
    CC1D_CUDA_CHECK(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), where);
    CC1D_CUDA_CHECK(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), where);
    CC1D_CUDA_CHECK(d.cuDeviceGetAttribute(&gx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, dev), where);
    CC1D_CUDA_CHECK(d.cuDeviceGetAttribute(&gy, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, dev), where);
    CC1D_CUDA_CHECK(d.cuDeviceGetAttribute(&gz, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, dev), where);
    info.target = "sm_" + std::to_string(major) + std::to_string(minor);
    info.max_grid = {unsigned(gx), unsigned(gy), unsigned(gz)};
    info.ready = true;
    return info;
  }

  // The caller's current context (PyTorch's, usually); if there is none, the
  // device's primary context is made current, as the runtime API would do.
  // Caller holds mu_.
  CUcontext current_context(int device) {
    const Driver& d = driver();
    CUcontext ctx = nullptr;
    CC1D_CUDA_CHECK(d.cuCtxGetCurrent(&ctx), "");
    if (ctx) return ctx;
    DeviceInfo& info = device_info(device);
    if (!info.primary) {
      CUdevice dev = 0;
      CC1D_CUDA_CHECK(d.cuDeviceGet(&dev, device), "device " + std::to_string(device));
      CC1D_CUDA_CHECK(d.cuDevicePrimaryCtxRetain(&info.primary, dev), "device " + std::to_string(device));
    }
    CC1D_CUDA_CHECK(d.cuCtxSetCurrent(info.primary), "device " + std::to_string(device));
    return info.primary;
  }

  // Declared first so they are destroyed last (modules unload before dlclose).
  Driver driver_{};
  Nvrtc nvrtc_{};
  std::once_flag driver_once_, nvrtc_once_;
  bool driver_ok_ = false;
  int nvrtc_major_ = 0;
  std::string driver_error_, nvrtc_error_;

  std::mutex mu_;
  std::vector<DeviceInfo> devices_;
  std::unordered_map<CUcontext, std::unordered_map<std::string, Loaded>> modules_;
  // Loaded kernels that let the next grid launch early (they export cc1d_waits_for_previous_grid).
  std::unordered_set<CUfunction> early_kernels_;
};

}  // namespace

Backend& cuda_backend() {
  static CudaBackend b;
  return b;
}

}  // namespace cc1d
