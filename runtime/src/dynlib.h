// RAII handle on a dlopen()ed shared library. Vendors' libraries are loaded at
// run time so one build serves CUDA and HIP machines, and machines with neither.
#pragma once
#include <string>
#include <vector>

namespace cc1d {

class DynLib {
 public:
  // Tries each name in order (bare sonames go through the loader's search
  // path); with `required_symbol`, a library lacking it is skipped. Throws
  // BackendError listing every name tried and why it was not taken.
  static DynLib open_first(const std::vector<std::string>& names, const char* what,
                           const char* required_symbol = nullptr);

  DynLib() = default;
  DynLib(DynLib&& o) noexcept;
  DynLib& operator=(DynLib&& o) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;
  ~DynLib();

  explicit operator bool() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }  // the name that loaded
  std::string real_path() const;                     // resolved file, for versioning

  void* find(const char* symbol) const;               // nullptr if absent
  void* symbol(const char* symbol) const;             // throws BackendError naming it

  // Typed lookup: lib.get(fn_ptr, "cuInit").
  template <class F> void get(F& fn, const char* name) const {
    fn = reinterpret_cast<F>(symbol(name));
  }
  template <class F> bool try_get(F& fn, const char* name) const {
    fn = reinterpret_cast<F>(find(name));
    return fn != nullptr;
  }

 private:
  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace cc1d
