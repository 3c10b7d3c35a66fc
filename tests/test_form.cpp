// SPDX-License-Identifier: Apache-2.0
// Specialization: deterministic rendering and exact float constants.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "pooler/error.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/sample_form.hpp"
#include "runtime/jit/template_library.hpp"
#include "runtime/jit/trace_records.hpp"
#include "support/process.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

TEST(Form, RenderingIsDeterministicAndIndependentOfSetOrder) {
  const TemplateLibrary& library = TemplateLibrary::instance();
  Form a("f", "sample.cu", {"pooler_sample_fill"});
  a.set("VALUE", 0.5f).set("SCALE", 2.0f).set("THREADS", 128);
  Form b("f", "sample.cu", {"pooler_sample_fill"});
  b.set("THREADS", 128).set("SCALE", 2.0f).set("VALUE", 0.5f);
  EXPECT_EQ(a.render(library), b.render(library));
  EXPECT_EQ(a.render(library), a.render(library));
  EXPECT_NE(a.render(library), Form(a).set("EXTRA", 1).render(library));
  const std::string source = a.render(library);
  EXPECT_NE(source.find("constexpr int THREADS = 128;"), std::string::npos) << source;
  EXPECT_NE(source.find("constexpr float VALUE = 0x1p-1f;"), std::string::npos) << source;
  EXPECT_NE(source.find(library.text("sample.cu")), std::string::npos);
}

// The literal must read back as the very same float, for awkward values too.
float read_back(const std::string& literal) {
  EXPECT_EQ(literal.back(), 'f');
  return std::strtof(literal.substr(0, literal.size() - 1).c_str(), nullptr);
}

TEST(Form, FloatConstantsSurviveTheRoundTripBitForBit) {
  const float awkward[] = {1e-5f,
                           1e-6f,
                           0.1f,
                           1.0f / 3.0f,
                           448.0f * 6.0f / 2.71828f,
                           -0.0f,
                           0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::nextafter(1.0f, 2.0f),
                           16777217.0f};
  for (float value : awkward) {
    const std::string literal = hex_float_literal(value);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(read_back(literal)), std::bit_cast<std::uint32_t>(value))
        << literal << " for " << value;
  }
  std::mt19937 random(std::random_device{}());
  for (int i = 0; i < 100000; ++i) {
    float value = std::bit_cast<float>(static_cast<std::uint32_t>(random()));
    if (!std::isfinite(value)) continue;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(read_back(hex_float_literal(value))), std::bit_cast<std::uint32_t>(value))
        << hex_float_literal(value);
  }
}

TEST(Form, RejectsBadConstants) {
  Form form("f", "sample.cu", {"k"});
  EXPECT_THROW(form.set("1abc", 1), InvalidArgument);
  EXPECT_THROW(form.set("has space", 1), InvalidArgument);
  EXPECT_THROW(form.set("NAN_VALUE", std::numeric_limits<float>::quiet_NaN()), InvalidArgument);
  EXPECT_THROW(form.set("INF", std::numeric_limits<float>::infinity()), InvalidArgument);
  form.set("X", 1);
  try {
    form.set("X", 2);
    FAIL() << "a constant set twice must be refused";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("X is set twice"), std::string::npos) << error.what();
  }
  EXPECT_THROW(Form("f", "sample.cu", {}), InvalidArgument);
}

TEST(Form, LargeIntegersAreLongLong) {
  Form form("f", "sample.cu", {"k"});
  form.set("BIG", 1LL << 40).set("SMALL", -3);
  const std::string source = form.render(TemplateLibrary::instance());
  EXPECT_NE(source.find("constexpr long long BIG = 1099511627776LL;"), std::string::npos) << source;
  EXPECT_NE(source.find("constexpr int SMALL = -3;"), std::string::npos) << source;
}

TEST(TemplateLibrary, UnknownTemplateNamesTheKnownOnes) {
  try {
    TemplateLibrary::instance().text("nope.cu");
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("sample.cu"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(TemplateLibrary::instance().headers().contains("pdl.cuh"));
}

// The library ships its own kernels only; the test and benchmark kernels come
// from the tables this program's main registered.
TEST(TemplateLibrary, ShipsOnlyItsKernelsAndTakesTheRegisteredOnes) {
  for (const EmbeddedTemplate& embedded : embedded_templates()) {
    const std::string name = embedded.name;
    EXPECT_FALSE(name.starts_with("test_") || name.starts_with("bench_") || name == "numerics_check.cu") << name;
  }
  const TemplateLibrary& library = TemplateLibrary::instance();
  for (const char* name : {"test_spin.cu", "test_compare.cu", "numerics_check.cu", "bench_fill.cu", "bench_read.cu"}) {
    EXPECT_NO_THROW((void)library.text(name)) << name;
  }
  EXPECT_NE(library.text("test_spin.cu").find("pooler_test_spin"), std::string::npos);
}

TEST(TemplateLibrary, RegistrationRefusesHeadersConflictsAndLateNewcomers) {
  (void)TemplateLibrary::instance();  // in use from here on
  const std::string spin = TemplateLibrary::instance().text("test_spin.cu");
  // The same table again: nothing to add, accepted at any time.
  const EmbeddedTemplate again[] = {{"test_spin.cu", spin}};
  EXPECT_NO_THROW(register_templates(again));
  const EmbeddedTemplate header[] = {{"extra.cuh", "// a header"}};
  EXPECT_THROW(register_templates(header), InvalidArgument);
  const EmbeddedTemplate clash[] = {{"sample.cu", "// other text"}};
  EXPECT_THROW(register_templates(clash), InvalidArgument);
  const EmbeddedTemplate late[] = {{"late_newcomer.cu", "// new"}};
  EXPECT_THROW(register_templates(late), Error);
  EXPECT_THROW((void)TemplateLibrary::instance().text("late_newcomer.cu"), InvalidArgument);
}

// POOLER_TEMPLATE_DIR's folder: its subfolders too (the repository's kernel_templates/ as it is), a
// name in two places refused naming both, and a folder that replaces nothing refused.
TEST(TemplateLibrary, OverrideFolderIsSearchedWithItsSubfoldersAndMustReplaceSomething) {
  const testing::ScratchDir dir;
  std::filesystem::create_directories(dir / "common");
  std::filesystem::create_directories(dir / "gather");
  std::ofstream(dir / "common/pdl.cuh") << "// replaced pdl\n";
  std::ofstream(dir / "gather/publish.cu") << "// replaced publish\n";
  std::ofstream(dir / "gather/notes.txt") << "not a template\n";
  const TemplateLibrary library(dir.path());
  EXPECT_EQ(library.text("publish.cu"), "// replaced publish\n");
  EXPECT_EQ(library.headers().at("pdl.cuh"), "// replaced pdl\n");
  EXPECT_EQ(library.text("sample.cu"), TemplateLibrary::instance().text("sample.cu"));  // not in the folder

  std::ofstream(dir / "publish.cu") << "// a second publish\n";
  testing::expect_mentions(testing::rejection([&] { TemplateLibrary twice(dir.path()); }),
                           {"template publish.cu is both"});

  const testing::ScratchDir empty;
  std::filesystem::create_directories(empty / "sub");
  std::ofstream(empty / "sub/readme.md") << "nothing here\n";
  testing::expect_mentions(testing::rejection([&] { TemplateLibrary none(empty.path()); }),
                           {"POOLER_TEMPLATE_DIR=" + empty.path(), "holds no *.cu or *.cuh file"});
}

}  // namespace
}  // namespace pooler

TEST(TraceRecords, LaunchCountsOutsideTheFormsAreRefusedBeforeAnyCopy) {
  // A trace form records 1 to max_launches launches; other counts are refused with the count and
  // the range, before the driver is asked for anything (this test has no device memory).
  const pooler::LoadedForm::Global records{};
  bool visited = false;
  for (int launches : {0, -1, 17}) {
    pooler::testing::expect_mentions(pooler::testing::rejection([&] {
                                       pooler::visit_trace_records(
                                           records, launches, 16, 4, 3, "a test trace",
                                           [&](int, const unsigned long long*) { visited = true; });
                                     }),
                                     {"reading a test trace", "launches = " + std::to_string(launches), "1 to 16"});
  }
  EXPECT_FALSE(visited);
}
