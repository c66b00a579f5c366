// The Python extension module c4comm_torch._C: creates ProcessGroupC4 instances for
// torch.distributed (the package's __init__.py registers them as backend "c4").
#include <c10/core/CPUAllocator.h>
#include <torch/python.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>

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

// c4comm_torch.shared_allocations(): while set, CPU allocations of at least minBytes come from
// c4::memAlloc (so DDP's gradient buckets, made inside, are reduced zero-copy); smaller ones from
// the allocator that was current. Every tensor allocated meanwhile, of either kind, frees through
// sharedOrPrevDelete, which tells the two apart, so raw_allocate keeps working too.
c10::DeleterFnPtr gPrevRawDeleter = nullptr;

void sharedOrPrevDelete(void* p) {
  if (p && c4::memShareable(p, 1)) {
    (void)c4::memFree(p);
  } else if (gPrevRawDeleter) {
    gPrevRawDeleter(p);
  }
}

at::DataPtr sharedOrPrevAllocate(at::Allocator* prev, size_t minBytes, size_t n) {
  void* p = nullptr;
  if (n >= minBytes && n > 0 && c4::memAlloc(&p, n).isOk())
    return {p, p, &sharedOrPrevDelete, at::Device(at::DeviceType::CPU)};
  if (!gPrevRawDeleter) return prev->allocate(n);  // the previous allocator has no raw form
  at::DataPtr d = prev->allocate(n);
  void* q = d.release_context();  // its raw form: context == data, freed by its raw deleter
  return {q, q, &sharedOrPrevDelete, at::Device(at::DeviceType::CPU)};
}

// at::Allocator::allocate is const in torch 1.x and early 2.x; later 2.x releases made it non-const
// and added a pure virtual copy_data. The override takes whichever form the headers declare.
constexpr bool kAllocateIsConst =
    std::is_same<decltype(&at::Allocator::allocate), at::DataPtr (at::Allocator::*)(size_t) const>::value;

struct SharedAllocatorBase : at::Allocator {
  at::Allocator* prev = nullptr;
  size_t minBytes = 0;
  at::DeleterFnPtr raw_deleter() const override { return gPrevRawDeleter ? &sharedOrPrevDelete : nullptr; }
  // Overrides the pure virtual of later torch 2.x (no `override`: older torch has no such member).
  void copy_data(void* dest, const void* src, size_t count) const { memcpy(dest, src, count); }
};

// Partial specializations, so that only the one for these headers is instantiated.
template <typename Base, bool IsConst>
struct SharedAllocatorOf;
template <typename Base>
struct SharedAllocatorOf<Base, true> : Base {
  at::DataPtr allocate(size_t n) const override { return sharedOrPrevAllocate(this->prev, this->minBytes, n); }
};
template <typename Base>
struct SharedAllocatorOf<Base, false> : Base {
  at::DataPtr allocate(size_t n) override { return sharedOrPrevAllocate(this->prev, this->minBytes, n); }
};

SharedAllocatorOf<SharedAllocatorBase, kAllocateIsConst> gShared;
constexpr uint8_t kAllocatorPriority = 100;

void setSharedAllocator(int64_t minBytes) {
  TORCH_CHECK(minBytes >= 0, "c4: min_bytes must be >= 0");
  TORCH_CHECK(!gShared.prev, "c4: shared_allocations() does not nest");
  at::Allocator* prev = c10::GetCPUAllocator();
  gPrevRawDeleter = prev->raw_deleter();
  gShared.prev = prev;
  gShared.minBytes = static_cast<size_t>(minBytes);
  c10::SetCPUAllocator(&gShared, kAllocatorPriority);
  TORCH_CHECK(c10::GetCPUAllocator() == &gShared, "c4: another CPU allocator with a higher priority is installed");
}

void resetAllocator() {
  if (!gShared.prev) return;
  c10::SetCPUAllocator(gShared.prev, kAllocatorPriority);
  gShared.prev = nullptr;
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
  m.def("_set_shared_allocator", &setSharedAllocator, py::arg("min_bytes"));
  m.def("_reset_allocator", &resetAllocator);
  m.def("_diagnoses", &c4torch::diagnoses,
        "C4D's diagnoses of this process's c4 groups, oldest first, as JSON records (docs/c4d.md)");
  m.def("_python_exiting", &c4torch::pythonExiting,
        "Registered with atexit by c4comm_torch: workers stop releasing tensors (see process_group_c4.hpp)");
  m.attr("torch_api") = TORCH_VERSION_MAJOR >= 2 ? "Backend" : "ProcessGroup";
}
