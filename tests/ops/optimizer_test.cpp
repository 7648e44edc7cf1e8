// AdamW, the gradient clip and the learning-rate schedule on sharded parameters: the same
// result for every layout (replicated, split, split and replicated), one step checked against
// the formula by hand, and every bad argument refused naming it. (PyTorch itself checks the
// numbers over many steps: ops_optimizer_matches_pytorch.)

#include "numesh/ops/optimizer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "numesh/core/error.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using testing::make_mesh;
using testing::MeshCase;
using testing::random_host;
using ::testing::ThrowsMessage;

// `host` laid out by `spec` on `mesh`.
std::unique_ptr<runtime::ShardedTensor> laid(const runtime::DeviceMesh& mesh,
                                             const runtime::HostTensor& host,
                                             const sharding::PartitionSpec& spec) {
  auto t = std::make_unique<runtime::ShardedTensor>(mesh, host.shape, spec);
  runtime::scatter(host, *t);
  return t;
}

// Two AdamW steps against torch.optim.AdamW's formula, written out in double. beta2 = 0.999 keeps
// 1 - beta1 away from sqrt(1 - beta2): with beta2 = 0.99 a step that drops both bias corrections
// moves the parameters exactly as the corrected one does, so the test could not see it. The
// second step has a gradient of another size and sign, so the moments' history matters.
TEST(OptimizerTest, TwoAdamWStepsAreTorchsFormula) {
  const auto mesh = make_mesh(MeshCase{{1}, {"tp"}});
  runtime::HostTensor p = runtime::HostTensor::zeros({1, 2});
  p.data = {1.0f, -2.0f};
  const AdamWOptions o{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.5};
  auto pt = laid(mesh, p, sharding::PartitionSpec({{}, {}}));
  AdamW adam({pt.get()}, o);
  const std::vector<std::vector<float>> gradients{{0.5f, 0.25f}, {-0.125f, 1.5f}};
  std::vector<double> want(p.data.begin(), p.data.end()), m(2, 0.0), v(2, 0.0);
  for (std::size_t t = 1; t <= gradients.size(); ++t) {
    runtime::HostTensor g = runtime::HostTensor::zeros({1, 2});
    g.data = gradients[t - 1];
    auto gt = laid(mesh, g, pt->spec());
    const runtime::ShardedTensor* grads[] = {gt.get()};
    adam.step(grads);
    // torch: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    // p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    const double c1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double c2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    for (std::size_t e = 0; e < 2; ++e) {
      const double ge = g.data[e];
      m[e] = o.beta1 * m[e] + (1.0 - o.beta1) * ge;
      v[e] = o.beta2 * v[e] + (1.0 - o.beta2) * ge * ge;
      want[e] = want[e] * (1.0 - o.lr * o.weight_decay) -
                o.lr / c1 * m[e] / (std::sqrt(v[e]) / std::sqrt(c2) + o.eps);
    }
    const runtime::HostTensor got = runtime::gather(*pt);
    // fp32 moments and update: a few ulps of |p| <= 2 (a missing bias correction is off by ~2).
    for (std::size_t e = 0; e < 2; ++e)
      EXPECT_NEAR(got.data[e], want[e], 3e-6) << "step " << t << ", element " << e;
    EXPECT_EQ(adam.steps(), static_cast<std::int64_t>(t));
  }
}

TEST(OptimizerTest, EveryLayoutGivesTheSameParametersNormsAndMoments) {
  const runtime::HostTensor p0 = random_host({8, 6}, 1, 1.0f), p1 = random_host({5}, 2, 1.0f);
  std::vector<runtime::HostTensor> results;
  std::vector<double> norms;
  for (const MeshCase& c :
       {MeshCase{{1}, {"tp"}}, MeshCase{{2}, {"tp"}}, MeshCase{{2, 2}, {"dp", "tp"}}}) {
    const auto mesh = make_mesh(c);
    // The matrix split over tp (replicated over dp), the vector replicated everywhere.
    auto a = laid(mesh, p0, sharding::PartitionSpec({sharding::AxisRule("tp"), {}}));
    auto b = laid(mesh, p1, sharding::PartitionSpec({{}}));
    AdamW adam({a.get(), b.get()}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    const LearningRateSchedule schedule{
        .lr = 0.01, .warmup = 2, .total = 6, .kind = LearningRateSchedule::Kind::kCosine};
    for (std::uint32_t step = 0; step < 6; ++step) {
      auto ga = laid(mesh, random_host({8, 6}, 10 + step, 3.0f), a->spec());
      auto gb = laid(mesh, random_host({5}, 20 + step, 3.0f), b->spec());
      runtime::ShardedTensor* grads[] = {ga.get(), gb.get()};
      norms.push_back(clip_grad_norm(grads, 1.0));
      const runtime::ShardedTensor* cgrads[] = {ga.get(), gb.get()};
      adam.step(cgrads, schedule.at(step));
    }
    results.push_back(runtime::gather(*a));
    results.push_back(runtime::gather(*b));
    results.push_back(runtime::gather(adam.exp_avg_sq(0)));
  }
  for (std::size_t r = 3; r < results.size(); ++r)
    EXPECT_EQ(results[r], results[r % 3]) << "layout " << r / 3;
  for (std::size_t k = 6; k < norms.size(); ++k)
    EXPECT_DOUBLE_EQ(norms[k], norms[k % 6]) << "norms counted once";
}

// The trainer's fused clip: grad_norm, then AdamW reading each gradient scaled by the clip
// coefficient, gives the bits of clip_grad_norm scaling the gradients and a plain step, and
// leaves the gradients as they were.
TEST(OptimizerTest, TheClipFusedIntoTheUpdateIsTheClipThenTheUpdate) {
  const auto mesh = make_mesh(MeshCase{{2}, {"tp"}});
  const runtime::HostTensor p0 = random_host({300, 7}, 3, 1.0f),
                            g0 = random_host({300, 7}, 4, 5.0f);
  const sharding::PartitionSpec spec({sharding::AxisRule("tp"), {}});
  auto fused_p = laid(mesh, p0, spec), plain_p = laid(mesh, p0, spec);
  auto fused_g = laid(mesh, g0, spec), plain_g = laid(mesh, g0, spec);
  AdamW fused({fused_p.get()}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  AdamW plain({plain_p.get()}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    const runtime::ShardedTensor* fg[] = {fused_g.get()};
    const double norm = grad_norm(fg);
    const double scale = clip_coefficient(norm, 1.0);
    EXPECT_LT(scale, 0.01) << "the clip must act for the test to mean anything";
    fused.step(fg, 0.01, scale);
    runtime::ShardedTensor* pg[] = {plain_g.get()};
    EXPECT_DOUBLE_EQ(clip_grad_norm(pg, 1.0), norm);
    const runtime::ShardedTensor* cpg[] = {plain_g.get()};
    plain.step(cpg, 0.01);
    plain_g = laid(mesh, g0, spec);  // clip_grad_norm scaled it; the next step starts afresh
  }
  EXPECT_EQ(runtime::gather(*fused_p), runtime::gather(*plain_p));
  EXPECT_EQ(runtime::gather(fused.exp_avg_sq(0)), runtime::gather(plain.exp_avg_sq(0)));
  EXPECT_EQ(runtime::gather(*fused_g), g0) << "the fused update reads the gradients only";
  const runtime::ShardedTensor* fg[] = {fused_g.get()};
  EXPECT_THAT([&] { fused.step(fg, 0.01, -1.0); },
              ThrowsMessage<ValueError>(
                  HasSubstr("the gradients' scale -1 must be finite and not negative")));
  EXPECT_THAT([&] { clip_coefficient(2.0, 0.0); },
              ThrowsMessage<ValueError>(HasSubstr("max_norm 0 must be positive")));
}

TEST(OptimizerTest, ClippingScalesOnlyAboveTheLimitAndReturnsTheNormBefore) {
  const auto mesh = make_mesh(MeshCase{{2}, {"tp"}});
  runtime::HostTensor g = runtime::HostTensor::zeros({2, 2});
  g.data = {3.0f, 0.0f, 0.0f, 4.0f};  // norm 5
  auto gt = laid(mesh, g, sharding::PartitionSpec({sharding::AxisRule("tp"), {}}));
  runtime::ShardedTensor* grads[] = {gt.get()};
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 10.0), 5.0);
  EXPECT_EQ(runtime::gather(*gt), g) << "under the limit: untouched";
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 1.0), 5.0);
  const runtime::HostTensor clipped = runtime::gather(*gt);
  EXPECT_NEAR(clipped.data[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(clipped.data[3], 4.0 / (5.0 + 1e-6), 1e-7);
}

TEST(OptimizerTest, SchedulesWarmUpThenHoldOrDecay) {
  const LearningRateSchedule constant{.lr = 1.0, .warmup = 4, .total = 10};
  EXPECT_DOUBLE_EQ(constant.at(0), 0.0);
  EXPECT_DOUBLE_EQ(constant.at(2), 0.5);
  EXPECT_DOUBLE_EQ(constant.at(4), 1.0);
  EXPECT_DOUBLE_EQ(constant.at(100), 1.0);
  const LearningRateSchedule cosine{
      .lr = 2.0, .warmup = 2, .total = 6, .kind = LearningRateSchedule::Kind::kCosine};
  EXPECT_DOUBLE_EQ(cosine.at(1), 1.0);
  EXPECT_DOUBLE_EQ(cosine.at(2), 2.0);
  EXPECT_NEAR(cosine.at(4), 1.0, 1e-12) << "half way down";
  EXPECT_DOUBLE_EQ(cosine.at(6), 0.0);
  EXPECT_DOUBLE_EQ(cosine.at(9), 0.0) << "past the end: held at 0";
}

TEST(OptimizerTest, BadArgumentsAreNamed) {
  const auto mesh = make_mesh(MeshCase{{2}, {"tp"}});
  auto p = laid(mesh, random_host({4, 2}, 1, 1.0f),
                sharding::PartitionSpec({sharding::AxisRule("tp"), {}}));
  EXPECT_THAT([&] { AdamW({p.get()}, AdamWOptions{.beta1 = 1.0}); },
              ThrowsMessage<ValueError>("adamw: invalid beta parameter at index 0: 1"));
  EXPECT_THAT([&] { AdamW({p.get()}, AdamWOptions{.lr = -1.0}); },
              ThrowsMessage<ValueError>("adamw: invalid learning rate -1"));
  EXPECT_THAT([&] { AdamW({nullptr}, AdamWOptions{}); },
              ThrowsMessage<ValueError>("adamw: parameter 0 is null"));
  AdamW adam({p.get()}, AdamWOptions{});
  auto replicated = laid(mesh, random_host({4, 2}, 2, 1.0f), sharding::PartitionSpec({{}, {}}));
  const runtime::ShardedTensor* wrong[] = {replicated.get()};
  EXPECT_THAT([&] { adam.step(wrong); },
              ThrowsMessage<ShapeError>(HasSubstr(
                  "adamw: gradient 0 is f32 [4, 2] P(None, None) but its parameter is f32 "
                  "[4, 2] P('tp', None)")));
  EXPECT_THAT([&] { adam.step(std::span<const runtime::ShardedTensor* const>{}); },
              ThrowsMessage<ShapeError>("adamw: 0 gradients for 1 parameters"));
  runtime::ShardedTensor* grads[] = {p.get()};
  EXPECT_THAT([&] { clip_grad_norm(grads, 0.0); },
              ThrowsMessage<ValueError>("clip_grad_norm: max_norm 0 must be positive"));
  const LearningRateSchedule bad{.lr = 1.0, .warmup = -1};
  EXPECT_THAT([&] { bad.validate(); },
              ThrowsMessage<ValueError>(HasSubstr("warmup -1 must not be negative")));
  EXPECT_EQ(adam.steps(), 0) << "refused steps count nothing";
}

}  // namespace
}  // namespace numesh::ops
