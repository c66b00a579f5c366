// TCP transport: ranks on different hosts, or every rank with C4_TRANSPORT=tcp (see
// docs/tcp-transport.md).
//
// Every peer connection is carried on C4_LANES sockets (lanes, transports/lane.hpp). Lane i is
// bound to one of this rank's NIC ports (C4_TCP_PORTS) and a chosen source port (Context::lanePlan,
// C4_TCP_SPORT_BASE) and connects to the peer's port of the same index. The lower rank opens the
// lanes and proves the communicator key (SipHash challenge-response in both directions). Messages
// are cut into pieces striped over the live lanes by weight; each piece carries a small header
// (message number, offset, size, OpSig) so the receiver places it at its offset, straight into the
// posted buffer. The receiver acknowledges every piece on the lane it came by and keeps a bitmap of
// the pieces of each message; the sender keeps unacknowledged pieces re-sendable. A lane that fails
// or stalls while another delivers is retired and what it had not delivered goes out on the other
// lanes, each piece counted and reduced once; only when no lane is left does the connection fail.
// Sockets are non-blocking and driven by progress() through epoll; nothing blocks after setup.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/params.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

// Parameters (read once per createTcpTransport; documented in docs/tcp-transport.md).
C4_PARAM_INT(Lanes, "C4_LANES", nullptr, 2, 1, 16, kParamSameOnAllRanks,
             "tcp: sockets (lanes) per peer connection; large messages are striped over them")
C4_PARAM_STR(TcpPorts, "C4_TCP_PORTS", nullptr, "", {}, kParamNone,
             "tcp: comma list of this host's NIC ports to use (interface name prefixes or IP addresses, e.g. "
             "\"p0,p1\"); lane i uses port i mod count; default: the interface C4_SOCKET_IFNAME chooses")
C4_PARAM_INT(TcpSportBase, "C4_TCP_SPORT_BASE", nullptr, 0, 0, 65535, kParamNone,
             "tcp: if > 0, lane l from rank r to peer p binds source port base + (r * nranks + p) * lanes + l "
             "(deterministic ports for tests and ECMP experiments); 0 = kernel-chosen")
C4_PARAM_INT(TcpPieceBytes, "C4_TCP_PIECE_BYTES", nullptr, 524288, 4096, int64_t{64} << 20, kParamSameOnAllRanks,
             "tcp: largest piece (frame payload) a message is cut into for striping over lanes (rounded to 4 KiB)")
C4_PARAM_INT(TcpAck, "C4_TCP_ACK", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "tcp: 1 = the receiver acknowledges every piece and a send completes once all its pieces are "
             "acknowledged, so a failed or stalled lane is retired and its pieces re-sent on the others; 0 = a send "
             "completes when its bytes are in the kernel and a lane error fails the connection")
C4_PARAM_INT(TcpLaneStallMs, "C4_TCP_LANE_STALL_MS", nullptr, 2000, 1, 3600000, kParamNone,
             "tcp: a lane whose pieces go unacknowledged this long while another lane of the connection delivers is "
             "retired and its pieces re-sent on the others (needs C4_TCP_ACK=1)")
C4_PARAM_INT(TcpEagerBytes, "C4_TCP_EAGER_BYTES", nullptr, 65536, 0, int64_t{1} << 30, kParamSameOnAllRanks,
             "tcp: sends up to this size are copied and complete once written, without waiting for their "
             "acknowledgement (the copy serves re-sends); 0 = never")
C4_PARAM_INT(TcpEagerLimit, "C4_TCP_EAGER_LIMIT", nullptr, 4194304, 0, int64_t{1} << 40, kParamNone,
             "tcp: bytes of such copies a connection holds at most; beyond, small sends wait for their "
             "acknowledgement like large ones")
C4_PARAM_INT(TcpUnexpectedWaitUs, "C4_TCP_UNEXPECTED_WAIT_US", nullptr, 50, 0, 10000000, kParamNone,
             "tcp: a large piece of the next message whose receive is not posted yet stays in the socket this "
             "long (its lane is read again each progress round) before it is copied into a heap buffer; 0 = copy at "
             "once")
C4_PARAM_INT(TcpSendQueue, "C4_TCP_SEND_QUEUE", nullptr, 4096, 1, int64_t{1} << 20, kParamNone,
             "tcp: messages a connection queues before isend answers 'queue full' (back-pressure; the executor "
             "retries after progress)")
C4_PARAM_INT(TcpBufBytes, "C4_TCP_BUF_BYTES", nullptr, -1, -1, int64_t{1} << 30, kParamNone,
             "tcp: SO_SNDBUF/SO_RCVBUF per socket in bytes; 0 = kernel autotuning; -1 = 1 MiB with acknowledgements "
             "(bounds what an operation's last sends hold unacknowledged), autotuning without")
C4_PARAM_INT(TcpUnexpectedBytes, "C4_TCP_UNEXPECTED_BYTES", nullptr, 67108864, 0, int64_t{1} << 40, kParamNone,
             "tcp: bytes per peer buffered for messages whose receive is not posted yet; beyond it the lane stops "
             "reading (TCP back-pressure)")
C4_PARAM_INT(TcpHandshakeMs, "C4_TCP_HANDSHAKE_MS", nullptr, 10000, 1, 3600000, kParamNone,
             "tcp: milliseconds an incoming connection has to prove the communicator key before it is dropped")
C4_PARAM_INT(TcpProbeMs, "C4_TCP_PROBE_MS", nullptr, 1000, 0, 3600000, kParamNone,
             "tcp: a rank waiting this long for a lower rank that has not connected its lanes probes that rank's "
             "listening socket, every as long again; a refused probe fails the wait at once (the rank exited or "
             "left the communicator) instead of after C4_TIMEOUT; 0 = never probe")

/// The tcp transport's own interface beyond Transport and its capabilities (tests reach it by
/// dynamic_cast). Same threading as Transport: the thread that drives progress().
class TcpTransport : public Transport, public LaneSetup, public WaitSource {
 public:
  /// Bytes of released sends saved so far because a receive of this transport was about to
  /// overwrite them before their acknowledgement (Request::released; tests).
  virtual uint64_t savedBytes() const = 0;
};

/// Creates the tcp transport for ctx.rank. Collective: every rank of the communicator must call it
/// (one allGather over ctx.oob of each rank's listen addresses). Listens on every chosen NIC port;
/// connections open lazily on connect(). Blocking (setup only). ctx.authKey must be the same on
/// every rank (derived from the UniqueId secret).
Status createTcpTransport(const Context& ctx, std::unique_ptr<Transport>* out);

}  // namespace c4::transport
