// What the fuzz targets share: a check that aborts (libFuzzer then keeps the input as a crash,
// and the regression runner fails), and a wrapper that turns an unexpected exception into one.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

// Aborts with the condition and where it failed; active in every build (NDEBUG included).
#define FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                               \
      std::fprintf(stderr, "\n");                                                      \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

// Parsers refuse bad input by throwing their documented error type (the `Refusal` given). Any
// other exception is a finding: it would reach a server's catch-all as an unexplained 500.
template <typename Refusal, typename Body>
void ExpectRefusalOrSuccess(Body body) {
  try {
    body();
  } catch (const Refusal& e) {
    FUZZ_CHECK(e.what()[0] != '\0', "a refusal without a message");
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, "unexpected exception: %s", e.what());
  }
}

// For bodies that catch their refusals themselves: any exception escaping is a finding.
template <typename Body>
void ExpectNoThrow(Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, "unexpected exception: %s", e.what());
  }
}
