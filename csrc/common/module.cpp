// The extension module: llmkern._C (CPU + CUDA backends) or llmkern._simt (CUDA sources on the
// SIMT emulator), chosen by LLMK_MODULE_NAME at build time.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/bindings.h"
#include "common/checks.h"
#include "common/cpu_quota.h"
#include "common/device_memory.h"
#include "common/dispatch.h"
#include "common/errors.h"
#include "simt/simt_selftest.h"
#include "common/thread_pool.h"

namespace py = pybind11;

// common/kernel_paths_cpu.cpp, once per SIMD level.
#define LLMK_KERNEL_PATHS_DECL(ns) \
  namespace llmk { namespace ns { std::vector<std::pair<std::string, std::string>> kernel_paths(); } }
#if defined(LLMK_SIMT)
#elif LLMK_MULTI_ISA
LLMK_KERNEL_PATHS_DECL(cpu_scalar)
LLMK_KERNEL_PATHS_DECL(cpu_avx2)
LLMK_KERNEL_PATHS_DECL(cpu_avx512)
#else
LLMK_KERNEL_PATHS_DECL(cpu_scalar)
#endif

#ifndef LLMK_CUDA_TOOLKIT  // _simt, and a _C built without CUDA
#define LLMK_CUDA_TOOLKIT ""
#define LLMK_CUDA_SASS ""
#define LLMK_CUDA_PTX ""
#endif

namespace {

py::dict build_info() {
  py::dict d;
  d["version"] = LLMK_VERSION;
#if defined(LLMK_SIMT)
  d["backends"] = py::make_tuple("simt");
#elif defined(LLMK_WITH_CUDA)
  d["backends"] = py::make_tuple("cpu", "cuda");
#else
  d["backends"] = py::make_tuple("cpu");
#endif
  d["cuda_compiled"] = llmk::cuda_compiled();
  d["cuda_archs"] = std::string(LLMK_CUDA_ARCHS);
  // The toolkit that compiled the CUDA kernels, the architectures they carry machine code for, and
  // those with PTX, from which the driver compiles code for a newer GPU (cmake/cuda_info.cmake).
  d["cuda_toolkit"] = std::string(LLMK_CUDA_TOOLKIT);
  d["cuda_sass"] = std::string(LLMK_CUDA_SASS);
  d["cuda_ptx"] = std::string(LLMK_CUDA_PTX);
  d["cuda_device_count"] = llmk::cuda_device_count();
  d["cpu_simd"] = llmk::cpu_isa_name(llmk::cpu_isa());
  d["cpu_simd_supported"] = llmk::cpu_isa_name(llmk::cpu_isa_supported());
  d["cpu_amx"] = llmk::amx_mode_name(llmk::amx_mode());
#if LLMK_MULTI_ISA
  if (llmk::amx_compiled()) d["cpu_simd_compiled"] = py::make_tuple("scalar", "avx2", "avx512", "amx");
  else d["cpu_simd_compiled"] = py::make_tuple("scalar", "avx2", "avx512");
#else
  d["cpu_simd_compiled"] = py::make_tuple("scalar");
#endif
  py::dict paths;
#if !defined(LLMK_SIMT)
  std::vector<std::pair<std::string, std::string>> kp;
#if LLMK_MULTI_ISA
  switch (llmk::cpu_isa()) {
    case llmk::CpuIsa::Amx:
    case llmk::CpuIsa::Avx512: kp = llmk::cpu_avx512::kernel_paths(); break;
    case llmk::CpuIsa::Avx2: kp = llmk::cpu_avx2::kernel_paths(); break;
    default: kp = llmk::cpu_scalar::kernel_paths(); break;
  }
#else
  kp = llmk::cpu_scalar::kernel_paths();
#endif
  for (const auto& [family, path] : kp) paths[py::str(family)] = path;
#endif
  d["cpu_kernels"] = paths;  // the instructions each CPU kernel family runs on (kernel_paths_cpu.cpp)
  d["num_threads"] = llmk::pool_threads();
  d["threads"] = llmk::use_openmp() ? "openmp" : "pool";
#if defined(_OPENMP)
  d["threads_compiled"] = py::make_tuple("pool", "openmp");
#else
  d["threads_compiled"] = py::make_tuple("pool");  // built with LLMKERN_OPENMP=OFF (wheels)
#endif
  d["thread_placement"] = llmk::pool_placement();
  d["available_cpus"] = llmk::available_cpus();
  d["cgroup_cpu_limit"] = llmk::cgroup_cpu_limit();
  return d;
}

void set_num_threads(int n) {
  LLMK_CHECK(n >= 1, ValueError, "n: number of threads must be >= 1, got ", n);
  llmk::set_pool_threads(n);
}

int get_num_threads() { return llmk::pool_threads(); }

py::dict thread_pool_stats() {
  const llmk::PoolStats s = llmk::pool_stats();
  py::dict d;
  d["jobs"] = s.jobs;
  d["chunks"] = s.chunks;
  d["worker_chunks"] = s.worker_chunks;
  d["solo_jobs"] = s.solo_jobs;
  d["stalls"] = s.stalls;
  d["wait_us"] = s.wait_us;
  d["stall_wait_us"] = s.stall_wait_us;
  d["worker_jobs"] = s.worker_jobs;
  d["colocated"] = s.colocated;
  d["nudges"] = s.nudges;
  return d;
}

// llmkern.IndexOutOfRangeError (defined in Python so that _C and _simt raise the same class);
// ValueError should the package not be importable.
PyObject* index_out_of_range_type() {
  static PyObject* type = [] {
    PyObject* mod = PyImport_ImportModule("llmkern._errors");
    PyObject* t = mod ? PyObject_GetAttrString(mod, "IndexOutOfRangeError") : nullptr;
    Py_XDECREF(mod);
    if (!t) PyErr_Clear();
    return t ? t : PyExc_ValueError;
  }();
  return type;
}

// Python narrows int64 index tensors to the int32 the kernels read (attention's cu_seqlens,
// cache_seqlens, block_table): every entry must fit, or the narrowing would wrap silently. Read on
// the host for CPU tensors (and in the emulator), for CUDA tensors under LLMKERN_DEBUG_CHECKS=1.
void check_fits_int32(llmk::TensorView t, const std::string& name) {
  llmk::check_index(t, name.c_str());
  llmk::check_index_range(t, name.c_str(), INT32_MIN, int64_t{INT32_MAX} + 1,
                          "an int32 index (the kernels' index type)");
}

}  // namespace

PYBIND11_MODULE(LLMK_MODULE_NAME, m) {
  m.doc() = "llmkern kernels (called through llmkern.ops; tensors cross as DLPack capsules)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const llmk::IndexOutOfRangeError& e) {
      PyErr_SetString(index_out_of_range_type(), e.what());
    } catch (const llmk::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const llmk::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const llmk::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const llmk::RuntimeError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  llmk::use_openmp();  // decide the thread mode now, which also registers the fork handler
  m.def("build_info", &build_info);
  m.def("set_num_threads", &set_num_threads);
  m.def("get_num_threads", &get_num_threads);
  m.def("thread_pool_stats", &thread_pool_stats);
  m.def("thread_pool_selftest", &llmk::pool_selftest, py::arg("jobs"), py::arg("max_chunks") = 16,
        py::call_guard<py::gil_scoped_release>());
  m.def("pause_thread_placement", &llmk::pause_thread_placement, py::call_guard<py::gil_scoped_release>());
  m.def("check_fits_int32", &check_fits_int32);
  llmk::bind_kvcache(m);
  llmk::bind_attention(m);
  llmk::bind_sampling(m);
  llmk::bind_linear(m);
  llmk::bind_layernorm(m);
  llmk::bind_rotary(m);
  llmk::bind_moe(m);
  llmk::bind_decoder(m);
  llmk::bind_simt_selftest(m);
}
