#include "common/process.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>

namespace ferry {
namespace {

// In a child: 100 writes to a stream socket whose peer has closed. Returns the
// child's wait status: exit 0 when every write failed with EPIPE, 1 when one
// did not; killed by SIGPIPE when it is not ignored.
int WriteToAClosedPeer(bool ignore) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (ignore) IgnoreBrokenPipes();
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::_Exit(2);
    close(fds[1]);
    const char byte = 'x';
    for (int i = 0; i < 100; ++i) {
      if (write(fds[0], &byte, 1) != -1 || errno != EPIPE) std::_Exit(1);
    }
    std::_Exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// Issue #53: no Ferry binary ignored SIGPIPE, so a write to a peer that died
// could kill the writer (a CPU tensor-parallel rank exited 141 that way).
TEST(IgnoreBrokenPipesTest, AWriteToAClosedPeerIsAnErrorNotADeath) {
  const int ignored = WriteToAClosedPeer(true);
  ASSERT_TRUE(WIFEXITED(ignored)) << "killed by signal " << WTERMSIG(ignored);
  EXPECT_EQ(WEXITSTATUS(ignored), 0);
  // The control: at SIGPIPE's default the same writes kill the process.
  const int by_default = WriteToAClosedPeer(false);
  ASSERT_TRUE(WIFSIGNALED(by_default));
  EXPECT_EQ(WTERMSIG(by_default), SIGPIPE);
}

}  // namespace
}  // namespace ferry
