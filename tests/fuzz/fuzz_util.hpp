// Helpers of the fuzz targets (docs/fuzzing.md): reading an input from the front, and the check of
// an invariant a parser promises (a failure aborts, which libFuzzer reports as a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

/// Aborts with a message when `cond` is false.
#define C4_FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "fuzz invariant failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fprintf(stderr, "\n");                                                              \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

namespace c4::fuzz {

/// Reads an input from the front; past its end every read gives zeros (and ok() turns false).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  size_t left() const { return n_; }
  bool ok() const { return ok_; }
  const uint8_t* peek() const { return p_; }
  /// Copies sizeof(T) bytes into a trivially copyable T (zero-filled past the end).
  template <typename T>
  T take() {
    static_assert(std::is_trivially_copyable_v<T>, "bytes only");
    T v;
    memset(static_cast<void*>(&v), 0, sizeof(v));
    bytes(&v, sizeof(v));
    return v;
  }
  /// Copies up to `n` bytes to `out`; the rest of `out` is zeroed. Returns how many were copied.
  size_t bytes(void* out, size_t n) {
    const size_t k = n < n_ ? n : n_;
    if (k) memcpy(out, p_, k);
    if (k < n) {
      memset(static_cast<char*>(out) + k, 0, n - k);
      ok_ = false;
    }
    p_ += k;
    n_ -= k;
    return k;
  }
  /// Skips `n` bytes (at most what is left).
  void skip(size_t n) {
    const size_t k = n < n_ ? n : n_;
    p_ += k;
    n_ -= k;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

}  // namespace c4::fuzz
