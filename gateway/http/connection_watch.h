// Notices when the client of a non-streamed HTTP request closes its connection
// while the request is queued or generating, so its scheduler call can be
// cancelled (its sequence and KV blocks freed), as vLLM's OpenAI server does.
// A streamed request needs none of this: its next write fails.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace ferry::gateway::http {

// The socket of the connection from peer_addr:peer_port to our local_port, or
// -1. cpp-httplib serves a connection on one thread and keeps its socket open
// while the handler runs, so the descriptor stays valid for the handler.
int FindConnectionSocket(const std::string& peer_addr, int peer_port, int local_port);
// The same, remembered per thread: cpp-httplib serves a connection's requests on one thread, so
// a keep-alive connection is looked up once (the scan of /proc/self/fd costs ~1 ms with a
// thousand connections open), and the remembered socket is checked against the peer each time.
int ConnectionSocketOfThisThread(const std::string& peer_addr, int peer_port, int local_port);

class ConnectionWatch {
 public:
  // Watches `socket` (nothing if it is -1) on a thread of its own; calls
  // on_gone once, from that thread, when the peer closes or resets it.
  ConnectionWatch(int socket, std::function<void()> on_gone);
  ~ConnectionWatch();  // stops at once (the thread waits on an eventfd too)
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  bool watching() const { return thread_.joinable(); }
  bool gone() const { return gone_.load(); }

 private:
  void Run(int socket);

  std::function<void()> on_gone_;
  int wake_fd_ = -1;
  std::atomic<bool> gone_{false};
  std::thread thread_;
};

}  // namespace ferry::gateway::http
