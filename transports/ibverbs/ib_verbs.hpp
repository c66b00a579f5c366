// libibverbs for the ibverbs transport, loaded with dlopen so that one libnccl.so.2 runs
// with or without rdma-core installed; and the discovery of the RDMA ports a rank may use.
//
// Only the functions rdma-core exports are looked up here; the data path's calls (ibv_post_send,
// ibv_post_recv, ibv_poll_cq) are inline in verbs.h and go through the device context's ops, so
// they need no symbol. Nothing in this library links against libibverbs.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/params.hpp"

namespace c4::transport::ib {

C4_PARAM_STR(IbLibrary, "C4_IB_LIBRARY", nullptr, "libibverbs.so.1", {}, kParamNone,
             "ibverbs: the libibverbs to load (dlopen); a name or a path")
C4_PARAM_STR(IbHca, "C4_IB_HCA", "NCCL_IB_HCA", "", {}, kParamNone,
             "ibverbs: which RDMA devices and ports to use, NCCL's syntax: comma-separated names with optional "
             ":port, matched as prefixes; a leading ^ excludes them, a leading = matches names exactly (\"\": "
             "every active port)")
C4_PARAM_INT(IbGidIndex, "C4_IB_GID_INDEX", "NCCL_IB_GID_INDEX", -1, -1, 65535, kParamNone,
             "ibverbs: the GID index on RoCE ports (-1: the RoCE v2 GID of an IPv4 address, else the first RoCE v2 "
             "GID, else index 0)")

/// The exported functions of libibverbs this transport calls.
struct Verbs {
  ibv_device** (*getDeviceList)(int*) = nullptr;
  void (*freeDeviceList)(ibv_device**) = nullptr;
  const char* (*getDeviceName)(ibv_device*) = nullptr;
  ibv_context* (*openDevice)(ibv_device*) = nullptr;
  int (*closeDevice)(ibv_context*) = nullptr;
  int (*queryDevice)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*queryPortCompat)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;  // fills the compat prefix
  int (*queryGid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*allocPd)(ibv_context*) = nullptr;
  int (*deallocPd)(ibv_pd*) = nullptr;
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int) = nullptr;
  int (*deregMr)(ibv_mr*) = nullptr;
  ibv_cq* (*createCq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroyCq)(ibv_cq*) = nullptr;
  ibv_qp* (*createQp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modifyQp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroyQp)(ibv_qp*) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status) = nullptr;
  // Completion channels (WaitSource::waitFd); ibv_req_notify_cq is inline (the context's ops).
  ibv_comp_channel* (*createCompChannel)(ibv_context*) = nullptr;
  int (*destroyCompChannel)(ibv_comp_channel*) = nullptr;
  int (*getCqEvent)(ibv_comp_channel*, ibv_cq**, void**) = nullptr;
  void (*ackCqEvents)(ibv_cq*, unsigned int) = nullptr;

  /// ibv_query_port through the context's op where the provider has one, else the compat export.
  int queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* out) const;
};

/// libibverbs, loaded once per process (C4_IB_LIBRARY). Fails with the loader's reason and what to
/// install when it is missing or lacks a function.
Status loadVerbs(const Verbs** out);

/// One usable port: a device, a port number, and how peers address it.
struct IbPort {
  std::string device;  ///< "mlx5_0", "rxe0"
  int port = 1;
  bool ethernet = false;  ///< RoCE (GIDs and UDP); else InfiniBand (LIDs)
  int gidIndex = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  std::string netdev;   ///< RoCE: the network interface of the GID ("" unknown)
  std::string gidText;  ///< the GID as IPv4/IPv6 text, for messages

  std::string name() const { return device + ":" + std::to_string(port); }
};

/// Whether `device`:`port` passes an NCCL_IB_HCA-style spec ("" passes everything).
bool hcaMatches(const std::string& spec, const std::string& device, int port);

/// RoCE GID choice from sysfs (`portDir` = /sys/class/infiniband/<dev>/ports/<port>): `wanted` >= 0
/// must exist (non-zero GID), else the RoCE v2 GID of an IPv4 address, else the first RoCE v2 one,
/// else index 0 when it is set. `gids` are the port's GIDs by index (unset: all zero).
Status pickRoceGid(const std::string& portDir, const std::vector<ibv_gid>& gids, int wanted, const std::string& what,
                   int* index);

/// Text of a GID: dotted IPv4 for an IPv4-mapped one, else IPv6.
std::string gidText(const ibv_gid& g);

/// The active ports that pass C4_IB_HCA, with their GID / LID. Fails naming the setting when none
/// does (no device at all, a filter that matches nothing, a GID index that does not exist).
Status discoverPorts(const Verbs& v, std::vector<IbPort>* out);

}  // namespace c4::transport::ib
