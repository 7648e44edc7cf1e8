// The dense references' gradients: every bad argument refused naming it, and one gradient by
// hand. (PyTorch's autograd checks the numbers: ops_backward_matches_pytorch.)

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/ops/reference/backward.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using testing::random_host;
using ::testing::ThrowsMessage;

TEST(BackwardReferenceTest, CrossEntropyOfUniformLogitsIsLogVAndItsGradientSoftmaxMinusOneHot) {
  // Zero weights: every logit 0, loss log V, d logits = (1/V - onehot) / rows, so dw = x^T dl.
  runtime::HostTensor x = runtime::HostTensor::zeros({1, 2}),
                      w = runtime::HostTensor::zeros({2, 4});
  x.data = {1.0f, 2.0f};
  const std::vector<std::int32_t> targets{3};
  const CrossEntropyGrads g = lm_head_cross_entropy(x, w, targets);
  EXPECT_NEAR(g.loss, std::log(4.0), 1e-12);
  EXPECT_FLOAT_EQ(g.dw.data[0], 0.25f);               // x0 * (1/4)
  EXPECT_FLOAT_EQ(g.dw.data[3], 1.0f * (0.25f - 1));  // x0 * (1/4 - 1) for the target
  EXPECT_FLOAT_EQ(g.dw.data[7], 2.0f * (0.25f - 1));
}

TEST(BackwardReferenceTest, BadArgumentsAreNamed) {
  const runtime::HostTensor x = random_host({3, 4}, 1, 1.0f);
  EXPECT_THAT(
      [&] {
        rmsnorm_backward(x, random_host({1, 5}, 2, 1.0f), x, 1e-6);
      },
      ThrowsMessage<ShapeError>("rmsnorm backward: weight is [1, 5], expected [1, 4]"));
  EXPECT_THAT(
      [&] {
        rmsnorm_backward(x, random_host({1, 4}, 2, 1.0f), x, -1.0);
      },
      ThrowsMessage<ValueError>("rmsnorm backward: eps -1 is negative"));
  EXPECT_THAT(
      [&] {
        layernorm_backward(x, random_host({1, 5}, 2, 1.0f), x, 1e-5);
      },
      ThrowsMessage<ShapeError>("layernorm backward: weight is [1, 5], expected [1, 4]"));
  EXPECT_THAT(
      [&] {
        layernorm_backward(x, random_host({1, 4}, 2, 1.0f), random_host({2, 4}, 3, 1.0f), 1e-5);
      },
      ThrowsMessage<ShapeError>("layernorm backward: dy is [2, 4], expected [3, 4]"));
  EXPECT_THAT(
      [&] {
        layernorm_backward(x, random_host({1, 4}, 2, 1.0f), x, -1.0);
      },
      ThrowsMessage<ValueError>("layernorm backward: eps -1 is negative"));
  EXPECT_THAT(
      [&] {
        linear_backward(x, random_host({5, 2}, 3, 1.0f), random_host({3, 2}, 4, 1.0f));
      },
      ThrowsMessage<ShapeError>("linear backward: w is [5, 2], expected [4, 2]"));
  MlpWeights mlp{.gate = random_host({4, 6}, 5, 1.0f),
                 .up = random_host({4, 6}, 6, 1.0f),
                 .down = random_host({6, 4}, 7, 1.0f)};
  mlp.up_bias = random_host({5}, 8, 1.0f);
  EXPECT_THAT([&] { mlp_backward(x, MlpKind::kSwiGLU, mlp, x); },
              ThrowsMessage<ShapeError>("swiglu backward: up bias is [5], expected [1, 6]"));
  mlp.up_bias = {};
  mlp.stored_as = MlpFormats::all(DType::kBF16);
  EXPECT_THAT(
      [&] { mlp_backward(x, MlpKind::kSwiGLU, mlp, x); },
      ThrowsMessage<NotImplementedError>(HasSubstr("16-bit weights are not differentiated yet")));
  const std::vector<std::int32_t> ids{0, 10, 1};
  EXPECT_THAT(
      [&] { embedding_backward(ids, 10, x); },
      ThrowsMessage<IndexError>("embedding backward: token 10 at row 1 is outside [0, 10)"));
  const std::vector<std::int32_t> targets{0, 1, 7};
  EXPECT_THAT(
      [&] {
        lm_head_cross_entropy(x, random_host({4, 7}, 9, 1.0f), targets);
      },
      ThrowsMessage<IndexError>("cross entropy: target 7 at row 2 is outside [0, 7)"));
  EXPECT_THAT(
      [&] {
        lm_head_cross_entropy(x, random_host({4, 7}, 9, 1.0f), std::vector<std::int32_t>{0});
      },
      ThrowsMessage<ShapeError>("cross entropy: 1 targets for 3 rows (at least one)"));
}

}  // namespace
}  // namespace numesh::ops
