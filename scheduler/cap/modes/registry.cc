// The cap controller's modes, registered by name: --controller-mode's values (replica_flags.cc), the names the
// controller reports (ControllerModeName) and parses (ParseControllerMode) all come from this table. A new mode
// is a file here, its factory in modes.h, a ControllerMode value and a line below (README.md "Modes").
#include <array>
#include <stdexcept>
#include <string>

#include "scheduler/cap/modes/modes.h"

namespace ferry::scheduler {
namespace {

constexpr std::array kModes = {
    CapModeEntry{ControllerMode::kStatic, "static", "", "fixed at --max-num-seqs (vLLM's fixed cap)", false,
                 MakeStatic},
    CapModeEntry{ControllerMode::kLoadLevel, "load-level", "",
                 "named levels up to --max-num-seqs; the one the goodput model predicts serves best", true,
                 MakeLoadLevel},
    // "slo" named a rule-based controller that failed on traces it was not tuned on; configurations that
    // name it get the model.
    CapModeEntry{ControllerMode::kGoodput, "goodput", "slo",
                 "the cap with the most expected requests within the targets, up to --max-num-seqs", true,
                 MakeGoodput},
};

}  // namespace

std::span<const CapModeEntry> CapModes() { return kModes; }

const CapModeEntry& CapModeFor(ControllerMode mode) {
  for (const CapModeEntry& entry : kModes) {
    if (entry.mode == mode) return entry;
  }
  throw std::invalid_argument("controller mode " + std::to_string(static_cast<int>(mode)) + " is not registered");
}

std::vector<std::string> ControllerModeValues() {
  std::vector<std::string> values;
  for (const CapModeEntry& entry : kModes) {
    values.emplace_back(entry.name);
    if (!entry.alias.empty()) values.emplace_back(entry.alias);
  }
  return values;
}

}  // namespace ferry::scheduler
