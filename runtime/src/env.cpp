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

Env read_env() {
  Env e;
  if (auto d = getenv_str("CC1D_CACHE_DIR"); !d.empty()) e.cache_dir = d;
  else if (auto x = getenv_str("XDG_CACHE_HOME"); !x.empty()) e.cache_dir = x + "/cc1d";
  else if (auto h = getenv_str("HOME"); !h.empty()) e.cache_dir = h + "/.cache/cc1d";
  auto dis = getenv_str("CC1D_DISABLE_DISK_CACHE");
  e.disk_cache = !e.cache_dir.empty() && !(dis == "1" || dis == "true" || dis == "yes");
  auto no_pdl = getenv_str("CC1D_DISABLE_PDL");
  e.pdl = !(no_pdl == "1" || no_pdl == "true" || no_pdl == "yes");
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
