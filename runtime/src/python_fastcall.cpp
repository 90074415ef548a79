// See python_fastcall.h.
#include "python_fastcall.h"

#include <cstdint>
#include <exception>
#include <new>

namespace cc1d_py {
namespace {

ErrorTypes g_types{};

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

constexpr const char* kCapsuleName = "cc1d.FwdPlan";
constexpr const char* kArgNames[] = {"x",   "weight", "bias",         "seq_idx", "initial_states",
                                     "out", "final_states", "stream"};
constexpr Py_ssize_t kArgs = 8;

using PlanRef = std::shared_ptr<const cc1d::FwdPlan>;

void drop_plan(PyObject* capsule) {
  std::unique_ptr<PlanRef>(static_cast<PlanRef*>(PyCapsule_GetPointer(capsule, kCapsuleName)));
}

PyObject* run_fwd_plan(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != kArgs) {
    PyErr_Format(PyExc_TypeError,
                 "FwdPlan launcher: expected 8 arguments (x, weight, bias, seq_idx, initial_states, out, "
                 "final_states, stream), got %zd",
                 nargs);
    return nullptr;
  }
  int64_t v[kArgs];
  for (Py_ssize_t i = 0; i < kArgs; ++i) {
    if (!PyLong_Check(args[i])) {
      PyErr_Format(PyExc_TypeError, "FwdPlan launcher: %s: expected an int (a data pointer or handle), got %s",
                   kArgNames[i], Py_TYPE(args[i])->tp_name);
      return nullptr;
    }
    v[i] = PyLong_AsLongLong(args[i]);
    if (v[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "FwdPlan launcher: %s: expected an int in the int64 range, got %R",
                   kArgNames[i], args[i]);
      return nullptr;
    }
  }
  auto as_ptr = [](int64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); };
  cc1d::FwdBuffers b;
  b.x = as_ptr(v[0]);
  b.weight = as_ptr(v[1]);
  b.bias = as_ptr(v[2]);
  b.seq_idx = static_cast<const int32_t*>(as_ptr(v[3]));
  b.initial_states = as_ptr(v[4]);
  b.out = as_ptr(v[5]);
  b.final_states = as_ptr(v[6]);
  const cc1d::FwdPlan& plan = **static_cast<PlanRef*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  std::exception_ptr error;
  Py_BEGIN_ALLOW_THREADS  // a first call may compile for seconds
  try {
    plan.run(b, as_ptr(v[7]));
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
    "fwd_plan_launcher", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(run_fwd_plan)),
    METH_FASTCALL,
    "launcher(x, weight, bias, seq_idx, initial_states, out, final_states, stream): runs the FwdPlan it came from"};

}  // namespace

void set_error_types(const ErrorTypes& types) { g_types = types; }

pybind11::object fwd_launcher(std::shared_ptr<const cc1d::FwdPlan> plan) {
  auto ref = std::make_unique<PlanRef>(std::move(plan));
  PyObject* capsule = PyCapsule_New(ref.get(), kCapsuleName, drop_plan);
  if (!capsule) throw pybind11::error_already_set();
  ref.release();  // the capsule owns it now
  PyObject* fn = PyCFunction_New(&g_run_fwd_plan, capsule);  // holds the capsule
  Py_DECREF(capsule);
  if (!fn) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(fn);
}

}  // namespace cc1d_py
