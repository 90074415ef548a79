// pybind11 module cc1d._cc1d: a thin layer over the C++ API. The fwd and bwd
// paths are timed for host overhead: plain ints in, fixed-size arrays, no dicts;
// FwdPlan, BwdPlan and UpdPlan take only the per-call ints (pointers, stream).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <memory>

#include "backend.h"
#include "catalog.h"
#include "cc1d/cc1d.h"
#include "python_fastcall.h"

namespace py = pybind11;
using namespace cc1d;

namespace {

using Ptrs = std::array<int64_t, 7>;      // x, weight, bias, seq_idx, initial_states, out, final_states
using Sizes = std::array<int64_t, 4>;     // batch, dim, seqlen, width
using Strides = std::array<int64_t, 17>;  // FwdParams stride fields, declared order

// Backward: the 12 BwdParams pointers in declared order (x, weight, bias, seq_idx,
// initial_states, dout, dfinal_states, dx, dinitial_states, dweight, dbias,
// partials) and its 26 strides in declared order.
using BwdPtrs = std::array<int64_t, 12>;
using BwdStrides = std::array<int64_t, 26>;

// Varlen prefill: the 8 VarlenParams pointers in declared order (x, weight, bias,
// cu_seqlens, cache_indices, has_initial_state, conv_states, out), its 8 sizes
// (num_seqs, dim, total_tokens, max_seqlen, state_len, pool, pad_slot_id,
// his_bytes) then width, and its 13 strides in declared order.
using VarlenPtrs = std::array<int64_t, 8>;
using VarlenSizes = std::array<int64_t, 9>;
using VarlenStrides = std::array<int64_t, 13>;
// Update: the 8 UpdParams pointers in declared order (x, weight, bias, conv_state,
// cache_seqlens, conv_state_indices, num_accepted_tokens, out), sizes (batch,
// dim, seqlen, state_len, pool, width) and its 15 strides in declared order.
using UpdPtrs = std::array<int64_t, 8>;
using UpdSizes = std::array<int64_t, 6>;
using UpdStrides = std::array<int64_t, 15>;

template <class T> T* as_ptr(int64_t v) { return reinterpret_cast<T*>(static_cast<uintptr_t>(v)); }

void set_ptrs(FwdParams& p, const Ptrs& ptrs) {
  p.x = as_ptr<const void>(ptrs[0]);
  p.weight = as_ptr<const void>(ptrs[1]);
  p.bias = as_ptr<const void>(ptrs[2]);
  p.seq_idx = as_ptr<const int32_t>(ptrs[3]);
  p.initial_states = as_ptr<const void>(ptrs[4]);
  p.out = as_ptr<void>(ptrs[5]);
  p.final_states = as_ptr<void>(ptrs[6]);
}

FwdArgs make_args(const Ptrs& ptrs, const Sizes& sizes, const Strides& s, int x_dtype, int w_dtype,
                  bool silu, int64_t stream) {
  FwdArgs a;
  FwdParams& p = a.p;
  set_ptrs(p, ptrs);
  p.batch = sizes[0];
  p.dim = sizes[1];
  p.seqlen = sizes[2];
  // The 17 strides are contiguous int64 fields starting at x_batch_stride.
  static_assert(offsetof(FwdParams, fs_w_stride) - offsetof(FwdParams, x_batch_stride) == 16 * 8,
                "FwdParams strides must stay contiguous");
  std::memcpy(&p.x_batch_stride, s.data(), sizeof(int64_t) * s.size());
  p.silu = silu ? 1 : 0;
  a.x_dtype = static_cast<DType>(x_dtype);
  a.w_dtype = static_cast<DType>(w_dtype);
  a.width = int(sizes[3]);
  a.stream = as_ptr<void>(stream);
  return a;
}

void set_ptrs(BwdParams& p, const BwdPtrs& ptrs) {
  p.x = as_ptr<const void>(ptrs[0]);
  p.weight = as_ptr<const void>(ptrs[1]);
  p.bias = as_ptr<const void>(ptrs[2]);
  p.seq_idx = as_ptr<const int32_t>(ptrs[3]);
  p.initial_states = as_ptr<const void>(ptrs[4]);
  p.dout = as_ptr<const void>(ptrs[5]);
  p.dfinal_states = as_ptr<const void>(ptrs[6]);
  p.dx = as_ptr<void>(ptrs[7]);
  p.dinitial_states = as_ptr<void>(ptrs[8]);
  p.dweight = as_ptr<void>(ptrs[9]);
  p.dbias = as_ptr<void>(ptrs[10]);
  p.partials = as_ptr<float>(ptrs[11]);
}

BwdArgs make_bwd_args(const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& s, int x_dtype, int w_dtype,
                      bool silu, size_t workspace_bytes, int64_t stream) {
  BwdArgs a;
  BwdParams& p = a.p;
  set_ptrs(p, ptrs);
  p.batch = sizes[0];
  p.dim = sizes[1];
  p.seqlen = sizes[2];
  // The 26 strides are contiguous int64 fields from x_batch_stride to db_stride.
  static_assert(offsetof(BwdParams, db_stride) - offsetof(BwdParams, x_batch_stride) == 25 * 8,
                "BwdParams strides must stay contiguous");
  std::memcpy(&p.x_batch_stride, s.data(), sizeof(int64_t) * s.size());
  p.silu = silu ? 1 : 0;
  a.x_dtype = static_cast<DType>(x_dtype);
  a.w_dtype = static_cast<DType>(w_dtype);
  a.width = int(sizes[3]);
  a.workspace_bytes = workspace_bytes;
  a.stream = as_ptr<void>(stream);
  return a;
}

VarlenArgs make_varlen_args(const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& s, int x_dtype,
                            int w_dtype, bool silu, int64_t stream) {
  VarlenArgs a;
  VarlenParams& p = a.p;
  p.x = as_ptr<const void>(ptrs[0]);
  p.weight = as_ptr<const void>(ptrs[1]);
  p.bias = as_ptr<const void>(ptrs[2]);
  p.cu_seqlens = as_ptr<const int32_t>(ptrs[3]);
  p.cache_indices = as_ptr<const int32_t>(ptrs[4]);
  p.has_initial_state = as_ptr<const void>(ptrs[5]);
  p.conv_states = as_ptr<void>(ptrs[6]);
  p.out = as_ptr<void>(ptrs[7]);
  static_assert(offsetof(VarlenParams, his_bytes) - offsetof(VarlenParams, num_seqs) == 7 * 8,
                "VarlenParams sizes must stay contiguous");
  std::memcpy(&p.num_seqs, sizes.data(), sizeof(int64_t) * 8);
  static_assert(offsetof(VarlenParams, his_stride) - offsetof(VarlenParams, x_dim_stride) == 12 * 8,
                "VarlenParams strides must stay contiguous");
  std::memcpy(&p.x_dim_stride, s.data(), sizeof(int64_t) * s.size());
  p.silu = silu ? 1 : 0;
  a.x_dtype = static_cast<DType>(x_dtype);
  a.w_dtype = static_cast<DType>(w_dtype);
  a.width = int(sizes[8]);
  a.stream = as_ptr<void>(stream);
  return a;
}

UpdArgs make_upd_args(const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& s, int64_t pad_slot_id,
                      int x_dtype, int w_dtype, bool silu, int64_t stream) {
  UpdArgs a;
  UpdParams& p = a.p;
  p.x = as_ptr<const void>(ptrs[0]);
  p.weight = as_ptr<const void>(ptrs[1]);
  p.bias = as_ptr<const void>(ptrs[2]);
  p.conv_state = as_ptr<void>(ptrs[3]);
  p.cache_seqlens = as_ptr<const int32_t>(ptrs[4]);
  p.conv_state_indices = as_ptr<const int32_t>(ptrs[5]);
  p.num_accepted_tokens = as_ptr<const int32_t>(ptrs[6]);
  p.out = as_ptr<void>(ptrs[7]);
  p.batch = sizes[0];
  p.dim = sizes[1];
  p.seqlen = sizes[2];
  p.state_len = sizes[3];
  p.pool = sizes[4];
  static_assert(offsetof(UpdParams, accepted_stride) - offsetof(UpdParams, x_batch_stride) == 14 * 8,
                "UpdParams strides must stay contiguous");
  std::memcpy(&p.x_batch_stride, s.data(), sizeof(int64_t) * s.size());
  p.pad_slot_id = pad_slot_id;
  p.silu = silu ? 1 : 0;
  a.x_dtype = static_cast<DType>(x_dtype);
  a.w_dtype = static_cast<DType>(w_dtype);
  a.width = int(sizes[5]);
  a.stream = as_ptr<void>(stream);
  return a;
}

// A call's sizes, strides, dtypes and activation, converted once. The PyTorch API
// keeps one per call signature, so that a call converts only its pointers and
// stream: converting fwd()'s and bwd()'s tuples costs more than the rest of the
// binding. The calls check and dispatch exactly as fwd() and bwd() do; the
// forward's is cc1d::FwdPlan, which also remembers its launch, the backward's
// cc1d::BwdPlan (its fixed kernel).
struct BwdPlanHandle {
  BwdArgs args;
  std::shared_ptr<const cc1d::BwdPlan> plan;
};

BwdBuffers bwd_buffers(int64_t x, int64_t weight, int64_t bias, int64_t seq_idx, int64_t initial_states, int64_t dout,
                       int64_t dfinal_states, int64_t dx, int64_t dinitial_states, int64_t dweight, int64_t dbias,
                       int64_t partials) {
  BwdBuffers b;
  b.x = as_ptr<const void>(x);
  b.weight = as_ptr<const void>(weight);
  b.bias = as_ptr<const void>(bias);
  b.seq_idx = as_ptr<const int32_t>(seq_idx);
  b.initial_states = as_ptr<const void>(initial_states);
  b.dout = as_ptr<const void>(dout);
  b.dfinal_states = as_ptr<const void>(dfinal_states);
  b.dx = as_ptr<void>(dx);
  b.dinitial_states = as_ptr<void>(dinitial_states);
  b.dweight = as_ptr<void>(dweight);
  b.dbias = as_ptr<void>(dbias);
  b.partials = as_ptr<float>(partials);
  return b;
}

py::dict variant_dict(const KernelVariant& v) {
  py::dict d;
  d["key"] = v.key;
  d["hash"] = v.hash;
  d["source"] = v.source;
  d["threads"] = v.threads;
  d["tile_l"] = v.tile_l;
  d["tile_d"] = v.tile_d;
  d["smem_bytes"] = v.smem_bytes;
  d["align_bytes"] = v.align_bytes;
  d["split_blocks"] = v.split_blocks;
  return d;
}

KernelVariant variant_from(const py::dict& d) {
  auto need = [&](const char* k) {
    if (!d.contains(k)) throw InvalidArgument(std::string("variant dict lacks '") + k + "'");
    return d[k];
  };
  KernelVariant v;
  v.key = need("key").cast<std::string>();
  v.hash = need("hash").cast<std::string>();
  v.source = need("source").cast<std::string>();
  v.threads = need("threads").cast<int>();
  v.tile_l = need("tile_l").cast<int>();
  v.tile_d = need("tile_d").cast<int>();
  v.smem_bytes = need("smem_bytes").cast<int>();
  v.align_bytes = need("align_bytes").cast<int>();
  // Optional: forward variants have none; the backward checks it is >= 1.
  if (d.contains("split_blocks")) v.split_blocks = d["split_blocks"].cast<int>();
  return v;
}

py::dict explanation_dict(const Explanation& e) {
  py::dict d;
  d["variant"] = variant_dict(e.variant);
  d["key"] = e.variant.key;
  d["reason"] = e.reason;
  d["source"] = e.source;
  d["matched_shape"] = e.matched_shape;
  d["arch"] = e.arch;
  d["shape"] = e.call_shape;
  d["alignment"] = e.alignment;
  d["distance"] = e.reason == "default" ? py::object(py::none()) : py::object(py::float_(e.distance));
  d["detail"] = e.detail;
  return d;
}

// Holds the Python callable; calls and drops it with the GIL held, and leaks
// it if the interpreter is already gone at process exit.
struct PyLogHandler {
  py::object fn;
  explicit PyLogHandler(py::object f) : fn(std::move(f)) {}
  ~PyLogHandler() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      fn = py::object();
    } else {
      fn.release();
    }
  }
  void operator()(const std::string& message) const {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    try {
      fn(message);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("cc1d log handler");
    }
  }
};

// Binds name(<fwd's arguments but stream>) -> query(args): a question about calls like
// these that launches nothing (the plans' fixed-kernel queries).
template <class Result>
void def_fwd_query(py::module_& m, const char* name, Result (*query)(const FwdArgs&), const char* doc) {
  m.def(
      name,
      [query](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu) {
        return query(make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0));
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), doc);
}

// def_fwd_query for the update: name(<upd's arguments but stream>) -> query(args).
template <class Result>
void def_upd_query(py::module_& m, const char* name, Result (*query)(const UpdArgs&), const char* doc) {
  m.def(
      name,
      [query](const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id,
              int x_dtype, int w_dtype, bool silu) {
        return query(make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, 0));
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), doc);
}

}  // namespace

PYBIND11_MODULE(_cc1d, m) {
  m.doc() = "cc1d runtime: run-time compiled causal conv1d kernels (NVRTC / hipRTC)";

  // Translators run newest first: the base class goes first so that the
  // derived ones below are tried before it.
  cc1d_py::set_error_types({
      py::register_exception<Error>(m, "Error", PyExc_RuntimeError).ptr(),
      py::register_exception<CompileError>(m, "CompileError", PyExc_RuntimeError).ptr(),
      py::register_exception<BackendError>(m, "BackendError", PyExc_RuntimeError).ptr(),
      py::register_exception<TypeMismatch>(m, "TypeMismatch", PyExc_TypeError).ptr(),
      py::register_exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError).ptr(),
  });

  m.def(
      "compile",
      [](const std::string& source, const std::string& target, const std::vector<std::string>& options) {
        CompileResult r;
        {
          py::gil_scoped_release nogil;
          r = cc1d::compile(source, target, options);
        }
        return py::make_tuple(
            py::bytes(reinterpret_cast<const char*>(r.binary.data()), r.binary.size()), r.log);
      },
      py::arg("source"), py::arg("target"), py::arg("options") = std::vector<std::string>{},
      "compile(source, target, options=[]) -> (binary: bytes, log: str), through the compile cache");

  m.def("compiler_version", &cc1d::compiler_version, py::arg("target"),
        py::call_guard<py::gil_scoped_release>());
  m.def("device_target", &cc1d::device_target, py::arg("vendor"), py::arg("device"),
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "early_launch_helps",
      [](const std::string& vendor, int64_t stream) {
        return cc1d::backend_for_vendor(vendor).early_launch_helps(reinterpret_cast<void*>(stream));
      },
      py::arg("vendor"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
      "early_launch_helps(vendor, stream) -> bool: whether a kernel launched onto the stream now "
      "would be launched early (programmatic dependent launch, where the kernel allows it)");

  m.def(
      "fwd",
      [](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu,
         int64_t stream) {
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        causal_conv1d_fwd(a);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream"));

  py::class_<cc1d::FwdPlan, std::shared_ptr<cc1d::FwdPlan>>(m, "FwdPlan",
                            "FwdPlan(sizes, strides, x_dtype, w_dtype, silu): fwd's arguments but the pointers and "
                            "the stream, converted once; plan(x, weight, bias, seq_idx, initial_states, out, "
                            "final_states, stream) is fwd((x, ..., final_states), sizes, strides, x_dtype, w_dtype, "
                            "silu, stream), and remembers its launch (cc1d::FwdPlan).")
      .def(py::init([](const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu) {
             return std::make_shared<cc1d::FwdPlan>(make_args(Ptrs{}, sizes, strides, x_dtype, w_dtype, silu, 0));
           }),
           py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"), py::arg("silu"))
      .def(
          "__call__",
          [](const cc1d::FwdPlan& plan, int64_t x, int64_t weight, int64_t bias, int64_t seq_idx,
             int64_t initial_states, int64_t out, int64_t final_states, int64_t stream) {
            FwdBuffers b;
            b.x = as_ptr<const void>(x);
            b.weight = as_ptr<const void>(weight);
            b.bias = as_ptr<const void>(bias);
            b.seq_idx = as_ptr<const int32_t>(seq_idx);
            b.initial_states = as_ptr<const void>(initial_states);
            b.out = as_ptr<void>(out);
            b.final_states = as_ptr<void>(final_states);
            py::gil_scoped_release nogil;
            plan.run(b, as_ptr<void>(stream));
          },
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("seq_idx"), py::arg("initial_states"),
          py::arg("out"), py::arg("final_states"), py::arg("stream"))
      .def("launcher", [](std::shared_ptr<cc1d::FwdPlan> self) { return cc1d_py::fwd_launcher(std::move(self)); },
           "A builtin function f(x, weight, bias, seq_idx, initial_states, out, final_states, stream) doing what "
           "plan(...) does, called without pybind11's dispatcher (a fraction of its per-call cost).");

  m.def(
      "launch_fwd",
      [](const py::dict& variant, const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype,
         int w_dtype, bool silu, int64_t stream, bool as_plan) {
        const KernelVariant v = variant_from(variant);
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        cc1d::launch_fwd(v, a, as_plan ? cc1d::LaunchAs::plan : cc1d::LaunchAs::generic);
      },
      py::arg("variant"), py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("stream"), py::arg("as_plan") = false,
      "launch_fwd(variant, ptrs, sizes, strides, x_dtype, w_dtype, silu, stream, as_plan=False): launches "
      "exactly this variant: its generic kernel, or with as_plan the kernel a plan for such calls launches "
      "(its fixed kernel where fwd_plan_fixes; CompileError's RuntimeError if that does not compile).");

  def_fwd_query(
      m, "fwd_plan_fixes", &cc1d::fwd_plan_fixes,
      "fwd_plan_fixes(<fwd's arguments but stream>) -> bool: whether forward plans for such calls launch "
      "fixed kernels (channel-last, channel-first of width 5-8 or with seq_idx; not with CC1D_FWD_GENERIC=1).");

  def_fwd_query(
      m, "fwd_fixed_options", &cc1d::fwd_fixed_options,
      "fwd_fixed_options(<fwd's arguments but stream>) -> list of str: the compiler options of a forward plan's "
      "fixed kernel for such calls (dim, the strides batch and seqlen do not set and the optional inputs as "
      "constants).");

  m.def(
      "select_fwd",
      [](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu,
         int64_t stream, const std::string& arch) {
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        KernelVariant v;
        {
          py::gil_scoped_release nogil;
          v = cc1d::select_fwd(a, arch);
        }
        return variant_dict(v);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream"), py::arg("arch") = "");

  m.def(
      "explain_fwd",
      [](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu,
         int64_t stream, const std::string& arch) {
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // a first decision may read DB files
          e = cc1d::explain_fwd(a, arch);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream") = 0, py::arg("arch") = "",
      "explain_fwd(<fwd's arguments>, arch='') -> dict: the variant the dispatcher picks and why "
      "(reason exact|nearest|default, source DB path or 'catalog', matched_shape, distance, detail). "
      "arch='' takes the target of x's device. Touches no memory.");

  m.def(
      "prepare_fwd",
      [](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu,
         int device) {
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // may compile
          e = cc1d::prepare_fwd(a, device);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("device") = -1,
      "prepare_fwd(<fwd's arguments but stream>, device=-1) -> dict like explain_fwd's: decide, compile and "
      "load the kernel such a call uses, launching nothing and touching no memory (pointers only carry "
      "alignment). device=-1: the device owning x, else the current one.");

  m.def(
      "precompile_fwd",
      [](const Ptrs& ptrs, const Sizes& sizes, const Strides& strides, int x_dtype, int w_dtype, bool silu,
         const std::string& arch) {
        const FwdArgs a = make_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // compiles
          e = cc1d::precompile_fwd(a, arch);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("arch"),
      "precompile_fwd(<fwd's arguments but stream>, arch) -> dict like explain_fwd's: decide for arch and compile "
      "the kernel into the compile cache, loading nothing (no GPU needed).");

  // ---- backward ----
  // Argument order: fwd's, with the backward's 12 pointers and 26 strides, and
  // workspace_bytes (the bytes at partials) before stream.
  m.def(
      "bwd",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu,
         size_t workspace_bytes, int64_t stream) {
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream);
        py::gil_scoped_release nogil;
        causal_conv1d_bwd(a);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("workspace_bytes"), py::arg("stream"),
      "bwd(ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream): the backward's kernels "
      "on stream. ptrs (12): x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, dinitial_states, "
      "dweight, dbias, partials (0 = none). sizes: batch, dim, seqlen, width. strides (26, elements): x (batch, "
      "dim, l), weight (dim, width), bias, dout (3), dx (3), seq_idx (batch, l), initial_states (batch, dim, w), "
      "dfinal_states (3), dinitial_states (3), dweight (dim, width), dbias. partials: workspace_bytes >= "
      "bwd_workspace_bytes(...) of device memory, 16-byte aligned.");

  m.def(
      "bwd_workspace_bytes",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu,
         const std::string& arch) {
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0, 0);
        py::gil_scoped_release nogil;  // a first decision may read DB files
        return cc1d::bwd_workspace_bytes(a, arch);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("arch") = "",
      "bwd_workspace_bytes(<bwd's arguments but workspace_bytes and stream>, arch='') -> int: bytes of partials "
      "the call needs (splits * dim * (width + 1) * 4 for the variant dispatch picks). partials may be 0. "
      "arch='' takes the target of x's device (and then compiles and loads the kernels, as prepare_bwd). "
      "Touches no memory.");

  m.def(
      "bwd_fixed_options",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu) {
        return cc1d::bwd_fixed_options(make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0, 0));
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"),
      "bwd_fixed_options(<bwd's arguments but workspace_bytes and stream>) -> list of str: the compiler options "
      "of a backward plan's fixed kernel for such calls (channel-last: dim, the optional inputs and outputs and "
      "the strides batch and seqlen do not set as constants); [] for channel-first calls.");

  m.def(
      "bwd_plan_fixes",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu) {
        return cc1d::bwd_plan_fixes(make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0, 0));
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"),
      "bwd_plan_fixes(<bwd's arguments but workspace_bytes and stream>) -> bool: whether backward plans for such "
      "calls launch fixed kernels (channel-last; not with CC1D_BWD_GENERIC=1).");

  py::class_<BwdPlanHandle>(m, "BwdPlan",
                            "BwdPlan(sizes, strides, x_dtype, w_dtype, silu): bwd's arguments but the pointers, "
                            "workspace_bytes and the stream, converted once. plan.workspace_bytes(<12 pointers>) is "
                            "bwd_workspace_bytes(<12 pointers>, ..., arch=''); plan(<12 pointers>, workspace_bytes, "
                            "stream) is bwd through cc1d::BwdPlan (a channel-last plan launches its fixed kernel from "
                            "its second run on: bwd_fixed_options). Pointers in bwd's order: x, weight, bias, seq_idx, "
                            "initial_states, dout, dfinal_states, dx, dinitial_states, dweight, dbias, partials.")
      .def(py::init([](const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu) {
             const BwdArgs a = make_bwd_args(BwdPtrs{}, sizes, strides, x_dtype, w_dtype, silu, 0, 0);
             return BwdPlanHandle{a, std::make_shared<const cc1d::BwdPlan>(a)};
           }),
           py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"), py::arg("silu"))
      .def(
          "workspace_bytes",
          [](const BwdPlanHandle& plan, int64_t x, int64_t weight, int64_t bias, int64_t seq_idx,
             int64_t initial_states, int64_t dout, int64_t dfinal_states, int64_t dx, int64_t dinitial_states,
             int64_t dweight, int64_t dbias, int64_t partials) {
            BwdArgs a = plan.args;
            set_ptrs(a.p, BwdPtrs{x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx,
                                  dinitial_states, dweight, dbias, partials});
            py::gil_scoped_release nogil;  // a first decision may read DB files, compile and load
            return cc1d::bwd_workspace_bytes(a, "");
          },
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("seq_idx"), py::arg("initial_states"),
          py::arg("dout"), py::arg("dfinal_states"), py::arg("dx"), py::arg("dinitial_states"), py::arg("dweight"),
          py::arg("dbias"), py::arg("partials"))
      .def(
          "__call__",
          [](const BwdPlanHandle& plan, int64_t x, int64_t weight, int64_t bias, int64_t seq_idx,
             int64_t initial_states, int64_t dout, int64_t dfinal_states, int64_t dx, int64_t dinitial_states,
             int64_t dweight, int64_t dbias, int64_t partials, size_t workspace_bytes, int64_t stream) {
            const BwdBuffers b = bwd_buffers(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx,
                                             dinitial_states, dweight, dbias, partials);
            py::gil_scoped_release nogil;
            plan.plan->run(b, workspace_bytes, as_ptr<void>(stream));
          },
          py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("seq_idx"), py::arg("initial_states"),
          py::arg("dout"), py::arg("dfinal_states"), py::arg("dx"), py::arg("dinitial_states"), py::arg("dweight"),
          py::arg("dbias"), py::arg("partials"), py::arg("workspace_bytes"), py::arg("stream"));

  m.def(
      "launch_bwd",
      [](const py::dict& variant, const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype,
         int w_dtype, bool silu, size_t workspace_bytes, int64_t stream, bool as_plan) {
        const KernelVariant v = variant_from(variant);
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream);
        py::gil_scoped_release nogil;
        cc1d::launch_bwd(v, a, as_plan ? cc1d::LaunchAs::plan : cc1d::LaunchAs::generic);
      },
      py::arg("variant"), py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("workspace_bytes"), py::arg("stream"), py::arg("as_plan") = false,
      "launch_bwd(variant, <bwd's arguments>, as_plan=False): exactly this variant (its workspace need uses its "
      "own tiles): its plain build, or with as_plan what a BwdPlan launches for it (a channel-last call's "
      "fixed kernel, a channel-first call's seq_idx build where it has seq_idx; CompileError's RuntimeError if "
      "that does not compile).");

  m.def(
      "bwd_seq_build_options", [] { return cc1d::bwd_seq_build_options(); },
      "bwd_seq_build_options() -> list of str: the compiler options of a variant's seq_idx build, which "
      "backward calls with seq_idx run (and the tuner times for shapes with seq_idx).");

  m.def(
      "select_bwd",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu,
         size_t workspace_bytes, int64_t stream, const std::string& arch) {
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream);
        KernelVariant v;
        {
          py::gil_scoped_release nogil;
          v = cc1d::select_bwd(a, arch);
        }
        return variant_dict(v);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("workspace_bytes") = 0, py::arg("stream") = 0, py::arg("arch") = "",
      "select_bwd(<bwd's arguments>, arch='') -> variant dict the dispatcher picks (workspace_bytes, stream "
      "and partials are not looked at).");

  m.def(
      "explain_bwd",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu,
         size_t workspace_bytes, int64_t stream, const std::string& arch) {
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream);
        Explanation e;
        {
          py::gil_scoped_release nogil;
          e = cc1d::explain_bwd(a, arch);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("workspace_bytes") = 0, py::arg("stream") = 0, py::arg("arch") = "",
      "explain_bwd(<bwd's arguments>, arch='') -> dict as explain_fwd's, for the backward.");

  m.def(
      "prepare_bwd",
      [](const BwdPtrs& ptrs, const Sizes& sizes, const BwdStrides& strides, int x_dtype, int w_dtype, bool silu,
         int device) {
        const BwdArgs a = make_bwd_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0, 0);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // may compile
          e = cc1d::prepare_bwd(a, device);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("device") = -1,
      "prepare_bwd(<bwd's arguments but workspace_bytes and stream>, device=-1) -> dict like explain_bwd's: "
      "decide, compile and load both backward kernels, launching nothing and touching no memory.");

  // ---- varlen prefill ----
  // ptrs (8): x, weight, bias, cu_seqlens, cache_indices, has_initial_state, conv_states, out (0 = none;
  // out 0: states only). sizes (9): num_seqs, dim, total_tokens, max_seqlen (0: unknown), state_len, pool,
  // pad_slot_id, his_bytes, width. strides (13, elements): x (dim, l), weight (dim, width), bias, out (dim, l),
  // conv_states (pool, dim, state), cu_seqlens, cache_indices, has_initial_state.
  m.def(
      "varlen",
      [](const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& strides, int x_dtype, int w_dtype,
         bool silu, int64_t stream) {
        const VarlenArgs a = make_varlen_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        causal_conv1d_varlen(a);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream"),
      "varlen(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream): the varlen prefill on stream (see the "
      "comment above this binding for the argument order).");

  m.def(
      "launch_varlen",
      [](const py::dict& variant, const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& strides,
         int x_dtype, int w_dtype, bool silu, int64_t stream) {
        const KernelVariant v = variant_from(variant);
        const VarlenArgs a = make_varlen_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        cc1d::launch_varlen(v, a);
      },
      py::arg("variant"), py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("stream"), "launch_varlen(variant, <varlen's arguments>)");

  m.def(
      "select_varlen",
      [](const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& strides, int x_dtype, int w_dtype,
         bool silu, int64_t stream, const std::string& arch) {
        const VarlenArgs a = make_varlen_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        KernelVariant v;
        {
          py::gil_scoped_release nogil;
          v = cc1d::select_varlen(a, arch);
        }
        return variant_dict(v);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream") = 0, py::arg("arch") = "");

  m.def(
      "explain_varlen",
      [](const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& strides, int x_dtype, int w_dtype,
         bool silu, int64_t stream, const std::string& arch) {
        const VarlenArgs a = make_varlen_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, stream);
        Explanation e;
        {
          py::gil_scoped_release nogil;
          e = cc1d::explain_varlen(a, arch);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("stream") = 0, py::arg("arch") = "",
      "explain_varlen(<varlen's arguments>, arch='') -> dict as explain_fwd's, for the varlen prefill.");

  m.def(
      "prepare_varlen",
      [](const VarlenPtrs& ptrs, const VarlenSizes& sizes, const VarlenStrides& strides, int x_dtype, int w_dtype,
         bool silu, int device) {
        const VarlenArgs a = make_varlen_args(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // may compile
          e = cc1d::prepare_varlen(a, device);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("silu"), py::arg("device") = -1,
      "prepare_varlen(<varlen's arguments but stream>, device=-1): decide, compile and load, launching nothing.");
  // ---- decode update ----
  // Arguments: ptrs (8), sizes (6), strides (15), pad_slot_id, x_dtype, w_dtype, silu, then stream.
  m.def(
      "upd",
      [](const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id, int x_dtype,
         int w_dtype, bool silu, int64_t stream) {
        const UpdArgs a = make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        causal_conv1d_update(a);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("stream"),
      "upd(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream): the decode update on stream. "
      "ptrs (8): x, weight, bias, conv_state, cache_seqlens, conv_state_indices, num_accepted_tokens, out "
      "(0 = none). sizes: batch, dim, seqlen, state_len, pool, width. strides (15, elements): x (batch, dim, l), "
      "weight (dim, width), bias, conv_state (pool, dim, state_len), out (3), cache_seqlens, conv_state_indices, "
      "num_accepted_tokens.");

  py::class_<cc1d::UpdPlan, std::shared_ptr<cc1d::UpdPlan>>(
      m, "UpdPlan",
      "UpdPlan(sizes, strides, pad_slot_id, x_dtype, w_dtype, silu): upd's arguments but the pointers and the "
      "stream, converted once (cc1d::UpdPlan, which remembers its launch); launcher() runs it.")
      .def(py::init([](const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id, int x_dtype,
                       int w_dtype, bool silu) {
             return std::make_shared<cc1d::UpdPlan>(
                 make_upd_args(UpdPtrs{}, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, 0));
           }),
           py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"), py::arg("w_dtype"),
           py::arg("silu"))
      .def("launcher", [](std::shared_ptr<cc1d::UpdPlan> self) { return cc1d_py::upd_launcher(std::move(self)); },
           "A builtin function f(x, weight, bias, conv_state, cache_seqlens, conv_state_indices, "
           "num_accepted_tokens, out, stream) (data pointers, 0 for none; the stream handle) doing upd(...) with "
           "the plan's other arguments, called without pybind11's dispatcher.");

  m.def(
      "launch_upd",
      [](const py::dict& variant, const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides,
         int64_t pad_slot_id, int x_dtype, int w_dtype, bool silu, int64_t stream, bool as_plan) {
        const KernelVariant v = variant_from(variant);
        const UpdArgs a = make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream);
        py::gil_scoped_release nogil;
        cc1d::launch_upd(v, a, as_plan ? cc1d::LaunchAs::plan : cc1d::LaunchAs::generic);
      },
      py::arg("variant"), py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"),
      py::arg("x_dtype"), py::arg("w_dtype"), py::arg("silu"), py::arg("stream"), py::arg("as_plan") = false,
      "launch_upd(variant, <upd's arguments>, as_plan=False): exactly this variant: its generic kernel, or with "
      "as_plan the one an update plan launches (its fixed kernel where upd_plan_fixes).");

  def_upd_query(
      m, "upd_plan_fixes", &cc1d::upd_plan_fixes,
      "upd_plan_fixes(<upd's arguments but stream>) -> bool: whether update plans launch fixed kernels "
      "(unless CC1D_UPD_GENERIC=1).");

  def_upd_query(
      m, "upd_fixed_options", &cc1d::upd_fixed_options,
      "upd_fixed_options(<upd's arguments but stream>) -> list of str: the compiler options of an update plan's "
      "fixed kernel for such calls (their sizes, strides and optional inputs as constants).");

  m.def(
      "select_upd",
      [](const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id, int x_dtype,
         int w_dtype, bool silu, int64_t stream, const std::string& arch) {
        const UpdArgs a = make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream);
        KernelVariant v;
        {
          py::gil_scoped_release nogil;
          v = cc1d::select_upd(a, arch);
        }
        return variant_dict(v);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("stream") = 0, py::arg("arch") = "");

  m.def(
      "explain_upd",
      [](const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id, int x_dtype,
         int w_dtype, bool silu, int64_t stream, const std::string& arch) {
        const UpdArgs a = make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream);
        Explanation e;
        {
          py::gil_scoped_release nogil;
          e = cc1d::explain_upd(a, arch);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("stream") = 0, py::arg("arch") = "",
      "explain_upd(<upd's arguments>, arch='') -> dict as explain_fwd's, for the decode update.");

  m.def(
      "prepare_upd",
      [](const UpdPtrs& ptrs, const UpdSizes& sizes, const UpdStrides& strides, int64_t pad_slot_id, int x_dtype,
         int w_dtype, bool silu, int device) {
        const UpdArgs a = make_upd_args(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, 0);
        Explanation e;
        {
          py::gil_scoped_release nogil;  // may compile
          e = cc1d::prepare_upd(a, device);
        }
        return explanation_dict(e);
      },
      py::arg("ptrs"), py::arg("sizes"), py::arg("strides"), py::arg("pad_slot_id"), py::arg("x_dtype"),
      py::arg("w_dtype"), py::arg("silu"), py::arg("device") = -1,
      "prepare_upd(<upd's arguments but stream>, device=-1): decide, compile and load the update's kernel.");

  m.def("dispatch_stats", [] {
    const DispatchStats s = cc1d::dispatch_stats();
    py::dict d;
    d["decisions"] = s.decisions;
    d["loads"] = s.loads;
    d["compiles"] = s.compiles;
    d["corrupt_cache_files"] = s.corrupt_cache_files;
    return d;
  }, "Counters so far: dispatch decisions computed (memo misses), kernels loaded into a context, compiler "
     "invocations, and disk-cache files found corrupt (then rebuilt).");

  m.def("set_tuning_dbs", &cc1d::set_tuning_dbs, py::arg("paths"), py::call_guard<py::gil_scoped_release>(),
        "DB files searched first by the dispatcher (replaces the previous list).");
  m.def("set_package_dir", &cc1d::set_package_dir, py::arg("dir"), py::call_guard<py::gil_scoped_release>(),
        "Folder holding tuning_db/<arch>.db (the shipped tuning results).");
  m.def("clear_dispatch_cache", &cc1d::clear_dispatch_cache, py::call_guard<py::gil_scoped_release>(),
        "Forget memoised dispatch decisions and loaded tuning DBs (tuned winners found not to compile stay "
        "excluded).");

  m.def("catalog", [] {
    py::list out;
    const catalog::Entry* e = catalog::entries();
    for (std::size_t i = 0; i < catalog::num_entries(); ++i) {
      py::dict d = variant_dict({e[i].key, e[i].hash, e[i].source, e[i].threads, e[i].tile_l, e[i].tile_d,
                                 e[i].smem_bytes, e[i].align_bytes, e[i].split_blocks});
      d["family"] = e[i].family;
      out.append(std::move(d));
    }
    return out;
  });

  m.def(
      "set_log_handler",
      [](py::object fn) {
        if (fn.is_none()) {
          cc1d::set_log_handler({});
          return;
        }
        auto h = std::make_shared<PyLogHandler>(std::move(fn));
        cc1d::set_log_handler([h](const std::string& msg) { (*h)(msg); });
      },
      py::arg("handler"), "Route runtime warnings to handler(message: str); None restores stderr.");
}
