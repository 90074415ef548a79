#include "backend.h"

#include <cctype>

namespace cc1d {
namespace {

bool all_of(const std::string& s, std::size_t from, std::size_t to, int (*pred)(int)) {
  if (from >= to) return false;
  for (std::size_t i = from; i < to; ++i)
    if (!pred(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// sm_90, sm_90a, sm_100f. Strict on purpose: nothing odd reaches a compiler.
bool is_sm_target(const std::string& t) {
  if (t.rfind("sm_", 0) != 0) return false;
  std::size_t end = t.size();
  if (end > 3 && (t.back() == 'a' || t.back() == 'f')) --end;
  return all_of(t, 3, end, isdigit);
}

// gfx942, gfx90a, gfx90a:sramecc+:xnack-. Old hipRTC aborts the process on a
// target it does not know, so at least reject what cannot be one.
bool is_gfx_target(const std::string& t) {
  if (t.rfind("gfx", 0) != 0) return false;
  std::size_t colon = t.find(':');
  std::size_t end = colon == std::string::npos ? t.size() : colon;
  if (!all_of(t, 3, end, isxdigit)) return false;
  while (colon != std::string::npos) {
    std::size_t next = t.find(':', colon + 1);
    std::size_t stop = next == std::string::npos ? t.size() : next;
    if (stop - colon < 3 || (t[stop - 1] != '+' && t[stop - 1] != '-') ||
        !all_of(t, colon + 1, stop - 1, isalnum))
      return false;
    colon = next;
  }
  return true;
}

}  // namespace

Backend& backend_for_target(const std::string& target) {
  if (is_sm_target(target)) return cuda_backend();
  if (is_gfx_target(target)) return hip_backend();
  throw InvalidArgument("target must look like sm_90 (NVIDIA) or gfx942 (AMD), got '" + target + "'");
}

Backend& backend_for_vendor(const std::string& vendor) {
  if (vendor == "cuda" || vendor == "nvidia") return cuda_backend();
  if (vendor == "hip" || vendor == "amd" || vendor == "rocm") return hip_backend();
  throw InvalidArgument("vendor must be one of cuda, nvidia, hip, amd, rocm; got '" + vendor + "'");
}

}  // namespace cc1d
