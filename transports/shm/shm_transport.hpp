// Shared-memory transport for ranks on the same host (see docs/shm-transport.md).
//
// Each rank owns one POSIX shared-memory segment holding a header (pid, abort/closed flags and
// reason) and one inbound channel per possible sender. A channel is an SPSC ring of slots: small
// messages are copied into slots (eager), large ones are announced by a descriptor and pulled by the
// receiver with a single copy (process_vm_readv, or memcpy for a peer in the same process). Without
// CMA, large messages stream through the ring (pipelined, numSlots-buffered).
#pragma once

#include <memory>

#include "c4comm/status.hpp"
#include "common/params.hpp"
#include "transports/idle.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

// Parameters (read once per createShmTransport; documented in docs/shm-transport.md).
C4_PARAM_INT(ShmSlotBytes, "C4_SHM_SLOT_BYTES", nullptr, 0, 128, int64_t{64} << 20,
             kParamSameOnAllRanks | kParamZeroToo,
             "shm: bytes per ring slot including its 64-byte header (multiple of 64); 0 = by "
             "ranks on the host: 512 KiB, less above 16 ranks so that every channel fits a 2 GiB host budget and "
             "3/4 of /dev/shm's free space (down to 8 KiB; below that same-host ranks use the network transport)")
C4_PARAM_INT(ShmSlots, "C4_SHM_SLOTS", nullptr, 8, 2, 4096, kParamSameOnAllRanks, "shm: slots per channel ring")
C4_PARAM_INT(ShmCma, "C4_SHM_CMA", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "shm: 1 = single-copy large messages allowed (CMA between processes, memcpy between ranks of one "
             "process); 0 = stream everything through the ring")
C4_PARAM_INT(ShmCmaThreshold, "C4_SHM_CMA_THRESHOLD", nullptr, 65536, -1, INT64_MAX, kParamSameOnAllRanks,
             "shm: messages between processes larger than this many bytes use CMA single copy where the plan "
             "allows it (AllGather, AlltoAll, Gather, Scatter, Send/Recv; the rest stream through the ring); -1 = "
             "never (see docs/shm-transport.md)")
C4_PARAM_INT(ShmLocalCopyThreshold, "C4_SHM_LOCAL_COPY_THRESHOLD", nullptr, 32768, 0, INT64_MAX, kParamSameOnAllRanks,
             "shm: messages between ranks of one process larger than this use a direct memcpy from the sender")
C4_PARAM_INT(ShmCmaPiece, "C4_SHM_CMA_PIECE", nullptr, 262144, 4096, int64_t{1} << 30, kParamSameOnAllRanks,
             "shm: bytes pulled per staging piece when a single-copy receive reduces")
C4_PARAM_INT(ShmCmaChunk, "C4_SHM_CMA_CHUNK", nullptr, 4194304, 65536, int64_t{1} << 30, kParamSameOnAllRanks,
             "shm: bytes pulled per progress() call and connection by a single-copy receive without reduction")
C4_PARAM_INT(ShmLivenessMs, "C4_SHM_LIVENESS_MS", nullptr, 100, 1, 60000, kParamNone,
             "shm: how often (ms) a stalled connection checks whether its peer process still exists")
C4_PARAM_INT(ShmSpread, "C4_SHM_SPREAD", nullptr, 1, 0, 1, kParamNone,
             "shm: a rank that has shared its CPU with a lower rank of its host for 0.2 ms while waiting for it "
             "moves itself to a CPU of its affinity mask that no local rank reports (then restores the mask); "
             "0 = never (only yield)")

/// Creates the shm transport for ctx.rank. Collective: every rank of the communicator must call it
/// (it uses ctx.oob for two allGathers and a barrier). Creates this rank's segment in /dev/shm and
/// maps every same-host peer's segment; all names are unlinked before it returns (also on failure),
/// so nothing is left in /dev/shm even if a process is killed later. Blocking (setup only).
Status createShmTransport(const Context& ctx, std::unique_ptr<Transport>* out);

}  // namespace c4::transport
