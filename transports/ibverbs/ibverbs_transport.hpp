// ibverbs transport: every peer over RDMA reliable-connected queue pairs, several per
// connection as lanes, on InfiniBand or RoCE (Soft-RoCE included). libibverbs is loaded with dlopen
// (ib_verbs.hpp): without rdma-core the transport fails to create, naming what to install, and the
// rest of the library works. Selected with C4_TRANSPORT=ibverbs (docs/ibverbs-transport.md).
//
// Each lane is an RC queue pair with a ring of C4_IB_SLOTS receive slots of C4_IB_SLOT_BYTES that
// the peer writes into with RDMA write-with-immediate (the immediate names the slot), and a staging
// ring of as many slots on the sending side; a sender holds one credit per free slot of the peer,
// and the receiver returns credits with zero-byte sends once it copied (or reduced) a slot out. A
// message goes in chunks striped over the lanes, each with a header (message sequence, offset,
// size, OpSig), so the receiver checks every message against the receive it posted and peeks
// without consuming. Queue pairs are made and connected at creation, their addresses exchanged over
// the bootstrap's authenticated allGather. A lane whose queue pair fails (a completion error) or
// that C4P retires is taken out of service: its uncredited chunks go again on the other lanes from
// their staged copies, the peer is told, and the receiver from then on takes chunks in any order,
// each once; the connection fails only with its last lane.
#pragma once

#include <memory>

#include "c4comm/status.hpp"
#include "common/params.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

C4_PARAM_INT(IbQpsPerConnection, "C4_IB_QPS_PER_CONNECTION", "NCCL_IB_QPS_PER_CONNECTION", 2, 1, 16,
             kParamSameOnAllRanks, "ibverbs: queue pairs (lanes) per connection; chunks are striped over them")
C4_PARAM_INT(IbTimeout, "C4_IB_TIMEOUT", "NCCL_IB_TIMEOUT", 18, 1, 31, kParamNone,
             "ibverbs: the queue pairs' ack timeout, 4.096 us * 2^value (18: about 1 s) before a retry")
C4_PARAM_INT(IbRetryCnt, "C4_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT", 6, 0, 7, kParamNone,
             "ibverbs: retries after an ack timeout before the queue pair fails (a completion error); Soft-RoCE "
             "(rxe) retries forever at 7, so a dead peer would never be found: 6 by default")
C4_PARAM_INT(IbSlotBytes, "C4_IB_SLOT_BYTES", nullptr, 131072, 4096, int64_t{1} << 24, kParamSameOnAllRanks,
             "ibverbs: bytes of one receive slot (a chunk and its 64-byte header)")
C4_PARAM_INT(IbFaultAddLane, "C4_IB_FAULT_ADD_LANE", nullptr, 0, 0, 1, kParamNone,
             "Test hook: 1 = every lane this rank adds after init (C4P's replacements) fails to make its queue pair, "
             "as with a full completion queue")
C4_PARAM_INT(IbSourcePortBase, "C4_IB_SOURCE_PORT_BASE", nullptr, 0, 49152, 65535, kParamZeroToo,
             "ibverbs, RoCE v2: lane l of a connection leaves from UDP source port BASE + l (49152 and up, set through "
             "the flow label) where the lane planner asks for none; 0: the device's choice (a hash of the queue pairs)")
C4_PARAM_INT(IbSlots, "C4_IB_SLOTS", nullptr, 8, 2, 256, kParamSameOnAllRanks,
             "ibverbs: receive slots (credits) per lane; each lane holds twice slots x slot bytes")

/// Creates the ibverbs transport for ctx.rank. Collective over ctx.oob (two allGathers and a
/// barrier): every rank learns whether every other could open its RDMA device, so that one rank
/// without a device fails every rank at once, naming it. Blocking (setup only).
Status createIbverbsTransport(const Context& ctx, std::unique_ptr<Transport>* out);

C4_PARAM_INT(IbDisable, "C4_IB_DISABLE", "NCCL_IB_DISABLE", 0, 0, 1, kParamSameOnAllRanks,
             "1: C4_TRANSPORT=auto does not try RDMA (ibverbs) between hosts and uses tcp")
/// Whether C4_TRANSPORT=auto tries ibverbs (the registry's AUTO_FIRST veto): not under C4_IB_DISABLE=1.
bool ibverbsAutoEnabled();

}  // namespace c4::transport
