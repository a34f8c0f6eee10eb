// `ferry-launch --tls auto`: a throwaway CA and one certificate per process of the stack, for a
// stack on loopback. Every certificate names IP 127.0.0.1, DNS localhost and the gateway's --host,
// serves as server and client (the internal hops are mutual TLS), is valid for 30 days from an hour
// ago, and has an EC P-256 key written 0600. Made with OpenSSL in-process (no openssl binary).
#pragma once

#include <string>
#include <vector>

#include "common/tls.h"

namespace ferry::launch {

struct LoopbackPki {
  std::string dir;  // ca.pem (what a client trusts), ca.key, <name>.pem and <name>.key
  std::string ca() const { return dir + "/ca.pem"; }
  // The TLS flags of process `name` (one of those made): its certificate and key, and the CA.
  TlsFlags For(const std::string& name) const;
  // The same as command-line flags.
  std::vector<std::string> Args(const std::string& name) const;
};

// Writes a new CA and a certificate for each of `names` into `dir` (made if missing); throws
// std::runtime_error naming the file or the OpenSSL step that failed.
LoopbackPki MakeLoopbackPki(const std::string& dir, const std::vector<std::string>& names, const std::string& host);

}  // namespace ferry::launch
