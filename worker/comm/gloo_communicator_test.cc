// Gloo communicator tests with real separate processes: each rank is a forked
// child that rendezvouses through a fresh FileStore directory and talks TCP on
// loopback. Children hand their results back through files; only the parent
// makes assertions.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"

namespace ferry::worker {
namespace {

using Bytes = std::vector<char>;
using Clock = std::chrono::steady_clock;
// What a rank computes; its return value goes back to the parent.
using RankBody = std::function<Bytes(Communicator&)>;

struct RankResult {
  int exit_code = -1;
  std::string error;  // exception text when exit_code != 0
  Bytes output;
};

struct Group {
  int size = 2;
  std::vector<int> ranks;  // which ranks to start; empty = all
  int timeout_s = 10;
  // A rank whose body stops its own process (SIGSTOP): killed once every other rank has exited.
  int stopped_rank = -1;
  std::filesystem::path store_dir;  // empty: a fresh directory
  int rank0_start_delay_ms = 0;     // rank 0 joins this much later than the others
};

template <typename T>
Bytes ToBytes(const std::vector<T>& v) {
  const char* p = reinterpret_cast<const char*>(v.data());
  return Bytes(p, p + v.size() * sizeof(T));
}

template <typename T>
std::vector<T> FromBytes(const Bytes& b, size_t offset_elems, size_t count) {
  std::vector<T> v(count);
  std::memcpy(v.data(), b.data() + offset_elems * sizeof(T), count * sizeof(T));
  return v;
}

void WriteFile(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Bytes ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs in the child; never returns, so the child never re-enters gtest.
[[noreturn]] void RunChild(const GlooOptions& options, const std::filesystem::path& dir, const RankBody& body,
                           int start_delay_ms) {
  const std::string stem = "rank" + std::to_string(options.rank);
  int code = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(start_delay_ms));
  try {
    Bytes output;
    {
      auto comm = CreateGlooCommunicator(options);
      output = body(*comm);
    }
    WriteFile(dir / (stem + ".out"), output);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    WriteFile(dir / (stem + ".err"), Bytes(what.begin(), what.end()));
    code = 1;
  }
  std::_Exit(code);
}

// Waits for every child, killing any still running at the deadline so a hung
// collective fails the test instead of hanging it. `stopped` (an index, or -1)
// is killed without a failure once it is the last one running.
std::vector<int> WaitAll(const std::vector<pid_t>& pids, Clock::duration deadline, int stopped = -1) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  auto give_up = Clock::now() + deadline;
  for (size_t remaining = pids.size(); remaining > 0;) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --remaining;
      codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (remaining == 0) break;
    if (remaining == 1 && stopped >= 0 && !done[stopped]) kill(pids[stopped], SIGKILL);
    if (Clock::now() > give_up) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) kill(pids[i], SIGKILL);
      }
      ADD_FAILURE() << "ranks still running at the deadline; killed";
      give_up += std::chrono::hours(1);  // reap below without killing twice
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

// Forks one process per started rank; results are indexed by rank (ranks not
// started keep exit_code -1).
std::vector<RankResult> RunRanks(const Group& group, const RankBody& body) {
  std::string pattern = (std::filesystem::temp_directory_path() / "ferry_comm_XXXXXX").string();
  const std::filesystem::path dir = mkdtemp(pattern.data());
  const std::filesystem::path store_dir = group.store_dir.empty() ? dir / "store" : group.store_dir;
  std::vector<int> ranks = group.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < group.size; ++r) ranks.push_back(r);
  }
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    GlooOptions options;
    options.rank = rank;
    options.size = group.size;
    options.store_dir = store_dir.string();
    options.prefix = "test";
    options.timeout_s = group.timeout_s;
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) RunChild(options, dir, body, rank == 0 ? group.rank0_start_delay_ms : 0);
    pids.push_back(pid);
  }
  const auto stopped = std::find(ranks.begin(), ranks.end(), group.stopped_rank);
  const std::vector<int> codes =
      WaitAll(pids, std::chrono::seconds(60), stopped == ranks.end() ? -1 : static_cast<int>(stopped - ranks.begin()));
  std::vector<RankResult> results(group.size);
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankResult& result = results[ranks[i]];
    const std::string stem = "rank" + std::to_string(ranks[i]);
    result.exit_code = codes[i];
    result.output = ReadFile(dir / (stem + ".out"));
    const Bytes err = ReadFile(dir / (stem + ".err"));
    result.error.assign(err.begin(), err.end());
  }
  std::filesystem::remove_all(dir);
  return results;
}

void ExpectAllSucceeded(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].error;
  }
}

std::vector<float> RankInput(int rank, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + n));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// 16384 and 16385 straddle the switch from gather-then-sum to the ring.
const std::vector<size_t> kAllReduceSizes = {1, 7, 1000, 16384, 16385, 1000000};

class GlooGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroupTest, AllReduceSumMatchesLocalSumAndIsBitwiseEqualAcrossRanks) {
  const int size = GetParam();
  const auto results = RunRanks({.size = size}, [](Communicator& comm) {
    Bytes out;
    for (size_t n : kAllReduceSizes) {
      std::vector<float> x = RankInput(comm.rank(), n);
      comm.AllReduceSum(x.data(), x.size());
      const Bytes b = ToBytes(x);
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  });
  ExpectAllSucceeded(results);
  if (HasFailure()) return;
  size_t offset = 0;
  for (size_t n : kAllReduceSizes) {
    std::vector<double> want(n, 0.0);
    for (int r = 0; r < size; ++r) {
      const auto x = RankInput(r, n);
      for (size_t i = 0; i < n; ++i) want[i] += x[i];
    }
    const auto got = FromBytes<float>(results[0].output, offset, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 * size) << "n=" << n << " i=" << i;
    }
    for (int r = 1; r < size; ++r) {
      const char* a = results[0].output.data() + offset * sizeof(float);
      const char* b = results[r].output.data() + offset * sizeof(float);
      ASSERT_EQ(std::memcmp(a, b, n * sizeof(float)), 0) << "rank " << r << " differs from rank 0 at n=" << n;
    }
    offset += n;
  }
}

TEST_P(GlooGroupTest, AllGatherConcatenatesInRankOrder) {
  const int size = GetParam();
  constexpr size_t kCount = 5;
  const auto results = RunRanks({.size = size}, [](Communicator& comm) {
    std::vector<float> send(kCount), recv(kCount * comm.size(), -1.0f);
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>(comm.rank() * 100 + i);
    comm.AllGather(send.data(), kCount, recv.data());
    return ToBytes(recv);
  });
  ExpectAllSucceeded(results);
  if (HasFailure()) return;
  for (int rank = 0; rank < size; ++rank) {
    const auto got = FromBytes<float>(results[rank].output, 0, kCount * size);
    for (int src = 0; src < size; ++src) {
      for (size_t i = 0; i < kCount; ++i) {
        EXPECT_EQ(got[src * kCount + i], static_cast<float>(src * 100 + i)) << "rank " << rank << " src " << src;
      }
    }
  }
}

TEST_P(GlooGroupTest, BroadcastFromNonZeroRoot) {
  const int size = GetParam();
  const int root = size - 1;
  constexpr size_t kBytes = 1001;
  auto pattern = [](size_t i) { return static_cast<char>((i * 7 + 3) & 0xff); };
  const auto results = RunRanks({.size = size}, [&](Communicator& comm) {
    Bytes data(kBytes, 0);
    if (comm.rank() == root) {
      for (size_t i = 0; i < kBytes; ++i) data[i] = pattern(i);
    }
    comm.Broadcast(data.data(), data.size(), root);
    return data;
  });
  ExpectAllSucceeded(results);
  if (HasFailure()) return;
  Bytes want(kBytes);
  for (size_t i = 0; i < kBytes; ++i) want[i] = pattern(i);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(results[rank].output, want) << "rank " << rank;
}

// A forward pass issues two allreduces per layer per step; 500 in a row, with
// the other collectives interleaved, must keep tags and pairing in step.
TEST_P(GlooGroupTest, ManyConsecutiveCollectives) {
  const int size = GetParam();
  constexpr int kIterations = 500;
  constexpr size_t kCount = 16;
  const auto results = RunRanks({.size = size}, [](Communicator& comm) {
    Bytes out;
    for (int it = 0; it < kIterations; ++it) {
      // Small integers: the float sum is exact, so the parent can check it.
      std::vector<float> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(comm.rank() * 1000 + it + i);
      comm.AllReduceSum(x.data(), kCount);
      const Bytes b = ToBytes(x);
      out.insert(out.end(), b.begin(), b.end());
      if (it % 50 == 0) comm.Barrier();
      if (it % 100 == 0) {
        int value = comm.rank() == 1 ? it : -1;
        comm.Broadcast(&value, sizeof(value), 1);
        if (value != it) throw std::runtime_error("broadcast mismatch at iteration " + std::to_string(it));
      }
    }
    return out;
  });
  ExpectAllSucceeded(results);
  if (HasFailure()) return;
  for (int rank = 0; rank < size; ++rank) {
    const auto got = FromBytes<float>(results[rank].output, 0, kIterations * kCount);
    for (int it = 0; it < kIterations; ++it) {
      for (size_t i = 0; i < kCount; ++i) {
        const float want = static_cast<float>(1000 * size * (size - 1) / 2 + size * (it + static_cast<int>(i)));
        ASSERT_EQ(got[it * kCount + i], want) << "rank " << rank << " iteration " << it << " i " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooGroupTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "size" + std::to_string(info.param); });

// Tensor-parallel decode pays one such allreduce (hidden size 896, Qwen2-0.5B)
// twice per layer per token, so its latency bounds decode speed.
TEST(GlooCommunicator, SmallAllReduceLatencyTwoProcesses) {
  constexpr int kWarmup = 50;
  constexpr int kIterations = 1000;
  const auto results = RunRanks({.size = 2}, [](Communicator& comm) {
    std::vector<float> x = RankInput(comm.rank(), 896);
    for (int i = 0; i < kWarmup; ++i) comm.AllReduceSum(x.data(), x.size());
    comm.Barrier();
    const auto start = Clock::now();
    for (int i = 0; i < kIterations; ++i) comm.AllReduceSum(x.data(), x.size());
    const double mean_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kIterations;
    return ToBytes(std::vector<double>{mean_us});
  });
  ExpectAllSucceeded(results);
  if (HasFailure()) return;
  const double mean_us = FromBytes<double>(results[0].output, 0, 1)[0];
  std::cout << "mean latency of a 896-float allreduce between 2 processes: " << mean_us << " us over " << kIterations
            << " calls\n";
  RecordProperty("allreduce_896_mean_us", std::to_string(mean_us));
}

bool MentionsTimeout(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

TEST(GlooCommunicator, RankThatNeverJoinsMakesOthersTimeOut) {
  const auto start = Clock::now();
  const auto results = RunRanks({.size = 3, .ranks = {0, 1}, .timeout_s = 1}, [](Communicator&) { return Bytes(); });
  const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].exit_code, 1) << "rank " << rank;
    EXPECT_TRUE(MentionsTimeout(results[rank].error)) << "rank " << rank << ": " << results[rank].error;
    EXPECT_NE(results[rank].error.find("rendezvous"), std::string::npos) << results[rank].error;
  }
  EXPECT_LT(elapsed_s, 10.0);
}

TEST(GlooCommunicator, RankThatSkipsACollectiveMakesOthersTimeOut) {
  const auto results = RunRanks({.size = 2, .timeout_s = 1}, [](Communicator& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));  // outlives rank 0's timeout
      return Bytes();
    }
    std::vector<float> x(896, 1.0f);
    comm.AllReduceSum(x.data(), x.size());
    return Bytes();
  });
  EXPECT_EQ(results[1].exit_code, 0) << results[1].error;
  EXPECT_EQ(results[0].exit_code, 1);
  EXPECT_TRUE(MentionsTimeout(results[0].error)) << results[0].error;
  EXPECT_NE(results[0].error.find("AllReduceSum"), std::string::npos) << results[0].error;
}

// Rank 0 runs allreduces until one throws; rank 1 runs 10, then `fail_peer` (stop or kill
// itself) before its 11th. Rank 0's output: "<exception type> <ms the failed call took>".
// Rank 1 raises `fail_peer` before its `fail_at`-th all-reduce of `floats`
// floats; rank 0 reports how its next call failed.
Bytes LoseRankOneMidStream(Communicator& comm, int fail_peer, size_t floats = 896, int fail_at = 10) {
  std::vector<float> x(floats, 1.0f);
  for (int i = 0;; ++i) {
    if (comm.rank() == 1 && i == fail_at) raise(fail_peer);
    const auto start = Clock::now();
    try {
      comm.AllReduceSum(x.data(), x.size());
    } catch (const CommError& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      // The communicator is unusable from now on: the next call throws at once.
      try {
        comm.Barrier();
      } catch (const CommError&) {
        const std::string out = "CommError " + std::to_string(ms) + " " + e.what();
        return Bytes(out.begin(), out.end());
      }
      return Bytes();
    } catch (const std::exception& e) {
      const std::string out = std::string("other ") + e.what();
      return Bytes(out.begin(), out.end());
    }
  }
}

TEST(GlooCommunicator, StoppedPeerThrowsCommErrorWithinTheTimeout) {
  const auto results = RunRanks({.size = 2, .timeout_s = 2, .stopped_rank = 1},
                                [](Communicator& comm) { return LoseRankOneMidStream(comm, SIGSTOP); });
  ASSERT_EQ(results[0].exit_code, 0) << results[0].error;
  const std::string out(results[0].output.begin(), results[0].output.end());
  ASSERT_EQ(out.rfind("CommError ", 0), 0u) << out;
  const int ms = std::stoi(out.substr(10));
  EXPECT_GE(ms, 1900) << out;  // it waited for the stopped peer ...
  EXPECT_LT(ms, 4000) << out;  // ... no longer than the timeout (2 s) and some slack
  EXPECT_TRUE(MentionsTimeout(out)) << out;
}

TEST(GlooCommunicator, KilledPeerThrowsCommErrorBeforeTheTimeout) {
  const auto results = RunRanks({.size = 2, .timeout_s = 20},
                                [](Communicator& comm) { return LoseRankOneMidStream(comm, SIGKILL); });
  EXPECT_EQ(results[1].exit_code, 128 + SIGKILL);
  ASSERT_EQ(results[0].exit_code, 0) << results[0].error;
  const std::string out(results[0].output.begin(), results[0].output.end());
  ASSERT_EQ(out.rfind("CommError ", 0), 0u) << out;
  EXPECT_LT(std::stoi(out.substr(10)), 20000) << out;
}

// A peer killed while this rank writes to it: the write gets EPIPE, and with
// SIGPIPE at its default the rank died of it (exit 141) instead of throwing
// CommError, once in a fresh machine's suite (issue #53). A hundred kills
// while rank 0 streams 4 MiB all-reduces, at different points of the stream.
TEST(GlooCommunicator, APeerKilledMidWriteNeverKillsTheSurvivor) {
  int broken_pipes = 0;
  for (int run = 0; run < 100; ++run) {
    const auto results = RunRanks({.size = 2, .timeout_s = 20}, [run](Communicator& comm) {
      comm.Barrier();  // both connected: the kill lands in the stream, not in the rendezvous
      if (comm.rank() == 1) {  // killed from a second thread while the all-reduces stream
        std::thread([run] {
          std::this_thread::sleep_for(std::chrono::microseconds(2000 + 97 * run));
          raise(SIGKILL);
        }).detach();
      }
      return LoseRankOneMidStream(comm, SIGKILL, 1 << 20, 1 << 30);
    });
    broken_pipes += results[0].exit_code == 128 + SIGPIPE;
    EXPECT_EQ(results[0].exit_code, 0) << "run " << run << ": " << results[0].error;
    const std::string out(results[0].output.begin(), results[0].output.end());
    EXPECT_EQ(out.rfind("CommError ", 0), 0u) << "run " << run << ": " << out;
  }
  EXPECT_EQ(broken_pipes, 0) << "runs where the surviving rank died of SIGPIPE";
  // What makes it so, where the race above is rare: a rank of a group ignores SIGPIPE.
  const auto results = RunRanks({.size = 2}, [](Communicator& comm) {
    // Both ranks finish forming the group before either exits: a rank that returned at once
    // closed its end while the other was still completing the rendezvous ("Connection closed by
    // peer", 1 run in 6 under a concurrent build).
    comm.Barrier();
    struct sigaction now {};
    sigaction(SIGPIPE, nullptr, &now);
    const std::string out = now.sa_handler == SIG_IGN ? "ignored" : "default";
    return Bytes(out.begin(), out.end());
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << results[r].error;
    EXPECT_EQ(std::string(results[r].output.begin(), results[r].output.end()), "ignored") << "rank " << r;
  }
}

// A group restarted on the same store directory (and prefix) forms afresh: the keys and the
// rendezvous address its dead predecessor left are not used. Gloo's FileStore alone would
// refuse to overwrite the old keys, or hand a rank the dead incarnation's addresses.
TEST(GlooCommunicator, RestartedGroupOnTheSameStoreDirFormsAfresh) {
  std::string pattern = (std::filesystem::temp_directory_path() / "ferry_comm_store_XXXXXX").string();
  const std::filesystem::path store = mkdtemp(pattern.data());
  const RankBody sum = [](Communicator& comm) {
    std::vector<float> x = {static_cast<float>(comm.rank() + 1)};
    comm.AllReduceSum(x.data(), x.size());
    return ToBytes(x);
  };
  // The first incarnation dies without closing anything (as a killed group would).
  const auto first = RunRanks({.size = 2, .store_dir = store}, [](Communicator& comm) -> Bytes {
    comm.Barrier();
    raise(SIGKILL);
    return {};
  });
  EXPECT_EQ(first[0].exit_code, 128 + SIGKILL);
  // The next: rank 1 first, so it meets the dead rank 0's address file before the new one.
  for (int delay_ms : {0, 1500}) {
    const auto start = Clock::now();
    const auto again = RunRanks({.size = 2, .timeout_s = 10, .store_dir = store, .rank0_start_delay_ms = delay_ms}, sum);
    ExpectAllSucceeded(again);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(FromBytes<float>(again[r].output, 0, 1)[0], 3.0f) << "rank " << r;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 8.0) << "delay " << delay_ms;
  }
  std::filesystem::remove_all(store);
}

TEST(GlooCommunicator, SizeOneNeedsNoStore) {
  auto comm = CreateGlooCommunicator({});  // rank 0 of 1, no store_dir
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  const std::vector<float> original = x;
  comm->AllReduceSum(x.data(), x.size());
  EXPECT_EQ(x, original);
  std::vector<float> gathered(3, 0.0f);
  comm->AllGather(x.data(), x.size(), gathered.data());
  EXPECT_EQ(gathered, original);
  int value = 42;
  comm->Broadcast(&value, sizeof(value), 0);
  EXPECT_EQ(value, 42);
  comm->Barrier();
  EXPECT_THROW(comm->Broadcast(&value, sizeof(value), 1), std::runtime_error);
}

TEST(GlooCommunicator, InvalidOptionsThrow) {
  EXPECT_THROW(CreateGlooCommunicator({.rank = 2, .size = 2, .store_dir = "/tmp/x"}), std::runtime_error);
  EXPECT_THROW(CreateGlooCommunicator({.rank = 0, .size = 0}), std::runtime_error);
  EXPECT_THROW(CreateGlooCommunicator({.rank = 0, .size = 2}), std::runtime_error);  // no store_dir
  EXPECT_THROW(CreateGlooCommunicator({.rank = 0, .size = 1, .timeout_s = 0}), std::runtime_error);
}

}  // namespace
}  // namespace ferry::worker
