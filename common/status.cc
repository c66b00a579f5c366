#include "common/status.hpp"

#include <cstdio>
#include <cstring>

namespace c4 {

const char* codeName(Code code) {
  switch (code) {
    case Code::kSuccess:
      return "no error";
    case Code::kUnhandledCudaError:
      return "unhandled cuda error";
    case Code::kSystemError:
      return "unhandled system error";
    case Code::kInternalError:
      return "internal error";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kInvalidUsage:
      return "invalid usage";
    case Code::kRemoteError:
      return "remote process exited or there was a network error";
    case Code::kInProgress:
      return "operation in progress";
    case Code::kTimeout:
      return "timeout";
  }
  return "unknown result code";
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  return std::string(codeName(code_)) + ": " + message();
}

std::string strFormatV(const char* fmt, va_list ap) {
  char buf[512];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  if (n < 0) {
    va_end(ap2);
    return std::string(fmt);
  }
  if (static_cast<size_t>(n) < sizeof(buf)) {
    va_end(ap2);
    return std::string(buf, static_cast<size_t>(n));
  }
  std::string out(static_cast<size_t>(n) + 1, '\0');
  vsnprintf(&out[0], out.size(), fmt, ap2);
  va_end(ap2);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string strFormat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = strFormatV(fmt, ap);
  va_end(ap);
  return s;
}

Status makeError(Code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = strFormatV(fmt, ap);
  va_end(ap);
  return Status(code, std::move(s));
}

Status sysError(const char* what, int err) {
  return Status(Code::kSystemError, std::string(what) + ": " + strerror(err));
}

}  // namespace c4
