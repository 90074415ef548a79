// See python_fastcall.h.
#include "python_fastcall.h"

#include <cstdint>
#include <exception>
#include <new>
#include <string>

namespace cc1d_py {
namespace {

ErrorTypes g_types{};

void* as_ptr(int64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// Raises the Python error for a C++ exception caught with the GIL released.
void raise_python(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const cc1d::InvalidArgument& e) {
    PyErr_SetString(g_types.invalid_argument, e.what());
  } catch (const cc1d::TypeMismatch& e) {
    PyErr_SetString(g_types.type_mismatch, e.what());
  } catch (const cc1d::BackendError& e) {
    PyErr_SetString(g_types.backend_error, e.what());
  } catch (const cc1d::CompileError& e) {
    PyErr_SetString(g_types.compile_error, e.what());
  } catch (const cc1d::Error& e) {
    PyErr_SetString(g_types.error, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "cc1d: unknown C++ exception");
  }
}

// What a plan type's launcher takes: its buffers' names (then "stream"), in order,
// and how its buffers are made from them.
template <class Plan> struct Launcher;

template <> struct Launcher<cc1d::FwdPlan> {
  using Buffers = cc1d::FwdBuffers;
  static constexpr const char* kName = "FwdPlan";
  static constexpr const char* kCapsule = "cc1d.FwdPlan";
  static constexpr Py_ssize_t kPtrs = 7;
  static constexpr const char* kArgNames[kPtrs + 1] = {"x",   "weight",       "bias",  "seq_idx", "initial_states",
                                                       "out", "final_states", "stream"};
  static Buffers buffers(const int64_t* v) {
    Buffers b;
    b.x = as_ptr(v[0]);
    b.weight = as_ptr(v[1]);
    b.bias = as_ptr(v[2]);
    b.seq_idx = static_cast<const int32_t*>(as_ptr(v[3]));
    b.initial_states = as_ptr(v[4]);
    b.out = as_ptr(v[5]);
    b.final_states = as_ptr(v[6]);
    return b;
  }
};

template <> struct Launcher<cc1d::UpdPlan> {
  using Buffers = cc1d::UpdBuffers;
  static constexpr const char* kName = "UpdPlan";
  static constexpr const char* kCapsule = "cc1d.UpdPlan";
  static constexpr Py_ssize_t kPtrs = 8;
  static constexpr const char* kArgNames[kPtrs + 1] = {
      "x", "weight", "bias", "conv_state", "cache_seqlens", "conv_state_indices", "num_accepted_tokens", "out",
      "stream"};
  static Buffers buffers(const int64_t* v) {
    Buffers b;
    b.x = as_ptr(v[0]);
    b.weight = as_ptr(v[1]);
    b.bias = as_ptr(v[2]);
    b.conv_state = as_ptr(v[3]);
    b.cache_seqlens = static_cast<const int32_t*>(as_ptr(v[4]));
    b.conv_state_indices = static_cast<const int32_t*>(as_ptr(v[5]));
    b.num_accepted_tokens = static_cast<const int32_t*>(as_ptr(v[6]));
    b.out = as_ptr(v[7]);
    return b;
  }
};

template <class Plan> using PlanRef = std::shared_ptr<const Plan>;

template <class Plan> void drop_plan(PyObject* capsule) {
  std::unique_ptr<PlanRef<Plan>>(
      static_cast<PlanRef<Plan>*>(PyCapsule_GetPointer(capsule, Launcher<Plan>::kCapsule)));
}

template <class Plan> PyObject* run_plan(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  using L = Launcher<Plan>;
  constexpr Py_ssize_t kArgs = L::kPtrs + 1;
  if (nargs != kArgs) {
    std::string names;
    for (const char* n : L::kArgNames) names += (names.empty() ? "" : ", ") + std::string(n);
    PyErr_Format(PyExc_TypeError, "%s launcher: expected %zd arguments (%s), got %zd", L::kName, kArgs,
                 names.c_str(), nargs);
    return nullptr;
  }
  int64_t v[kArgs];
  for (Py_ssize_t i = 0; i < kArgs; ++i) {
    if (!PyLong_Check(args[i])) {
      PyErr_Format(PyExc_TypeError, "%s launcher: %s: expected an int (a data pointer or handle), got %s", L::kName,
                   L::kArgNames[i], Py_TYPE(args[i])->tp_name);
      return nullptr;
    }
    v[i] = PyLong_AsLongLong(args[i]);
    if (v[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s launcher: %s: expected an int in the int64 range, got %R", L::kName,
                   L::kArgNames[i], args[i]);
      return nullptr;
    }
  }
  const typename L::Buffers b = L::buffers(v);
  const Plan& plan = **static_cast<PlanRef<Plan>*>(PyCapsule_GetPointer(capsule, L::kCapsule));
  std::exception_ptr error;
  Py_BEGIN_ALLOW_THREADS  // a first call may compile for seconds
  try {
    plan.run(b, as_ptr(v[L::kPtrs]));
  } catch (...) {
    error = std::current_exception();
  }
  Py_END_ALLOW_THREADS
  if (error) {
    raise_python(error);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef g_run_fwd_plan = {
    "fwd_plan_launcher", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(run_plan<cc1d::FwdPlan>)),
    METH_FASTCALL,
    "launcher(x, weight, bias, seq_idx, initial_states, out, final_states, stream): runs the FwdPlan it came from"};

PyMethodDef g_run_upd_plan = {
    "upd_plan_launcher", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(run_plan<cc1d::UpdPlan>)),
    METH_FASTCALL,
    "launcher(x, weight, bias, conv_state, cache_seqlens, conv_state_indices, num_accepted_tokens, out, stream): "
    "runs the UpdPlan it came from"};

// A builtin function bound to a capsule owning `plan`.
template <class Plan> pybind11::object launcher(std::shared_ptr<const Plan> plan, PyMethodDef* def) {
  auto ref = std::make_unique<PlanRef<Plan>>(std::move(plan));
  PyObject* capsule = PyCapsule_New(ref.get(), Launcher<Plan>::kCapsule, drop_plan<Plan>);
  if (!capsule) throw pybind11::error_already_set();
  ref.release();  // the capsule owns it now
  PyObject* fn = PyCFunction_New(def, capsule);  // holds the capsule
  Py_DECREF(capsule);
  if (!fn) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(fn);
}

}  // namespace

void set_error_types(const ErrorTypes& types) { g_types = types; }

pybind11::object fwd_launcher(std::shared_ptr<const cc1d::FwdPlan> plan) {
  return launcher(std::move(plan), &g_run_fwd_plan);
}

pybind11::object upd_launcher(std::shared_ptr<const cc1d::UpdPlan> plan) {
  return launcher(std::move(plan), &g_run_upd_plan);
}

}  // namespace cc1d_py
