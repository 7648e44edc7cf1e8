// The option parsers of the numesh program (tools/numesh/parsers.hpp): values and the exact
// error messages `numesh: error: ...` prints (the CLI tests check a few of them end to end).

#include "parsers.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "numesh/core/error.hpp"

namespace numesh::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

TEST(SplitListTest, SplitsAtTopLevelCommasAndTrims) {
  EXPECT_THAT(split_list("a, (b,c) ,[d, e]"), ElementsAre("a", "(b,c)", "[d, e]"));
  EXPECT_THAT(split_list("a,,b"), ElementsAre("a", "", "b"));
  EXPECT_THAT(split_list(""), ElementsAre(""));
}

TEST(ParseNamesTest, KeepsEmptyNamesForTheMeshToReport) {
  EXPECT_THAT(parse_names("dp, tp"), ElementsAre("dp", "tp"));
  EXPECT_THAT(parse_names("a,,b"), ElementsAre("a", "", "b"));
}

TEST(ParseItemsTest, DropsEmptyItems) {
  EXPECT_THAT(parse_items("all-reduce,,all-gather,"), ElementsAre("all-reduce", "all-gather"));
  EXPECT_THAT(parse_items(","), IsEmpty());
}

TEST(ParseIntListTest, ParsesSignedIntegers) {
  EXPECT_THAT(parse_int_list("2,-1", "--dims"), ElementsAre(2, -1));
  EXPECT_THAT(parse_int_list(" 4 ", "--dims"), ElementsAre(4));
}

TEST(ParseIntListTest, NamesTheOptionAndTheBadItem) {
  EXPECT_THAT([] { parse_int_list("2,x", "--dims"); },
              ThrowsMessage<ValueError>("--dims '2,x': 'x' is not an integer"));
  EXPECT_THAT([] { parse_int_list("", "--dims"); },
              ThrowsMessage<ValueError>("--dims '': '' is not an integer"));
  EXPECT_THAT([] { parse_int_list("1.5", "--shape"); },
              ThrowsMessage<ValueError>("--shape '1.5': '1.5' is not an integer"));
}

TEST(ParseShapeTest, RefusesNegativeExtents) {
  EXPECT_THAT(parse_shape("8,0,3", "--shape"), ElementsAre(8, 0, 3));
  EXPECT_THAT([] { parse_shape("2,-1", "--shape"); },
              ThrowsMessage<ValueError>("--shape '2,-1': extent -1 is negative"));
}

TEST(ParseBytesTest, ReadsBinaryUnits) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("12B"), 12u);
  EXPECT_EQ(parse_bytes("4K"), 4096u);
  EXPECT_EQ(parse_bytes("4k"), 4096u);
  EXPECT_EQ(parse_bytes("64KiB"), 65536u);
  EXPECT_EQ(parse_bytes("1M"), 1u << 20);
  EXPECT_EQ(parse_bytes("64MiB"), 64u << 20);
  EXPECT_EQ(parse_bytes("2G"), std::size_t{2} << 30);
  EXPECT_EQ(parse_bytes("1GiB"), std::size_t{1} << 30);
}

TEST(ParseBytesTest, NamesTheTextAndTheUnit) {
  EXPECT_THAT(
      [] { parse_bytes("4X"); },
      ThrowsMessage<ValueError>("bad size '4X': unknown unit 'X' (use K, KiB, M, MiB, G or GiB)"));
  EXPECT_THAT(
      [] { parse_bytes("X"); },
      ThrowsMessage<ValueError>("bad size 'X': expected a number such as 4K, 64MiB or 4096"));
  EXPECT_THAT([] { parse_bytes(""); }, ThrowsMessage<ValueError>(HasSubstr("bad size ''")));
  // Sizes that do not fit a 64-bit count are refused rather than wrapped.
  EXPECT_THAT(
      [] { parse_bytes("99999999999999999999"); },
      ThrowsMessage<ValueError>("bad size '99999999999999999999': too large for a byte count"));
  EXPECT_THAT([] { parse_bytes("17179869184G"); },
              ThrowsMessage<ValueError>("bad size '17179869184G': too large for a byte count"));
  EXPECT_EQ(parse_bytes("17179869183G"), std::size_t{17179869183} << 30);
}

TEST(ParseArrayBytesTest, ChecksCacheLinesAndLimitsNamingTheOption) {
  constexpr std::size_t kTiB = std::size_t{1} << 40;
  EXPECT_EQ(parse_array_bytes("--size", "4K", kTiB), 4096u);
  EXPECT_EQ(parse_array_bytes("--size", "512M", kTiB), std::size_t{512} << 20);
  EXPECT_THAT([] { parse_array_bytes("--size", "100", std::size_t{1} << 40); },
              ThrowsMessage<ValueError>("--size '100' is 100 bytes; it must be a multiple of 64 "
                                        "bytes from 4.0 KiB to 1.0 TiB"));
  EXPECT_THAT([] { parse_array_bytes("--size", "4100", std::size_t{1} << 40); },
              ThrowsMessage<ValueError>(HasSubstr("'4100' is 4100 bytes")));
  EXPECT_THAT([] { parse_array_bytes("--latency-size", "128G", std::size_t{64} << 30); },
              ThrowsMessage<ValueError>("--latency-size '128G' is 137438953472 bytes; it must be "
                                        "a multiple of 64 bytes from 4.0 KiB to 64.0 GiB"));
  EXPECT_THAT([] { parse_array_bytes("--size", "4X", std::size_t{1} << 40); },
              ThrowsMessage<ValueError>(
                  "--size: bad size '4X': unknown unit 'X' (use K, KiB, M, MiB, G or GiB)"));
}

TEST(ParseMemoryKernelsTest, KeepsTheOrderAndRefusesUnknownOrRepeatedKernels) {
  EXPECT_THAT(parse_memory_kernels("triad, read"),
              ElementsAre(diagnostics::MemoryKernel::kTriad, diagnostics::MemoryKernel::kRead));
  EXPECT_THAT([] { parse_memory_kernels("read,scale"); },
              ThrowsMessage<ValueError>(
                  "--kernels 'read,scale': unknown memory kernel 'scale' (choose read, copy or "
                  "triad)"));
  EXPECT_THAT([] { parse_memory_kernels("copy,copy"); },
              ThrowsMessage<ValueError>("--kernels 'copy,copy': 'copy' is listed twice"));
  EXPECT_THAT(
      [] { parse_memory_kernels(","); },
      ThrowsMessage<ValueError>("--kernels ',' names no kernel (choose from read, copy, triad)"));
}

TEST(ParseThreadsSweepTest, ReadsCountsAndAll) {
  EXPECT_THAT(parse_threads_sweep("1,2,4,all"), ElementsAre(1, 2, 4, 0));
  EXPECT_THAT(parse_threads_sweep("all"), ElementsAre(0));
  EXPECT_THAT(
      [] { parse_threads_sweep("1,x"); },
      ThrowsMessage<ValueError>("--threads-sweep '1,x': 'x' is neither a thread count nor 'all'"));
  EXPECT_THAT([] { parse_threads_sweep("0"); },
              ThrowsMessage<ValueError>("--threads-sweep '0': 0 is not a positive thread count "
                                        "('all' means every thread of a device)"));
  EXPECT_THAT([] { parse_threads_sweep("-2"); },
              ThrowsMessage<ValueError>(HasSubstr("-2 is not a positive thread count")));
  EXPECT_THAT([] { parse_threads_sweep("2,all,2"); },
              ThrowsMessage<ValueError>("--threads-sweep '2,all,2': '2' is listed twice"));
  EXPECT_THAT([] { parse_threads_sweep("all,all"); },
              ThrowsMessage<ValueError>("--threads-sweep 'all,all': 'all' is listed twice"));
  EXPECT_THAT(
      [] { parse_threads_sweep(""); },
      ThrowsMessage<ValueError>("--threads-sweep '' names no thread count (e.g. 1,2,4,all)"));
}

TEST(ParsePolicyOptionTest, AcceptsWhatTheCommandLineCanPlace) {
  EXPECT_EQ(parse_policy_option("numa"), runtime::PlacementPolicy::kNuma);
  EXPECT_EQ(parse_policy_option("l3"), runtime::PlacementPolicy::kL3);
  EXPECT_EQ(parse_policy_option("core"), runtime::PlacementPolicy::kCore);
  EXPECT_THAT([] { parse_policy_option("foo"); },
              ThrowsMessage<ValueError>(
                  "--policy 'foo' is not a placement policy (choose numa, l3 or core)"));
  EXPECT_THAT([] { parse_policy_option("explicit"); },
              ThrowsMessage<ValueError>(HasSubstr("--policy 'explicit' needs cpusets")));
}

TEST(ParseModeArgTest, ReadsNamedAndIntegerModes) {
  EXPECT_EQ(parse_mode_arg("decode").mode(), sharding::Mode::kDecode);
  EXPECT_EQ(parse_mode_arg("insert").mode(), sharding::Mode::kInsert);
  const sharding::ModeArg dim = parse_mode_arg("dim:1");
  ASSERT_TRUE(dim.is_dim());
  EXPECT_EQ(dim.dim(), 1);
  EXPECT_THAT(
      [] { parse_mode_arg("fast"); },
      ThrowsMessage<ValueError>(
          "--mode 'fast' is not a mode (expected train, prefill, decode, insert or dim:N)"));
  EXPECT_THAT([] { parse_mode_arg("dim:x"); },
              ThrowsMessage<ValueError>("--mode dim:N 'x': 'x' is not an integer"));
  EXPECT_THAT([] { parse_mode_arg("dim:1,2"); },
              ThrowsMessage<ValueError>("--mode 'dim:1,2': dim:N takes one integer"));
}

TEST(ParseRunModeTest, RefusesInsert) {
  EXPECT_EQ(parse_run_mode("prefill").mode(), sharding::Mode::kPrefill);
  EXPECT_TRUE(parse_run_mode("dim:1").is_dim());
  EXPECT_THAT(
      [] { parse_run_mode("insert"); },
      ThrowsMessage<ValueError>("--mode 'insert': expected train, prefill, decode or dim:N"));
  EXPECT_THAT([] { parse_run_mode("dim:x"); },
              ThrowsMessage<ValueError>("--mode dim:N 'x': 'x' is not an integer"));
}

TEST(ParseOpModeTest, RefusesIntegerModes) {
  EXPECT_EQ(parse_op_mode("insert"), sharding::Mode::kInsert);
  EXPECT_THAT(
      [] { parse_op_mode("dim:1"); },
      ThrowsMessage<ValueError>("--mode 'dim:1': expected train, prefill, decode or insert"));
}

TEST(ParseKvLayoutTest, ReadsBothLayouts) {
  EXPECT_EQ(parse_kv_layout("bthd"), ops::KvLayout::kBTHD);
  EXPECT_EQ(parse_kv_layout("bhtd"), ops::KvLayout::kBHTD);
  EXPECT_THAT([] { parse_kv_layout("thd"); },
              ThrowsMessage<ValueError>("--kv-layout 'thd': expected bthd or bhtd"));
}

TEST(ParseAxesTest, ReadsNamesNoneAndComposites) {
  const std::vector<sharding::AxisRule> axes = parse_axes("batch, None, (fsdp, sp), _");
  ASSERT_EQ(axes.size(), 4u);
  EXPECT_TRUE(axes[1].is_none());
  EXPECT_TRUE(axes[2].is_sequence());
  EXPECT_EQ(axes[2].members().size(), 2u);
  EXPECT_THAT(parse_axes(" "), IsEmpty());
}

TEST(ParseAxesTest, NamesTheTextOnBadBrackets) {
  EXPECT_THAT([] { parse_axes("(a,(b))"); },
              ThrowsMessage<ValueError>("--axes '(a,(b))': composites cannot nest"));
  EXPECT_THAT([] { parse_axes("a)"); }, ThrowsMessage<ValueError>("--axes 'a)': unbalanced ')'"));
  EXPECT_THAT([] { parse_axes("(a"); }, ThrowsMessage<ValueError>("--axes '(a': unclosed bracket"));
  EXPECT_THAT([] { parse_axes("(a)b"); },
              ThrowsMessage<ValueError>("--axes '(a)b': entry '(a)b' has text after its bracket"));
}

TEST(ParseFieldSetTest, ReadsNamesNoneAndTuples) {
  const auto [field, value] = parse_field_set(" tensor_parallel_axis = model");
  EXPECT_EQ(field, "tensor_parallel_axis");
  EXPECT_EQ(value, "model");
  EXPECT_TRUE(parse_field_set("a=None").second.is_null());
  EXPECT_EQ(parse_field_set("a=(fsdp, None)").second, nlohmann::json({"fsdp", nullptr}));
  EXPECT_EQ(parse_field_set("a=[]").second, nlohmann::json::array());
}

TEST(ParseFieldSetTest, NamesTheMalformedText) {
  EXPECT_THAT([] { parse_field_set("x"); },
              ThrowsMessage<ValueError>("--set 'x' is not of the form field=value"));
  EXPECT_THAT([] { parse_field_set("=x"); },
              ThrowsMessage<ValueError>("--set '=x' is not of the form field=value"));
  EXPECT_THAT([] { parse_field_set("a=(b"); },
              ThrowsMessage<ValueError>("--set value '(b' has an unclosed bracket"));
  EXPECT_THAT([] { parse_field_set("a=(b,(c))"); },
              ThrowsMessage<ValueError>("--set value '(b,(c))' nests brackets"));
}

}  // namespace
}  // namespace numesh::tools
