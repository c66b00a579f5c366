#include "bindings/torch/process_group_c4.hpp"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>

#include "c4comm/trace.hpp"

namespace c4torch {

namespace {
std::mutex gDiagMu;
std::vector<std::string> gDiagnoses;  // guarded by gDiagMu
}  // namespace

std::vector<std::string> diagnoses() {
  std::lock_guard<std::mutex> g(gDiagMu);
  return gDiagnoses;
}

namespace {

using ::c10d::OpType;
using ::c10d::ReduceOp;

// ---- validation (calling thread; raises c10::Error, which Python sees as RuntimeError) ---------

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "c4 ", op, ": undefined tensor");
#if C4_TORCH_CUDA
  TORCH_CHECK(t.device().is_cpu() || t.is_cuda(), "c4 ", op, ": only CPU and CUDA tensors are supported (tensor on ",
              t.device(), ")");
#else
  TORCH_CHECK(!t.is_cuda(), "c4 ", op, ": CUDA tensors need torch 2.2 or newer with backend c4 (tensor on ", t.device(),
              "); use CPU tensors, or backend nccl/gloo for CUDA tensors");
  TORCH_CHECK(t.device().is_cpu(), "c4 ", op, ": only CPU tensors are supported (tensor on ", t.device(), ")");
#endif
  TORCH_CHECK(t.layout() == at::kStrided, "c4 ", op, ": only dense (strided) tensors are supported, got layout ",
              t.layout());
}

void checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "c4 ", op, ": expects exactly one tensor per call, got ", ts.size());
  checkTensor(ts[0], op);
}

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "c4 ", op, ": tensors must have one dtype, got ", a.scalar_type(),
              " and ", b.scalar_type());
}

c4::DataType toC4(at::ScalarType st, const char* op) {
  switch (st) {
    case at::kFloat:
      return c4::DataType::kFloat32;
    case at::kDouble:
      return c4::DataType::kFloat64;
    case at::kHalf:
      return c4::DataType::kFloat16;
    case at::kBFloat16:
      return c4::DataType::kBfloat16;
    case at::kChar:
      return c4::DataType::kInt8;
    case at::kByte:
    case at::kBool:  // one byte 0/1; reductions are mapped to MAX/MIN (see reduceOf)
      return c4::DataType::kUint8;
    case at::kInt:
      return c4::DataType::kInt32;
    case at::kLong:
      return c4::DataType::kInt64;
    default:
      break;
  }
  TORCH_CHECK(false, "c4 ", op, ": dtype ", st,
              " is not supported (supported: float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool)");
}

/// A reduction as c4 will run it: a builtin op, or PREMUL_SUM with its factor.
struct Reduction {
  c4::RedOp op = c4::RedOp::kSum;
  bool preMul = false;
  double factor = 1.0;
  at::Tensor factorTensor;  // PREMUL_SUM with a tensor factor (read on the worker)
};

Reduction reduceOf(const ReduceOp& rop, at::ScalarType st, const char* op) {
  Reduction r;
  const bool isBool = st == at::kBool;
  switch (rop.op_) {
    case ReduceOp::SUM:
      // bool: a sum of 0/1 bytes overflows at 256 ranks; torch's bool sum is a logical or.
      r.op = isBool ? c4::RedOp::kMax : c4::RedOp::kSum;
      return r;
    case ReduceOp::PRODUCT:
      r.op = isBool ? c4::RedOp::kMin : c4::RedOp::kProd;
      return r;
    case ReduceOp::MIN:
      r.op = c4::RedOp::kMin;
      return r;
    case ReduceOp::MAX:
      r.op = c4::RedOp::kMax;
      return r;
    case ReduceOp::AVG:
      TORCH_CHECK(!isBool, "c4 ", op, ": ReduceOp.AVG is not defined for bool tensors");
      r.op = c4::RedOp::kAvg;
      return r;
    case ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(at::isFloatingType(st), "c4 ", op, ": PREMUL_SUM needs a floating-point tensor, got ", st);
      auto* sup = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "c4 ", op, ": PREMUL_SUM without its factor");
      r.preMul = true;
      // torch 1.x keeps a tensor factor in a vector, 2.x in one tensor.
#if TORCH_VERSION_MAJOR >= 2
      const at::Tensor* factor = sup->tensor_factor.defined() ? &sup->tensor_factor : nullptr;
#else
      TORCH_CHECK(sup->tensor_factors.size() <= 1, "c4 ", op, ": PREMUL_SUM expects one factor, got ",
                  sup->tensor_factors.size());
      const at::Tensor* factor = sup->tensor_factors.empty() ? nullptr : &sup->tensor_factors[0];
#endif
      if (factor) {
        const at::Tensor& f = *factor;
        TORCH_CHECK(f.numel() == 1, "c4 ", op, ": the PREMUL_SUM factor must have one element, got ", f.numel());
        checkTensor(f, op);
        r.factorTensor = f;
      } else {
        r.factor = sup->double_factor;
      }
      return r;
    }
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TORCH_CHECK(false, "c4 ", op, ": bitwise reductions (BAND, BOR, BXOR) are not supported by backend c4");
    default:
      break;
  }
  TORCH_CHECK(false, "c4 ", op, ": unsupported reduce op ", static_cast<int>(rop.op_));
}

/// The stream the worker's c4 calls are ordered on (a cudaStream_t; null for CPU operations): the
/// group's stream of the running CUDA operation (ProcessGroupC4::enqueue sets it around the call).
thread_local void* tStream = nullptr;
void* S() { return tStream; }

/// Runs `fn` with the c4 op for `r` (creating and destroying a PreMulSum op when needed).
c4::Status withRedOp(c4::Comm* comm, const Reduction& r, at::ScalarType st,
                     const std::function<c4::Status(c4::RedOp)>& fn) {
  if (!r.preMul) return fn(r.op);
  // A factor in a CUDA tensor is read to the host (on the worker, in the group stream's order).
  at::Tensor scalar = r.factorTensor.defined() ? r.factorTensor.reshape({1}).to(at::kCPU, st).contiguous()
                                               : at::full({1}, r.factor, at::TensorOptions().dtype(st));
  c4::RedOp op;
  c4::Status st4 = c4::redOpCreatePreMulSum(&op, scalar.data_ptr(), toC4(st, "premul_sum"),
                                            c4::ScalarResidence::kHostImmediate, comm);
  if (!st4.isOk()) return st4;
  c4::Status res = fn(op);
  c4::Status d = c4::redOpDestroy(op, comm);
  return res.isOk() ? d : res;
}

/// Runs the c4 calls made by `body` as one c4 group (executed together at groupEnd).
c4::Status inGroup(const std::function<c4::Status()>& body) {
  c4::Status st = c4::groupStart();
  if (!st.isOk()) return st;
  c4::Status b = body();
  c4::Status e = c4::groupEnd();  // always closes the group; runs nothing if a call was rejected
  return b.isOk() ? e : b;
}

/// Copies `buf` back into `user` when the op worked on a contiguous copy.
void copyBack(const at::Tensor& user, const at::Tensor& buf) {
  if (!buf.is_same(user)) user.copy_(buf.view(user.sizes()));
}

size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

/// The tensors of `list` flattened into one new contiguous buffer, in order.
at::Tensor flatten(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

/// Copies consecutive slices of the flat `buf` into `list`.
void unflatten(const at::Tensor& buf, const std::vector<at::Tensor>& list) {
  int64_t off = 0;
  for (const at::Tensor& t : list) {
    t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

void* ptr(const at::Tensor& t) { return t.data_ptr(); }

}  // namespace

// ---- WorkC4 ----------------------------------------------------------------------------------

WorkC4::WorkC4(int rank, OpType type, const char* opName, const char* profilingTitle, uint64_t seq,
               std::vector<at::Tensor> outputs, std::vector<c10::Device> devices)
    : ::c10d::Work(rank, type, profilingTitle),
      opName_(opName),
      seq_(seq),
      outputs_(std::move(outputs)),
      // With devices the Future is CUDA-aware: completed on the worker, whose current stream is then
      // the group's, it records events there that wait()/value()/then() make their streams wait for.
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), std::move(devices))),
      futureResult_(c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get())) {}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10::ivalue::Future> WorkC4::getFutureResult() { return futureResult_; }

float WorkC4::getDuration() const {
  TORCH_CHECK(const_cast<WorkC4*>(this)->isCompleted(), "c4 ", opName_, " (op ", seq_,
              "): the duration is known once the operation completed");
  const int64_t begin = startNs_.load(), end = endNs_.load();
  return begin && end >= begin ? static_cast<float>(end - begin) / 1e6f : 0.f;
}
#endif

bool WorkC4::wait(std::chrono::milliseconds timeout) {
  {
    // Work's mutex_ is a std::mutex, or a std::timed_mutex in some 2.x releases.
    std::unique_lock<std::decay_t<decltype(mutex_)>> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      TORCH_CHECK(false, "c4 ", opName_, " (op ", seq_, " of this process group): wait() timed out after ",
                  timeout.count(),
                  " ms; the operation is still running and fails by itself once it has seen no progress for "
                  "the process group's timeout (C4_TIMEOUT if set), naming the rank it waits for");
    }
    if (exception_) std::rethrow_exception(exception_);
  }
  synchronize();
  return true;
}

void WorkC4::synchronize() {
#if C4_TORCH_CUDA
  if (cuda_ && cuda_->recorded.load(std::memory_order_acquire)) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    cuda_->done.block(impl.getStream(cuda_->device));
  }
#endif
}

bool WorkC4::isCompleted() {
  if (!::c10d::Work::isCompleted()) return false;
#if C4_TORCH_CUDA
  if (cuda_ && cuda_->recorded.load(std::memory_order_acquire)) return cuda_->done.query();
#endif
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkC4::getFuture() { return future_; }

int WorkC4::sourceRank() const {
  const int r = sourceRank_.load();
  TORCH_CHECK(r >= 0, "c4 ", opName_, " (op ", seq_,
              "): the source rank is known only for a completed receive from any source");
  return r;
}

void WorkC4::complete(const std::string& error) {
  std::exception_ptr ex;
  if (!error.empty()) ex = std::make_exception_ptr(std::runtime_error(error));
#if TORCH_VERSION_MAJOR >= 2
  // The result code: a timeout when c4comm (or a wait for a peer's channel) gave up waiting.
  ::c10d::WorkResult code = ::c10d::WorkResult::SUCCESS;
  if (!error.empty())
    code = error.find("no progress") != std::string::npos || error.find("timed out") != std::string::npos ||
                   error.find("within ") != std::string::npos
               ? ::c10d::WorkResult::TIMEOUT
               : ::c10d::WorkResult::COMM_ERROR;
  try {
    futureResult_->markCompleted(c10::IValue(static_cast<int64_t>(code)));
  } catch (const std::exception&) {  // completed once only; nothing else can throw here
  }
#endif
  // The Future first (like ProcessGroupGloo): its callbacks (DDP's comm hook) may queue more work.
  try {
    if (ex)
      future_->setError(ex);
    else
      future_->markCompleted(c10::IValue(outputs_));
  } catch (const std::exception& e) {
    if (!ex) ex = std::make_exception_ptr(std::runtime_error(std::string("c4 ") + opName_ + ": " + e.what()));
  }
  finish(ex);
}

// ---- Channel ---------------------------------------------------------------------------------

namespace {
std::atomic<bool> gPythonExiting{false};
}  // namespace

void pythonExiting() { gPythonExiting.store(true, std::memory_order_release); }

struct Channel::Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool reached = false;   // the worker got to the pause (or failed it: error)
  bool released = false;  // resume() (or close/abort) let it go on
  std::string error;
};

Channel::Channel(std::string name, Init init, bool ownsComm)
    : name_(std::move(name)), init_(std::move(init)), ownsComm_(ownsComm) {
  thread_ = std::thread([this] { loop(); });
}

namespace {
void release(const std::shared_ptr<Channel::Gate>& g) {
  if (!g) return;
  std::lock_guard<std::mutex> l(g->mu);
  g->released = true;
  g->cv.notify_all();
}
}  // namespace

Channel::~Channel() {
  close("the process group was destroyed");
  if (comm_ && ownsComm_) {
    // A failed or aborted communicator is aborted (tells its peers, never hangs); a healthy one is
    // destroyed.
    const bool healthy = !aborted_ && c4::commGetAsyncError(comm_).isOk();
    c4::Status st = healthy ? c4::commDestroy(comm_) : c4::commAbort(comm_);
    (void)st;  // nothing to report to at teardown; c4comm has logged it
  }
  comm_ = nullptr;
}

void Channel::close(const std::string& why) {
  std::shared_ptr<Gate> gate;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_.empty()) closed_ = why;
    stop_ = true;
    gate = std::move(gate_);
  }
  cancelled_.store(true);
  release(gate);
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Channel::abort(const std::string& why) {
  std::shared_ptr<Gate> gate;
  c4::Comm* comm = nullptr;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_.empty()) closed_ = why;
    aborted_ = true;
    stop_ = true;
    gate = std::move(gate_);
    comm = comm_;
  }
  cancelled_.store(true);
  release(gate);
  cv_.notify_all();
  // Another thread may revoke while an operation runs: that operation fails at once.
  if (comm) (void)c4::commRevoke(comm);
}

void Channel::enqueue(c10::intrusive_ptr<WorkC4> work, Op op, std::string describe) {
  enqueue(
      std::move(op), [work = std::move(work)](const std::string& error) { work->complete(error); },
      std::move(describe));
}

void Channel::enqueue(Op op, Done done, std::string describe) {
  std::string closed;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_.empty()) {
      queue_.push_back(Item{std::move(op), std::move(done), std::move(describe)});
    } else {
      closed = closed_;
    }
  }
  if (!closed.empty()) {
    done(describe + " failed: " + closed);
    return;
  }
  cv_.notify_one();
}

c4::Comm* Channel::pause(std::string* error) {
  auto gate = std::make_shared<Gate>();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (gate_) {
      *error = "the communicator is already lent (nccl_comm() does not nest)";
      return nullptr;
    }
    gate_ = gate;
  }
  enqueue(
      [gate](c4::Comm*) {
        std::unique_lock<std::mutex> l(gate->mu);
        gate->reached = true;
        gate->cv.notify_all();
        gate->cv.wait(l, [&] { return gate->released; });
        return c4::Status::ok();
      },
      [gate](const std::string& err) {
        std::lock_guard<std::mutex> l(gate->mu);
        if (!gate->reached) gate->error = err.empty() ? "the channel closed" : err;
        gate->reached = true;
        gate->cv.notify_all();
      },
      "c4 nccl_comm");
  std::unique_lock<std::mutex> l(gate->mu);
  gate->cv.wait(l, [&] { return gate->reached; });
  if (!gate->error.empty()) {
    *error = gate->error;
    l.unlock();
    resume();
    return nullptr;
  }
  std::lock_guard<std::mutex> g(mu_);
  return comm_;
}

void Channel::resume() {
  std::shared_ptr<Gate> gate;
  {
    std::lock_guard<std::mutex> g(mu_);
    gate = std::move(gate_);
  }
  release(gate);
}

void Channel::loop() {
  // Named for top/perf/gdb: "c4:" and the channel's name, cut to the kernel's 15 characters.
  (void)pthread_setname_np(pthread_self(), ("c4:" + name_).substr(0, 15).c_str());
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!initDone_) {
      c4::Comm* comm = nullptr;
      c4::Status st = init_(&comm, cancelled_);
      bool revoke = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        comm_ = comm;
        revoke = aborted_ && comm;  // abort() came while init ran: it could not revoke then
      }
      if (revoke) (void)c4::commRevoke(comm);
      initStatus_ = st;
      initDone_ = true;
    }
    std::string error;
    std::string abortedWhy;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (aborted_) abortedWhy = closed_;
    }
    if (!abortedWhy.empty()) {
      error = item.describe + " failed: " + abortedWhy;
    } else {
      try {
        c4::Status st = initStatus_.isOk() ? item.op(comm_) : initStatus_;
        if (!st.isOk()) error = item.describe + " failed: " + st.message();
      } catch (const std::exception& e) {
        error = item.describe + " failed: " + e.what();
      }
      std::lock_guard<std::mutex> g(mu_);
      if (!error.empty() && aborted_) error += " (" + closed_ + ")";  // abort() revoked it meanwhile
    }
    item.done(error);
    // At interpreter exit the item's tensors stay alive (pythonExiting() says why).
    if (gPythonExiting.load(std::memory_order_acquire)) new Item(std::move(item));  // NOLINT: leaked on purpose
  }
}

// ---- ProcessGroupC4 --------------------------------------------------------------------------

namespace {

constexpr const char* kKeyPrefix = "c4comm_torch/";

std::vector<uint8_t> idBytes(const c4::UniqueId& id) {
  return std::vector<uint8_t>(id.bytes, id.bytes + sizeof id.bytes);
}

c4::Status idFrom(const std::vector<uint8_t>& v, c4::UniqueId* id) {
  if (v.size() != sizeof id->bytes)
    return c4::Status(c4::Code::kInternalError,
                      "the store holds " + std::to_string(v.size()) + " bytes for a c4 unique id, expected 128");
  std::memcpy(id->bytes, v.data(), v.size());
  return c4::Status::ok();
}

/// The config of a communicator made for a process group: its name and timeout.
c4::Config groupConfig(const std::string& name, std::chrono::milliseconds timeout) {
  c4::Config cfg;
  cfg.name = name;
  cfg.timeoutMs = std::max<int64_t>(1, timeout.count());  // C4_TIMEOUT, if set, wins
  // Each group's calls run on a worker thread beside the training threads, so a rank spinning
  // while it waits takes CPU from compute. c4comm's default spin (250 us, sized for ranks that have
  // their cores to themselves) cost DDP 7% of its step on 2 ranks x 2 cores (bench/torch); 30 us
  // gave the best step time. C4_SHM_SPIN, if set, wins.
  cfg.spinUs = 30;
  return cfg;
}

/// Waits until `key` is in the store (polled every 1 ms, backing off to 20 ms): at most `timeout`,
/// and not past `cancelled`.
c4::Status waitForKey(::c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                      const std::atomic<bool>& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  while (!store.check({key})) {
    if (cancelled.load())
      return c4::Status(c4::Code::kInvalidUsage, "the process group was closed before the peer set up the channel");
    if (std::chrono::steady_clock::now() > deadline)
      return c4::Status(c4::Code::kTimeout, "the peer did not set up the channel within " +
                                                std::to_string(timeout.count()) + " ms (the process group's timeout)");
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
  return c4::Status::ok();
}

/// Creates rank `rank` of an `n`-rank communicator whose unique id `creator` publishes under `key`.
/// The others wait for the key until `cancelled` (when given) or the timeout.
c4::Status initThroughStore(::c10d::Store& store, const std::string& key, bool creator, int rank, int n,
                            const std::string& name, std::chrono::milliseconds timeout, c4::Comm** comm,
                            const std::atomic<bool>* cancelled = nullptr) {
  c4::UniqueId id;
  try {
    if (creator) {
      c4::Status st = c4::getUniqueId(&id);
      if (!st.isOk()) return st;
      store.set(key, idBytes(id));
    } else {
      if (cancelled) {
        c4::Status st = waitForKey(store, key, timeout, *cancelled);
        if (!st.isOk()) return st;
      }
      c4::Status st = idFrom(store.get(key), &id);
      if (!st.isOk()) return st;
    }
  } catch (const std::exception& e) {
    return c4::Status(c4::Code::kSystemError,
                      "exchanging the c4 unique id through the store failed: " + std::string(e.what()));
  }
  return c4::commInitRank(comm, n, id, rank, groupConfig(name, timeout));
}

int commRank(c4::Comm* comm) {
  int r = -1;
  c4::Status st = c4::commUserRank(comm, &r);
  TORCH_CHECK(st.isOk(), "c4: not a usable communicator: ", st.message());
  return r;
}

int commSize(c4::Comm* comm) {
  int n = 0;
  c4::Status st = c4::commCount(comm, &n);
  TORCH_CHECK(st.isOk(), "c4: not a usable communicator: ", st.message());
  return n;
}

}  // namespace

/// One receive from any source (recvAnysource): shared by its probe tasks on the receive channels
/// and by the watcher; settled once, by whoever claims it first.
struct AnySourceRecv {
  c10::intrusive_ptr<WorkC4> work;
  at::Tensor user, buf;
  c4::DataType dt = c4::DataType::kFloat32;
  std::string describe;
  std::chrono::steady_clock::time_point deadline;
  std::set<int> watched;  // peers whose receive channel has its probe task (anyMu_)

  /// True for the one caller that settles it (receives, fails or cancels); false once settled.
  bool claim() { return !settled_.exchange(true); }
  bool settled() const { return settled_.load(); }

 private:
  std::atomic<bool> settled_{false};
};

ProcessGroupC4::ProcessGroupC4(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                               std::chrono::milliseconds timeout)
    : BackendBase(rank, size), store_(store), timeout_(timeout) {
  TORCH_CHECK(store_, "c4: no store");
  store_->setTimeout(timeout_);
  // Every rank counts the c4 groups made on this store under its own key: all ranks create their
  // groups in the same order, so they agree on the generation without talking to each other.
  generation_ = store_->add(std::string(kKeyPrefix) + "generation/" + std::to_string(rank), 1);
  const std::string key = std::string(kKeyPrefix) + "uid/" + std::to_string(generation_);
  c4::Status st =
      initThroughStore(*store_, key, rank == 0, rank, size, "torch-pg" + std::to_string(generation_), timeout_, &comm_);
  TORCH_CHECK(st.isOk(), "c4: creating the communicator of rank ", rank, "/", size, " failed: ", st.message());
  start(/*ownsComm=*/true);
}

ProcessGroupC4::ProcessGroupC4(const c10::intrusive_ptr<::c10d::Store>& store, c4::Comm* comm, bool ownsComm,
                               std::chrono::milliseconds timeout)
    : BackendBase(commRank(comm), commSize(comm)), store_(store), timeout_(timeout), comm_(comm) {
  TORCH_CHECK(store_, "c4: no store");
  store_->setTimeout(timeout_);
  generation_ = store_->add(std::string(kKeyPrefix) + "generation/" + std::to_string(rank_), 1);
  start(ownsComm);
}

void ProcessGroupC4::start(bool ownsComm) {
  (void)c4::setDiagnosisCallback(comm_, [](const c4::Diagnosis& d) {
    std::lock_guard<std::mutex> g(gDiagMu);
    if (gDiagnoses.size() < 1000) gDiagnoses.push_back(d.json);
  });
  main_ = std::make_unique<Channel>(
      "torch-pg" + std::to_string(generation_),
      [comm = comm_](c4::Comm** out, const std::atomic<bool>&) {
        *out = comm;
        return c4::Status::ok();
      },
      ownsComm);
  init();
}

namespace {

/// Releases the GIL for its lifetime if this thread holds it. The workers may need the GIL (the last
/// reference to a tensor that has a Python object frees it), so waiting for them with the GIL held,
/// as a destructor run by Python's garbage collection would, deadlocks.
class GilRelease {
 public:
  GilRelease() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilRelease() {
    if (state_) PyEval_RestoreThread(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

}  // namespace

ProcessGroupC4::~ProcessGroupC4() {
  GilRelease nogil;
  closeAll("the process group was destroyed", /*abort=*/false);
  {
    std::lock_guard<std::mutex> g(p2pMu_);
    p2p_.clear();
  }
  main_.reset();
#if C4_TORCH_CUDA
  // The workers are gone; what they issued on the group's streams must pass before its tensors go.
  std::lock_guard<std::mutex> g(seqMu_);
  for (const auto& o : cudaPending_)
    if (o->recorded.load(std::memory_order_acquire)) o->done.synchronize();
  cudaPending_.clear();
#endif
}

void ProcessGroupC4::closeAll(const std::string& why, bool abort) {
  {
    // Pending receives from any source fail now: their probe tasks end, so the channels drain.
    std::vector<std::shared_ptr<AnySourceRecv>> pending;
    {
      std::lock_guard<std::mutex> ga(anyMu_);
      anyStop_ = true;
      pending.swap(anyPending_);
    }
    for (const auto& a : pending)
      if (a->claim()) a->work->complete(a->describe + " failed: " + why + " before a message came");
  }
  anyCv_.notify_all();
  if (anyWatcher_.joinable()) anyWatcher_.join();
  std::vector<Channel*> channels;
  {
    std::lock_guard<std::mutex> g(p2pMu_);
    if (closed_.empty()) closed_ = why;
    for (auto& kv : p2p_) channels.push_back(kv.second.get());
  }
  channels.push_back(main_.get());
  // Abort first revokes every communicator, so that none waits on a peer of another; close lets
  // each finish what was issued.
  for (Channel* ch : channels) abort ? ch->abort(why) : ch->close(why);
}

std::string ProcessGroupC4::p2pKey(int src, int dst) const {
  return std::string(kKeyPrefix) + "p2p/" + std::to_string(generation_) + "/" + std::to_string(src) + "-" +
         std::to_string(dst);
}

Channel& ProcessGroupC4::p2pChannel(int peer, bool send) {
  std::lock_guard<std::mutex> g(p2pMu_);
  TORCH_CHECK(closed_.empty(), "c4 ", send ? "send to" : "recv from", " rank ", peer, ": ", closed_);
  auto& ch = p2p_[{peer, send}];
  if (!ch) {
    const int src = send ? rank_ : peer;
    const int dst = send ? peer : rank_;
    const std::string name =
        "torch-pg" + std::to_string(generation_) + "-p2p-" + std::to_string(src) + "to" + std::to_string(dst);
    const std::string key = p2pKey(src, dst);
    c10::intrusive_ptr<::c10d::Store> store = store_;
    // Rank 0 of the pair communicator is the sender. Created on the channel's own thread, so the
    // caller never blocks waiting for the peer to show up.
    const std::chrono::milliseconds timeout = timeout_;
    ch = std::make_unique<Channel>(
        name, [store, key, send, name, timeout](c4::Comm** out, const std::atomic<bool>& cancelled) {
          return initThroughStore(*store, key, send, send ? 0 : 1, 2, name, timeout, out, &cancelled);
        });
    if (!send) {
      // Receives from any source issued before this channel existed come before anything queued
      // on it from now on.
      std::lock_guard<std::mutex> ga(anyMu_);
      for (const auto& a : anyPending_) watchPeer(a, peer, *ch);
    }
  }
  return *ch;
}

void ProcessGroupC4::watchPeer(const std::shared_ptr<AnySourceRecv>& a, int peer, Channel& ch) {
  if (a->settled() || !a->watched.insert(peer).second) return;
  // Rank 0 of the pair communicator is the sender. The task polls until a message is there (then
  // claims the receive and takes it), the receive was settled elsewhere, or the deadline passed.
  Channel::Op probe = [a, peer](c4::Comm* c) -> c4::Status {
    while (!a->settled()) {
      // Waits as c4comm waits for a message (spin, then short sleeps), at most 1 ms at a time, so
      // that the task ends soon after another channel took the message.
      c4::ProbeResult pr;
      c4::Status st = c4::probe(0, c, &pr, /*waitMs=*/1);
      if (!st.isOk()) return st;  // Done settles it with this error
      if (pr.ready) {
        if (!a->claim()) return c4::Status::ok();
        std::string error;
        try {
          const uint64_t begin = c4::trace::now();
          st = c4::recv(ptr(a->buf), count(a->buf), a->dt, 0, c, S());
          if (st.isOk()) copyBack(a->user, a->buf);
          (void)c4::trace::addSpan(c, a->work->opName(), begin, c4::trace::now(), a->buf.nbytes());
          if (!st.isOk())
            error = a->describe + " failed receiving from rank " + std::to_string(peer) + ": " + st.message();
        } catch (const std::exception& e) {
          error = a->describe + " failed: " + e.what();
        }
        if (error.empty()) a->work->setSourceRank(peer);
        a->work->complete(error);
        return st;
      }
      if (std::chrono::steady_clock::now() > a->deadline) return c4::Status::ok();  // the watcher fails it
    }
    return c4::Status::ok();
  };
  ch.enqueue(
      std::move(probe),
      [a, peer](const std::string& error) {
        if (!error.empty() && a->claim()) a->work->complete(error + " (probing rank " + std::to_string(peer) + ")");
      },
      a->describe);
}

void ProcessGroupC4::anySourceLoop() {
  (void)pthread_setname_np(pthread_self(), "c4:anysource");
  auto nap = std::chrono::milliseconds(1);
  std::unique_lock<std::mutex> lock(anyMu_);
  for (;;) {
    anyPending_.erase(std::remove_if(anyPending_.begin(), anyPending_.end(),
                                     [](const std::shared_ptr<AnySourceRecv>& a) { return a->settled(); }),
                      anyPending_.end());
    if (anyStop_) return;
    if (anyPending_.empty()) {
      nap = std::chrono::milliseconds(1);
      anyCv_.wait(lock, [&] { return anyStop_ || !anyPending_.empty(); });
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<AnySourceRecv>> expired;
    std::set<int> unseen;  // peers some pending receive has no channel for yet
    for (const auto& a : anyPending_) {
      if (now > a->deadline && a->claim()) {
        expired.push_back(a);
        continue;
      }
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && !a->watched.count(p)) unseen.insert(p);
    }
    std::vector<std::shared_ptr<AnySourceRecv>> pending = anyPending_;
    lock.unlock();
    // Completed without the lock: a Future's callbacks may issue more operations.
    for (const auto& a : expired)
      a->work->complete(a->describe + ": no message from any rank within " + std::to_string(timeout_.count()) +
                        " ms (the process group's timeout)");
    std::string storeError;
    for (int p : unseen) {
      try {
        // A sender publishes its channel's unique id with its first send to this rank.
        if (store_->check({p2pKey(p, rank_)})) p2pChannel(p, /*send=*/false);  // watches it
      } catch (const std::exception& e) {
        storeError = e.what();
      }
    }
    if (!storeError.empty()) {
      for (const auto& a : pending)
        if (a->claim()) a->work->complete(a->describe + ": looking for senders in the store failed: " + storeError);
    }
    lock.lock();
    // Polled every 1 ms at first, then less often (at most every 20 ms) while nobody new sends.
    anyCv_.wait_for(lock, nap, [&] { return anyStop_; });
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::enqueue(Channel& ch, OpType type, const char* opName,
                                                         const char* profilingTitle, std::vector<at::Tensor> outputs,
                                                         Channel::Op op, const at::Tensor& like) {
  const c10::Device dev = like.defined()    ? like.device()
                          : outputs.empty() ? c10::Device(c10::kCPU)
                                            : outputs[0].device();
  for (const at::Tensor& t : outputs)
    TORCH_CHECK(t.device() == dev, "c4 ", opName, ": every tensor of a call must be on one device, got ", t.device(),
                " and ", dev);
  std::lock_guard<std::mutex> g(seqMu_);
  const uint64_t seq = seq_++;
  uint64_t bytes = 0;  // for the trace span below
  for (const at::Tensor& t : outputs) bytes += t.nbytes();
  std::vector<c10::Device> devices;
  if (dev.is_cuda()) devices.push_back(dev);
  auto work = c10::make_intrusive<WorkC4>(rank_, type, opName, profilingTitle, seq, std::move(outputs), devices);
  auto shared = std::make_shared<Channel::Op>(std::move(op));
  std::shared_ptr<void> cudaOrder;  // CudaOrder where built with CUDA tensor support
#if C4_TORCH_CUDA
  if (dev.is_cuda()) {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    auto it = cudaStreams_.find(dev.index());
    if (it == cudaStreams_.end()) it = cudaStreams_.emplace(dev.index(), impl.getStreamFromGlobalPool(dev)).first;
    auto order = std::make_shared<CudaOrder>(dev, it->second);
    order->ready.record(impl.getStream(dev));  // everything the caller queued before this call
    order->keep = shared;
    while (!cudaPending_.empty() && cudaPending_.front()->recorded.load(std::memory_order_acquire) &&
           cudaPending_.front()->done.query())
      cudaPending_.pop_front();
    cudaPending_.push_back(order);
    work->setCuda(order);
    cudaOrder = order;
  }
#endif
  work->setTimeout(timeout_);
  std::string describe = std::string("c4 ") + opName + " (op " + std::to_string(seq) + " of process group " +
                         std::to_string(generation_) + ", rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
                         ")";
  // c4comm's tracer gets PyTorch's name of the operation: a span named `opName` over the c4 calls
  // it made, so the report (application spans) and the timeline (span track above the
  // collectives) say which PyTorch call each c4 operation served. bytes: the outputs' size.
  // `w` lives while the item is queued: the item's completion holds the Work.
  Channel::Op traced = [shared, cudaOrder, opName, bytes, w = work.get()](c4::Comm* comm) {
    w->markStart();
    const uint64_t begin = c4::trace::now();
#if C4_TORCH_CUDA
    // A CUDA operation: on the group's stream, after the caller's work; "done" after it however it ends.
    struct StreamScope {
      CudaOrder* o;
      explicit StreamScope(CudaOrder* order) : o(order) {
        if (!o) return;
        c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
        impl.setDevice(o->device);
        // The worker's current stream from now on: the ops' own copies (at::Tensor::copy_) and the
        // Future's events go there.
        impl.exchangeStream(o->internal);
        o->ready.block(o->internal);
        tStream = o->internal.native_handle();
      }
      ~StreamScope() {
        if (!o) return;
        tStream = nullptr;
        o->done.record(o->internal);
        o->recorded.store(true, std::memory_order_release);
      }
    } scope(static_cast<CudaOrder*>(cudaOrder.get()));
#endif
    c4::Status st = (*shared)(comm);
    (void)c4::trace::addSpan(comm, opName, begin, c4::trace::now(), bytes);  // the worker's comm is live
    w->markEnd();
    return st;
  };
  ch.enqueue(work, std::move(traced), std::move(describe));
  return work;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::broadcast(std::vector<at::Tensor>& tensors,
                                                           const ::c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "c4 broadcast: root ", opts.rootRank, " out of range");
  TORCH_CHECK(opts.rootTensor == 0, "c4 broadcast: rootTensor must be 0");
  at::Tensor t = tensors[0];
  at::Tensor buf = t.contiguous();
  const c4::DataType dt = toC4(t.scalar_type(), "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = root == rank_;
  return enqueue(*main_, OpType::BROADCAST, "broadcast", "c4:broadcast", {t}, [=](c4::Comm* c) {
    c4::Status st = c4::broadcast(ptr(buf), ptr(buf), count(buf), dt, root, c, S());
    if (st.isOk() && !isRoot) copyBack(t, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::allreduce(std::vector<at::Tensor>& tensors,
                                                           const ::c10d::AllreduceOptions& opts) {
  checkSingle(tensors, "allreduce");
  at::Tensor t = tensors[0];
  const c4::DataType dt = toC4(t.scalar_type(), "allreduce");
  const Reduction red = reduceOf(opts.reduceOp, t.scalar_type(), "allreduce");
  at::Tensor buf = t.contiguous();
  return enqueue(*main_, OpType::ALLREDUCE, "allreduce", "c4:all_reduce", {t}, [=](c4::Comm* c) {
    c4::Status st = withRedOp(c, red, buf.scalar_type(), [&](c4::RedOp op) {
      return c4::allReduce(ptr(buf), ptr(buf), count(buf), dt, op, c, S());
    });
    if (st.isOk()) copyBack(t, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "c4 allreduce_coalesced: no tensors");
  std::vector<at::Tensor> bufs;
  std::vector<c4::DataType> dts;
  std::vector<Reduction> reds;
  for (const at::Tensor& t : tensors) {
    checkTensor(t, "allreduce_coalesced");
    dts.push_back(toC4(t.scalar_type(), "allreduce_coalesced"));
    reds.push_back(reduceOf(opts.reduceOp, t.scalar_type(), "allreduce_coalesced"));
    TORCH_CHECK(!reds.back().preMul, "c4 allreduce_coalesced: PREMUL_SUM is supported by allreduce only");
    bufs.push_back(t.contiguous());
  }
  std::vector<at::Tensor> users = tensors;
  return enqueue(
      *main_, OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", "c4:all_reduce_coalesced", users, [=](c4::Comm* c) {
        c4::Status st = inGroup([&] {
          for (size_t i = 0; i < bufs.size(); ++i) {
            c4::Status s = c4::allReduce(ptr(bufs[i]), ptr(bufs[i]), count(bufs[i]), dts[i], reds[i].op, c, S());
            if (!s.isOk()) return s;
          }
          return c4::Status::ok();
        });
        if (st.isOk())
          for (size_t i = 0; i < bufs.size(); ++i) copyBack(users[i], bufs[i]);
        return st;
      });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::reduce(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::ReduceOptions& opts) {
  checkSingle(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "c4 reduce: root ", opts.rootRank, " out of range");
  TORCH_CHECK(opts.rootTensor == 0, "c4 reduce: rootTensor must be 0");
  at::Tensor t = tensors[0];
  const c4::DataType dt = toC4(t.scalar_type(), "reduce");
  const Reduction red = reduceOf(opts.reduceOp, t.scalar_type(), "reduce");
  at::Tensor buf = t.contiguous();
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = root == rank_;
  return enqueue(*main_, OpType::REDUCE, "reduce", "c4:reduce", {t}, [=](c4::Comm* c) {
    c4::Status st = withRedOp(c, red, buf.scalar_type(), [&](c4::RedOp op) {
      return c4::reduce(ptr(buf), ptr(buf), count(buf), dt, op, root, c, S());
    });
    if (st.isOk() && isRoot) copyBack(t, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ::c10d::AllgatherOptions& opts) {
  checkSingle(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "c4 allgather: expects one output list, got ", outputs.size());
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "c4 allgather: the output list must hold ", size_,
              " tensors (one per rank), got ", outputs[0].size());
  at::Tensor in = inputs[0].contiguous();
  for (const at::Tensor& o : outputs[0]) {
    checkTensor(o, "allgather");
    checkSameType(o, in, "allgather");
    TORCH_CHECK(o.numel() == in.numel(), "c4 allgather: every output must have the input's ", in.numel(),
                " elements, got ", o.numel());
  }
  const c4::DataType dt = toC4(in.scalar_type(), "allgather");
  std::vector<at::Tensor> outs = outputs[0];
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  return enqueue(*main_, OpType::ALLGATHER, "allgather", "c4:all_gather", outs, [=](c4::Comm* c) {
    c4::Status st = c4::allGather(ptr(in), ptr(flat), count(in), dt, c, S());
    if (st.isOk()) unflatten(flat, outs);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const ::c10d::AllgatherOptions& opts) {
  checkTensor(output, "_allgather_base");
  checkTensor(input, "_allgather_base");
  checkSameType(output, input, "_allgather_base");
  TORCH_CHECK(output.numel() == input.numel() * size_, "c4 _allgather_base: the output must hold ", size_, " x ",
              input.numel(), " elements, got ", output.numel());
  at::Tensor in = input.contiguous();
  at::Tensor out = output;
  at::Tensor buf = output.contiguous();
  const c4::DataType dt = toC4(in.scalar_type(), "_allgather_base");
  return enqueue(*main_, OpType::_ALLGATHER_BASE, "_allgather_base", "c4:_all_gather_base", {out}, [=](c4::Comm* c) {
    c4::Status st = c4::allGather(ptr(in), ptr(buf), count(in), dt, c, S());
    if (st.isOk()) copyBack(out, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "c4 allgather_coalesced: no input tensors");
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_, "c4 allgather_coalesced: expects ", size_,
              " output lists (one per rank), got ", outputLists.size());
  std::vector<at::Tensor> ins;
  std::vector<at::Tensor> flats;
  std::vector<c4::DataType> dts;
  std::vector<at::Tensor> outs;  // rank-major: outputLists[r][i]
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_coalesced");
    ins.push_back(inputs[i].contiguous());
    dts.push_back(toC4(inputs[i].scalar_type(), "allgather_coalesced"));
    flats.push_back(at::empty({static_cast<int64_t>(size_) * inputs[i].numel()}, inputs[i].options()));
  }
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(outputLists[r].size() == inputs.size(), "c4 allgather_coalesced: output list ", r, " holds ",
                outputLists[r].size(), " tensors, expected ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& o = outputLists[r][i];
      checkTensor(o, "allgather_coalesced");
      checkSameType(o, inputs[i], "allgather_coalesced");
      TORCH_CHECK(o.numel() == inputs[i].numel(), "c4 allgather_coalesced: output [", r, "][", i, "] has ", o.numel(),
                  " elements, expected ", inputs[i].numel());
      outs.push_back(o);
    }
  }
  const int n = size_;
  return enqueue(*main_, OpType::ALLGATHER_COALESCED, "allgather_coalesced", "c4:all_gather_coalesced", outs,
                 [=](c4::Comm* c) {
                   c4::Status st = inGroup([&] {
                     for (size_t i = 0; i < ins.size(); ++i) {
                       c4::Status s = c4::allGather(ptr(ins[i]), ptr(flats[i]), count(ins[i]), dts[i], c, S());
                       if (!s.isOk()) return s;
                     }
                     return c4::Status::ok();
                   });
                   if (!st.isOk()) return st;
                   const size_t k = ins.size();
                   for (int r = 0; r < n; ++r)
                     for (size_t i = 0; i < k; ++i) {
                       const at::Tensor& o = outs[static_cast<size_t>(r) * k + i];
                       o.copy_(flats[i].narrow(0, r * ins[i].numel(), ins[i].numel()).view(o.sizes()));
                     }
                   return st;
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const ::c10d::GatherOptions& opts) {
  checkSingle(inputs, "gather");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "c4 gather: root ", opts.rootRank, " out of range");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0].contiguous();
  std::vector<at::Tensor> outs;
  at::Tensor flat;
  if (root == rank_) {
    TORCH_CHECK(outputs.size() == 1, "c4 gather: the root expects one output list, got ", outputs.size());
    TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "c4 gather: the output list must hold ", size_,
                " tensors, got ", outputs[0].size());
    for (const at::Tensor& o : outputs[0]) {
      checkTensor(o, "gather");
      checkSameType(o, in, "gather");
      TORCH_CHECK(o.numel() == in.numel(), "c4 gather: every output must have the input's ", in.numel(),
                  " elements, got ", o.numel());
    }
    outs = outputs[0];
    flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "c4 gather: only the root passes output tensors");
  }
  const c4::DataType dt = toC4(in.scalar_type(), "gather");
  return enqueue(
      *main_, OpType::GATHER, "gather", "c4:gather", outs,
      [=](c4::Comm* c) {
        c4::Status st = c4::gather(ptr(in), flat.defined() ? ptr(flat) : nullptr, count(in), dt, root, c, S());
        if (st.isOk() && flat.defined()) unflatten(flat, outs);
        return st;
      },
      in);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const ::c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "c4 scatter: root ", opts.rootRank, " out of range");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  at::Tensor buf = out.contiguous();
  at::Tensor flat;
  if (root == rank_) {
    TORCH_CHECK(inputs.size() == 1, "c4 scatter: the root expects one input list, got ", inputs.size());
    TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "c4 scatter: the input list must hold ", size_,
                " tensors, got ", inputs[0].size());
    for (const at::Tensor& i : inputs[0]) {
      checkTensor(i, "scatter");
      checkSameType(i, out, "scatter");
      TORCH_CHECK(i.numel() == out.numel(), "c4 scatter: every input must have the output's ", out.numel(),
                  " elements, got ", i.numel());
    }
    flat = flatten(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "c4 scatter: only the root passes input tensors");
  }
  const c4::DataType dt = toC4(out.scalar_type(), "scatter");
  return enqueue(*main_, OpType::SCATTER, "scatter", "c4:scatter", {out}, [=](c4::Comm* c) {
    c4::Status st = c4::scatter(flat.defined() ? ptr(flat) : nullptr, ptr(buf), count(buf), dt, root, c, S());
    if (st.isOk()) copyBack(out, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const ::c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "c4 reduce_scatter: expects one input list, got ", inputs.size());
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "c4 reduce_scatter: the input list must hold ", size_,
              " tensors, got ", inputs[0].size());
  at::Tensor out = outputs[0];
  for (const at::Tensor& i : inputs[0]) {
    checkTensor(i, "reduce_scatter");
    checkSameType(i, out, "reduce_scatter");
    TORCH_CHECK(i.numel() == out.numel(), "c4 reduce_scatter: every input must have the output's ", out.numel(),
                " elements, got ", i.numel());
  }
  const c4::DataType dt = toC4(out.scalar_type(), "reduce_scatter");
  const Reduction red = reduceOf(opts.reduceOp, out.scalar_type(), "reduce_scatter");
  at::Tensor flat = flatten(inputs[0]);
  at::Tensor buf = out.contiguous();
  return enqueue(*main_, OpType::REDUCE_SCATTER, "reduce_scatter", "c4:reduce_scatter", {out}, [=](c4::Comm* c) {
    c4::Status st = withRedOp(c, red, buf.scalar_type(), [&](c4::RedOp op) {
      return c4::reduceScatter(ptr(flat), ptr(buf), count(buf), dt, op, c, S());
    });
    if (st.isOk()) copyBack(out, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const ::c10d::ReduceScatterOptions& opts) {
  checkTensor(output, "_reduce_scatter_base");
  checkTensor(input, "_reduce_scatter_base");
  checkSameType(output, input, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == output.numel() * size_, "c4 _reduce_scatter_base: the input must hold ", size_, " x ",
              output.numel(), " elements, got ", input.numel());
  const c4::DataType dt = toC4(output.scalar_type(), "_reduce_scatter_base");
  const Reduction red = reduceOf(opts.reduceOp, output.scalar_type(), "_reduce_scatter_base");
  at::Tensor in = input.contiguous();
  at::Tensor out = output;
  at::Tensor buf = output.contiguous();
  return enqueue(*main_, OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", "c4:_reduce_scatter_base", {out},
                 [=](c4::Comm* c) {
                   c4::Status st = withRedOp(c, red, buf.scalar_type(), [&](c4::RedOp op) {
                     return c4::reduceScatter(ptr(in), ptr(buf), count(buf), dt, op, c, S());
                   });
                   if (st.isOk()) copyBack(out, buf);
                   return st;
                 });
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const ::c10d::AllgatherOptions& opts) {
  const char* fn = "allgather_into_tensor_coalesced";
  TORCH_CHECK(!inputs.empty(), "c4 ", fn, ": no input tensors");
  TORCH_CHECK(outputs.size() == inputs.size(), "c4 ", fn, ": ", inputs.size(), " inputs but ", outputs.size(),
              " outputs");
  std::vector<at::Tensor> ins, bufs, users;
  std::vector<c4::DataType> dts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], fn);
    checkTensor(outputs[i], fn);
    checkSameType(outputs[i], inputs[i], fn);
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_, "c4 ", fn, ": output ", i, " must hold ", size_, " x ",
                inputs[i].numel(), " elements, got ", outputs[i].numel());
    dts.push_back(toC4(inputs[i].scalar_type(), fn));
    ins.push_back(inputs[i].contiguous());
    bufs.push_back(outputs[i].contiguous());
    users.push_back(outputs[i]);
  }
  return enqueue(*main_, OpType::COALESCED, fn, "c4:all_gather_into_tensor_coalesced", users, [=](c4::Comm* c) {
    c4::Status st = inGroup([&] {
      for (size_t i = 0; i < ins.size(); ++i) {
        c4::Status s = c4::allGather(ptr(ins[i]), ptr(bufs[i]), count(ins[i]), dts[i], c, S());
        if (!s.isOk()) return s;
      }
      return c4::Status::ok();
    });
    if (st.isOk())
      for (size_t i = 0; i < bufs.size(); ++i) copyBack(users[i], bufs[i]);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  const char* fn = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(!inputs.empty(), "c4 ", fn, ": no input tensors");
  TORCH_CHECK(outputs.size() == inputs.size(), "c4 ", fn, ": ", inputs.size(), " inputs but ", outputs.size(),
              " outputs");
  std::vector<at::Tensor> ins, bufs, users;
  std::vector<c4::DataType> dts;
  std::vector<Reduction> reds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], fn);
    checkTensor(outputs[i], fn);
    checkSameType(outputs[i], inputs[i], fn);
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_, "c4 ", fn, ": input ", i, " must hold ", size_, " x ",
                outputs[i].numel(), " elements, got ", inputs[i].numel());
    dts.push_back(toC4(outputs[i].scalar_type(), fn));
    reds.push_back(reduceOf(opts.reduceOp, outputs[i].scalar_type(), fn));
    // One PreMulSum operator serves the group: it is made for one type.
    TORCH_CHECK(!reds.back().preMul || outputs[i].scalar_type() == outputs[0].scalar_type(), "c4 ", fn,
                ": PREMUL_SUM needs tensors of one type");
    ins.push_back(inputs[i].contiguous());
    bufs.push_back(outputs[i].contiguous());
    users.push_back(outputs[i]);
  }
  const at::ScalarType type0 = outputs[0].scalar_type();
  return enqueue(*main_, OpType::COALESCED, fn, "c4:reduce_scatter_tensor_coalesced", users, [=](c4::Comm* c) {
    c4::Status st = withRedOp(c, reds[0], type0, [&](c4::RedOp preMulOp) {
      return inGroup([&] {
        for (size_t i = 0; i < ins.size(); ++i) {
          const c4::RedOp op = reds[i].preMul ? preMulOp : reds[i].op;
          c4::Status s = c4::reduceScatter(ptr(ins[i]), ptr(bufs[i]), count(bufs[i]), dts[i], op, c, S());
          if (!s.isOk()) return s;
        }
        return c4::Status::ok();
      });
    });
    if (st.isOk())
      for (size_t i = 0; i < bufs.size(); ++i) copyBack(users[i], bufs[i]);
    return st;
  });
}
#endif

namespace {

/// Element offsets of `splits` rows of `rowElems` elements each (splits empty: `n` equal parts).
std::vector<int64_t> splitCounts(const std::vector<int64_t>& splits, const at::Tensor& t, int n, const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
  std::vector<int64_t> counts(static_cast<size_t>(n));
  if (splits.empty()) {
    TORCH_CHECK(rows % n == 0, "c4 alltoall_base: the ", which, " tensor's first dimension (", rows,
                ") is not divisible by the group size ", n);
    std::fill(counts.begin(), counts.end(), rows / n * rowElems);
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == n, "c4 alltoall_base: ", which, " split sizes must have ", n,
              " entries, got ", splits.size());
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    TORCH_CHECK(splits[i] >= 0, "c4 alltoall_base: negative ", which, " split size");
    sum += splits[i];
    counts[static_cast<size_t>(i)] = splits[i] * rowElems;
  }
  TORCH_CHECK(sum == rows, "c4 alltoall_base: ", which, " split sizes add up to ", sum,
              " but the tensor's first dimension is ", rows);
  return counts;
}

/// Grouped send/recv of one segment per peer on `c`; the own segment is copied locally.
c4::Status exchange(c4::Comm* c, int me, const std::vector<at::Tensor>& sendSegs,
                    const std::vector<at::Tensor>& recvSegs, c4::DataType dt) {
  const int n = static_cast<int>(sendSegs.size());
  c4::Status st = inGroup([&] {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const at::Tensor& s = sendSegs[static_cast<size_t>(p)];
      const at::Tensor& r = recvSegs[static_cast<size_t>(p)];
      // Both sides skip empty segments alike: the split sizes agree across ranks.
      if (s.numel() > 0) {
        c4::Status x = c4::send(ptr(s), count(s), dt, p, c, S());
        if (!x.isOk()) return x;
      }
      if (r.numel() > 0) {
        c4::Status x = c4::recv(ptr(r), count(r), dt, p, c, S());
        if (!x.isOk()) return x;
      }
    }
    return c4::Status::ok();
  });
  if (st.isOk()) recvSegs[static_cast<size_t>(me)].copy_(sendSegs[static_cast<size_t>(me)]);
  return st;
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplitSizes,
                                                               std::vector<int64_t>& inputSplitSizes,
                                                               const ::c10d::AllToAllOptions& opts) {
  checkTensor(output, "alltoall_base");
  checkTensor(input, "alltoall_base");
  checkSameType(output, input, "alltoall_base");
  const c4::DataType dt = toC4(input.scalar_type(), "alltoall_base");
  at::Tensor in = input.contiguous();
  at::Tensor out = output;
  at::Tensor buf = output.contiguous();
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    TORCH_CHECK(in.numel() % size_ == 0, "c4 alltoall_base: the input's ", in.numel(),
                " elements do not split evenly over ", size_, " ranks");
    TORCH_CHECK(out.numel() == in.numel(), "c4 alltoall_base: output has ", out.numel(), " elements, input ",
                in.numel());
    const size_t per = count(in) / static_cast<size_t>(size_);
    return enqueue(*main_, OpType::ALLTOALL_BASE, "alltoall_base", "c4:all_to_all", {out}, [=](c4::Comm* c) {
      c4::Status st = c4::alltoAll(ptr(in), ptr(buf), per, dt, c, S());
      if (st.isOk()) copyBack(out, buf);
      return st;
    });
  }
  const std::vector<int64_t> sendCounts = splitCounts(inputSplitSizes, in, size_, "input");
  const std::vector<int64_t> recvCounts = splitCounts(outputSplitSizes, buf, size_, "output");
  std::vector<at::Tensor> sendSegs, recvSegs;
  at::Tensor inFlat = in.reshape({-1});
  at::Tensor outFlat = buf.view({-1});
  int64_t so = 0, ro = 0;
  for (int p = 0; p < size_; ++p) {
    sendSegs.push_back(inFlat.narrow(0, so, sendCounts[static_cast<size_t>(p)]));
    recvSegs.push_back(outFlat.narrow(0, ro, recvCounts[static_cast<size_t>(p)]));
    so += sendCounts[static_cast<size_t>(p)];
    ro += recvCounts[static_cast<size_t>(p)];
  }
  TORCH_CHECK(sendSegs[static_cast<size_t>(rank_)].numel() == recvSegs[static_cast<size_t>(rank_)].numel(),
              "c4 alltoall_base: this rank sends itself ", sendSegs[static_cast<size_t>(rank_)].numel(),
              " elements but expects ", recvSegs[static_cast<size_t>(rank_)].numel());
  const int me = rank_;
  return enqueue(*main_, OpType::ALLTOALL_BASE, "alltoall_base", "c4:all_to_all", {out}, [=](c4::Comm* c) {
    c4::Status st = exchange(c, me, sendSegs, recvSegs, dt);
    if (st.isOk()) copyBack(out, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "c4 alltoall: expects ", size_, " input and output tensors, got ", inputs.size(), " and ",
              outputs.size());
  TORCH_CHECK(size_ > 0, "c4 alltoall: empty group");
  std::vector<at::Tensor> sendSegs, recvSegs;
  for (int p = 0; p < size_; ++p) {
    const at::Tensor& i = inputs[static_cast<size_t>(p)];
    const at::Tensor& o = outputs[static_cast<size_t>(p)];
    checkTensor(i, "alltoall");
    checkTensor(o, "alltoall");
    checkSameType(i, inputs[0], "alltoall");
    checkSameType(o, inputs[0], "alltoall");
    sendSegs.push_back(i.contiguous());
    recvSegs.push_back(o.contiguous());
  }
  TORCH_CHECK(sendSegs[static_cast<size_t>(rank_)].numel() == recvSegs[static_cast<size_t>(rank_)].numel(),
              "c4 alltoall: this rank's own input and output differ in size");
  const c4::DataType dt = toC4(inputs[0].scalar_type(), "alltoall");
  std::vector<at::Tensor> outs = outputs;
  const int me = rank_;
  return enqueue(*main_, OpType::ALLTOALL, "alltoall", "c4:all_to_all", outs, [=](c4::Comm* c) {
    c4::Status st = exchange(c, me, sendSegs, recvSegs, dt);
    if (st.isOk())
      for (size_t p = 0; p < outs.size(); ++p) copyBack(outs[p], recvSegs[p]);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkSingle(tensors, "send");
  TORCH_CHECK(dstRank >= 0 && dstRank < size_ && dstRank != rank_, "c4 send: invalid destination rank ", dstRank,
              " (this is rank ", rank_, " of ", size_, ")");
  at::Tensor buf = tensors[0].contiguous();
  const c4::DataType dt = toC4(buf.scalar_type(), "send");
  return enqueue(p2pChannel(dstRank, true), OpType::SEND, "send", "c4:send", {tensors[0]},
                 [=](c4::Comm* c) { return c4::send(ptr(buf), count(buf), dt, /*peer=*/1, c, S()); });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkSingle(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < size_ && srcRank != rank_, "c4 recv: invalid source rank ", srcRank,
              " (this is rank ", rank_, " of ", size_, ")");
  at::Tensor t = tensors[0];
  at::Tensor buf = t.contiguous();
  const c4::DataType dt = toC4(buf.scalar_type(), "recv");
  return enqueue(p2pChannel(srcRank, false), OpType::RECV, "recv", "c4:recv", {t}, [=](c4::Comm* c) {
    c4::Status st = c4::recv(ptr(buf), count(buf), dt, /*peer=*/0, c, S());
    if (st.isOk()) copyBack(t, buf);
    return st;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  checkSingle(tensors, "recv");
  TORCH_CHECK(size_ > 1, "c4 recv: receiving from any source in a group of 1 rank: there is no other rank");
  TORCH_CHECK(!tensors[0].is_cuda(),
              "c4 recv: receiving from any source into a CUDA tensor is not supported (its "
              "probe runs on the host outside the stream order); pass src=, or receive into a CPU tensor");
  TORCH_CHECK(tensors[0].numel() > 0,
              "c4 recv: receiving from any source needs a non-empty tensor (an empty send is never transmitted, so "
              "its sender cannot be found); pass src=");
  auto a = std::make_shared<AnySourceRecv>();
  a->user = tensors[0];
  a->buf = a->user.contiguous();
  a->dt = toC4(a->buf.scalar_type(), "recv");
  a->deadline = std::chrono::steady_clock::now() + timeout_;
  {
    std::lock_guard<std::mutex> g(seqMu_);
    const uint64_t seq = seq_++;
    a->work = c10::make_intrusive<WorkC4>(rank_, OpType::RECVANYSOURCE, "recvAnySource", "c4:recvAnySource", seq,
                                          std::vector<at::Tensor>{a->user});
    a->work->setTimeout(timeout_);
    a->describe = "c4 recvAnySource (op " + std::to_string(seq) + " of process group " + std::to_string(generation_) +
                  ", rank " + std::to_string(rank_) + "/" + std::to_string(size_) + ")";
  }
  c10::intrusive_ptr<WorkC4> work = a->work;
  {
    std::lock_guard<std::mutex> g(p2pMu_);
    std::lock_guard<std::mutex> ga(anyMu_);
    TORCH_CHECK(!anyStop_, "c4 recv: the process group is being destroyed");
    for (int p = 0; p < size_; ++p) {
      auto it = p2p_.find({p, false});
      if (p != rank_ && it != p2p_.end()) watchPeer(a, p, *it->second);
    }
    anyPending_.push_back(a);
    if (!anyWatcher_.joinable()) anyWatcher_ = std::thread([this] { anySourceLoop(); });
  }
  anyCv_.notify_all();
  return work;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupC4::barrier(const ::c10d::BarrierOptions& opts) {
  // A one-byte allreduce on the collective channel: it runs after everything issued before it.
  at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kByte));
  return enqueue(*main_, OpType::BARRIER, "barrier", "c4:barrier", {}, [=](c4::Comm* c) {
    return c4::allReduce(ptr(token), ptr(token), 1, c4::DataType::kUint8, c4::RedOp::kSum, c, S());
  });
}

#if TORCH_VERSION_MAJOR >= 2

c10::intrusive_ptr<::c10d::Backend> ProcessGroupC4::split(const c10::intrusive_ptr<::c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<::c10d::Backend::Options>& opts) {
  GilRelease nogil;
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = me != ranks.end();
  // torch registers this one backend for "cpu" and "cuda", and ProcessGroup::splitGroup asks each
  // device type's backend in turn until one returns a group: a non-member is asked twice for one
  // split. The second ask (same store) is answered without a second collective.
  if (!member && lastNoColorStore_ == store) return {};
  lastNoColorStore_ = member ? nullptr : store;
  TORCH_CHECK(std::is_sorted(ranks.begin(), ranks.end()), "c4 split: the ranks must be sorted");
  // Groups do not overlap, so each one's lowest rank is a color no other group has.
  const int color = member ? ranks.front() : -1;  // -1: NCCL_SPLIT_NOCOLOR
  const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
  const c4::Config cfg = groupConfig("torch-pg" + std::to_string(generation_) + "-split", timeout);
  auto child = std::make_shared<c4::Comm*>(nullptr);
  const int key = rank_;
  // On the worker, after everything issued before: commSplit is collective over this group.
  c10::intrusive_ptr<::c10d::Work> work =
      enqueue(*main_, OpType::UNKNOWN, "split", "c4:split", {},
              [child, color, key, cfg](c4::Comm* c) { return c4::commSplit(c, color, key, child.get(), &cfg); });
  work->wait(::kNoTimeout);
  if (!member) {
    TORCH_CHECK(*child == nullptr, "c4 split: rank ", rank_, " is in no group but got a communicator");
    return {};
  }
  TORCH_CHECK(*child != nullptr, "c4 split: rank ", rank_, " is in group ", c10::Join(",", ranks),
              " but got no communicator");
  const int n = commSize(*child);
  const int r = commRank(*child);
  const int want = static_cast<int>(me - ranks.begin());
  if (n != static_cast<int>(ranks.size()) || r != want) {
    (void)c4::commDestroy(*child);
    TORCH_CHECK(false, "c4 split: rank ", rank_, " asked for group [", c10::Join(",", ranks),
                "] but the ranks of lowest rank ", color, " form a group of ", n, " in which it is rank ", r,
                ": every rank must pass the same split");
  }
  return c10::make_intrusive<ProcessGroupC4>(store, *child, /*ownsComm=*/true, timeout);
}

c10::intrusive_ptr<::c10d::Backend::Options> ProcessGroupC4::getBackendOptions() {
  return c10::make_intrusive<::c10d::Backend::Options>("c4", timeout_);
}

void ProcessGroupC4::abort() {
  GilRelease nogil;
  closeAll("the process group was aborted", /*abort=*/true);
}

void ProcessGroupC4::shutdown() {
  GilRelease nogil;
  closeAll("the process group was shut down", /*abort=*/false);
}

void ProcessGroupC4::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  GilRelease nogil;
  if (size_ == 1) return;
  const std::chrono::milliseconds timeout = opts.timeout.count() > 0 ? opts.timeout : timeout_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Time left until the deadline; at least 1 ms (a Work's wait(0) would wait without limit).
  auto left = [&] {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(ms, std::chrono::milliseconds(1));
  };
  auto token = [] { return std::vector<at::Tensor>{at::zeros({1}, at::TensorOptions().dtype(at::kByte))}; };
  if (rank_ != 0) {
    std::vector<at::Tensor> out = token(), in = token();
    c10::intrusive_ptr<::c10d::Work> sent = send(out, 0, 0);
    c10::intrusive_ptr<::c10d::Work> answer = recv(in, 0, 0);
    try {
      answer->wait(left());
      sent->wait(left());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "c4 monitored_barrier: rank ", rank_,
                  " reached the barrier but had no answer from rank 0 within ", timeout.count(),
                  " ms (rank 0 raises naming the ranks that did not come): ", e.what());
    }
    return;
  }
  std::vector<std::vector<at::Tensor>> in(size_);
  std::vector<c10::intrusive_ptr<::c10d::Work>> arrived(size_);
  for (int r = 1; r < size_; ++r) {
    in[r] = token();
    arrived[r] = recv(in[r], r, 0);
  }
  std::vector<int> missing;
  std::string detail;  // the first failure that was not a timeout (a peer that died, ...)
  for (int r = 1; r < size_; ++r) {
    try {
      arrived[r]->wait(left());
    } catch (const std::exception& e) {
      missing.push_back(r);
      const std::string what = e.what();
      if (detail.empty() && what.find("timed out") == std::string::npos) detail = what;
      if (!waitAllRanks) break;
    }
  }
  if (!missing.empty()) {
    // gloo's wording, which programs and tests match, then what c4 knows.
    TORCH_CHECK(false, "c4 monitored_barrier: ", missing.size() == 1 ? "Rank " : "Ranks ", c10::Join(", ", missing),
                " failed to pass monitoredBarrier in ", timeout.count(), " ms",
                detail.empty() ? "" : " (" + detail + ")");
  }
  std::vector<c10::intrusive_ptr<::c10d::Work>> answers;
  for (int r = 1; r < size_; ++r) {
    std::vector<at::Tensor> out = token();
    answers.push_back(send(out, r, 0));
  }
  for (auto& w : answers) w->wait(left());
}

#endif  // TORCH_VERSION_MAJOR >= 2

}  // namespace c4torch
