#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "backward_detail.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/backward.hpp"

// The MoE layer's reference gradients (router, experts, shared expert) and the router's
// load-balancing loss.

namespace numesh::ops {

using oracle::checked_matrix;
using oracle::GatedGradsD;
using oracle::matrix_dim;
using oracle::MatrixD;

MoeGrads moe_backward(const runtime::HostTensor& x, const MoeWeights& w, const MoeConfig& c,
                      const runtime::HostTensor& dy, std::span<const double> dprobs) {
  NUMESH_CHECK(w.stored_as.all_are(DType::kF32) && w.shared_expert.stored_as.all_are(DType::kF32),
               NotImplementedError, "moe backward: 16-bit experts are not differentiated yet");
  const std::int64_t t = matrix_dim(x, 0, "moe backward: x"),
                     h = matrix_dim(x, 1, "moe backward: x");
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e && c.capacity_factor >= 0.0f, ValueError,
               "moe backward: top_k {} must be between 1 and the {} experts and capacity_factor {} "
               "not negative",
               k, e, c.capacity_factor);
  const std::int64_t f = w.gate.shape.size() == 3 ? w.gate.shape[2] : -1;
  NUMESH_CHECK(
      f > 0 && w.gate.shape == (std::vector<std::int64_t>{e, h, f}) && w.up.shape == w.gate.shape &&
          w.down.shape == (std::vector<std::int64_t>{e, f, h}),
      ShapeError, "moe backward: gate [{}], up [{}], down [{}] do not fit {} experts and hidden {}",
      fmt::join(w.gate.shape, ", "), fmt::join(w.up.shape, ", "), fmt::join(w.down.shape, ", "), e,
      h);
  NUMESH_CHECK(dprobs.empty() || static_cast<std::int64_t>(dprobs.size()) == e, ShapeError,
               "moe backward: {} probability gradients for {} experts", dprobs.size(), e);
  check_shared_expert(w, h);
  const MatrixD xm = checked_matrix(x, t, h, "moe backward: x");
  const MatrixD wr = checked_matrix(w.router, h, e, "moe backward: router");
  const MatrixD g = checked_matrix(dy, t, h, "moe backward: dy");
  const oracle::Routing r = oracle::route(xm, w.router, c);

  // y[t] = sum over kept choices j of w_tj E_j(x[t]). The experts see dy scaled by the weight;
  // each weight sees dy . E_j(x[t]) (dropped choices: nothing).
  MatrixD dx = MatrixD::Zero(t, h), dweight = MatrixD::Zero(t, k);
  MatrixD dgate(e * h, f), dup(e * h, f), ddown(e * f, h);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    std::vector<std::pair<std::int64_t, std::int64_t>> uses;  // (token, choice) kept for ex
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (std::int64_t j = 0; j < k; ++j) {
        const auto i = static_cast<std::size_t>(ti), jj = static_cast<std::size_t>(j);
        if (r.kept[i][jj] && r.chosen[i][jj] == ex) uses.emplace_back(ti, j);
      }
    }
    const MatrixD wg = oracle::widen(w.gate.data.data() + ex * h * f, h, f);
    const MatrixD wu = oracle::widen(w.up.data.data() + ex * h * f, h, f);
    const MatrixD wd = oracle::widen(w.down.data.data() + ex * f * h, f, h);
    const auto n = static_cast<Eigen::Index>(uses.size());
    MatrixD xe(n, h), ge(n, h);
    for (Eigen::Index u = 0; u < n; ++u) {
      const auto [ti, j] = uses[static_cast<std::size_t>(u)];
      xe.row(u) = xm.row(ti);
      ge.row(u) = r.weight[static_cast<std::size_t>(ti)][static_cast<std::size_t>(j)] * g.row(ti);
    }
    const MatrixD out = oracle::swiglu_mlp(xe, wg, wu, wd);
    const GatedGradsD d = oracle::gated_gradients(Activation::kSilu, xe, wg, wu, wd, ge);
    for (Eigen::Index u = 0; u < n; ++u) {
      const auto [ti, j] = uses[static_cast<std::size_t>(u)];
      dx.row(ti) += d.dx.row(u);
      dweight(ti, j) = g.row(ti).dot(out.row(u));
    }
    dgate.middleRows(ex * h, h) = d.dgate;
    dup.middleRows(ex * h, h) = d.dup;
    ddown.middleRows(ex * f, f) = d.ddown;
  }
  // Through the weights to the probabilities: w_j = p_j / Z with Z the sum of the k chosen
  // probabilities (renormalised), so dp_i = (dw_i - sum_j w_j dw_j) / Z; else dp_i = dw_i.
  // Then the softmax: dlogits = p .* (dp - p . dp).
  MatrixD dlogits = MatrixD::Zero(t, e);
  for (std::int64_t ti = 0; ti < t; ++ti) {
    const auto i = static_cast<std::size_t>(ti);
    double z = 0.0, mean = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      z += r.probs(ti, r.chosen[i][static_cast<std::size_t>(j)]);
      mean += r.weight[i][static_cast<std::size_t>(j)] * dweight(ti, j);
    }
    Eigen::RowVectorXd dp = Eigen::RowVectorXd::Zero(e);
    for (std::int64_t j = 0; j < k; ++j) {
      dp(r.chosen[i][static_cast<std::size_t>(j)]) =
          c.renormalize ? (dweight(ti, j) - mean) / z : dweight(ti, j);
    }
    for (std::size_t ex = 0; ex < dprobs.size(); ++ex)
      dp(static_cast<Eigen::Index>(ex)) += dprobs[ex];
    const double pdp = r.probs.row(ti).dot(dp);
    dlogits.row(ti) = r.probs.row(ti).array() * (dp.array() - pdp);
  }
  dx += dlogits * wr.transpose();
  MoeGrads out;
  out.drouter = oracle::narrow(xm.transpose() * dlogits, {h, e});
  out.dgate = oracle::narrow(dgate, {e, h, f});
  out.dup = oracle::narrow(dup, {e, h, f});
  out.ddown = oracle::narrow(ddown, {e, f, h});
  // The shared expert: y += s S(x) with s = sigmoid(x g) per token. S sees dy scaled by s; the
  // gate's logit gets s (1 - s) (dy . S(x)).
  if (w.has_shared_expert()) {
    const std::int64_t fs = w.shared_expert.up.shape[1];
    const MatrixD sg =
        checked_matrix(w.shared_expert.gate, h, fs, "moe backward: shared expert gate");
    const MatrixD su = checked_matrix(w.shared_expert.up, h, fs, "moe backward: shared expert up");
    const MatrixD sd =
        checked_matrix(w.shared_expert.down, fs, h, "moe backward: shared expert down");
    const MatrixD gate =
        checked_matrix(w.shared_expert_gate, h, 1, "moe backward: shared_expert_gate");
    const MatrixD logit = xm * gate;
    const MatrixD shared = oracle::swiglu_mlp(xm, sg, su, sd);
    MatrixD scaled(t, h), dlogit(t, 1);
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const double s = oracle::sigmoid(logit(ti, 0));
      scaled.row(ti) = s * g.row(ti);
      dlogit(ti, 0) = s * (1.0 - s) * g.row(ti).dot(shared.row(ti));
    }
    const GatedGradsD d = oracle::gated_gradients(Activation::kSilu, xm, sg, su, sd, scaled);
    dx += d.dx + dlogit * gate.transpose();
    out.dshared_gate = oracle::narrow(d.dgate, {h, fs});
    out.dshared_up = oracle::narrow(d.dup, {h, fs});
    out.dshared_down = oracle::narrow(d.ddown, {fs, h});
    out.dshared_expert_gate = oracle::narrow(xm.transpose() * dlogit, {h, 1});
  }
  out.dx = oracle::narrow(dx, {t, h});
  return out;
}

RouterAuxLoss router_aux_loss(const std::vector<runtime::HostTensor>& xs,
                              const std::vector<runtime::HostTensor>& routers, const MoeConfig& c) {
  NUMESH_CHECK(!xs.empty() && xs.size() == routers.size(), ValueError,
               "router aux loss: {} layers' inputs and {} routers (at least one of each, as many)",
               xs.size(), routers.size());
  const std::int64_t e = c.num_experts, k = c.top_k;
  NUMESH_CHECK(e >= 1 && k >= 1 && k <= e, ValueError,
               "router aux loss: top_k {} must be between 1 and the {} experts", k, e);
  std::vector<double> choices(static_cast<std::size_t>(e), 0.0),
      probs(static_cast<std::size_t>(e), 0.0);
  std::int64_t n = 0;
  for (std::size_t l = 0; l < xs.size(); ++l) {
    const std::int64_t t = matrix_dim(xs[l], 0, "router aux loss: x"),
                       h = matrix_dim(xs[l], 1, "router aux loss: x");
    NUMESH_CHECK(routers[l].shape == (std::vector<std::int64_t>{h, e}), ShapeError,
                 "router aux loss: layer {}'s router is [{}], expected [{}, {}]", l,
                 fmt::join(routers[l].shape, ", "), h, e);
    const oracle::Routing r =
        oracle::route(checked_matrix(xs[l], t, h, "router aux loss: x"), routers[l], c);
    for (std::int64_t ti = 0; ti < t; ++ti) {
      for (const std::int64_t ex : r.chosen[static_cast<std::size_t>(ti)])
        choices[static_cast<std::size_t>(ex)] += 1.0;
      for (std::int64_t ex = 0; ex < e; ++ex)
        probs[static_cast<std::size_t>(ex)] += r.probs(ti, ex);
    }
    n += t;
  }
  RouterAuxLoss out;
  const double nn = static_cast<double>(n) * static_cast<double>(n);
  for (std::int64_t ex = 0; ex < e; ++ex) {
    const auto i = static_cast<std::size_t>(ex);
    out.loss += static_cast<double>(e) * choices[i] * probs[i] / nn;
    out.dprobs.push_back(static_cast<double>(e) * choices[i] / nn);
  }
  return out;
}

}  // namespace numesh::ops
