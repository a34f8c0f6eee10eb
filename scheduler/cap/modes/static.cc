// static: the cap stays at max_num_seqs (vLLM's fixed cap), or where an admin set it.
#include "scheduler/cap/modes/modes.h"

namespace ferry::scheduler {
namespace {

class Static final : public CapMode {
 public:
  explicit Static(int32_t max_num_seqs) : max_num_seqs_(max_num_seqs) {}
  int32_t InitialCap() const override { return max_num_seqs_; }
  void Report(ControllerStatus& status) const override { status.regime = "static"; }

 private:
  int32_t max_num_seqs_;
};

}  // namespace

std::unique_ptr<CapMode> MakeStatic(const ControllerOptions& options) {
  return std::make_unique<Static>(options.max_num_seqs);
}

}  // namespace ferry::scheduler
