// Test helper: a connected TCP pair over 127.0.0.1 on a kernel-chosen port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ferry::gateway::http {

inline int Port(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (peer) getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A connected pair over 127.0.0.1 (kernel-chosen port): the client's and the
// server's (accepted) descriptors, and the listening port.
struct Connection {
  int listener = -1, client = -1, server = -1, port = 0;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listener, 4);
    port = Port(listener, false);
    a.sin_port = htons(static_cast<uint16_t>(port));
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    server = accept(listener, nullptr, nullptr);
  }
  ~Connection() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) close(fd);
    }
  }
};

}  // namespace ferry::gateway::http
