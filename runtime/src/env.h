// Every path and environment knob of the runtime, read once per process.
#pragma once
#include <string>
#include <vector>

namespace cc1d {

struct Env {
  std::string cache_dir;      // CC1D_CACHE_DIR | $XDG_CACHE_HOME/cc1d | $HOME/.cache/cc1d ("" if none)
  bool disk_cache = true;     // false when CC1D_DISABLE_DISK_CACHE=1 or no cache dir
  std::string nvrtc_path;     // CC1D_NVRTC: explicit libnvrtc to load first
  std::string hiprtc_path;    // CC1D_HIPRTC: explicit libhiprtc (or libamdhip64) to load first
  std::vector<std::string> tuning_dbs;  // CC1D_TUNING_DB: colon-separated DB files, searched first
  std::string package_dir;    // CC1D_PACKAGE_DIR: where tuning_db/<arch>.db is shipped (Python sets it too)
  bool pdl = true;            // false when CC1D_DISABLE_PDL=1: no kernel launched before the previous one ends
  bool pdl_after_any = false; // CC1D_PDL_AFTER_ANY=1: in graphs too, early after any kernel (backend_cuda.cpp)
  bool fwd_fixed = true;      // false when CC1D_FWD_GENERIC=1: forward plans launch the generic kernel
  bool bwd_seq_build = true;  // false when CC1D_BWD_GENERIC=1: backward calls with seq_idx launch
                              // the plain build instead of the seq_idx one (backward.cpp)
  bool bwd_fixed = true;      // false when CC1D_BWD_GENERIC=1: channel-last backward plans launch
                              // the generic kernel (backward.cpp)
  bool upd_fixed = true;      // false when CC1D_UPD_GENERIC=1: update plans launch the generic kernel
  bool log_dispatch = false;  // CC1D_LOG names "dispatch" (comma-separated list): log each new decision
  std::string kernels_dir() const { return cache_dir + "/kernels"; }
  std::string user_tuning_db() const { return cache_dir.empty() ? "" : cache_dir + "/tuning.db"; }
};

const Env& env();

}  // namespace cc1d
