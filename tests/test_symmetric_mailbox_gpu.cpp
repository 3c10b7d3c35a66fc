// SPDX-License-Identifier: Apache-2.0
// The symmetric mailbox memory on two GPUs (skipped with fewer): NCCL 2.28
// symmetric windows, the peers' addresses derived on the host from the
// window descriptor, and a round trip through them:
//   - every rank fills its buffer with the 0x8000 sentinel and reads every
//     rank's buffer (its own through NCCL's flat alias too) through the peer
//     addresses with a 16-byte-load kernel;
//   - twice, every rank writes a fresh random pattern into its own buffer,
//     and every rank reads every rank's pattern back through the peer
//     addresses, bit for bit (the second round catches stale reads);
//   - every rank writes a random block into slot [rank] of every rank's buffer
//     through the peer addresses (the mailbox's unicast fan-out) and checks
//     that its own buffer holds every rank's block;
//   - after the buffer is destroyed, a plain ncclAllReduce on the same
//     communicator still works, and a second buffer on it does too.
// The same scenario runs with one process driving both GPUs (a thread per
// rank) and with one process per GPU. Every wait has a deadline: a watchdog
// ends the test with a message after 120 s, children have a 100 s alarm.
//
// Why a thread per rank rather than ncclGroupStart/ncclCommInitRank x2/
// ncclGroupEnd from one thread: ncclCommWindowRegister, the barriers and the
// copies are all per rank and collective, so one thread would have to group
// every one of them; a thread per rank (each with its GPU's primary context
// current) runs exactly the code an engine's rank runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/comm/symmetric_buffer.hpp"
#include "support/gpu.hpp"
#include "support/multi_gpu.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

constexpr int kRanks = 2;
constexpr int kThreads = 256;
constexpr std::chrono::seconds kWatchdogLimit{120};
constexpr int kChildAlarmSeconds = 100;
constexpr std::chrono::seconds kChildWaitLimit{110};
constexpr const char* kChildTest = "SymmetricMailboxChild.RunsOneRank";
constexpr const char* kChildPrefix = "POOLER_SYMMETRIC_CHILD_";

Form peer_copy_form() {
  return Form("test_peer_copy", "test_peer_copy.cu", {"pooler_test_peer_copy"}).set("THREADS", kThreads);
}

// The watchdog, the problem list and disable_nvls are the multi-GPU tests' own
// (tests/support/multi_gpu.hpp).
using testing::disable_nvls;
using testing::fresh_seed;
using testing::Problems;
using testing::Watchdog;

// A reproducible random pattern: what rank `rank` writes in phase `phase`.
// Every rank can compute every other rank's.
std::vector<std::uint32_t> pattern(std::uint64_t seed, int rank, int phase, std::size_t bytes) {
  std::seed_seq sequence{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                         static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(phase)};
  std::mt19937 random(sequence);
  std::vector<std::uint32_t> words(bytes / 4);
  for (std::uint32_t& word : words) {
    word = static_cast<std::uint32_t>(random());
  }
  return words;
}

// Compares `got` with `expected` word for word; reports the first mismatches
// with their byte offsets, and says so when the words are still the sentinel
// or the poison (nothing arrived).
void compare(Problems& problems, const std::string& what, const std::uint32_t* got, const std::uint32_t* expected,
             std::size_t words) {
  std::size_t wrong = 0, sentinel = 0, poison = 0;
  for (std::size_t i = 0; i < words; ++i) {
    if (got[i] != expected[i]) {
      sentinel += got[i] == 0x80008000u;
      poison += got[i] == 0x5A5A5A5Au;
      if (++wrong <= 4) {
        problems.add(fmt::format("{}: byte offset {} (word {}): got 0x{:08x}, expected 0x{:08x}", what, i * 4, i,
                                 got[i], expected[i]));
      }
    }
  }
  if (wrong > 4) {
    problems.add(fmt::format("{}: {} of {} words differ ({} still the 0x8000 sentinel, {} still the 0x5A poison)", what,
                             wrong, words, sentinel, poison));
  }
}

// The test's rank barrier: an ncclAllReduce of one int on `stream`, waited
// for. Everything queued on `stream` before it has completed on this rank
// once it returns, and every other rank has reached its own barrier.
class Barrier {
 public:
  Barrier(ncclComm_t comm, CUstream stream, int ranks) : comm_(comm), stream_(stream), ranks_(ranks), flag_(4) {}
  void operator()(const char* where) {
    const int one = 1;
    int sum = 0;
    POOLER_CU(cuMemcpyHtoDAsync(flag_.get(), &one, sizeof(one), stream_), where);
    void* flag = reinterpret_cast<void*>(static_cast<std::uintptr_t>(flag_.get()));
    check_nccl(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce", where, comm_);
    POOLER_CU(cuMemcpyDtoHAsync(&sum, flag_.get(), sizeof(sum), stream_), where);
    POOLER_CU(cuStreamSynchronize(stream_), where);
    if (sum != ranks_) {
      throw Error(fmt::format("barrier {}: the all-reduce of ones gave {}, expected {}", where, sum, ranks_));
    }
  }

 private:
  ncclComm_t comm_;
  CUstream stream_;
  int ranks_;
  DeviceBuffer flag_;
};

// Copies `bytes` (a multiple of 16) from `source` to `destination` with the
// test kernel, on `stream`.
void copy16(const Kernel& kernel, CUstream stream, CUdeviceptr source, CUdeviceptr destination, std::size_t bytes) {
  const auto vectors = static_cast<long long>(bytes / 16);
  LaunchShape shape;
  shape.block_x = kThreads;
  shape.grid_x = static_cast<unsigned>(std::clamp<long long>((vectors + kThreads - 1) / kThreads, 1, 528));
  kernel(stream, shape, source, destination, vectors);
}

// Reads rank `peer`'s buffer through this GPU's address for it into
// `landing` (poisoned first) and returns the words.
std::vector<std::uint32_t> read_through(const Kernel& kernel, CUstream stream, const SymmetricBuffer& buffer, int peer,
                                        const DeviceBuffer& landing) {
  POOLER_CU(cuMemsetD8Async(landing.get(), 0x5A, buffer.bytes(), stream), "poisoning the landing buffer");
  copy16(kernel, stream, buffer.peer(peer), landing.get(), buffer.bytes());
  POOLER_CU(cuStreamSynchronize(stream), fmt::format("reading rank {}'s buffer", peer));
  std::vector<std::uint32_t> words(buffer.bytes() / 4);
  landing.download(words.data(), buffer.bytes());
  return words;
}

// Every rank's buffer, read through the peer addresses, is the sentinel.
void check_sentinel_everywhere(Problems& problems, const Kernel& kernel, CUstream stream, const SymmetricBuffer& buffer,
                               const DeviceBuffer& landing, const std::string& phase) {
  const std::vector<std::uint32_t> expected(buffer.bytes() / 4, 0x80008000u);
  for (int peer = 0; peer < buffer.size(); ++peer) {
    const std::vector<std::uint32_t> got = read_through(kernel, stream, buffer, peer, landing);
    compare(problems,
            fmt::format("{}: rank {}'s buffer read through 0x{:x} (expected the 0x8000 sentinel)", phase, peer,
                        buffer.peer(peer)),
            got.data(), expected.data(), expected.size());
  }
}

// The whole scenario on one rank; the rank's GPU context is current.
void run_rank(Problems& problems, ncclComm_t comm, int rank, int ranks, CUcontext context, const CacheEntry& entry,
              std::uint64_t seed) {
  Stream stream;
  Barrier barrier(comm, stream.get(), ranks);
  LoadedForm loaded(entry, context);
  const Kernel kernel = loaded.kernel("pooler_test_peer_copy");

  // Slots of 1 MiB + 48 bytes: the buffer is not a multiple of 4 KiB, so the
  // mapping is rounded up while bytes() is not.
  const std::size_t slot = (std::size_t{1} << 20) + 48;
  const std::size_t bytes = slot * static_cast<std::size_t>(ranks);
  {
    SymmetricBuffer buffer(comm, bytes);
    if (buffer.rank() != rank || buffer.size() != ranks || buffer.bytes() != bytes) {
      problems.add(fmt::format("SymmetricBuffer says rank {} of {}, {} bytes; expected rank {} of {}, {} bytes",
                               buffer.rank(), buffer.size(), buffer.bytes(), rank, ranks, bytes));
    }
    if (buffer.peers().size() != static_cast<std::size_t>(ranks)) {
      problems.add(fmt::format("peers() has {} entries, expected {}", buffer.peers().size(), ranks));
      return;
    }
    std::string addresses = fmt::format("local 0x{:x}, peers", buffer.local());
    for (int peer = 0; peer < ranks; ++peer) {
      const CUdeviceptr address = buffer.peer(peer);
      addresses += fmt::format(" 0x{:x}", address);
      // add4G changes only the upper half: the same offset in every copy.
      if ((address & 0xFFFFFFFFull) != (buffer.peer(0) & 0xFFFFFFFFull) || address == 0) {
        problems.add(fmt::format("peer {}'s address 0x{:x} does not share rank 0's low 32 bits (0x{:x})", peer, address,
                                 buffer.peer(0)));
      }
      for (int other = 0; other < peer; ++other) {
        if (buffer.peer(other) == address) {
          problems.add(fmt::format("peers {} and {} share the address 0x{:x}", other, peer, address));
        }
      }
    }
    std::printf("[rank %d] %s\n", rank, addresses.c_str());
    try {
      (void)buffer.peer(ranks);
      problems.add("peer(size()) did not throw");
    } catch (const InvalidArgument&) {}

    DeviceBuffer landing(bytes);

    // 1. The sentinel, written by each rank into its own buffer, is what
    //    every rank reads through the peer addresses (and through the flat
    //    alias of its own buffer).
    buffer.fill_u16(stream.get(), 0x8000);
    barrier("after filling the sentinel");
    check_sentinel_everywhere(problems, kernel, stream.get(), buffer, landing, "sentinel");

    // 2. Reads: each rank writes a random pattern into its own buffer
    //    (local()); every rank reads every rank's through peers(). Twice,
    //    with new patterns, so a stale second read shows.
    for (int round = 0; round < 2; ++round) {
      barrier("before writing the read pattern");  // nobody still reads the previous contents
      const std::vector<std::uint32_t> mine = pattern(seed, rank, 10 + round, bytes);
      POOLER_CU(cuMemcpyHtoDAsync(buffer.local(), mine.data(), bytes, stream.get()), "writing the read pattern");
      barrier("after writing the read pattern");
      for (int peer = 0; peer < ranks; ++peer) {
        const std::vector<std::uint32_t> got = read_through(kernel, stream.get(), buffer, peer, landing);
        const std::vector<std::uint32_t> expected = pattern(seed, peer, 10 + round, bytes);
        compare(problems,
                fmt::format("read round {}: rank {}'s pattern read through 0x{:x}", round, peer, buffer.peer(peer)),
                got.data(), expected.data(), expected.size());
      }
    }

    // 3. Writes: each rank stores a random block into slot [rank] of every
    //    rank's buffer (its own included) through peers(); each rank then
    //    finds every rank's block in its own memory.
    barrier("before refilling the sentinel");  // nobody still reads the patterns
    buffer.fill_u16(stream.get(), 0x8000);
    barrier("after refilling the sentinel");  // every buffer is the sentinel before anyone writes
    {
      const std::vector<std::uint32_t> block = pattern(seed, rank, 20, slot);
      DeviceBuffer staging(slot);
      // On `stream`, not DeviceBuffer::upload: a synchronous copy from pageable
      // memory may still be in flight on the legacy stream, which this
      // non-blocking stream does not wait for.
      POOLER_CU(cuMemcpyHtoDAsync(staging.get(), block.data(), slot, stream.get()), "staging the fan-out block");
      for (int peer = 0; peer < ranks; ++peer) {
        copy16(kernel, stream.get(), staging.get(), buffer.peer(peer) + static_cast<std::size_t>(rank) * slot, slot);
      }
      barrier("after the fan-out writes");
      std::vector<std::uint32_t> mine(bytes / 4);
      POOLER_CU(cuMemcpyDtoH(mine.data(), buffer.local(), bytes), "reading this rank's buffer after the writes");
      for (int writer = 0; writer < ranks; ++writer) {
        const std::vector<std::uint32_t> expected = pattern(seed, writer, 20, slot);
        compare(problems,
                fmt::format("write round trip: slot {} (written by rank {} through its address for rank {})", writer,
                            writer, rank),
                mine.data() + static_cast<std::size_t>(writer) * slot / 4, expected.data(), expected.size());
      }
    }
    barrier("before destroying the buffer");  // nobody still writes into this rank's buffer
  }

  // 4. The communicator outlives the window: a plain all-reduce.
  {
    const int count = 4099;
    std::vector<std::int32_t> values(count), sums(count);
    for (int i = 0; i < count; ++i) {
      values[static_cast<std::size_t>(i)] = (rank + 1) * 1000 + i;
    }
    DeviceBuffer data(sizeof(std::int32_t) * count);
    POOLER_CU(cuMemcpyHtoDAsync(data.get(), values.data(), data.bytes(), stream.get()), "all-reduce input");
    void* pointer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(data.get()));
    check_nccl(ncclAllReduce(pointer, pointer, count, ncclInt32, ncclSum, comm, stream.get()), "ncclAllReduce",
               "after destroying the window", comm);
    stream.synchronize();
    data.download(sums.data(), data.bytes());
    int wrong = 0;
    for (int i = 0; i < count; ++i) {
      const std::int32_t expected = 1000 * ranks * (ranks + 1) / 2 + ranks * i;
      if (sums[static_cast<std::size_t>(i)] != expected && ++wrong <= 4) {
        problems.add(fmt::format("all-reduce after the window's destruction: element {} is {}, expected {}", i,
                                 sums[static_cast<std::size_t>(i)], expected));
      }
    }
  }

  // 5. A second window on the same communicator, of another size.
  {
    SymmetricBuffer again(comm, 3 * 4096 + 5 * 16);
    DeviceBuffer landing(again.bytes());
    const std::vector<std::uint32_t> mine = pattern(seed, rank, 30, again.bytes());
    POOLER_CU(cuMemcpyHtoDAsync(again.local(), mine.data(), again.bytes(), stream.get()), "second window");
    barrier("second window, after writing");
    for (int peer = 0; peer < ranks; ++peer) {
      const std::vector<std::uint32_t> got = read_through(kernel, stream.get(), again, peer, landing);
      const std::vector<std::uint32_t> expected = pattern(seed, peer, 30, again.bytes());
      compare(problems, fmt::format("second window: rank {}'s pattern", peer), got.data(), expected.data(),
              expected.size());
    }
    barrier("second window, before destroying it");
  }
}

// One rank from context to communicator to scenario; exceptions become
// problems (and are printed at once: a peer may now wait until the watchdog).
Problems run_rank_on_gpu(int rank, int ranks, const ncclUniqueId& id, const CacheEntry& entry, std::uint64_t seed) {
  Problems problems;
  problems.rank = rank;
  try {
    PrimaryContext context(rank);
    ContextScope scope(context.get());
    NcclComm comm(ranks, id, rank);
    run_rank(problems, comm.get(), rank, ranks, context.get(), entry, seed);
  } catch (const std::exception& error) {
    problems.add(fmt::format("threw: {}", error.what()));
    std::fprintf(stderr, "[rank %d] threw: %s\n", rank, error.what());
    std::fflush(stderr);
  }
  return problems;
}

std::shared_ptr<const CacheEntry> compile_for(KernelCache& cache, int ordinal) {
  return cache.get(peer_copy_form(), device_info(ordinal).architecture()).entry;
}

TEST(SymmetricMailboxGpu, TwoRanksInOneProcess) {
  POOLER_REQUIRE_GPUS(kRanks);
  disable_nvls();
  Watchdog watchdog(kWatchdogLimit, "SymmetricMailboxGpu.TwoRanksInOneProcess");
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  std::vector<std::shared_ptr<const CacheEntry>> entries;
  for (int rank = 0; rank < kRanks; ++rank) {
    entries.push_back(compile_for(cache, rank));
  }
  const std::uint64_t seed = fresh_seed();
  const ncclUniqueId id = NcclComm::unique_id();
  std::vector<Problems> outcomes(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      outcomes[static_cast<std::size_t>(rank)] =
          run_rank_on_gpu(rank, kRanks, id, *entries[static_cast<std::size_t>(rank)], seed);
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (const Problems& outcome : outcomes) {
    EXPECT_EQ(outcome.count, 0) << "seed " << seed << "\n" << outcome.text();
  }
}

// ---- one process per GPU ----------------------------------------------------
// The parent re-executes this test program once per rank with only
// SymmetricMailboxChild.RunsOneRank selected (support/multi_gpu.hpp's
// run_rank_processes: the id through a pipe, the seed and kernel cache through
// the environment, a result file per child so a child that never ran the
// scenario cannot pass).

TEST(SymmetricMailboxGpu, TwoRanksInTwoProcesses) {
  POOLER_REQUIRE_GPUS(kRanks);
  disable_nvls();
  testing::ScratchDir dir;
  {
    // Compiled here, found on disk by the children.
    KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
    for (int rank = 0; rank < kRanks; ++rank) {
      compile_for(cache, rank);
    }
  }
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  // Made here: NCCL's bootstrap root listens in this process while the
  // children join.
  const ncclUniqueId id = NcclComm::unique_id();
  testing::RankProcesses spec;
  spec.child_test = kChildTest;
  spec.prefix = kChildPrefix;
  spec.ranks = kRanks;
  spec.variables = {{"SEED", std::to_string(seed)}};
  spec.directory = dir.path();
  spec.limit = kChildWaitLimit;  // the children's own alarm fires first
  testing::run_rank_processes(spec, id);
}

// Runs only as a child of TwoRanksInTwoProcesses (skipped otherwise).
TEST(SymmetricMailboxChild, RunsOneRank) {
  Problems problems;
  const std::optional<testing::ChildRank> child = testing::child_rank(kChildPrefix, problems);
  if (!child) {
    GTEST_SKIP() << "runs only as a child process of SymmetricMailboxGpu.TwoRanksInTwoProcesses";
  }
  ::alarm(kChildAlarmSeconds);
  const std::uint64_t seed = std::strtoull(testing::child_variable(kChildPrefix, "SEED").c_str(), nullptr, 10);
  if (problems.count == 0) {
    try {
      KernelCache cache(CacheLocation{child->directory, true}, TemplateLibrary::instance());
      const auto entry = compile_for(cache, child->rank);
      problems = run_rank_on_gpu(child->rank, child->ranks, child->id, *entry, seed);
    } catch (const std::exception& error) {
      problems.add(fmt::format("threw: {}", error.what()));
    }
  }
  testing::finish_child(*child, problems);
}

}  // namespace
}  // namespace pooler
