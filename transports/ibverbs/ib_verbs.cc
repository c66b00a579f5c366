#include "transports/ibverbs/ib_verbs.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <mutex>

#include "common/logging.hpp"
#include "common/status.hpp"

namespace c4::transport::ib {

int Verbs::queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* out) const {
  memset(out, 0, sizeof(*out));
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, out, sizeof(*out));
  return queryPortCompat(ctx, port, out);
}

Status loadVerbs(const Verbs** out) {
  static std::mutex mu;
  static Verbs verbs;
  static Status loaded = Status(Code::kInternalError, "not loaded yet");
  static bool tried = false;
  std::lock_guard<std::mutex> g(mu);
  if (!tried) {
    tried = true;
    const std::string lib = paramIbLibrary();
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      loaded = makeError(Code::kSystemError,
                         "ibverbs: cannot load %s (C4_IB_LIBRARY): %s; install rdma-core's libibverbs1 and a provider "
                         "(ibverbs-providers), or choose another C4_TRANSPORT",
                         lib.c_str(), why ? why : "unknown reason");
    } else {
      std::string missing;
      auto sym = [&](auto* fn, const char* name) {
        void* p = dlsym(h, name);
        if (p == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
        *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
      };
      sym(&verbs.getDeviceList, "ibv_get_device_list");
      sym(&verbs.freeDeviceList, "ibv_free_device_list");
      sym(&verbs.getDeviceName, "ibv_get_device_name");
      sym(&verbs.openDevice, "ibv_open_device");
      sym(&verbs.closeDevice, "ibv_close_device");
      sym(&verbs.queryDevice, "ibv_query_device");
      sym(&verbs.queryPortCompat, "ibv_query_port");
      sym(&verbs.queryGid, "ibv_query_gid");
      sym(&verbs.allocPd, "ibv_alloc_pd");
      sym(&verbs.deallocPd, "ibv_dealloc_pd");
      sym(&verbs.regMr, "ibv_reg_mr");
      sym(&verbs.deregMr, "ibv_dereg_mr");
      sym(&verbs.createCq, "ibv_create_cq");
      sym(&verbs.destroyCq, "ibv_destroy_cq");
      sym(&verbs.createQp, "ibv_create_qp");
      sym(&verbs.modifyQp, "ibv_modify_qp");
      sym(&verbs.destroyQp, "ibv_destroy_qp");
      sym(&verbs.wcStatusStr, "ibv_wc_status_str");
      sym(&verbs.createCompChannel, "ibv_create_comp_channel");
      sym(&verbs.destroyCompChannel, "ibv_destroy_comp_channel");
      sym(&verbs.getCqEvent, "ibv_get_cq_event");
      sym(&verbs.ackCqEvents, "ibv_ack_cq_events");
      if (!missing.empty()) {
        loaded = makeError(Code::kSystemError, "ibverbs: %s (C4_IB_LIBRARY) lacks %s: not a usable libibverbs",
                           lib.c_str(), missing.c_str());
        dlclose(h);
      } else {
        loaded = Status::ok();  // kept loaded for the life of the process
      }
    }
  }
  *out = loaded.isOk() ? &verbs : nullptr;
  return loaded;
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t e = s.find(sep, at);
    out.push_back(s.substr(at, e == std::string::npos ? std::string::npos : e - at));
    if (e == std::string::npos) return out;
    at = e + 1;
  }
}

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool zeroGid(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b) return false;
  return true;
}

bool ipv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g.raw, prefix, 12) == 0;
}

}  // namespace

bool hcaMatches(const std::string& spec, const std::string& device, int port) {
  if (spec.empty()) return true;
  std::string s = spec;
  const bool exclude = s[0] == '^';
  if (exclude) s = s.substr(1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s = s.substr(1);
  bool hit = false;
  for (const std::string& item : split(s, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    const int wantPort = colon == std::string::npos ? -1 : atoi(item.c_str() + colon + 1);
    const bool nameOk = exact ? device == name : device.compare(0, name.size(), name) == 0;
    if (nameOk && (wantPort < 0 || wantPort == port)) hit = true;
  }
  return exclude ? !hit : hit;
}

std::string gidText(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ipv4Mapped(g)) return inet_ntop(AF_INET, g.raw + 12, buf, sizeof(buf)) ? buf : "?";
  return inet_ntop(AF_INET6, g.raw, buf, sizeof(buf)) ? buf : "?";
}

Status pickRoceGid(const std::string& portDir, const std::vector<ibv_gid>& gids, int wanted, const std::string& what,
                   int* index) {
  auto typeOf = [&](int i) { return readLine(portDir + "/gid_attrs/types/" + std::to_string(i)); };
  if (wanted >= 0) {
    if (wanted >= static_cast<int>(gids.size()) || zeroGid(gids[static_cast<size_t>(wanted)]))
      return makeError(Code::kInvalidArgument,
                       "ibverbs: %s has no GID at index %d (C4_IB_GID_INDEX / NCCL_IB_GID_INDEX; `show_gids` or "
                       "`ibv_devinfo -v` lists them)",
                       what.c_str(), wanted);
    *index = wanted;
    return Status::ok();
  }
  int firstV2 = -1;
  for (int i = 0; i < static_cast<int>(gids.size()); ++i) {
    if (zeroGid(gids[static_cast<size_t>(i)]) || typeOf(i) != "RoCE v2") continue;
    if (ipv4Mapped(gids[static_cast<size_t>(i)])) {
      *index = i;
      return Status::ok();
    }
    if (firstV2 < 0) firstV2 = i;
  }
  if (firstV2 >= 0) {
    *index = firstV2;
    return Status::ok();
  }
  if (!gids.empty() && !zeroGid(gids[0])) {
    *index = 0;
    return Status::ok();
  }
  return makeError(Code::kSystemError,
                   "ibverbs: %s has no RoCE GID (its interface has no address?); set C4_IB_GID_INDEX or give the "
                   "interface an address",
                   what.c_str());
}

Status discoverPorts(const Verbs& v, std::vector<IbPort>* out) {
  out->clear();
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  if (list == nullptr || n == 0) {
    if (list) v.freeDeviceList(list);
    return makeError(Code::kSystemError,
                     "ibverbs: no RDMA device on this host (ibv_get_device_list found none; `ibv_devices` lists them; "
                     "for Soft-RoCE: rdma link add rxe0 type rxe netdev <if>)");
  }
  const std::string spec = paramIbHca();
  const int wantedGid = static_cast<int>(paramIbGidIndex());
  std::string seen;
  Status firstError;
  for (int d = 0; d < n; ++d) {
    const std::string dev = v.getDeviceName(list[d]);
    ibv_context* ctx = v.openDevice(list[d]);
    if (ctx == nullptr) {
      C4_WARN(kLogNet, "ibverbs: cannot open %s: %s", dev.c_str(), strerror(errno));
      continue;
    }
    ibv_device_attr da{};
    if (v.queryDevice(ctx, &da) != 0) da.phys_port_cnt = 1;
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
      IbPort ip;
      ip.device = dev;
      ip.port = p;
      seen += (seen.empty() ? "" : ", ") + ip.name();
      if (!hcaMatches(spec, dev, p)) continue;
      ibv_port_attr pa{};
      if (v.queryPort(ctx, static_cast<uint8_t>(p), &pa) != 0 || pa.state != IBV_PORT_ACTIVE) {
        seen += " (not active)";
        continue;
      }
      ip.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      ip.lid = pa.lid;
      ip.mtu = pa.active_mtu;
      if (ip.ethernet) {
        std::vector<ibv_gid> gids(static_cast<size_t>(std::max(0, pa.gid_tbl_len)));
        for (size_t i = 0; i < gids.size(); ++i)
          if (v.queryGid(ctx, static_cast<uint8_t>(p), static_cast<int>(i), &gids[i]) != 0) memset(&gids[i], 0, 16);
        const std::string dir = "/sys/class/infiniband/" + dev + "/ports/" + std::to_string(p);
        Status st = pickRoceGid(dir, gids, wantedGid, ip.name(), &ip.gidIndex);
        if (!st.isOk()) {
          if (firstError.isOk()) firstError = st;
          continue;
        }
        ip.gid = gids[static_cast<size_t>(ip.gidIndex)];
        ip.netdev = readLine(dir + "/gid_attrs/ndevs/" + std::to_string(ip.gidIndex));
      } else {
        ip.gidIndex = wantedGid >= 0 ? wantedGid : 0;
        if (v.queryGid(ctx, static_cast<uint8_t>(p), ip.gidIndex, &ip.gid) != 0) memset(&ip.gid, 0, 16);
      }
      ip.gidText = gidText(ip.gid);
      out->push_back(ip);
    }
    v.closeDevice(ctx);
  }
  v.freeDeviceList(list);
  if (!out->empty()) return Status::ok();
  if (!firstError.isOk()) return firstError;
  if (!spec.empty())
    return makeError(Code::kInvalidArgument,
                     "ibverbs: C4_IB_HCA / NCCL_IB_HCA \"%s\" matches no active port (ports: %s)", spec.c_str(),
                     seen.c_str());
  return makeError(Code::kSystemError, "ibverbs: no active RDMA port (ports: %s)", seen.c_str());
}

}  // namespace c4::transport::ib
