// The Python extension module c4comm_torch._C: creates ProcessGroupC4 instances for
// torch.distributed (the package's __init__.py registers them as backend "c4").
#include <torch/python.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "bindings/torch/process_group_c4.hpp"
#include "c4comm/c4comm.hpp"

namespace py = pybind11;

namespace {

c10::intrusive_ptr<c4torch::BackendBase> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                                double timeoutSeconds) {
  TORCH_CHECK(size > 0 && rank >= 0 && rank < size, "c4: invalid rank ", rank, " for world size ", size);
  TORCH_CHECK(std::isfinite(timeoutSeconds) && timeoutSeconds > 0, "c4: invalid timeout ", timeoutSeconds, " s");
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeoutSeconds * 1000.0)));
  return c10::make_intrusive<c4torch::ProcessGroupC4>(store, rank, size, timeout);
}

// `nbytes` of zeroed memory from c4::memAlloc (ncclMemAlloc's), as a uint8 tensor that frees it.
at::Tensor sharedBytes(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "c4: negative size ", nbytes);
  void* p = nullptr;
  c4::Status st = c4::memAlloc(&p, static_cast<size_t>(std::max<int64_t>(nbytes, 1)));
  TORCH_CHECK(st.isOk(), "c4: ", st.toString());
  return torch::from_blob(
      p, {nbytes}, [](void* q) { (void)c4::memFree(q); }, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "c4comm's torch.distributed backend (see c4comm_torch)";
  // Blocks until every rank joined: release the GIL so other Python threads keep running.
  m.def("_create", &create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_seconds"),
        py::call_guard<py::gil_scoped_release>(),
        "Creates the process group (torch 1.x: a ProcessGroup; 2.x: a Backend) for one group's store.");
  m.def(
      "c4_version", [] { return c4::version(); }, "c4comm's version, encoded as NCCL does (major*10000+...)");
  m.def("_shared_bytes", &sharedBytes, py::arg("nbytes"),
        "A uint8 CPU tensor of nbytes zeroed bytes on shareable memory (ncclMemAlloc's).");
  m.attr("torch_api") = TORCH_VERSION_MAJOR >= 2 ? "Backend" : "ProcessGroup";
}
