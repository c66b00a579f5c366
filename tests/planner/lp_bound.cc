#include "lp_bound.hpp"

#include <glpk.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace c4test {

using c4::plan::HostPort;
using c4::plan::RankPlace;
using c4::plan::Topology;

LpBound lpLowerBound(const c4::plan::PlanInput& in) {
  LpBound r;
  const Topology& t = *in.topo;
  // Connections as the planner forms them: same-host and empty flows carry nothing over the fabric.
  std::map<std::pair<int, int>, std::pair<double, double>> conns;
  for (const c4::plan::Flow& f : in.flows) {
    if (f.src == f.dst || f.bytes <= 0) continue;
    if (in.ranks[static_cast<size_t>(f.src)].host == in.ranks[static_cast<size_t>(f.dst)].host) continue;
    auto& c = conns[{std::min(f.src, f.dst), std::max(f.src, f.dst)}];
    (f.src < f.dst ? c.first : c.second) += f.bytes;
  }
  if (conns.empty()) {
    r.ok = true;
    return r;
  }
  // Columns: 1 is t, then one per (connection, candidate). Coefficients in units of `unit`
  // seconds, so that the LP's numbers are near 1.
  struct Col {
    int conn;
    std::map<int, double> secs;  // directed link -> seconds this candidate puts there if chosen whole
  };
  std::vector<Col> cols;
  double unit = 0;
  std::vector<int> fwd;
  int ci = 0;
  for (const auto& [k, bytes] : conns) {
    const RankPlace& ra = in.ranks[static_cast<size_t>(k.first)];
    const RankPlace& rb = in.ranks[static_cast<size_t>(k.second)];
    for (int pa : ra.ports)
      for (int pb : rb.ports) {
        const HostPort ha{ra.host, pa}, hb{rb.host, pb};
        for (int i = 0; i < t.numPaths(ha, hb); ++i) {
          Col c;
          c.conn = ci;
          t.pathLinks(ha, hb, i, &fwd);
          for (int l : fwd) {
            if (bytes.first > 0) c.secs[l] += bytes.first * 8.0 / t.link(l).bps;
            if (bytes.second > 0) c.secs[t.link(l).reverse] += bytes.second * 8.0 / t.link(t.link(l).reverse).bps;
          }
          for (auto& [l, s] : c.secs) unit = std::max(unit, s);
          cols.push_back(std::move(c));
        }
      }
    ++ci;
  }
  // Rows: one per connection (fractions sum to 1), then one per directed link any candidate uses.
  std::map<int, int> linkRow;
  for (const Col& c : cols)
    for (const auto& [l, s] : c.secs) linkRow.emplace(l, 0);
  const int nConn = ci;
  int row = nConn;
  for (auto& [l, rr] : linkRow) rr = ++row;

  glp_term_out(GLP_OFF);
  glp_prob* lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  glp_add_rows(lp, row);
  for (int i = 1; i <= nConn; ++i) glp_set_row_bnds(lp, i, GLP_FX, 1.0, 1.0);
  for (int i = nConn + 1; i <= row; ++i) glp_set_row_bnds(lp, i, GLP_UP, 0.0, 0.0);
  const int ncols = 1 + static_cast<int>(cols.size());
  glp_add_cols(lp, ncols);
  glp_set_col_bnds(lp, 1, GLP_LO, 0.0, 0.0);
  glp_set_obj_coef(lp, 1, 1.0);
  for (int j = 2; j <= ncols; ++j) glp_set_col_bnds(lp, j, GLP_LO, 0.0, 0.0);
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  auto put = [&](int i, int j, double v) {
    ia.push_back(i);
    ja.push_back(j);
    ar.push_back(v);
  };
  for (const auto& [l, rr] : linkRow) put(rr, 1, -1.0);
  for (size_t c = 0; c < cols.size(); ++c) {
    const int j = static_cast<int>(c) + 2;
    put(cols[c].conn + 1, j, 1.0);
    for (const auto& [l, s] : cols[c].secs) put(linkRow[l], j, s / unit);
  }
  glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  const int rc = glp_simplex(lp, &parm);
  if (rc != 0 || glp_get_status(lp) != GLP_OPT) {
    r.error = "glp_simplex returned " + std::to_string(rc) + ", status " + std::to_string(glp_get_status(lp));
  } else {
    r.ok = true;
    r.seconds = glp_get_obj_val(lp) * unit;
  }
  r.vars = ncols;
  r.rows = row;
  glp_delete_prob(lp);
  return r;
}

}  // namespace c4test
