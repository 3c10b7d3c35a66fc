// SPDX-License-Identifier: Apache-2.0
// What of the symmetric mailbox memory needs no GPU: NCCL error messages,
// argument checks, the peer-address arithmetic (ncclGetLsaPointer's, on a
// window descriptor), the LSA reachability error, and the test kernel
// compiling for sm_90 and sm_100a without spills.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/comm/symmetric_buffer.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Sets an environment variable for a scope, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) {
      had_ = true;
      old_ = old;
    }
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

TEST(CheckNccl, SuccessDoesNotThrow) { EXPECT_NO_THROW(check_nccl(ncclSuccess, "ncclAllReduce", "context")); }

TEST(CheckNccl, FailureNamesTheCallNcclsTextAndTheContext) {
  try {
    check_nccl(ncclInvalidArgument, "ncclCommWindowRegister(comm, ptr, 4096, &win, 1)", "rank 1 of 2");
    FAIL() << "no exception";
  } catch (const NcclError& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.code(), ncclInvalidArgument);
    EXPECT_TRUE(contains(message, "ncclCommWindowRegister(comm, ptr, 4096, &win, 1) failed: ")) << message;
    EXPECT_TRUE(contains(message, ncclGetErrorString(ncclInvalidArgument))) << message;
    EXPECT_TRUE(contains(message, "[rank 1 of 2]")) << message;
  }
  // NcclError is a pooler::Error.
  EXPECT_THROW(check_nccl(ncclSystemError, "ncclGroupEnd", {}), Error);
}

TEST(CheckNccl, MessageFormat) {
  EXPECT_EQ(describe_nccl_error(ncclInternalError, "ncclFoo", "ctx", "internal error", "bad things"),
            "ncclFoo failed: internal error (NCCL: bad things) [ctx]");
  EXPECT_EQ(describe_nccl_error(ncclInternalError, "ncclFoo", "", "internal error", ""),
            "ncclFoo failed: internal error");
  EXPECT_EQ(describe_nccl_error(ncclNumResults, "ncclFoo", "", "", ""), "ncclFoo failed: ncclResult_t 8");
}

TEST(CheckNccl, MacroStringifiesTheCall) {
  try {
    POOLER_NCCL(ncclGetVersion(nullptr), "asking for the version");
    FAIL() << "ncclGetVersion(nullptr) succeeded";
  } catch (const NcclError& error) {
    EXPECT_TRUE(contains(error.what(), "ncclGetVersion(nullptr) failed")) << error.what();
    EXPECT_TRUE(contains(error.what(), "[asking for the version]")) << error.what();
  }
}

TEST(NcclVersion, LoadedLibraryIsAtLeast228AndFormats) {
  EXPECT_EQ(nccl_version_string(22803), "2.28.3");
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(2708), "2.7.8");
  const int version = nccl_runtime_version();
  EXPECT_GE(version, 22800) << nccl_version_string(version);
}

TEST(NcclComm, RejectsBadRanksBeforeAnythingElse) {
  ncclUniqueId id{};
  try {
    NcclComm comm(0, id, 0);
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(contains(error.what(), "ranks is 0")) << error.what();
  }
  try {
    NcclComm comm(2, id, 2);
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(contains(error.what(), "rank is 2")) << error.what();
    EXPECT_TRUE(contains(error.what(), "< 2")) << error.what();
  }
  EXPECT_THROW({ NcclComm comm(2, id, -1); }, InvalidArgument);
}

TEST(NcclComm, RefusesUnlessNvlsIsDisabled) {
  ncclUniqueId id{};
  {
    ScopedEnv env("NCCL_NVLS_ENABLE", nullptr);
    try {
      NcclComm comm(2, id, 0);
      FAIL();
    } catch (const InvalidArgument&) {
      FAIL() << "arguments were valid";
    } catch (const Error& error) {
      EXPECT_TRUE(contains(error.what(), "NCCL_NVLS_ENABLE is unset")) << error.what();
    }
  }
  {
    ScopedEnv env("NCCL_NVLS_ENABLE", "1");
    try {
      require_nvls_disabled();
      FAIL();
    } catch (const Error& error) {
      EXPECT_TRUE(contains(error.what(), "NCCL_NVLS_ENABLE is \"1\", expected \"0\"")) << error.what();
    }
  }
  ScopedEnv env("NCCL_NVLS_ENABLE", "0");
  EXPECT_NO_THROW(require_nvls_disabled());
}

TEST(NcclComm, NeedsACurrentContext) {
  // A fresh thread has no current context: without a driver that is a
  // NoDriverError, with one the "no CUDA context is current" error. Either
  // way nothing reaches ncclCommInitRank (which would wait for a peer).
  ScopedEnv env("NCCL_NVLS_ENABLE", "0");
  std::string message;
  std::thread([&] {
    try {
      ncclUniqueId id{};
      NcclComm comm(2, id, 1);
    } catch (const Error& error) {
      message = error.what();
    }
  }).join();
  EXPECT_TRUE(contains(message, "no CUDA driver") || contains(message, "no CUDA context is current")) << message;
}

TEST(SymmetricBuffer, ArgumentsAreCheckedBeforeTouchingTheCommunicator) {
  try {
    SymmetricBuffer::check_arguments(nullptr, 4096);
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(contains(error.what(), "communicator is null")) << error.what();
  }
  // Never dereferenced: the size is checked first.
  const auto fake = reinterpret_cast<ncclComm_t>(static_cast<std::uintptr_t>(0x1000));
  for (std::size_t bytes : {std::size_t{0}, std::size_t{8}, std::size_t{4097}, std::size_t{(1ull << 40) + 16}}) {
    try {
      SymmetricBuffer::check_arguments(fake, bytes);
      FAIL() << bytes;
    } catch (const InvalidArgument& error) {
      EXPECT_TRUE(contains(error.what(), "bytes is " + std::to_string(bytes))) << error.what();
    }
    EXPECT_THROW({ SymmetricBuffer buffer(fake, bytes); }, InvalidArgument) << bytes;
  }
  EXPECT_THROW({ SymmetricBuffer buffer(nullptr, 4096); }, InvalidArgument);
  EXPECT_NO_THROW(SymmetricBuffer::check_arguments(fake, 16));
  EXPECT_NO_THROW(SymmetricBuffer::check_arguments(fake, 3 * 4096 + 48));
}

// ncclGetLsaPointer: add4G(lsaFlatBase, i * stride4G), i.e. the upper 32 bits
// grow by i * stride4G.
TEST(LsaPeerAddresses, FollowNcclsArithmetic) {
  WindowView view;
  view.lsa_flat_base = 0x7f1200000000ull + 0x3000;  // a window 12 KiB into NCCL's flat reservation
  view.stride4g = 36;                               // 144 GiB per rank (an H200's memory, rounded to 4 GiB)
  for (int world_size : {1, 2, 4, 8}) {
    for (int rank = 0; rank < world_size; ++rank) {
      view.lsa_rank = rank;
      view.world_rank = rank;
      const std::vector<CUdeviceptr> peers = lsa_peer_addresses(view, LsaTeam{world_size, rank, 1}, rank, world_size);
      ASSERT_EQ(peers.size(), static_cast<std::size_t>(world_size));
      for (int peer = 0; peer < world_size; ++peer) {
        const std::uint64_t expected = view.lsa_flat_base + (static_cast<std::uint64_t>(peer) * 36ull << 32);
        EXPECT_EQ(peers[static_cast<std::size_t>(peer)], expected) << "rank " << rank << " peer " << peer;
        // Same offset inside every copy: the window is symmetric.
        EXPECT_EQ(peers[static_cast<std::size_t>(peer)] & 0xFFFFFFFFull, view.lsa_flat_base & 0xFFFFFFFFull);
      }
    }
  }
}

TEST(LsaPeerAddresses, WorldRanksMapThroughTheLsaIndex) {
  // World ranks 4..7 form the LSA team of world rank 6 in a 4-rank-per-node
  // job; world rank p is LSA peer lsaRank + (p - worldRank).
  WindowView view;
  view.lsa_flat_base = 0x600000000000ull;
  view.stride4g = 20;
  view.lsa_rank = 2;
  view.world_rank = 6;
  try {
    lsa_peer_addresses(view, LsaTeam{4, 2, 1}, 6, 8);
    FAIL();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message,
                         "pooler needs every TP rank in one NVLink domain; ranks 0, 1, 2, 3 are not "
                         "load/store accessible from rank 6"))
        << message;
    EXPECT_TRUE(contains(message, "holds ranks 4..7 of 8")) << message;
  }
}

TEST(LsaPeerAddresses, NamesEveryUnreachableRank) {
  WindowView view;
  view.lsa_flat_base = 0x600000000000ull;
  view.stride4g = 36;
  view.lsa_rank = 0;
  view.world_rank = 0;
  try {
    lsa_peer_addresses(view, LsaTeam{2, 0, 1}, 0, 4);
    FAIL();
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "ranks 2, 3 are not load/store accessible from rank 0")) << error.what();
  }
}

// The nccl transport's automatic choice asks without throwing: the ranks outside
// the team come back, and no addresses.
TEST(LsaPeerAddresses, ReportsUnreachableRanksWhenAsked) {
  WindowView view;
  view.lsa_flat_base = 0x600000000000ull;
  view.stride4g = 36;
  view.lsa_rank = 1;
  view.world_rank = 3;
  std::vector<int> unreachable;
  EXPECT_TRUE(lsa_peer_addresses(view, LsaTeam{2, 1, 1}, 3, 4, &unreachable).empty());
  EXPECT_EQ(unreachable, (std::vector<int>{0, 1}));
  unreachable.clear();
  view.lsa_rank = 3;
  EXPECT_EQ(lsa_peer_addresses(view, LsaTeam{4, 3, 1}, 3, 4, &unreachable).size(), 4u);
  EXPECT_TRUE(unreachable.empty());
  // A contradiction is still an error: it is no answer about reachability.
  view.world_rank = 2;
  EXPECT_THROW(lsa_peer_addresses(view, LsaTeam{4, 3, 1}, 3, 4, &unreachable), Error);
}

TEST(LsaPeerAddresses, ContradictionsPointAtTheLayout) {
  WindowView view;
  view.lsa_flat_base = 0x600000000000ull;
  view.stride4g = 36;
  view.lsa_rank = 1;
  view.world_rank = 1;
  EXPECT_NO_THROW(lsa_peer_addresses(view, LsaTeam{2, 1, 1}, 1, 2));
  auto expect_layout_error = [](const WindowView& bad, const LsaTeam& team, int rank, int size) {
    try {
      lsa_peer_addresses(bad, team, rank, size);
      ADD_FAILURE() << "no exception";
    } catch (const InvalidArgument& error) {
      ADD_FAILURE() << "not a layout error: " << error.what();
    } catch (const Error& error) {
      EXPECT_TRUE(contains(error.what(), "ncclWindow_vidmem")) << error.what();
    }
  };
  WindowView bad = view;
  bad.world_rank = 0;  // descriptor disagrees with the communicator
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  bad = view;
  bad.lsa_rank = 0;  // descriptor disagrees with ncclTeamLsa
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  bad = view;
  bad.stride4g = 0;
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  bad = view;
  bad.lsa_flat_base = 0;
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  bad = view;
  bad.lsa_flat_base += 8;  // not 4 KiB aligned
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  bad = view;
  bad.lsa_flat_base = 0xFFFFFFF000000000ull;  // the last peer would wrap
  expect_layout_error(bad, LsaTeam{2, 1, 1}, 1, 2);
  // A nonsensical team, and a bad world rank.
  EXPECT_THROW(lsa_peer_addresses(view, LsaTeam{0, 0, 1}, 1, 2), Error);
  EXPECT_THROW(lsa_peer_addresses(view, LsaTeam{2, 1, 2}, 1, 2), Error);
  EXPECT_THROW(lsa_peer_addresses(view, LsaTeam{2, 1, 1}, 2, 2), InvalidArgument);
}

// The GPU test's kernel compiles for both architectures without spills.
TEST(PeerCopyKernel, CompilesForSm90AndSm100aWithoutSpills) {
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  const Form form = Form("test_peer_copy", "test_peer_copy.cu", {"pooler_test_peer_copy"}).set("THREADS", 256);
  for (const char* architecture : {"sm_90", "sm_100a"}) {
    const Lookup lookup = cache.get(form, architecture);
    EXPECT_EQ(cubin_architecture(lookup.entry->cubin), architecture);
    const std::vector<KernelResources> kernels = read_cubin_resources(lookup.entry->cubin);
    ASSERT_EQ(kernels.size(), 1u) << architecture;
    EXPECT_EQ(kernels[0].name, "pooler_test_peer_copy");
    EXPECT_EQ(kernels[0].local_bytes, 0) << architecture;
    EXPECT_EQ(kernels[0].max_threads, 256) << architecture;
  }
}

}  // namespace
}  // namespace pooler
