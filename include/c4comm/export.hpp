// c4comm public API: symbol visibility. libc4comm is built with hidden visibility; only what is
// marked C4_API is exported (tests/abi checks the list).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define C4_API [[gnu::visibility("default")]]
#else
#define C4_API
#endif
