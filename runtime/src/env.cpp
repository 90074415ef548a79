#include "env.h"

#include <cstdlib>

namespace cc1d {
namespace {

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t end = s.find(sep, pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// A CC1D_DISABLE_* switch: set to 1, true or yes.
bool switched_on(const char* name) {
  const std::string v = getenv_str(name);
  return v == "1" || v == "true" || v == "yes";
}

Env read_env() {
  Env e;
  if (auto d = getenv_str("CC1D_CACHE_DIR"); !d.empty()) e.cache_dir = d;
  else if (auto x = getenv_str("XDG_CACHE_HOME"); !x.empty()) e.cache_dir = x + "/cc1d";
  else if (auto h = getenv_str("HOME"); !h.empty()) e.cache_dir = h + "/.cache/cc1d";
  e.disk_cache = !e.cache_dir.empty() && !switched_on("CC1D_DISABLE_DISK_CACHE");
  e.pdl = !switched_on("CC1D_DISABLE_PDL");
  e.pdl_after_any = switched_on("CC1D_PDL_AFTER_ANY");
  e.fwd_fixed = !switched_on("CC1D_FWD_GENERIC");
  e.bwd_seq_build = !switched_on("CC1D_BWD_GENERIC");
  e.bwd_fixed = e.bwd_seq_build;
  e.upd_fixed = !switched_on("CC1D_UPD_GENERIC");
  e.nvrtc_path = getenv_str("CC1D_NVRTC");
  e.hiprtc_path = getenv_str("CC1D_HIPRTC");
  e.tuning_dbs = split(getenv_str("CC1D_TUNING_DB"), ':');
  e.package_dir = getenv_str("CC1D_PACKAGE_DIR");
  for (const auto& topic : split(getenv_str("CC1D_LOG"), ','))
    if (topic == "dispatch" || topic == "all") e.log_dispatch = true;
  return e;
}

}  // namespace

const Env& env() {
  static const Env e = read_env();
  return e;
}

}  // namespace cc1d
