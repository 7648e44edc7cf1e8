#include "numesh/ops/lowering/program.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "numesh/core/error.hpp"
#include "numesh/ops/lowering/mlp.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using testing::devices;
using ::testing::HasSubstr;
using testing::random_host;
using ::testing::ThrowsMessage;

// A program that all-reduces its input over tp: x [4, 6] placed Partial(sum) over tp (each
// device holds a full-size summand, here the same x), y = 2x replicated.
Program sum_program(const runtime::DeviceMesh& mesh) {
  ProgramBuilder pb(mesh, "sum");
  runtime::Frontier loaded;
  runtime::ShardedTensor& x = pb.input("x", {4, 6}, sharding::PartitionSpec::replicated(2), loaded);
  runtime::ShardedTensor& y =
      pb.tensor("y", TensorRole::kOutput, {4, 6}, sharding::PartitionSpec::replicated(2));
  const runtime::Frontier done = pb.reshard(x, {sharding::Placement::partial()}, y,
                                            {sharding::Placement::replicate()}, loaded, "sum.out");
  pb.output("y", y, done);
  return std::move(pb).compile();
}

TEST(ProgramTest, InputsAndOutputsStageThroughTheGraph) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  Program p = sum_program(mesh);
  const runtime::HostTensor x = random_host({4, 6}, 1, 1.0f);
  p.set_input("x", x);
  p.run();
  const runtime::HostTensor& y = p.output("y");
  for (std::size_t i = 0; i < x.data.size(); ++i) ASSERT_EQ(y.data[i], 2.0f * x.data[i]) << i;
  const runtime::HostTensor x2 = random_host({4, 6}, 2, 1.0f);
  p.set_input("x", x2);
  p.run();
  EXPECT_EQ(p.output("y").data[5], 2.0f * x2.data[5]) << "a rebound input is read on the next run";
}

TEST(ProgramTest, ThePlanCountsTensorsCollectivesAndMemory) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  Program p = sum_program(mesh);
  const ProgramPlan& plan = p.plan();
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(plan.tensors[0].role, TensorRole::kInput);
  EXPECT_EQ(plan.tensors[0].shard_bytes, 4 * 6 * 4);
  ASSERT_EQ(plan.collectives.size(), 1u);
  EXPECT_EQ(plan.collectives[0].step.kind, sharding::ReshardStep::Kind::kAllReduce);
  EXPECT_EQ(plan.collectives[0].payload_bytes, 96);
  EXPECT_EQ(plan.collectives[0].moved_bytes, 96) << "2 (g - 1) / g of the payload for g = 2";
  EXPECT_EQ(plan.memory_bytes, (std::vector<std::int64_t>{192, 192}));
  EXPECT_THAT(plan.text(), HasSubstr("collectives move 96 B per device per run"));
  EXPECT_EQ(plan.to_json()["collectives"][0]["moved_bytes"], 96);
}

TEST(ProgramTest, BadBindingsAreRefusedNamingThem) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  Program p = sum_program(mesh);
  EXPECT_THAT([&] { p.run(); },
              ThrowsMessage<ValueError>(HasSubstr("program sum: input 'x' was never set")));
  EXPECT_THAT(
      [&] {
        p.set_input("z", random_host({4, 6}, 1, 1.0f));
      },
      ThrowsMessage<KeyError>(HasSubstr("program sum has no input 'z'")));
  EXPECT_THAT(
      [&] {
        p.set_input("x", random_host({4, 5}, 1, 1.0f));
      },
      ThrowsMessage<ShapeError>(HasSubstr("input 'x' is [4, 6], got [4, 5]")));
  EXPECT_THAT([&] { (void)p.output("x"); },
              ThrowsMessage<KeyError>(HasSubstr("program sum has no output 'x'")));
  ProgramBuilder pb(mesh, "twice");
  runtime::Frontier loaded;
  pb.input("x", {2}, sharding::PartitionSpec::replicated(1), loaded);
  EXPECT_THAT([&] { pb.input("x", {2}, sharding::PartitionSpec::replicated(1), loaded); },
              ThrowsMessage<KeyError>(HasSubstr("'x' is already an input or output")));
}

// The collectives are injected: a builder given counting wrappers sees every collective an
// operator emits, and each all-reduce algorithm pinned through them gives the dense result.
TEST(ProgramTest, CollectivesAreInjectableCountableAndTheirAlgorithmPinned) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  MlpWeights w{
      .gate = {}, .up = random_host({16, 32}, 1, 0.3f), .down = random_host({32, 16}, 2, 0.3f)};
  const MlpLayer layer = MlpLayer::create(mesh, MlpKind::kGelu, w);
  const runtime::HostTensor x = random_host({8, 16}, 3, 1.0f);
  const RowMatrix want =
      mlp_gelu_reference(Eigen::Map<const RowMatrix>(x.data.data(), 8, 16),
                         Eigen::Map<const RowMatrix>(w.up.data.data(), 16, 32),
                         Eigen::Map<const RowMatrix>(w.down.data.data(), 32, 16));
  for (runtime::AllReduceAlgorithm algorithm :
       {runtime::AllReduceAlgorithm::kDirect,
        runtime::AllReduceAlgorithm::kReduceScatterAllGather}) {
    CollectiveOps ops = CollectiveOps::runtime_collectives(algorithm);
    int all_reduces = 0, others = 0;
    std::vector<std::string> axes_seen;
    ops.all_reduce = [&, inner = ops.all_reduce](runtime::GraphBuilder& b,
                                                 runtime::ShardedTensor& in,
                                                 runtime::ShardedTensor& out, runtime::ReduceOp op,
                                                 const runtime::CollectiveArgs& args) {
      ++all_reduces;
      axes_seen.insert(axes_seen.end(), args.axes.begin(), args.axes.end());
      return inner(b, in, out, op, args);
    };
    ops.redistribute = [&, inner = ops.redistribute](
                           runtime::GraphBuilder& b, runtime::ShardedTensor& in,
                           runtime::ShardedTensor& out, const runtime::CollectiveArgs& args) {
      ++others;
      return inner(b, in, out, args);
    };
    ProgramBuilder pb(mesh, "mlp", ops);
    runtime::Frontier loaded;
    runtime::ShardedTensor& xs =
        pb.input("x", {8, 16}, sharding::PartitionSpec::replicated(2), loaded);
    runtime::ShardedTensor& ys =
        pb.tensor("y", TensorRole::kOutput, {8, 16}, sharding::PartitionSpec::replicated(2));
    pb.output("y", ys, emit_mlp(pb, layer, xs, loaded, ys, "mlp"));
    Program program = std::move(pb).compile();
    EXPECT_EQ(all_reduces, 1) << "one all-reduce of the down projection's partial sums";
    EXPECT_EQ(axes_seen, std::vector<std::string>{"tp"});
    EXPECT_EQ(others, 0);
    const runtime::HostTensor& y = program.run("x", x, "y");
    EXPECT_TRUE(testing::matches_reference(
        y,
        runtime::HostTensor{.shape = {8, 16},
                            .data = std::vector<float>(want.data(), want.data() + want.size())},
        1e-5));
  }
  CollectiveOps broken = CollectiveOps::runtime_collectives();
  broken.reduce_scatter = nullptr;
  EXPECT_THAT([&] { ProgramBuilder(mesh, "p", broken); },
              ThrowsMessage<ValueError>(
                  HasSubstr("program p: the CollectiveOps leave a collective unset")));
}

TEST(ProgramTest, HelpersRefuseWhatTheyCannotDo) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"tp"});
  ProgramBuilder pb(mesh, "p");
  EXPECT_THAT([&] { pb.use("w", TensorRole::kWeight, nullptr); },
              ThrowsMessage<ValueError>(HasSubstr("program p: tensor 'w' is null")));
  EXPECT_THAT(
      [&] {
        (void)compare(random_host({2, 3}, 1, 1.0f), random_host({3, 2}, 1, 1.0f));
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("compare: the output is [2, 3] and the reference [3, 2]")));
  EXPECT_THAT(
      [&] {
        (void)slice_tokens(random_host({2, 5, 4}, 1, 1.0f), 3, 3);
      },
      ThrowsMessage<ShapeError>(HasSubstr("tokens [3, 6) of [2, 5, 4]")));
  EXPECT_EQ(slice_tokens(random_host({2, 5, 4}, 1, 1.0f), 1, 2).shape,
            (std::vector<std::int64_t>{2, 2, 4}));
}

// A program of `layers` stages (or none): stage l adds 1 to the stage before it (a = prev + 1,
// through scratch), beside tensors that must keep memory of their own.
struct StagedProgram {
  std::vector<runtime::ShardedTensor*> a, b, weight, unprefixed;
  std::vector<runtime::Tensor*> scratch;  // slot 0's
  std::vector<runtime::NodeId> first_node;
  std::unique_ptr<Program> program;
};

StagedProgram staged_program(const runtime::DeviceMesh& mesh, int layers, bool stages) {
  ProgramBuilder pb(mesh, "staged");
  const auto replicated = sharding::PartitionSpec::replicated(2);
  runtime::Frontier front;
  runtime::ShardedTensor* prev = &pb.input("x", {4, 6}, replicated, front);
  StagedProgram out;
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("layer{}.", l);
    if (stages) pb.begin_stage(p);
    runtime::ShardedTensor& a = pb.tensor(p + "a", TensorRole::kActivation, {4, 6}, replicated);
    runtime::ShardedTensor& b = pb.tensor(p + "b", TensorRole::kActivation, {4, 8}, replicated);
    out.a.push_back(&a), out.b.push_back(&b);
    out.weight.push_back(&pb.tensor(p + "w", TensorRole::kWeight, {4, 6}, replicated));
    out.unprefixed.push_back(
        &pb.tensor(fmt::format("other{}.a", l), TensorRole::kActivation, {4, 6}, replicated));
    runtime::ShardedTensor& in = *prev;
    front = pb.per_device(p + "add", {&front}, [&](std::int64_t s) {
      runtime::Tensor& t = pb.scratch(s, {24});
      if (s == 0) out.scratch.push_back(&t);
      runtime::Tensor& from = in.shard(s);
      runtime::Tensor& to = a.shard(s);
      runtime::Tensor& wide = b.shard(s);
      return [&t, &from, &to, &wide] {
        for (std::size_t i = 0; i < 24; ++i) t.values()[i] = from.values()[i] + 1.0f;
        std::copy_n(t.values().data(), 24, to.values().data());
        std::fill_n(wide.values().data(), 32, -1.0f);  // written whole, never read
      };
    });
    out.first_node.push_back(front[0]);
    prev = &a;
  }
  runtime::ShardedTensor& y = pb.tensor("y", TensorRole::kOutput, {4, 6}, replicated);
  front = pb.per_device("copy", {&front}, [&](std::int64_t s) {
    return [&from = prev->shard(s), &to = y.shard(s)] {
      std::copy_n(from.values().data(), 24, to.values().data());
    };
  });
  pb.output("y", y, front);
  out.program = std::make_unique<Program>(std::move(pb).compile());
  return out;
}

TEST(ProgramStageTest, ActivationsThreeStagesApartAndScratchTwoApartShareMemory) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"dp"});
  StagedProgram st = staged_program(mesh, 7, true);
  for (int l = 0; l < 7; ++l) {
    SCOPED_TRACE(l);
    const auto i = static_cast<std::size_t>(l);
    const std::size_t owner = i % 3;  // the stage whose activations stage l holds
    EXPECT_EQ(st.a[i], st.a[owner]);
    EXPECT_EQ(st.b[i], st.b[owner]);
    EXPECT_EQ(st.scratch[i], st.scratch[i % 2]) << "scratch from two stages back";
    for (std::size_t k = 0; k < i; ++k) {
      EXPECT_NE(st.weight[i], st.weight[k]) << "weights are not activations";
      EXPECT_NE(st.unprefixed[i], st.unprefixed[k]) << "not named with the stage's prefix";
      if (k % 3 != owner) {
        EXPECT_NE(st.a[i], st.a[k]);
      }
      if (k % 2 != i % 2) {
        EXPECT_NE(st.scratch[i], st.scratch[k]) << "the stage before may still read its own";
      }
    }
  }
  EXPECT_NE(st.a[0], st.a[1]);
  EXPECT_NE(st.a[0], st.a[2]);
  const ProgramPlan& plan = st.program->plan();
  const auto find = [&](const std::string& name) {
    for (const TensorPlan& t : plan.tensors) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return TensorPlan{};
  };
  EXPECT_EQ(find("layer3.a").memory_of, "layer0.a");
  EXPECT_EQ(find("layer6.b").memory_of, "layer0.b");
  EXPECT_EQ(find("layer5.a").memory_of, "layer2.a");
  EXPECT_EQ(find("layer2.a").memory_of, "");
  EXPECT_EQ(find("layer4.w").memory_of, "");
  EXPECT_THAT(plan.text(), HasSubstr("in layer1.a's memory"));
  EXPECT_EQ(plan.to_json()["tensors"][1 + 3 * 4]["memory_of"], "layer0.a");  // x, 3 stages of 4
  // The memory of four stages' a and b, and of five stages' scratch, is saved on each slot.
  const StagedProgram plain = staged_program(mesh, 7, false);
  const std::int64_t saved = 4 * (24 + 32) * 4 + 5 * 24 * 4;
  for (std::size_t s = 0; s < 2; ++s)
    EXPECT_EQ(plan.memory_bytes[s], plain.program->plan().memory_bytes[s] - saved) << s;
}

TEST(ProgramStageTest, AStageWaitsForTheFenceTwoStagesBack) {
  const auto mesh = runtime::DeviceMesh::create(devices(2), {2}, {"dp"});
  StagedProgram st = staged_program(mesh, 5, true);
  const runtime::CompiledGraph& g = st.program->graph();
  for (std::size_t l = 2; l < 5; ++l) {
    SCOPED_TRACE(l);
    const auto& deps = g.node(st.first_node[l]).deps;
    const auto fence = std::find_if(deps.begin(), deps.end(), [&](runtime::NodeId d) {
      return g.node(d).name == fmt::format("layer{}.fence", l - 2);
    });
    ASSERT_NE(fence, deps.end());
    // The fence waits for both nodes of its stage and the fence before it.
    const auto& waits = g.node(*fence).deps;
    EXPECT_NE(std::find(waits.begin(), waits.end(), st.first_node[l - 2]), waits.end());
    EXPECT_EQ(waits.size(), l >= 3 ? 3u : 2u);
  }
  for (int run = 0; run < 2; ++run) {
    const runtime::HostTensor x = random_host({4, 6}, 10 + run, 1.0f);
    const runtime::HostTensor& y = st.program->run("x", x, "y");
    for (std::size_t i = 0; i < x.data.size(); ++i)
      ASSERT_EQ(y.data[i], x.data[i] + 1.0f + 1.0f + 1.0f + 1.0f + 1.0f) << i;
  }
}

}  // namespace
}  // namespace numesh::ops
