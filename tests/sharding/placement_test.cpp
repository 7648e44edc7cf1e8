#include "numesh/sharding/placement.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "fixtures.hpp"
#include "numesh/core/error.hpp"
#include "numesh/sharding/reshard_plan.hpp"
#include "numesh/sharding/shard_layout.hpp"

namespace numesh::sharding {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Placements = std::vector<Placement>;
using Plan = std::vector<ReshardStep>;
using Names = std::vector<std::string>;

const Placement R = Placement::replicate();
const Placement S0 = Placement::shard(0);
const Placement S1 = Placement::shard(1);
const Placement P = Placement::partial(PartialOp::kSum);

using fixtures::kDpTp;
const Mesh kEformer({"dp", "fsdp", "ep", "tp", "sp"}, {1, 4, 2, 2, 2});

// ------------------------------------------------------------------------------------------
// Placement

TEST(PlacementTest, ToStringNamesKindDimOrderAndOp) {
  EXPECT_EQ(R.to_string(), "Replicate()");
  EXPECT_EQ(S0.to_string(), "Shard(0)");
  EXPECT_EQ(Placement::shard(2, 1).to_string(), "Shard(2)@1");
  EXPECT_EQ(P.to_string(), "Partial(sum)");
  EXPECT_EQ(Placement::partial(PartialOp::kMax).to_string(), "Partial(max)");
  EXPECT_EQ(fmt::format("{}", Placement::shard(1, 2)), "Shard(1)@2");
  EXPECT_EQ(to_string(Placements{S0, R, P}), "[Shard(0), Replicate(), Partial(sum)]");
  EXPECT_EQ(to_string(Placements{}), "[]");
  EXPECT_EQ(to_string(PartialOp::kSum), "sum");
  EXPECT_EQ(to_string(PartialOp::kMax), "max");
}

TEST(PlacementTest, EqualityAndHashIgnoreFieldsOfOtherKinds) {
  const Placement odd_replicate{Placement::Kind::kReplicate, 3, 2, PartialOp::kMax};
  const Placement odd_partial{Placement::Kind::kPartial, 5, 1, PartialOp::kSum};
  EXPECT_EQ(odd_replicate, R);
  EXPECT_EQ(odd_replicate.to_string(), "Replicate()");
  EXPECT_EQ(odd_partial, P);
  EXPECT_EQ(std::hash<Placement>{}(odd_replicate), std::hash<Placement>{}(R));
  EXPECT_EQ(std::hash<Placement>{}(odd_partial), std::hash<Placement>{}(P));
  EXPECT_NE(S0, S1);
  EXPECT_NE(Placement::shard(0, 0), Placement::shard(0, 1));
  EXPECT_NE(P, Placement::partial(PartialOp::kMax));
  EXPECT_NE(R, S0);
  EXPECT_NE(R, P);
  const std::unordered_set<Placement> set{R,           odd_replicate,
                                          S0,          Placement::shard(0, 1),
                                          S1,          P,
                                          odd_partial, Placement::partial(PartialOp::kMax)};
  EXPECT_EQ(set.size(), 6U);
}

TEST(PlacementTest, TwoNamesShardTwoDims) {
  EXPECT_EQ(to_placements(PartitionSpec{"dp", "tp"}, kDpTp, 2), (Placements{S0, S1}));
  EXPECT_EQ(to_placements(PartitionSpec{"tp", "dp"}, kDpTp, 2), (Placements{S1, S0}));
}

TEST(PlacementTest, TupleEntrySplitsOneDimMajorToMinor) {
  EXPECT_EQ(to_placements(PartitionSpec{AxisRule::tuple({"dp", "tp"})}, kDpTp, 1),
            (Placements{Placement::shard(0, 0), Placement::shard(0, 1)}));
  EXPECT_EQ(to_placements(PartitionSpec{AxisRule::tuple({"tp", "dp"})}, kDpTp, 1),
            (Placements{Placement::shard(0, 1), Placement::shard(0, 0)}));
  // A list is canonicalised to a tuple by PartitionSpec.
  EXPECT_EQ(to_placements(PartitionSpec{nullptr, AxisRule::list({"tp", "dp"})}, kDpTp, 2),
            (Placements{Placement::shard(1, 1), Placement::shard(1, 0)}));
}

TEST(PlacementTest, NoneEntryAndUnusedAxesAreReplicate) {
  EXPECT_EQ(to_placements(PartitionSpec{nullptr, "tp"}, kDpTp, 2), (Placements{R, S1}));
  EXPECT_EQ(to_placements(PartitionSpec{"dp"}, kDpTp, 3), (Placements{S0, R}));
  EXPECT_EQ(to_placements(PartitionSpec::replicated(3), kDpTp, 3), (Placements{R, R}));
}

TEST(PlacementTest, EmptySpecIsReplicateAtAnyRank) {
  for (std::size_t rank : {0U, 1U, 4U}) {
    EXPECT_EQ(to_placements(PartitionSpec{}, kDpTp, rank), (Placements{R, R})) << rank;
    EXPECT_EQ(to_placements(PartitionSpec{}, kEformer, rank), (Placements(5, R))) << rank;
  }
}

TEST(PlacementTest, FiveAxisEformerMesh) {
  // EasyDeL's bthd query spec with the default PartitionAxis.
  const PartitionSpec query = PartitionSpec::parse("P(('fsdp', 'dp'), 'sp', 'tp', None)");
  EXPECT_EQ(
      to_placements(query, kEformer, 4),
      (Placements{Placement::shard(0, 1), Placement::shard(0, 0), R, Placement::shard(2), S1}));
  EXPECT_EQ(to_placements(PartitionSpec{"dp", "tp"}, kEformer, 2), (Placements{S0, R, R, S1, R}));
  EXPECT_EQ(to_placements(PartitionSpec{AxisRule::tuple({"dp", "tp"})}, kEformer, 1),
            (Placements{Placement::shard(0, 0), R, R, Placement::shard(0, 1), R}));
  EXPECT_EQ(to_placements(PartitionSpec{nullptr, "tp"}, kEformer, 2), (Placements{R, R, R, S1, R}));
  // MoE column kernel [E, H, M]: P(ep, None, tp).
  EXPECT_EQ(to_placements(PartitionSpec{"ep", nullptr, "tp"}, kEformer, 3),
            (Placements{R, R, S0, Placement::shard(2), R}));
  EXPECT_EQ(
      to_placements(PartitionSpec::parse("P(('fsdp','sp','ep'), 'dp')"), kEformer, 2),
      (Placements{S1, Placement::shard(0, 0), Placement::shard(0, 2), R, Placement::shard(0, 1)}));
}

TEST(PlacementTest, SpecLongerThanRankIsShapeError) {
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"dp", "tp"}, kDpTp, 1);
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("sharding: P('dp', 'tp') has 2 entries but the array has rank 1")));
  // The rank is checked before the names.
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"model", "x"}, kDpTp, 0);
      },
      ThrowsMessage<ShapeError>(HasSubstr("has 2 entries but the array has rank 0")));
}

TEST(PlacementTest, UnknownAxisIsKeyErrorNamingIt) {
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"dp", "model"}, kDpTp, 2);
      },
      ThrowsMessage<KeyError>(
          HasSubstr("sharding: mesh axis 'model' of P('dp', 'model') is not in the mesh ('dp', "
                    "'tp')")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{AxisRule::tuple({"dp", "ep"})}, kDpTp, 1);
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'ep' of P(('dp', 'ep'),) is not in the mesh")));
  try {
    (void)to_placements(PartitionSpec{"fsdp"}, kDpTp, 1);
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "fsdp");
  }
}

TEST(PlacementTest, AxisUsedTwiceIsDuplicateSpecError) {
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"dp", "dp"}, kDpTp, 2);
      },
      ThrowsMessage<DuplicateSpecError>(
          HasSubstr("sharding: mesh axis 'dp' is used twice in P('dp', 'dp') (by dims 0 and 1)")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{AxisRule::tuple({"tp", "tp"})}, kDpTp, 1);
      },
      ThrowsMessage<DuplicateSpecError>(
          HasSubstr("mesh axis 'tp' is used twice in P(('tp', 'tp'),) (twice in dim 0)")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"tp", nullptr, AxisRule::tuple({"dp", "tp"})}, kDpTp, 3);
      },
      ThrowsMessage<DuplicateSpecError>(HasSubstr("(by dims 0 and 2)")));
}

TEST(PlacementTest, ErrorsAreReportedInSpecOrder) {
  // The duplicate in dim 1 comes before the unknown axis in dim 2, and vice versa.
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"dp", "dp", "model"}, kDpTp, 3);
      },
      ThrowsMessage<DuplicateSpecError>(HasSubstr("mesh axis 'dp' is used twice")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"model", "dp", "dp"}, kDpTp, 3);
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'model'")));
}

TEST(PlacementTest, UnconstrainedAndIntegerEntriesAreValueError) {
  EXPECT_THAT([] { (void)to_placements(PartitionSpec{AxisRule::unconstrained()}, kDpTp, 1); },
              ThrowsMessage<ValueError>(
                  HasSubstr("sharding: dim 0 of P(UNCONSTRAINED,) is UNCONSTRAINED, which has no "
                            "placement")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{"dp", AxisRule::integer(5)}, kDpTp, 2);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("sharding: dim 1 of P('dp', 5) is 5, which has no placement")));
  EXPECT_THAT([] { (void)to_placements(PartitionSpec{AxisRule(not_given)}, kDpTp, 1); },
              ThrowsMessage<ValueError>(HasSubstr("is NOT_GIVEN, which has no placement")));
}

TEST(PlacementTest, NonNameInsideTupleIsValueError) {
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{AxisRule::tuple({"dp", nullptr})}, kDpTp, 1);
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "sharding: dim 0 of P(('dp', None),) holds None inside ('dp', None), which is not a "
          "mesh axis name")));
  EXPECT_THAT(
      [] {
        (void)to_placements(PartitionSpec{AxisRule::tuple({AxisRule::integer(2), "tp"})}, kDpTp, 1);
      },
      ThrowsMessage<ValueError>(HasSubstr("holds 2 inside (2, 'tp')")));
}

// ------------------------------------------------------------------------------------------
// to_spec

TEST(PlacementTest, ToSpecBuildsNamesAndTuplesInOrder) {
  EXPECT_EQ(to_spec({S0, S1}, kDpTp, 2), (PartitionSpec{"dp", "tp"}));
  EXPECT_EQ(to_spec({Placement::shard(0, 0), Placement::shard(0, 1)}, kDpTp, 1),
            (PartitionSpec{AxisRule::tuple({"dp", "tp"})}));
  EXPECT_EQ(to_spec({Placement::shard(0, 1), Placement::shard(0, 0)}, kDpTp, 1).repr(),
            "P(('tp', 'dp'),)");
  EXPECT_EQ(to_spec({R, S1}, kDpTp, 2).repr(), "P(None, 'tp')");
  EXPECT_EQ(to_spec({R, Placement::shard(2)}, kDpTp, 3).repr(), "P(None, None, 'tp')");
}

TEST(PlacementTest, ToSpecDropsTrailingNoneEntries) {
  EXPECT_EQ(to_spec({S0, R}, kDpTp, 3).repr(), "P('dp',)");
  EXPECT_EQ(to_spec({R, S1}, kDpTp, 3).repr(), "P(None, 'tp')");
  EXPECT_EQ(to_spec({R, R}, kDpTp, 2), PartitionSpec{});
  EXPECT_EQ(to_spec({R, R}, kDpTp, 0), PartitionSpec{});
  EXPECT_EQ(to_spec({R, R, R, R, R}, kEformer, 4).repr(), "P()");
}

TEST(PlacementTest, RoundTripGivesTheCanonicalSpec) {
  struct Case {
    const Mesh* mesh;
    std::string spec;
    std::size_t rank;
    std::string canonical;
  };
  const std::vector<Case> cases = {
      {&kDpTp, "P('dp', 'tp')", 2, "P('dp', 'tp')"},
      {&kDpTp, "P(('dp', 'tp'))", 1, "P(('dp', 'tp'),)"},
      {&kDpTp, "P(('tp', 'dp'), None)", 2, "P(('tp', 'dp'),)"},
      {&kDpTp, "P(None, 'tp')", 2, "P(None, 'tp')"},
      {&kDpTp, "P(None, 'tp', None)", 3, "P(None, 'tp')"},
      {&kDpTp, "P()", 3, "P()"},
      {&kDpTp, "P(None)", 1, "P()"},
      {&kDpTp, "P(None, None)", 4, "P()"},
      {&kDpTp, "P('dp')", 4, "P('dp',)"},
      {&kDpTp, "P(['tp'], None, 'dp')", 3, "P('tp', None, 'dp')"},
      {&kEformer, "P(('fsdp', 'dp'), 'sp', 'tp', None)", 4, "P(('fsdp', 'dp'), 'sp', 'tp')"},
      {&kEformer, "P(('fsdp', 'sp'), 'tp')", 2, "P(('fsdp', 'sp'), 'tp')"},
      {&kEformer, "P('ep', None, 'tp')", 3, "P('ep', None, 'tp')"},
      {&kEformer, "P('tp', None, None)", 3, "P('tp',)"},
      {&kEformer, "P(None, ('dp', 'fsdp', 'ep', 'tp', 'sp'))", 2,
       "P(None, ('dp', 'fsdp', 'ep', 'tp', 'sp'))"},
      {&kEformer, "P(('sp', 'ep'), None, ('tp', 'dp'), 'fsdp')", 5,
       "P(('sp', 'ep'), None, ('tp', 'dp'), 'fsdp')"},
  };
  for (const Case& c : cases) {
    const PartitionSpec spec = PartitionSpec::parse(c.spec);
    const Placements placements = to_placements(spec, *c.mesh, c.rank);
    const PartitionSpec back = to_spec(placements, *c.mesh, c.rank);
    EXPECT_EQ(back.repr(), c.canonical) << c.spec;
    EXPECT_EQ(back, PartitionSpec::parse(c.canonical)) << c.spec;
    // The canonical spec is a fixed point, and gives the same placements.
    EXPECT_EQ(to_placements(back, *c.mesh, c.rank), placements) << c.spec;
    EXPECT_EQ(to_spec(to_placements(back, *c.mesh, c.rank), *c.mesh, c.rank), back) << c.spec;
  }
}

TEST(PlacementTest, ToSpecOfPartialIsValueErrorNamingTheAxis) {
  EXPECT_THAT(
      [] {
        (void)to_spec({S0, P}, kDpTp, 2);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("sharding: mesh axis 'tp' holds Partial(sum), a pending reduction that a "
                    "PartitionSpec cannot express")));
  EXPECT_THAT(
      [] {
        (void)to_spec({Placement::partial(PartialOp::kMax), R}, kDpTp, 1);
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh axis 'dp' holds Partial(max)")));
}

TEST(PlacementTest, ToSpecOfDimPastRankIsShapeError) {
  EXPECT_THAT(
      [] {
        (void)to_spec({S0, Placement::shard(2)}, kDpTp, 2);
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("sharding: mesh axis 'tp' holds Shard(2) but the array has rank 2")));
}

TEST(PlacementTest, MalformedPlacementVectorsAreValueError) {
  EXPECT_THAT([] { (void)to_spec({R}, kDpTp, 1); },
              ThrowsMessage<ValueError>(HasSubstr(
                  "sharding: 1 placements [Replicate()] for the 2 axes of Mesh('dp': 2, 'tp': "
                  "4); give one placement per mesh axis")));
  EXPECT_THAT(
      [] {
        (void)to_spec({Placement::shard(-1), R}, kDpTp, 1);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("sharding: mesh axis 'dp' holds Shard(-1); a Shard's dim and order must be "
                    ">= 0")));
  EXPECT_THAT(
      [] {
        (void)to_spec({S0, S0}, kDpTp, 1);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("the orders of the mesh axes sharding dim 0 must be 0..1, each once, but they "
                    "are 'dp' (order 0), 'tp' (order 0)")));
  EXPECT_THAT(
      [] {
        (void)to_spec({R, Placement::shard(1, 1)}, kDpTp, 2);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("sharding dim 1 must be 0..0, each once, but they are 'tp' (order 1)")));
  EXPECT_THAT(
      [] {
        check_placements({S0, Placement::shard(0, 2)}, kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("'dp' (order 0), 'tp' (order 2)")));
  EXPECT_NO_THROW(check_placements({Placement::shard(0, 1), Placement::shard(0, 0)}, kDpTp));
}

// ------------------------------------------------------------------------------------------
// ReshardStep

TEST(ReshardStepTest, ToStringOfEachKind) {
  EXPECT_EQ(ReshardStep::all_reduce({"dp", "tp"}, PartialOp::kSum).to_string(),
            "AllReduce(sum, axes=[dp,tp])");
  EXPECT_EQ(ReshardStep::reduce_scatter({"tp"}, 0, PartialOp::kMax).to_string(),
            "ReduceScatter(max, dim=0, axes=[tp])");
  EXPECT_EQ(ReshardStep::all_gather({"tp"}, 1).to_string(), "AllGather(dim=1, axes=[tp])");
  EXPECT_EQ(ReshardStep::all_to_all({"tp"}, 0, 1).to_string(), "AllToAll(dim=0->1, axes=[tp])");
  EXPECT_EQ(ReshardStep::local_slice({"dp"}, 0).to_string(), "LocalSlice(dim=0, axes=[dp])");
  EXPECT_EQ(fmt::format("{}", ReshardStep::all_to_all({"tp", "dp"}, 2, 2)),
            "AllToAll(dim=2->2, axes=[tp,dp])");
  EXPECT_EQ(to_string(Plan{ReshardStep::all_reduce({"tp"}, PartialOp::kSum),
                           ReshardStep::all_gather({"dp"}, 0)}),
            "[AllReduce(sum, axes=[tp]); AllGather(dim=0, axes=[dp])]");
  EXPECT_EQ(to_string(Plan{}), "[]");
}

TEST(ReshardStepTest, FactoriesFillUnusedFieldsWithDefaults) {
  const ReshardStep ar = ReshardStep::all_reduce({"dp"}, PartialOp::kMax);
  EXPECT_EQ(ar.kind, ReshardStep::Kind::kAllReduce);
  EXPECT_EQ(ar.from_dim, ReshardStep::kNoDim);
  EXPECT_EQ(ar.to_dim, ReshardStep::kNoDim);
  EXPECT_EQ(ar.op, PartialOp::kMax);
  const ReshardStep ag = ReshardStep::all_gather({"dp"}, 3);
  EXPECT_EQ(ag.from_dim, 3);
  EXPECT_EQ(ag.to_dim, ReshardStep::kNoDim);
  const ReshardStep sl = ReshardStep::local_slice({"dp"}, 2);
  EXPECT_EQ(sl.from_dim, ReshardStep::kNoDim);
  EXPECT_EQ(sl.to_dim, 2);
  EXPECT_NE(ReshardStep::all_gather({"dp"}, 0), ReshardStep::all_gather({"dp"}, 1));
  EXPECT_NE(ReshardStep::all_gather({"dp", "tp"}, 0), ReshardStep::all_gather({"tp", "dp"}, 0));
  EXPECT_EQ(std::hash<ReshardStep>{}(ReshardStep::all_to_all({"tp"}, 0, 1)),
            std::hash<ReshardStep>{}(ReshardStep::all_to_all({"tp"}, 0, 1)));
  const std::unordered_set<ReshardStep> set{ReshardStep::all_to_all({"tp"}, 0, 1),
                                            ReshardStep::all_to_all({"tp"}, 1, 0),
                                            ReshardStep::all_to_all({"tp"}, 0, 1)};
  EXPECT_EQ(set.size(), 2U);
}

// ------------------------------------------------------------------------------------------
// plan_reshard

TEST(ReshardPlanTest, EveryPairOnOneAxis) {
  const Mesh mesh({"tp"}, {4});
  struct Case {
    Placement from;
    Placement to;
    Plan plan;          // when error is empty
    std::string error;  // ValueError substring, or empty
  };
  const PartialOp sum = PartialOp::kSum;
  const std::vector<Case> cases = {
      {R, R, {}, ""},
      {R, S0, {ReshardStep::local_slice({"tp"}, 0)}, ""},
      {R, S1, {ReshardStep::local_slice({"tp"}, 1)}, ""},
      {R, P, {}, "from Replicate() to Partial(sum)"},
      {S0, R, {ReshardStep::all_gather({"tp"}, 0)}, ""},
      {S0, S0, {}, ""},
      {S0, S1, {ReshardStep::all_to_all({"tp"}, 0, 1)}, ""},
      {S0, P, {}, "from Shard(0) to Partial(sum)"},
      {S1, R, {ReshardStep::all_gather({"tp"}, 1)}, ""},
      {S1, S0, {ReshardStep::all_to_all({"tp"}, 1, 0)}, ""},
      {S1, S1, {}, ""},
      {S1, P, {}, "from Shard(1) to Partial(sum)"},
      {P, R, {ReshardStep::all_reduce({"tp"}, sum)}, ""},
      {P, S0, {ReshardStep::reduce_scatter({"tp"}, 0, sum)}, ""},
      {P, S1, {ReshardStep::reduce_scatter({"tp"}, 1, sum)}, ""},
      {P, P, {}, ""},
  };
  ASSERT_EQ(cases.size(), 16U);
  for (const Case& c : cases) {
    const std::string label = c.from.to_string() + " -> " + c.to.to_string();
    if (c.error.empty()) {
      const Plan plan = plan_reshard({c.from}, {c.to}, mesh);
      EXPECT_EQ(plan, c.plan) << label << ": " << to_string(plan);
    } else {
      EXPECT_THAT([&] { (void)plan_reshard({c.from}, {c.to}, mesh); },
                  ThrowsMessage<ValueError>(HasSubstr("cannot reshard mesh axis 'tp' " + c.error)))
          << label;
    }
  }
}

TEST(ReshardPlanTest, PartialTargetIsValueErrorNamingTheAxis) {
  EXPECT_THAT(
      [] {
        (void)plan_reshard({S0, R}, {S0, P}, kDpTp);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("sharding: cannot reshard mesh axis 'tp' from Replicate() to Partial(sum): a "
                    "reshard can keep a pending reduction but never create or change one")));
  EXPECT_THAT(
      [] {
        (void)plan_reshard({P, R}, {Placement::partial(PartialOp::kMax), R}, kDpTp);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("cannot reshard mesh axis 'dp' from Partial(sum) to Partial(max)")));
  // A pending reduction that stays is not an error.
  EXPECT_EQ(plan_reshard({P, S0}, {P, R}, kDpTp), (Plan{ReshardStep::all_gather({"tp"}, 0)}));
}

TEST(ReshardPlanTest, MixedPartialOpsAreValueError) {
  EXPECT_THAT(
      [] {
        (void)plan_reshard({P, Placement::partial(PartialOp::kMax)}, {R, R}, kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "sharding: mesh axes 'dp' and 'tp' hold Partial(sum) and Partial(max) in "
          "[Partial(sum), Partial(max)]; pending reductions of different kinds have no defined "
          "order")));
}

TEST(ReshardPlanTest, MalformedInputsAreValueError) {
  EXPECT_THAT(
      [] {
        (void)plan_reshard({R}, {R, R}, kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("1 placements [Replicate()] for the 2 axes")));
  EXPECT_THAT(
      [] {
        (void)plan_reshard({R, R}, {S1, S1}, kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("sharding dim 1 must be 0..1, each once")));
}

TEST(ReshardPlanTest, PartialMaxKeepsItsOp) {
  const Placement max = Placement::partial(PartialOp::kMax);
  EXPECT_EQ(plan_reshard({max, max}, {R, R}, kDpTp),
            (Plan{ReshardStep::all_reduce({"dp", "tp"}, PartialOp::kMax)}));
  EXPECT_EQ(plan_reshard({max, R}, {S1, R}, kDpTp),
            (Plan{ReshardStep::reduce_scatter({"dp"}, 1, PartialOp::kMax)}));
}

TEST(ReshardPlanTest, SameKindOverSeveralAxesIsOneStep) {
  const PartialOp sum = PartialOp::kSum;
  const Placement S0_1 = Placement::shard(0, 1);
  const Placement S1_1 = Placement::shard(1, 1);
  EXPECT_EQ(plan_reshard({P, P}, {R, R}, kDpTp),
            (Plan{ReshardStep::all_reduce({"dp", "tp"}, sum)}));
  EXPECT_EQ(plan_reshard({S0, S0_1}, {R, R}, kDpTp),
            (Plan{ReshardStep::all_gather({"dp", "tp"}, 0)}));
  EXPECT_EQ(plan_reshard({R, R}, {S0, S0_1}, kDpTp),
            (Plan{ReshardStep::local_slice({"dp", "tp"}, 0)}));
  // Slices follow the target's order: tp major.
  EXPECT_EQ(plan_reshard({R, R}, {S0_1, S0}, kDpTp),
            (Plan{ReshardStep::local_slice({"tp", "dp"}, 0)}));
  EXPECT_EQ(plan_reshard({P, P}, {S1, S1_1}, kDpTp),
            (Plan{ReshardStep::reduce_scatter({"dp", "tp"}, 1, sum)}));
  EXPECT_EQ(plan_reshard({S0, S0_1}, {S1, S1_1}, kDpTp),
            (Plan{ReshardStep::all_to_all({"dp", "tp"}, 0, 1)}));
  // On the eformer mesh: the gradient of a batch-sharded weight, reduced over fsdp and dp.
  EXPECT_EQ(plan_reshard({P, P, R, S1, R}, {R, R, R, S1, R}, kEformer),
            (Plan{ReshardStep::all_reduce({"dp", "fsdp"}, sum)}));
  // Different dims are different steps.
  EXPECT_EQ(plan_reshard({S0, S1}, {R, R}, kDpTp),
            (Plan{ReshardStep::all_gather({"dp"}, 0), ReshardStep::all_gather({"tp"}, 1)}));
}

TEST(ReshardPlanTest, HeaderExamples) {
  const PartialOp sum = PartialOp::kSum;
  EXPECT_EQ(plan_reshard({R, P}, {R, S0}, kDpTp),
            (Plan{ReshardStep::reduce_scatter({"tp"}, 0, sum)}));
  EXPECT_EQ(plan_reshard({S0, P}, {R, R}, kDpTp),
            (Plan{ReshardStep::all_reduce({"tp"}, sum), ReshardStep::all_gather({"dp"}, 0)}));
  EXPECT_EQ(plan_reshard({S0, R}, {R, S0}, kDpTp),
            (Plan{ReshardStep::local_slice({"tp"}, 0), ReshardStep::all_to_all({"tp", "dp"}, 0, 0),
                  ReshardStep::all_gather({"dp"}, 0)}));
}

TEST(ReshardPlanTest, SlicesThenReductionsThenAllToAllsThenGathers) {
  // Mesh order is dp, fsdp, tp, sp; the plan runs in the opposite order because dp's gather
  // grows the data and sp's slice shrinks it.
  const Mesh mesh({"dp", "fsdp", "tp", "sp"}, {2, 2, 2, 2});
  const Plan plan =
      plan_reshard({S0, P, S1, R}, {R, R, Placement::shard(2), Placement::shard(3)}, mesh);
  EXPECT_EQ(to_string(plan),
            "[LocalSlice(dim=3, axes=[sp]); AllReduce(sum, axes=[fsdp]); AllToAll(dim=1->2, "
            "axes=[tp]); AllGather(dim=0, axes=[dp])]");
  // Reduce-scatters come before all-reduces: the all-reduce then runs on the scattered data.
  EXPECT_EQ(to_string(plan_reshard({P, P}, {R, S0}, kDpTp)),
            "[ReduceScatter(sum, dim=0, axes=[tp]); AllReduce(sum, axes=[dp])]");
  // A slice before the reduce-scatter of the same dim: the slice is free and shrinks it.
  EXPECT_EQ(to_string(plan_reshard({R, P}, {S0, Placement::shard(0, 1)}, kDpTp)),
            "[LocalSlice(dim=0, axes=[dp]); ReduceScatter(sum, dim=0, axes=[tp])]");
}

TEST(ReshardPlanTest, OrderChangeWithinADimIsAllToAllOnThatDim) {
  const Placement S0_1 = Placement::shard(0, 1);
  const Placement S0_2 = Placement::shard(0, 2);
  // ('dp', 'tp') -> ('tp', 'dp').
  EXPECT_EQ(plan_reshard({S0, S0_1}, {S0_1, S0}, kDpTp),
            (Plan{ReshardStep::all_to_all({"tp", "dp"}, 0, 0)}));
  // (a, b, c) -> (a, c, b): only b and c move; a's blocks stay where they are.
  const Mesh abc({"a", "b", "c"}, {2, 3, 2});
  EXPECT_EQ(plan_reshard({S0, S0_1, S0_2}, {S0, S0_2, S0_1}, abc),
            (Plan{ReshardStep::all_to_all({"c", "b"}, 0, 0)}));
  // Dropping the major axis of a tuple: reorder so that it is minor-most, then gather it.
  EXPECT_EQ(
      plan_reshard({S0, S0_1}, {R, S0}, kDpTp),
      (Plan{ReshardStep::all_to_all({"tp", "dp"}, 0, 0), ReshardStep::all_gather({"dp"}, 0)}));
  // Dropping the minor one needs no reorder.
  EXPECT_EQ(plan_reshard({S0, S0_1}, {S0, R}, kDpTp), (Plan{ReshardStep::all_gather({"tp"}, 0)}));
  // Moving the major axis to another dim: reorder, then the all-to-all.
  EXPECT_EQ(
      plan_reshard({S0, S0_1}, {S1, S0}, kDpTp),
      (Plan{ReshardStep::all_to_all({"tp", "dp"}, 0, 0), ReshardStep::all_to_all({"dp"}, 0, 1)}));
  // A slice that must become the major splitter.
  EXPECT_EQ(
      plan_reshard({R, S0}, {S0, S0_1}, kDpTp),
      (Plan{ReshardStep::local_slice({"dp"}, 0), ReshardStep::all_to_all({"dp", "tp"}, 0, 0)}));
}

// ------------------------------------------------------------------------------------------
// apply_reshard_step

TEST(ReshardStepTest, ApplyFollowsTheDocumentedSemantics) {
  const Placement S0_1 = Placement::shard(0, 1);
  EXPECT_EQ(apply_reshard_step({S0, R}, ReshardStep::local_slice({"tp"}, 0), kDpTp),
            (Placements{S0, S0_1}));
  EXPECT_EQ(apply_reshard_step({S0, S0_1}, ReshardStep::all_gather({"tp"}, 0), kDpTp),
            (Placements{S0, R}));
  EXPECT_EQ(apply_reshard_step({S1, S0}, ReshardStep::all_to_all({"tp"}, 0, 1), kDpTp),
            (Placements{S1, Placement::shard(1, 1)}));
  EXPECT_EQ(apply_reshard_step({S0, S0_1}, ReshardStep::all_to_all({"tp", "dp"}, 0, 0), kDpTp),
            (Placements{S0_1, S0}));
  EXPECT_EQ(
      apply_reshard_step({P, S0}, ReshardStep::reduce_scatter({"dp"}, 0, PartialOp::kSum), kDpTp),
      (Placements{S0_1, S0}));
  EXPECT_EQ(apply_reshard_step({P, P}, ReshardStep::all_reduce({"tp"}, PartialOp::kSum), kDpTp),
            (Placements{P, R}));
}

TEST(ReshardStepTest, ApplyRejectsStepsWhosePreconditionsFail) {
  const Placement S0_1 = Placement::shard(0, 1);
  EXPECT_THAT(
      [&] {
        (void)apply_reshard_step({S0, S0_1}, ReshardStep::all_gather({"dp"}, 0), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr(
          "sharding: cannot apply AllGather(dim=0, axes=[dp]) to [Shard(0), Shard(0)@1]: the "
          "axes must be the minor-most mesh axes splitting dim 0, in order; dim 0 is split by "
          "[dp,tp], major to minor")));
  EXPECT_THAT(
      [&] {
        (void)apply_reshard_step({S0, S0_1}, ReshardStep::all_gather({"tp", "dp"}, 0), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("minor-most mesh axes splitting dim 0, in order")));
  EXPECT_THAT(
      [&] {
        (void)apply_reshard_step({S0, S1}, ReshardStep::all_to_all({"tp", "dp"}, 0, 0), kDpTp);
      },
      ThrowsMessage<ValueError>(
          HasSubstr("splitting dim 0 (in any order); dim 0 is split by [dp], major to minor")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({S0, R}, ReshardStep::local_slice({"dp"}, 1), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh axis 'dp' holds Shard(0), not Replicate()")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({P, R}, ReshardStep::all_reduce({"dp"}, PartialOp::kMax), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh axis 'dp' holds Partial(sum), not Partial(max)")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({R, R}, ReshardStep::local_slice({}, 0), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("the step names no mesh axis")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({R, R}, ReshardStep::local_slice({"dp", "dp"}, 0), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("mesh axis 'dp' is listed twice")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({R, R}, ReshardStep::local_slice({"dp"}, -1), kDpTp);
      },
      ThrowsMessage<ValueError>(HasSubstr("to_dim must be >= 0, got -1")));
  EXPECT_THAT(
      [] {
        (void)apply_reshard_step({R, R}, ReshardStep::local_slice({"ep"}, 0), kDpTp);
      },
      ThrowsMessage<KeyError>(HasSubstr("mesh axis 'ep' is not in the mesh ('dp', 'tp')")));
}

// ------------------------------------------------------------------------------------------
// Every pair of placement vectors on a three-axis mesh, executed on index data.

// All well-formed placement vectors over {Replicate, Partial(sum), Shard(0), Shard(1)} for
// `axes` mesh axes, every order of every dim included.
std::vector<Placements> all_placements(std::size_t axes) {
  std::vector<Placements> out;
  std::vector<int> kinds(axes, 0);  // 0 R, 1 P, 2 S0, 3 S1
  const auto total = static_cast<std::size_t>(std::pow(4, static_cast<double>(axes)));
  for (std::size_t code = 0; code < total; ++code) {
    std::size_t rest = code;
    std::vector<std::vector<std::size_t>> on_dim(2);
    Placements base(axes, R);
    for (std::size_t a = 0; a < axes; ++a) {
      const std::size_t k = rest % 4;
      rest /= 4;
      if (k == 1) base[a] = P;
      if (k >= 2) on_dim[k - 2].push_back(a);
    }
    std::vector<std::size_t> perm0 = on_dim[0];
    do {
      std::vector<std::size_t> perm1 = on_dim[1];
      do {
        Placements p = base;
        for (std::size_t i = 0; i < perm0.size(); ++i)
          p[perm0[i]] = Placement::shard(0, static_cast<int>(i));
        for (std::size_t i = 0; i < perm1.size(); ++i)
          p[perm1[i]] = Placement::shard(1, static_cast<int>(i));
        out.push_back(p);
      } while (std::next_permutation(perm1.begin(), perm1.end()));
    } while (std::next_permutation(perm0.begin(), perm0.end()));
  }
  return out;
}

Placements without_partial(Placements p) {
  for (Placement& x : p) {
    if (x.is_partial()) x = R;
  }
  return p;
}

// What each device holds: per tensor dim, the global indices, in local order.
using DeviceData = std::vector<std::vector<int>>;

std::vector<DeviceData> layout_data(const Placements& placements, const Mesh& mesh,
                                    const std::vector<std::int64_t>& shape) {
  const ShardLayout layout(shape, to_spec(without_partial(placements), mesh, shape.size()), mesh);
  std::vector<DeviceData> data;
  for (const DeviceShard& s : layout.devices()) {
    DeviceData d;
    for (const DimSlice& slice : s.slices) {
      std::vector<int> idx(static_cast<std::size_t>(slice.extent));
      std::iota(idx.begin(), idx.end(), static_cast<int>(slice.offset));
      d.push_back(idx);
    }
    data.push_back(d);
  }
  return data;
}

std::vector<int> chunk(const std::vector<int>& v, std::int64_t n, std::int64_t k) {
  EXPECT_EQ(static_cast<std::int64_t>(v.size()) % n, 0);
  const std::size_t len = v.size() / static_cast<std::size_t>(n);
  const auto begin = v.begin() + static_cast<std::ptrdiff_t>(len * static_cast<std::size_t>(k));
  return std::vector<int>(begin, begin + static_cast<std::ptrdiff_t>(len));
}

// Runs `step` on index data with the collective semantics documented on ReshardStep, written
// independently of the planner: groups over `axes`, rank = mixed radix in listed order.
std::vector<DeviceData> run_step(const std::vector<DeviceData>& data, const Placements& before,
                                 const ReshardStep& step, const Mesh& mesh) {
  std::vector<std::size_t> axes;
  for (const std::string& name : step.axes) axes.push_back(*mesh.find_axis(name));
  const auto rank_over = [&](const std::vector<std::int64_t>& coords,
                             const std::vector<std::size_t>& over) {
    std::int64_t r = 0;
    for (std::size_t a : over) r = r * mesh.sizes()[a] + coords[a];
    return r;
  };
  const auto member = [&](const std::vector<std::int64_t>& coords, std::int64_t r) {
    std::vector<std::int64_t> c = coords;
    for (std::size_t i = axes.size(); i-- > 0;) {
      c[axes[i]] = r % mesh.sizes()[axes[i]];
      r /= mesh.sizes()[axes[i]];
    }
    return static_cast<std::size_t>(mesh.device_at(c));
  };
  std::int64_t n = 1;
  for (std::size_t a : axes) n *= mesh.sizes()[a];

  std::vector<DeviceData> out = data;
  for (std::int64_t dev = 0; dev < mesh.size(); ++dev) {
    const std::vector<std::int64_t> coords = mesh.coords_of(dev);
    const std::int64_t r = rank_over(coords, axes);
    DeviceData& mine = out[static_cast<std::size_t>(dev)];
    const DeviceData& had = data[static_cast<std::size_t>(dev)];
    switch (step.kind) {
      case ReshardStep::Kind::kAllReduce:
        break;
      case ReshardStep::Kind::kLocalSlice:
      case ReshardStep::Kind::kReduceScatter: {
        const auto e = static_cast<std::size_t>(step.to_dim);
        mine[e] = chunk(had[e], n, r);
        break;
      }
      case ReshardStep::Kind::kAllGather: {
        const auto d = static_cast<std::size_t>(step.from_dim);
        mine[d].clear();
        for (std::int64_t k = 0; k < n; ++k) {
          const DeviceData& other = data[member(coords, k)];
          mine[d].insert(mine[d].end(), other[d].begin(), other[d].end());
        }
        break;
      }
      case ReshardStep::Kind::kAllToAll: {
        const auto d = static_cast<std::size_t>(step.from_dim);
        const auto e = static_cast<std::size_t>(step.to_dim);
        if (d != e) {
          mine[e] = chunk(had[e], n, r);
          mine[d].clear();
          for (std::int64_t k = 0; k < n; ++k) {
            const DeviceData& other = data[member(coords, k)];
            EXPECT_EQ(other[e], had[e]) << step.to_string();
            mine[d].insert(mine[d].end(), other[d].begin(), other[d].end());
          }
        } else {
          // A change of order: I hold the block whose old rank is my new rank.
          std::vector<std::size_t> old_order(axes.size());
          for (std::size_t a = 0; a < before.size(); ++a) {
            if (before[a].is_shard() && static_cast<std::size_t>(before[a].dim) == d) {
              const std::size_t total_on_dim =
                  std::count_if(before.begin(), before.end(), [&](const Placement& p) {
                    return p.is_shard() && static_cast<std::size_t>(p.dim) == d;
                  });
              const std::size_t first = total_on_dim - axes.size();
              const auto pos = static_cast<std::size_t>(before[a].order);
              if (pos >= first) old_order[pos - first] = a;
            }
          }
          bool found = false;
          for (std::int64_t k = 0; k < n; ++k) {
            const std::size_t src = member(coords, k);
            if (rank_over(mesh.coords_of(static_cast<std::int64_t>(src)), old_order) == r) {
              mine = data[src];
              found = true;
            }
          }
          EXPECT_TRUE(found) << step.to_string();
        }
        break;
      }
    }
  }
  return out;
}

int phase(ReshardStep::Kind kind) {
  switch (kind) {
    case ReshardStep::Kind::kLocalSlice:
      return 0;
    case ReshardStep::Kind::kReduceScatter:
      return 1;
    case ReshardStep::Kind::kAllReduce:
      return 2;
    case ReshardStep::Kind::kAllToAll:
      return 3;
    case ReshardStep::Kind::kAllGather:
      return 4;
  }
  return -1;
}

TEST(ReshardPlanTest, EveryPairOnThreeAxesMovesTheRightDataInPhaseOrder) {
  // Sizes 2, 3, 2 so that a wrong mixed radix shows; extent 12 divides every product.
  const Mesh mesh({"a", "b", "c"}, {2, 3, 2});
  const std::vector<std::int64_t> shape = {12, 12};
  const std::vector<Placements> all = all_placements(3);
  // Sum over the 4^3 kind assignments of k0! * k1! (k_d axes on dim d, in any order).
  ASSERT_EQ(all.size(), 92U);
  std::size_t planned = 0;
  std::size_t rejected = 0;
  for (const Placements& from : all) {
    for (const Placements& to : all) {
      const std::string label = to_string(from) + " -> " + to_string(to);
      bool creates_partial = false;
      for (std::size_t a = 0; a < to.size(); ++a) {
        creates_partial = creates_partial || (to[a].is_partial() && from[a] != to[a]);
      }
      if (creates_partial) {
        EXPECT_THROW((void)plan_reshard(from, to, mesh), ValueError) << label;
        ++rejected;
        continue;
      }
      const Plan plan = plan_reshard(from, to, mesh);
      ++planned;
      // Walk the plan on placements and on data.
      Placements cur = from;
      std::vector<DeviceData> data = layout_data(from, mesh, shape);
      int last_phase = -1;
      std::map<std::string, int> non_reorder_uses;
      for (const ReshardStep& step : plan) {
        ASSERT_FALSE(step.axes.empty()) << label;
        EXPECT_GE(phase(step.kind), last_phase) << label << ": " << to_string(plan);
        last_phase = phase(step.kind);
        const bool reorder =
            step.kind == ReshardStep::Kind::kAllToAll && step.from_dim == step.to_dim;
        if (!reorder) {
          for (const std::string& name : step.axes) {
            ++non_reorder_uses[name];
            const std::size_t a = *mesh.find_axis(name);
            EXPECT_FALSE(from[a].kind == to[a].kind && from[a].dim == to[a].dim)
                << label << ": axis " << name << " needs no collective";
          }
        }
        data = run_step(data, cur, step, mesh);
        cur = apply_reshard_step(cur, step, mesh);
      }
      EXPECT_EQ(cur, to) << label << ": " << to_string(plan);
      EXPECT_EQ(data, layout_data(to, mesh, shape)) << label << ": " << to_string(plan);
      for (const auto& [name, uses] : non_reorder_uses) {
        EXPECT_EQ(uses, 1) << label << ": axis " << name << " in " << to_string(plan);
      }
      if (from == to) {
        EXPECT_TRUE(plan.empty()) << label;
      }
    }
  }
  EXPECT_EQ(planned + rejected, all.size() * all.size());
  EXPECT_GT(rejected, 0U);
}

TEST(PlacementTest, EveryPlacementVectorWithoutPartialRoundTripsThroughItsSpec) {
  const Mesh mesh({"a", "b", "c"}, {2, 3, 2});
  std::size_t checked = 0;
  for (const Placements& p : all_placements(3)) {
    if (std::any_of(p.begin(), p.end(), [](const Placement& x) { return x.is_partial(); })) {
      continue;
    }
    const PartitionSpec spec = to_spec(p, mesh, 2);
    EXPECT_EQ(to_placements(spec, mesh, 2), p) << to_string(p) << " " << spec.repr();
    EXPECT_TRUE(spec.empty() || !spec.entries().back().is_none()) << spec.repr();
    ++checked;
  }
  // Sum over the 3^3 assignments to {R, S0, S1} of k0! * k1!.
  EXPECT_EQ(checked, 49U);
}

}  // namespace
}  // namespace numesh::sharding
