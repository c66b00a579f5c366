// UCX transport: every peer over UCP tagged messages, on whatever UCX chooses between the
// two ranks (shared memory, tcp, RDMA verbs on a cluster). Built when Debian's libucx-dev is found;
// selected with C4_TRANSPORT=ucx, or under auto between hosts where UCX reaches an RDMA device and
// the ibverbs transport is not used (docs/ucx-transport.md).
//
// One UCP context and worker per communicator and rank, in single-thread mode: the thread that
// drives the communicator drives the worker (progress()). Worker addresses travel over the
// bootstrap's authenticated allGather; endpoints open on first use, with peer-failure handling.
// A message of up to C4_UCX_INLINE_BYTES goes as one tagged message carrying a header (OpSig, size)
// and the payload, copied; a larger one as a header message and a payload message sent zero-copy
// from the caller's buffer (with its memory handle where ncclCommRegister registered it). Tags
// carry the sender's rank and a per-direction sequence number, so matching needs no ordering
// guarantee from UCX; the receiver checks every header against the receive it posted.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "c4comm/status.hpp"
#include "common/params.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

C4_PARAM_INT(UcxInlineBytes, "C4_UCX_INLINE_BYTES", nullptr, 16384, 0, int64_t{1} << 20, kParamSameOnAllRanks,
             "ucx: messages up to this size travel as one tagged message with their header (copied); larger ones "
             "as a header message and a zero-copy payload message")

C4_PARAM_INT(UcxPeerFailure, "C4_UCX_PEER_FAILURE", nullptr, 1, 0, 2, kParamSameOnAllRanks,
             "ucx: how a dead peer is found. 1 = at once, keeping UCX's fastest transports: endpoints to other "
             "hosts handle peer failure in UCX (UCP_ERR_HANDLING_MODE_PEER), and a peer on this host (same pid "
             "namespace) is watched as a process by the transport, so that UCX keeps shared memory there; 2 = UCX's "
             "peer-failure handling on every endpoint (UCX 1.13 then uses tcp even within a host); 0 = no "
             "handling: a dead peer is found by C4D and C4_TIMEOUT")

C4_PARAM_INT(UcxAuto, "C4_UCX_AUTO", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "ucx: under C4_TRANSPORT=auto, between hosts, after ibverbs and before tcp where UCX reaches an RDMA "
             "device (its ib component has one); 0 = only when C4_TRANSPORT names it")

/// Under C4_TRANSPORT=auto: whether ucx is a candidate between hosts (tried after ibverbs, before
/// tcp): C4_UCX_AUTO is 1 and UCX reaches an RDMA device. Asked of UCX once per process.
bool ucxAutoEnabled();
/// The decision on UCX's transport components (name, memory domains found): an "ib" component
/// Installs (once per process; the first ucx transport does it) the handler that rewords what UCX
/// logs about a peer that died (a failed flush, the peer's shared memory gone, requests not returned
/// to a pool) into c4comm's log, saying what it means. Other UCX messages pass through.
void installUcxLogHandler();

/// with a memory domain, i.e. a verbs device UCX can use (rc, ud, dc).
bool ucxComponentsReachRdma(const std::vector<std::pair<std::string, unsigned>>& components);

/// Creates the ucx transport for ctx.rank. Collective: one allGather of the worker addresses over
/// ctx.oob. Blocking (setup only). Fails with a clear error if UCX cannot be initialized.
Status createUcxTransport(const Context& ctx, std::unique_ptr<Transport>* out);

}  // namespace c4::transport
