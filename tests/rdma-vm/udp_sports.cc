// c4-udp-sports: which UDP source ports carry RoCE v2 traffic on an interface (the Soft-RoCE VMs'
// check that each queue pair leaves from the source port it was asked for).
//   c4-udp-sports IFACE SECONDS [DPORT=4791]
// Reads the interface's IPv4/UDP packets to DPORT for SECONDS, or until SIGINT/SIGTERM (an AF_PACKET
// socket; root), and prints "sport N: K packets" per source port, "to ADDR qp 0xQPN: K packets" per
// destination address and queue pair (the BTH's destination QP: which lane a packet belongs to),
// then "total: K".
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

namespace {
volatile sig_atomic_t gStop = 0;
void onSignal(int) { gStop = 1; }
}  // namespace

int main(int argc, char** argv) {
  signal(SIGINT, onSignal);
  signal(SIGTERM, onSignal);
  if (argc < 3) {
    fprintf(stderr, "usage: c4-udp-sports IFACE SECONDS [DPORT=4791]\n");
    return 2;
  }
  const unsigned ifindex = if_nametoindex(argv[1]);
  const double seconds = atof(argv[2]);
  const int dport = argc > 3 ? atoi(argv[3]) : 4791;
  if (ifindex == 0) {
    perror(argv[1]);
    return 1;
  }
  const int fd = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));  // from the IP header on
  if (fd < 0) {
    perror("socket(AF_PACKET)");
    return 1;
  }
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_IP);
  sll.sll_ifindex = static_cast<int>(ifindex);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof(sll)) != 0) {
    perror("bind");
    return 1;
  }
  timespec t0{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  std::map<int, long> ports;
  std::map<std::pair<uint32_t, uint32_t>, long> qps;  // (destination address, destination QP)
  long total = 0;
  unsigned char buf[65536];
  for (;;) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double left = seconds - ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9);
    if (left <= 0 || gStop) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < static_cast<ssize_t>(sizeof(iphdr))) continue;
    const auto* ip = reinterpret_cast<const iphdr*>(buf);
    const size_t ihl = static_cast<size_t>(ip->ihl) * 4;
    if (ip->protocol != IPPROTO_UDP || static_cast<size_t>(n) < ihl + sizeof(udphdr)) continue;
    const auto* udp = reinterpret_cast<const udphdr*>(buf + ihl);
    if (ntohs(udp->dest) != dport) continue;
    ++ports[ntohs(udp->source)];
    // RoCE v2: the Base Transport Header follows the UDP header; bytes 5-7 are the destination QP.
    const size_t bth = ihl + sizeof(udphdr);
    if (static_cast<size_t>(n) >= bth + 12) {
      const uint32_t qpn = (uint32_t{buf[bth + 5]} << 16) | (uint32_t{buf[bth + 6]} << 8) | buf[bth + 7];
      ++qps[{ntohl(ip->daddr), qpn}];
    }
    ++total;
  }
  for (const auto& kv : ports) printf("sport %d: %ld packets\n", kv.first, kv.second);
  for (const auto& kv : qps) {
    in_addr a{};
    a.s_addr = htonl(kv.first.first);
    printf("to %s qp 0x%06x: %ld packets\n", inet_ntoa(a), kv.first.second, kv.second);
  }
  printf("total: %ld\n", total);
  return 0;
}
