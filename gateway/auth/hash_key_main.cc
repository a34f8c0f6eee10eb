// ferry-hash-key: prints the SHA-256 (hex) of an API key read from stdin, for the keys file.
// A trailing newline is not part of the key.
#include <iostream>
#include <iterator>
#include <string>

#include "gateway/auth/key_file.h"

int main() {
  std::string key((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.empty()) {
    std::cerr << "usage: printf %s \"$KEY\" | ferry-hash-key\n";
    return 2;
  }
  std::cout << ferry::gateway::Sha256Hex(key) << "\n";
  return 0;
}
