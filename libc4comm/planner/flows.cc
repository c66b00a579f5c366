#include "planner/flows.hpp"

#include <algorithm>
#include <map>

namespace c4::plan {

Status scheduleFlows(sched::Algo algo, Coll coll, int nranks, size_t bytes, const std::vector<int32_t>& hostOf,
                     std::vector<Flow>* out, sched::Algo* used) {
  out->clear();
  if (nranks < 2) return Status::ok();
  if (!sched::supports(algo, coll, nranks)) algo = sched::Algo::kRing;
  if (!sched::supports(algo, coll, nranks)) algo = sched::Algo::kDirect;
  if (used != nullptr) *used = algo;
  std::map<std::pair<int, int>, double> sum;
  for (int q = 0; q < nranks; ++q) {
    sched::CollArgs a;
    a.coll = coll;
    a.rank = q;
    a.nranks = nranks;
    a.count = std::max<size_t>(bytes / 4, static_cast<size_t>(nranks));
    a.dtype = DataType::kFloat32;
    a.reduces = coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
    a.chunkBytes = std::max<size_t>(bytes, 4);  // one piece per block: only the totals matter here
    a.hostOf = hostOf;
    auto sch = sched::generate(algo, a);
    if (!sch.isOk()) return sch.status();
    for (const sched::Step& s : sch.value().steps)
      if (s.kind == sched::StepKind::kSend) sum[{q, s.peer}] += static_cast<double>(s.src.bytes);
  }
  for (auto& [k, b] : sum) out->push_back(Flow{k.first, k.second, b});
  return Status::ok();
}

void addFlows(const std::vector<Flow>& more, std::vector<Flow>* flows) {
  std::map<std::pair<int, int>, size_t> at;
  for (size_t i = 0; i < flows->size(); ++i) at[{(*flows)[i].src, (*flows)[i].dst}] = i;
  for (const Flow& f : more) {
    auto it = at.find({f.src, f.dst});
    if (it != at.end()) {
      (*flows)[it->second].bytes += f.bytes;
    } else {
      at[{f.src, f.dst}] = flows->size();
      flows->push_back(f);
    }
  }
}

}  // namespace c4::plan
