#include "common/opsig.hpp"

#include "common/status.hpp"

namespace c4 {
namespace {
constexpr uint8_t kUserOp = 0xff;
bool isP2p(uint8_t c) { return c == static_cast<uint8_t>(Coll::kSend) || c == static_cast<uint8_t>(Coll::kRecv); }
const char* opText(uint8_t op) { return op == kUserOp ? "premulsum" : redOpName(static_cast<RedOp>(op)); }
bool usesOp(uint8_t c) {
  auto k = static_cast<Coll>(c);
  return k == Coll::kAllReduce || k == Coll::kReduceScatter || k == Coll::kReduce;
}
bool usesRoot(uint8_t c) {
  auto k = static_cast<Coll>(c);
  return k == Coll::kBroadcast || k == Coll::kReduce || k == Coll::kGather || k == Coll::kScatter;
}
}  // namespace

bool sigMatches(const OpSig& sent, const OpSig& expected) {
  if (isP2p(sent.coll) && isP2p(expected.coll)) {
    return sent.coll != expected.coll && sent.count == expected.count && sent.dtype == expected.dtype &&
           sent.seq == expected.seq;
  }
  return sent.coll == expected.coll && sent.seq == expected.seq && sent.count == expected.count &&
         sent.dtype == expected.dtype && sent.op == expected.op && sent.root == expected.root;
}

std::string describeSig(const OpSig& s) {
  std::string out = strFormat("%s seq %llu count %llu %s", collName(static_cast<Coll>(s.coll)),
                              static_cast<unsigned long long>(s.seq), static_cast<unsigned long long>(s.count),
                              dataTypeName(static_cast<DataType>(s.dtype)));
  if (usesOp(s.coll)) out += std::string(" ") + opText(s.op);
  if (usesRoot(s.coll)) out += strFormat(" root %d", s.root);
  return out;
}

std::string diffSigs(const OpSig& a, const OpSig& b) {
  std::string out;
  auto add = [&out](const std::string& s) {
    if (!out.empty()) out += "; ";
    out += s;
  };
  bool p2pPair = isP2p(a.coll) && isP2p(b.coll);
  if (a.coll != b.coll && !p2pPair)
    add(strFormat("collective %s vs %s", collName(static_cast<Coll>(a.coll)), collName(static_cast<Coll>(b.coll))));
  if (a.seq != b.seq)
    add(strFormat("sequence %llu vs %llu", static_cast<unsigned long long>(a.seq),
                  static_cast<unsigned long long>(b.seq)));
  if (a.count != b.count)
    add(strFormat("count %llu vs %llu", static_cast<unsigned long long>(a.count),
                  static_cast<unsigned long long>(b.count)));
  if (a.dtype != b.dtype)
    add(strFormat("datatype %s vs %s", dataTypeName(static_cast<DataType>(a.dtype)),
                  dataTypeName(static_cast<DataType>(b.dtype))));
  if (!p2pPair && a.op != b.op) add(strFormat("op %s vs %s", opText(a.op), opText(b.op)));
  if (!p2pPair && a.root != b.root) add(strFormat("root %d vs %d", a.root, b.root));
  if (out.empty()) out = "no difference in signature";
  return out;
}

}  // namespace c4
