// c4comm public API: status codes and Status / Result<T>.
#pragma once

#include <string>
#include <utility>

#include "c4comm/export.hpp"

namespace c4 {

/// Result codes. Values equal NCCL's ncclResult_t so the C ABI can pass them through unchanged.
enum class Code : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
  /// A wait ran past its limit (NCCL 2.30's ncclTimeout).
  kTimeout = 8,
};

/// Short name of a code ("invalid argument", ...). Never null.
C4_API const char* codeName(Code code);

/// An outcome: a code plus, on failure, a human-readable reason. An ok Status is two words and
/// costs nothing to create, copy or destroy (the reason lives on the heap only on failure).
class [[nodiscard]] C4_API Status {
 public:
  Status() = default;
  Status(Code code, std::string msg)
      : code_(code), msg_(code == Code::kSuccess ? nullptr : new std::string(std::move(msg))) {}
  Status(const Status& o) : code_(o.code_), msg_(o.msg_ ? new std::string(*o.msg_) : nullptr) {}
  Status(Status&& o) noexcept : code_(o.code_), msg_(o.msg_) {
    o.code_ = Code::kSuccess;
    o.msg_ = nullptr;
  }
  Status& operator=(const Status& o) {
    if (this != &o) *this = Status(o);
    return *this;
  }
  Status& operator=(Status&& o) noexcept {
    std::swap(code_, o.code_);
    std::swap(msg_, o.msg_);
    return *this;
  }
  ~Status() { delete msg_; }
  static Status ok() { return Status(); }

  bool isOk() const { return code_ == Code::kSuccess; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  /// The reason; empty when ok.
  const std::string& message() const { return msg_ ? *msg_ : emptyString(); }
  /// "code name: reason".
  std::string toString() const;

 private:
  static const std::string& emptyString() {
    static const std::string empty;
    return empty;
  }
  Code code_ = Code::kSuccess;
  std::string* msg_ = nullptr;
};

/// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {}  // NOLINT(google-explicit-constructor)
  bool isOk() const { return status_.isOk(); }
  const Status& status() const { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T&& take() { return std::move(value_); }

 private:
  Status status_;
  T value_{};
};

}  // namespace c4
