// The small public functions of cc1d.h that are not dispatch.
#include "backend.h"
#include "cc1d/cc1d.h"
#include "compile_cache.h"

namespace cc1d {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

CompileResult compile(const std::string& source, const std::string& target,
                      const std::vector<std::string>& extra_options) {
  return compile_cached(backend_for_target(target), source, target, extra_options);
}

std::string compiler_version(const std::string& target) {
  return backend_for_target(target).compiler_version();
}

std::string device_target(const std::string& vendor, int device) {
  return backend_for_vendor(vendor).device_target(device);
}

}  // namespace cc1d
