// The forward and update plans' launchers for the PyTorch API's eager calls: a builtin
// function called with METH_FASTCALL, so that a call converts its ints
// without pybind11's dispatcher (which costs several times the conversion).
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "cc1d/cc1d.h"

namespace cc1d_py {

// The Python types cc1d's exceptions become (py::register_exception's), for
// errors raised outside pybind11's translation: Error, CompileError,
// BackendError, TypeMismatch, InvalidArgument.
struct ErrorTypes {
  PyObject *error, *compile_error, *backend_error, *type_mismatch, *invalid_argument;
};
void set_error_types(const ErrorTypes& types);

// f(x, weight, bias, seq_idx, initial_states, out, final_states, stream): all
// ints (data pointers, 0 for none; the stream handle), runs plan->run with the
// GIL released; errors as the pybind11 bindings raise them. Keeps `plan` alive.
pybind11::object fwd_launcher(std::shared_ptr<const cc1d::FwdPlan> plan);

// f(x, weight, bias, conv_state, cache_seqlens, conv_state_indices,
// num_accepted_tokens, out, stream): the same for an UpdPlan.
pybind11::object upd_launcher(std::shared_ptr<const cc1d::UpdPlan> plan);

}  // namespace cc1d_py
