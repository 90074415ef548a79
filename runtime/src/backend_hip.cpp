// AMD backend: hipRTC (compile to a code object) and the HIP module API, from
// libamdhip64 / libhiprtc dlopen()ed on first use. Nothing here runs at import:
// old hipRTC builds abort the whole process on targets they do not know, so the
// libraries are touched only when a gfx target or a HIP pointer is asked about.
#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend.h"
#include "dynlib.h"
#include "env.h"

namespace cc1d {
namespace {

// ---- declarations (hip_runtime_api.h / hiprtc.h subset, ROCm >= 5) --------
enum hipError_t : int { hipSuccess = 0 };
enum hiprtcResult : int { HIPRTC_SUCCESS = 0 };
using hipModule_t = struct ihipModule_t*;
using hipFunction_t = struct ihipModuleSymbol_t*;
using hipStream_t = struct ihipStream_t*;
using hiprtcProgram = struct _hiprtcProgram*;
// hipDeviceAttribute_t values of the CUDA-compatible enum (ROCm 5.0 .. 7).
constexpr int hipDeviceAttributeMaxGridDimX = 29;
constexpr int hipDeviceAttributeMaxGridDimY = 30;
constexpr int hipDeviceAttributeMaxGridDimZ = 31;
constexpr int HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
// hipDeviceProp_t is 792 bytes in ROCm 5.7 and ~1.5 KB in ROCm 6 (R0600); we
// never rely on its layout (see gcn_arch_name), only give it room.
constexpr std::size_t kDevicePropBytes = 16384;

struct Hip {
  DynLib lib;
  int runtime_version = 0;
  hipError_t (*hipInit)(unsigned);
  const char* (*hipGetErrorName)(hipError_t);
  hipError_t (*hipRuntimeGetVersion)(int*);
  hipError_t (*hipGetDevice)(int*);
  hipError_t (*hipGetDeviceCount)(int*);
  hipError_t (*hipSetDevice)(int);
  hipError_t (*hipDeviceGetAttribute)(int*, int, int);
  hipError_t (*hipGetDeviceProperties)(void*, int);  // R0600 symbol when present
  hipError_t (*hipPointerGetAttribute)(void*, int, void*);  // ROCm >= 5.0, optional
  hipError_t (*hipPointerGetAttributes)(void*, const void*);
  hipError_t (*hipModuleLoadData)(hipModule_t*, const void*);
  hipError_t (*hipModuleUnload)(hipModule_t);
  hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char*);
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, hipStream_t, void**, void**);
  hipError_t (*hipStreamIsCapturing)(hipStream_t, int*) = nullptr;  // optional; the status: 0 = none
};

struct Hiprtc {
  DynLib lib;
  const char* (*hiprtcGetErrorString)(hiprtcResult);
  hiprtcResult (*hiprtcVersion)(int*, int*);
  hiprtcResult (*hiprtcCreateProgram)(hiprtcProgram*, const char*, const char*, int, const char**, const char**);
  hiprtcResult (*hiprtcDestroyProgram)(hiprtcProgram*);
  hiprtcResult (*hiprtcCompileProgram)(hiprtcProgram, int, const char**);
  hiprtcResult (*hiprtcGetProgramLogSize)(hiprtcProgram, size_t*);
  hiprtcResult (*hiprtcGetProgramLog)(hiprtcProgram, char*);
  hiprtcResult (*hiprtcGetCodeSize)(hiprtcProgram, size_t*);
  hiprtcResult (*hiprtcGetCode)(hiprtcProgram, char*);
};

const Hip* g_hip = nullptr;
const Hiprtc* g_hiprtc = nullptr;

[[noreturn]] void throw_error(hipError_t r, const char* call, const std::string& context) {
  const char* name = g_hip ? g_hip->hipGetErrorName(r) : nullptr;
  throw BackendError(std::string(call) + " failed: " + (name ? name : "hipError?") + " (" +
                     std::to_string(int(r)) + ")" + (context.empty() ? "" : "; " + context));
}
[[noreturn]] void throw_error(hiprtcResult r, const char* call, const std::string& context) {
  const char* name = g_hiprtc ? g_hiprtc->hiprtcGetErrorString(r) : nullptr;
  throw BackendError(std::string(call) + " failed: " + (name ? name : "HIPRTC_ERROR_?") + " (" +
                     std::to_string(int(r)) + ")" + (context.empty() ? "" : "; " + context));
}

// The context expression is evaluated only on failure.
#define CC1D_HIP_CHECK(call, context)                           \
  do {                                                          \
    auto cc1d_r_ = (call);                                      \
    if (cc1d_r_ != 0) throw_error(cc1d_r_, #call, (context));   \
  } while (0)

std::vector<std::string> hip_candidates() {
  return {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so",
          "/opt/rocm/lib/libamdhip64.so"};
}

// hipRTC lives in its own library since ROCm 6 and inside libamdhip64 before
// (Debian's 5.7: libamdhip64.so.5 exports hiprtc*).
std::vector<std::string> hiprtc_candidates() {
  std::vector<std::string> names;
  if (!env().hiprtc_path.empty()) names.push_back(env().hiprtc_path);
  for (const char* s : {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "libhiprtc.so",
                        "/opt/rocm/lib/libhiprtc.so"})
    names.push_back(s);
  for (const auto& s : hip_candidates()) names.push_back(s);
  return names;
}

// gcnArchName ("gfx942:sramecc+:xnack-") moved between hipDeviceProp_t
// layouts (offset 396 in ROCm 5.7, later in R0600). It is the only field that
// holds a "gfx<hex>" string after `name` (first 256 bytes: the marketing name),
// so we scan for it instead of trusting one layout. Returns "gfx942".
std::string gcn_arch_name(const std::vector<char>& prop) {
  for (std::size_t i = 256; i + 4 < prop.size(); ++i) {
    if (prop[i] != 'g' || prop[i + 1] != 'f' || prop[i + 2] != 'x' || prop[i - 1] != '\0') continue;
    std::size_t j = i + 3;
    while (j < prop.size() && std::isxdigit(static_cast<unsigned char>(prop[j]))) ++j;
    if (j == i + 3 || j >= prop.size() || (prop[j] != '\0' && prop[j] != ':')) continue;
    return std::string(&prop[i], j - i);
  }
  return "";
}

struct Module {
  hipModule_t m = nullptr;
  explicit Module(hipModule_t mod) : m(mod) {}
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module() { if (m && g_hip) g_hip->hipModuleUnload(m); }
};

struct Program {
  hiprtcProgram p = nullptr;
  ~Program() { if (p) g_hiprtc->hiprtcDestroyProgram(&p); }
};

struct Loaded {
  std::unique_ptr<Module> module;
  Functions functions;
};

// Sets the current device for a scope and restores the caller's.
class DeviceGuard {
 public:
  DeviceGuard(const Hip& h, int device) : h_(h) {
    CC1D_HIP_CHECK(h.hipGetDevice(&prev_), "");
    if (prev_ != device) CC1D_HIP_CHECK(h.hipSetDevice(device), "device " + std::to_string(device));
    else prev_ = -1;
  }
  ~DeviceGuard() { if (prev_ >= 0) h_.hipSetDevice(prev_); }
 private:
  const Hip& h_;
  int prev_ = -1;
};

class HipBackend final : public Backend {
 public:
  const char* vendor() const override { return "hip"; }

  std::string compiler_version() override {
    const Hiprtc& r = hiprtc();
    int major = 0, minor = 0;
    CC1D_HIP_CHECK(r.hiprtcVersion(&major, &minor), "");
    std::string path = r.lib.real_path();
    std::string v = "hiprtc " + std::to_string(major) + "." + std::to_string(minor);
    // hiprtcVersion alone is not telling (Debian's ROCm 5.7 says 9.0); where
    // hipRTC lives in libamdhip64, add the HIP runtime's own version.
    hipError_t (*runtime_version)(int*) = nullptr;
    int rv = 0;
    if (r.lib.try_get(runtime_version, "hipRuntimeGetVersion") && runtime_version(&rv) == hipSuccess)
      v += ", hip " + std::to_string(rv);
    return v + " (" + path.substr(path.find_last_of('/') + 1) + ")";
  }

  CompileResult compile(const std::string& source, const std::string& target,
                        const std::vector<std::string>& options) override {
    const Hiprtc& r = hiprtc();
    Program prog;
    CC1D_HIP_CHECK(r.hiprtcCreateProgram(&prog.p, source.c_str(), "cc1d_kernel.hip", 0, nullptr, nullptr),
                   "target " + target);
    std::vector<std::string> opts = {"--offload-arch=" + target, "-O3", "-std=c++17"};
    opts.insert(opts.end(), options.begin(), options.end());
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    hiprtcResult rc = r.hiprtcCompileProgram(prog.p, int(argv.size()), argv.data());
    CompileResult out;
    size_t log_size = 0;
    if (r.hiprtcGetProgramLogSize(prog.p, &log_size) == HIPRTC_SUCCESS && log_size > 0) {
      out.log.resize(log_size);
      r.hiprtcGetProgramLog(prog.p, &out.log[0]);
      while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
    }
    if (rc != HIPRTC_SUCCESS) {
      std::string cmd;
      for (const auto& o : opts) cmd += " " + o;
      throw CompileError("hipRTC failed to compile for " + target + " (" + r.hiprtcGetErrorString(rc) +
                         "), options:" + cmd + "\n" + out.log);
    }
    size_t size = 0;
    CC1D_HIP_CHECK(r.hiprtcGetCodeSize(prog.p, &size), "target " + target);
    out.binary.resize(size);
    CC1D_HIP_CHECK(r.hiprtcGetCode(prog.p, reinterpret_cast<char*>(out.binary.data())), "target " + target);
    return out;
  }

  std::string device_target(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    return device_info(device).target;
  }

  int device_of_pointer(const void* ptr) noexcept override {
    const Hip* h = hip_or_null();
    if (!h || !ptr) return -1;
    int ordinal = -1;
    if (h->hipPointerGetAttribute) {
      if (h->hipPointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, const_cast<void*>(ptr)) !=
          hipSuccess)
        return -1;
      return ordinal;
    }
    // hipPointerAttribute_t starts {memoryType (enum), int device, ...} in ROCm 5 and 6.
    alignas(8) char attrs[256] = {};
    if (h->hipPointerGetAttributes(attrs, ptr) != hipSuccess) return -1;
    std::memcpy(&ordinal, attrs + 4, sizeof(int));
    return ordinal;
  }

  int device_count() noexcept override {
    const Hip* h = hip_or_null();
    int n = 0;
    return h && h->hipGetDeviceCount(&n) == hipSuccess ? n : 0;
  }

  int current_device() noexcept override {
    const Hip* h = hip_or_null();
    int d = -1;
    return h && h->hipGetDevice(&d) == hipSuccess ? d : -1;
  }

  Dim3 max_grid(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    return device_info(device).max_grid;
  }

  Functions find_functions(int device, const std::string& hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (device < 0 || size_t(device) >= modules_.size()) return {};
    auto f = modules_[device].find(hash);
    return f == modules_[device].end() ? Functions{} : f->second.functions;
  }

  bool stream_capturing(void* stream) noexcept override {
    const Hip* h = hip_or_null();
    int status = 0;
    if (!h || !h->hipStreamIsCapturing) return true;
    return h->hipStreamIsCapturing(static_cast<hipStream_t>(stream), &status) != hipSuccess || status != 0;
  }

  const void* module_scope(int device) noexcept override {
    // Modules are kept per device; the handle is the device, offset so that it is never null.
    return reinterpret_cast<const void*>(uintptr_t(device) + 1);
  }

  Functions load_functions(int device, const std::string& hash, const std::vector<uint8_t>& binary,
                           int /*smem_bytes: AMD needs no opt-in up to the LDS size*/, bool with_reduce) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Hip& h = hip();
    if (device < 0) throw BackendError("invalid HIP device " + std::to_string(device));
    if (size_t(device) >= modules_.size()) modules_.resize(device + 1);
    if (auto f = modules_[device].find(hash); f != modules_[device].end()) {
      Functions& fs = f->second.functions;
      if (with_reduce && !fs.reduce) {  // loaded before by a path that did not need it
        hipFunction_t reduce = nullptr;
        CC1D_HIP_CHECK(h.hipModuleGetFunction(&reduce, f->second.module->m, "cc1d_reduce"), "kernel " + hash);
        fs.reduce = reduce;
      }
      return fs;
    }
    DeviceGuard guard(h, device);
    hipModule_t mod = nullptr;
    CC1D_HIP_CHECK(h.hipModuleLoadData(&mod, binary.data()), "kernel " + hash + " on device " + std::to_string(device));
    Loaded l;
    l.module = std::make_unique<Module>(mod);
    hipFunction_t kernel = nullptr, reduce = nullptr;
    CC1D_HIP_CHECK(h.hipModuleGetFunction(&kernel, mod, "cc1d_kernel"), "kernel " + hash);
    if (with_reduce) CC1D_HIP_CHECK(h.hipModuleGetFunction(&reduce, mod, "cc1d_reduce"), "kernel " + hash);
    l.functions.kernel = kernel;
    l.functions.reduce = reduce;
    const Functions f = l.functions;
    modules_[device].emplace(hash, std::move(l));
    return f;
  }

  void launch(void* function, Dim3 g, Dim3 b, unsigned smem, void* stream, void* params,
              std::size_t params_size, bool /*early: no HIP kernel waits for the previous one*/) override {
    void* args[] = {params};
    CC1D_HIP_CHECK(hip().hipModuleLaunchKernel(static_cast<hipFunction_t>(function), g.x, g.y, g.z, b.x, b.y,
                                               b.z, smem, static_cast<hipStream_t>(stream), args, nullptr),
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
  };

  const Hiprtc& hiprtc() {
    std::call_once(hiprtc_once_, [this] {
      try {
        auto& r = hiprtc_;
        r.lib = DynLib::open_first(hiprtc_candidates(), "hipRTC (set CC1D_HIPRTC to its path)",
                                   "hiprtcCompileProgram");
        r.lib.get(r.hiprtcGetErrorString, "hiprtcGetErrorString");
        r.lib.get(r.hiprtcVersion, "hiprtcVersion");
        r.lib.get(r.hiprtcCreateProgram, "hiprtcCreateProgram");
        r.lib.get(r.hiprtcDestroyProgram, "hiprtcDestroyProgram");
        r.lib.get(r.hiprtcCompileProgram, "hiprtcCompileProgram");
        r.lib.get(r.hiprtcGetProgramLogSize, "hiprtcGetProgramLogSize");
        r.lib.get(r.hiprtcGetProgramLog, "hiprtcGetProgramLog");
        r.lib.get(r.hiprtcGetCodeSize, "hiprtcGetCodeSize");
        r.lib.get(r.hiprtcGetCode, "hiprtcGetCode");
        g_hiprtc = &hiprtc_;
      } catch (const Error& e) {
        hiprtc_error_ = e.what();
      }
    });
    if (!g_hiprtc) throw BackendError(hiprtc_error_);
    return hiprtc_;
  }

  const Hip* hip_or_null() noexcept {
    std::call_once(hip_once_, [this] {
      try {
        auto& h = hip_;
        h.lib = DynLib::open_first(hip_candidates(), "the HIP runtime");
        h.lib.get(h.hipInit, "hipInit");
        h.lib.get(h.hipGetErrorName, "hipGetErrorName");
        h.lib.get(h.hipRuntimeGetVersion, "hipRuntimeGetVersion");
        h.lib.get(h.hipGetDevice, "hipGetDevice");
        h.lib.get(h.hipGetDeviceCount, "hipGetDeviceCount");
        h.lib.get(h.hipSetDevice, "hipSetDevice");
        h.lib.get(h.hipDeviceGetAttribute, "hipDeviceGetAttribute");
        // ROCm 6 renamed the current layout's entry point; the plain name keeps the old layout.
        if (!h.lib.try_get(h.hipGetDeviceProperties, "hipGetDevicePropertiesR0600"))
          h.lib.get(h.hipGetDeviceProperties, "hipGetDeviceProperties");
        h.lib.try_get(h.hipPointerGetAttribute, "hipPointerGetAttribute");
        h.lib.get(h.hipPointerGetAttributes, "hipPointerGetAttributes");
        h.lib.get(h.hipModuleLoadData, "hipModuleLoadData");
        h.lib.get(h.hipModuleUnload, "hipModuleUnload");
        h.lib.get(h.hipModuleGetFunction, "hipModuleGetFunction");
        h.lib.get(h.hipModuleLaunchKernel, "hipModuleLaunchKernel");
        h.lib.try_get(h.hipStreamIsCapturing, "hipStreamIsCapturing");
        g_hip = &hip_;
        CC1D_HIP_CHECK(h.hipRuntimeGetVersion(&h.runtime_version), "");
        if (h.runtime_version < 50000000)
          throw BackendError("HIP runtime " + std::to_string(h.runtime_version) + " in " + h.lib.name() +
                             " is older than ROCm 5.0, which cc1d needs");
        CC1D_HIP_CHECK(h.hipInit(0), "");
        hip_ok_ = true;
      } catch (const std::exception& e) {
        hip_error_ = e.what();
      } catch (...) {
        hip_error_ = "unknown error loading the HIP runtime";
      }
    });
    return hip_ok_ ? &hip_ : nullptr;
  }

  const Hip& hip() {
    if (const Hip* h = hip_or_null()) return *h;
    throw BackendError("HIP runtime unavailable: " + hip_error_);
  }

  // Caller holds mu_.
  DeviceInfo& device_info(int device) {
    const Hip& h = hip();
    if (device < 0) throw BackendError("invalid HIP device " + std::to_string(device));
    if (size_t(device) >= devices_.size()) devices_.resize(device + 1);
    DeviceInfo& info = devices_[device];
    if (info.ready) return info;
    const std::string where = "device " + std::to_string(device);
    std::vector<char> prop(kDevicePropBytes, '\0');
    CC1D_HIP_CHECK(h.hipGetDeviceProperties(prop.data(), device), where);
    info.target = gcn_arch_name(prop);
    if (info.target.empty())
      throw BackendError("no gfx architecture name in the properties of HIP " + where + " (runtime " +
                         std::to_string(h.runtime_version) + ")");
    int g[3] = {0, 0, 0};
    const int attrs[3] = {hipDeviceAttributeMaxGridDimX, hipDeviceAttributeMaxGridDimY,
                          hipDeviceAttributeMaxGridDimZ};
    for (int i = 0; i < 3; ++i) CC1D_HIP_CHECK(h.hipDeviceGetAttribute(&g[i], attrs[i], device), where);
    auto clamp = [](int v) { return v > 0 ? unsigned(v) : 65535u; };
    info.max_grid = {clamp(g[0]), clamp(g[1]), clamp(g[2])};
    info.ready = true;
    return info;
  }

  // Declared first so they are destroyed last (modules unload before dlclose).
  Hip hip_{};
  Hiprtc hiprtc_{};
  std::once_flag hip_once_, hiprtc_once_;
  bool hip_ok_ = false;
  std::string hip_error_, hiprtc_error_;

  std::mutex mu_;
  std::vector<DeviceInfo> devices_;
  std::vector<std::unordered_map<std::string, Loaded>> modules_;  // per device
};

}  // namespace

Backend& hip_backend() {
  static HipBackend b;
  return b;
}

}  // namespace cc1d
