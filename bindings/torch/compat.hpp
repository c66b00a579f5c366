// The small compatibility layer between the torch versions c4comm_torch builds against.
//
// torch 1.x (Debian bookworm ships 1.13): a backend subclasses c10d::ProcessGroup and its creator
// returns that ProcessGroup to torch.distributed.
// torch 2.x: a backend subclasses c10d::Backend; torch wraps it in a ProcessGroup per device type
// (the Python package registers "c4" for devices cpu and cuda).
// Everything else the backend uses (Work, Store, the option structs, ReduceOp and its PREMUL_SUM
// supplement, ivalue::Future) has the same shape in both.
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

// CUDA tensors (torch >= 2.2): streams and events through c10's device-generic interface
// (c10::Stream::native_handle, c10::Event), so the backend links no CUDA library of torch's and
// the same source builds against CPU-only and CUDA torch.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define C4_TORCH_CUDA 1
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#else
#define C4_TORCH_CUDA 0
#endif

namespace c4torch {

#if TORCH_VERSION_MAJOR >= 2
/// What a torch 2.x backend derives from.
using BackendBase = ::c10d::Backend;
#else
/// What a torch 1.x backend derives from.
using BackendBase = ::c10d::ProcessGroup;
#endif

}  // namespace c4torch
