#include "numesh/serve/service.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "numesh/core/error.hpp"
#include "numesh/models/chat/chat_template.hpp"

namespace numesh::serve {
namespace {

using ::testing::ThrowsMessage;

ServiceOptions options() {
  ServiceOptions o;
  o.model = "/nonexistent/model";
  o.server.port = 0;
  return o;
}

// Each bad option is refused before anything binds, named as the caller's front end names it.
TEST(ServiceTest, BadOptionsAreNamedAsTheFrontEndNamesThem) {
  ServiceOptions o = options();
  o.parallel = 0;
  EXPECT_THAT([&] { Service(o, OptionStyle::kFlag); },
              ThrowsMessage<ValueError>("--parallel 0 must be between 1 and 1024"));
  EXPECT_THAT([&] { Service(o, OptionStyle::kKeyword); },
              ThrowsMessage<ValueError>("parallel=0 must be between 1 and 1024"));
  o = options();
  o.batch_tokens = 4;
  EXPECT_THAT([&] { Service(o, OptionStyle::kKeyword); },
              ThrowsMessage<ValueError>("batch_tokens=4 must be at least parallel=8 (every "
                                        "running request decodes in every step)"));
  o = options();
  o.model.clear();
  EXPECT_THAT(
      [&] { Service(o, OptionStyle::kFlag); },
      ThrowsMessage<ValueError>("--model is required (a Hugging Face folder or a GGUF file)"));
  o = options();
  o.chat_template_file = "/nonexistent/chat.jinja";
  EXPECT_THAT([&] { Service(o, OptionStyle::kKeyword); },
              ThrowsMessage<IoError>("chat_template: cannot read '/nonexistent/chat.jinja'"));
}

// Bound before the model loads; a model that cannot load stops it, and stop/wait end it.
TEST(ServiceTest, BindsFirstAndStopsWhenTheModelCannotLoad) {
  Service service(options(), OptionStyle::kFlag);
  EXPECT_GT(service.port(), 0);
  EXPECT_EQ(service.options().server.model_name, "model");  // the folder's name
  EXPECT_EQ(service.options().server.http_threads, 8 + 64 + 8);
  EXPECT_FALSE(service.wait_for(std::chrono::milliseconds(50)));  // serving (503)
  EXPECT_THROW(
      service.load(runtime::DeviceMesh::create(
          runtime::DeviceSet::create(runtime::Topology::from_synthetic("numa:1 core:1 pu:1")), {1},
          {"tp"})),
      Error);
  service.wait();  // the failed load stopped it
  EXPECT_TRUE(service.wait_for(std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace numesh::serve
