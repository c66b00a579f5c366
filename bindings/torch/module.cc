// The Python extension module c4comm_torch._C: creates ProcessGroupC4 instances for
// torch.distributed (the package's __init__.py registers them as backend "c4").
#include <c10/core/CPUAllocator.h>
#include <dlfcn.h>
#include <torch/python.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "bindings/torch/process_group_c4.hpp"
#include "c4comm/c4comm.hpp"

namespace py = pybind11;

namespace {

// The communicator the next group of this process adopts (c4comm_torch.adopt_comm), if any.
std::mutex gAdoptMu;
c4::Comm* gAdopt = nullptr;
bool gAdoptOwned = false;

c10::intrusive_ptr<c4torch::BackendBase> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                                double timeoutSeconds) {
  TORCH_CHECK(size > 0 && rank >= 0 && rank < size, "c4: invalid rank ", rank, " for world size ", size);
  TORCH_CHECK(std::isfinite(timeoutSeconds) && timeoutSeconds > 0, "c4: invalid timeout ", timeoutSeconds, " s");
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeoutSeconds * 1000.0)));
  c4::Comm* adopt = nullptr;
  bool owned = false;
  {
    std::lock_guard<std::mutex> g(gAdoptMu);
    std::swap(adopt, gAdopt);
    owned = gAdoptOwned;
  }
  if (!adopt) return c10::make_intrusive<c4torch::ProcessGroupC4>(store, rank, size, timeout);
  int n = 0, r = -1;
  TORCH_CHECK(c4::commCount(adopt, &n).isOk() && c4::commUserRank(adopt, &r).isOk(),
              "c4: the communicator handed to adopt_comm is not usable");
  TORCH_CHECK(n == size && r == rank, "c4: the communicator handed to adopt_comm is rank ", r, " of ", n,
              ", but the group being created is rank ", rank, " of ", size);
  return c10::make_intrusive<c4torch::ProcessGroupC4>(store, adopt, owned, timeout);
}

void adoptNext(uintptr_t comm, bool owned) {
  std::lock_guard<std::mutex> g(gAdoptMu);
  gAdopt = reinterpret_cast<c4::Comm*>(comm);
  gAdoptOwned = owned;
}

c4torch::ProcessGroupC4& c4Backend(const c10::intrusive_ptr<c4torch::BackendBase>& b) {
  auto* pg = dynamic_cast<c4torch::ProcessGroupC4*>(b.get());
  TORCH_CHECK(pg != nullptr, "c4: not a process group of backend c4");
  return *pg;
}

uintptr_t pauseBackend(const c10::intrusive_ptr<c4torch::BackendBase>& b) {
  std::string error;
  c4::Comm* comm = c4Backend(b).pause(&error);
  TORCH_CHECK(comm != nullptr, "c4 nccl_comm: ", error);
  return reinterpret_cast<uintptr_t>(comm);
}

// The directory of the libc4comm.so this module runs on (libnccl.so.2 and libc4comm_mpi.so of the
// same build sit beside it, so that they share its one copy).
std::string libraryDir() {
  Dl_info info{};
  TORCH_CHECK(dladdr(reinterpret_cast<void*>(&c4::version), &info) != 0 && info.dli_fname,
              "c4: cannot locate libc4comm");
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
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
  m.def("_adopt_next", &adoptNext, py::arg("comm"), py::arg("owned"),
        "The next c4 group this process creates runs on this communicator (an ncclComm_t address)");
  m.def(
      "_comm_ptr",
      [](const c10::intrusive_ptr<c4torch::BackendBase>& b) {
        return reinterpret_cast<uintptr_t>(c4Backend(b).comm());
      },
      "The group's collective communicator as an ncclComm_t address");
  m.def("_pause", &pauseBackend, py::call_guard<py::gil_scoped_release>(),
        "Waits for the group's issued operations, holds its worker; returns the ncclComm_t address");
  m.def(
      "_resume", [](const c10::intrusive_ptr<c4torch::BackendBase>& b) { c4Backend(b).resume(); },
      py::call_guard<py::gil_scoped_release>());
  m.def("_library_dir", &libraryDir, "The directory of the libc4comm.so this module uses");
  m.def(
      "_unique_id",
      [] {
        c4::UniqueId id;
        c4::Status st = c4::getUniqueId(&id);
        TORCH_CHECK(st.isOk(), "c4: getUniqueId failed: ", st.message());
        return py::bytes(id.bytes, sizeof id.bytes);
      },
      "A new c4 unique id (ncclGetUniqueId's 128 bytes)");
  m.def(
      "_comm_init_rank",
      [](const std::string& uid, int nranks, int rank) {
        TORCH_CHECK(uid.size() == sizeof(c4::UniqueId::bytes), "c4: a unique id has ", sizeof(c4::UniqueId::bytes),
                    " bytes, got ", uid.size());
        c4::UniqueId id;
        std::memcpy(id.bytes, uid.data(), uid.size());
        c4::Comm* comm = nullptr;
        c4::Status st;
        {
          py::gil_scoped_release nogil;
          st = c4::commInitRank(&comm, nranks, id, rank);
        }
        TORCH_CHECK(st.isOk(), "c4: creating rank ", rank, " of ", nranks, " failed: ", st.message());
        return reinterpret_cast<uintptr_t>(comm);
      },
      py::arg("uid"), py::arg("nranks"), py::arg("rank"), "ncclCommInitRank: a communicator as an ncclComm_t address");
  m.def(
      "_comm_destroy", [](uintptr_t comm) { (void)c4::commDestroy(reinterpret_cast<c4::Comm*>(comm)); },
      py::call_guard<py::gil_scoped_release>());
#if TORCH_VERSION_MAJOR >= 2
  // torch 2.x hands Python the backend object of a group (pg._get_backend(device)): registered as
  // a subclass of torch's Backend, it answers what torch.distributed asks of a backend that
  // supports splitting.
  auto backendType = py::module::import("torch._C._distributed_c10d").attr("Backend");
  py::class_<c4torch::ProcessGroupC4, c10::intrusive_ptr<c4torch::ProcessGroupC4>>(m, "ProcessGroupC4", backendType)
      // new_group with a bound device on a group that supports splitting: members create their
      // group afresh (c4's creator is not told to split), so non-members have nothing to join.
      .def(
          "perform_nocolor_split", [](c4torch::ProcessGroupC4&, const py::object&) {}, py::arg("device"))
      .def("_comm_ptr", [](c4torch::ProcessGroupC4& pg) { return reinterpret_cast<uintptr_t>(pg.comm()); });
#endif
  m.attr("torch_api") = TORCH_VERSION_MAJOR >= 2 ? "Backend" : "ProcessGroup";
}
