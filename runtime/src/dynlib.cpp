#include "dynlib.h"

#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <stdlib.h>

#include <utility>

#include "cc1d/cc1d.h"

namespace cc1d {

DynLib DynLib::open_first(const std::vector<std::string>& names, const char* what,
                          const char* required_symbol) {
  std::string tried;
  for (const auto& n : names) {
    if (n.empty()) continue;
    // RTLD_LOCAL: keep vendor symbols out of the global namespace (torch loads its own copies).
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (required_symbol && !dlsym(h, required_symbol)) {
        dlclose(h);
        tried += "\n  " + n + ": loaded, but has no " + required_symbol;
        continue;
      }
      DynLib lib;
      lib.handle_ = h;
      lib.name_ = n;
      return lib;
    }
    const char* err = dlerror();
    tried += "\n  " + n + ": " + (err ? err : "unknown error");
  }
  throw BackendError(std::string("cannot load ") + what + "; tried:" + tried);
}

DynLib::DynLib(DynLib&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), name_(std::move(o.name_)) {}

DynLib& DynLib::operator=(DynLib&& o) noexcept {
  if (this != &o) {
    if (handle_) dlclose(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
    name_ = std::move(o.name_);
  }
  return *this;
}

DynLib::~DynLib() {
  if (handle_) dlclose(handle_);
}

void* DynLib::find(const char* sym) const {
  return handle_ ? dlsym(handle_, sym) : nullptr;
}

void* DynLib::symbol(const char* sym) const {
  void* p = find(sym);
  if (!p) throw BackendError("symbol " + std::string(sym) + " not found in " + name_);
  return p;
}

std::string DynLib::real_path() const {
  // dlinfo(RTLD_DI_LINKMAP) gives the path the loader used; realpath() follows
  // the soname symlink to the versioned file (libnvrtc.so.13.0.88).
  struct link_map* lm = nullptr;
  if (!handle_ || dlinfo(handle_, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name) return name_;
  char buf[PATH_MAX];
  if (realpath(lm->l_name, buf)) return buf;
  return lm->l_name;
}

}  // namespace cc1d
