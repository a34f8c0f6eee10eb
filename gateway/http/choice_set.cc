#include "gateway/http/choice_set.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::gateway::http {

ChoiceSet::ChoiceSet(int32_t num_choices, std::optional<int64_t> timeout_ms) {
  if (timeout_ms) deadline_ = std::chrono::system_clock::now() + std::chrono::milliseconds(*timeout_ms);
  for (int32_t i = 0; i < num_choices; ++i) choices_.push_back(std::make_unique<Choice>());
  num_open_ = num_choices;
}

void ChoiceSet::Start(Generator& generator, std::vector<ferry::v1::GenerateRequest> requests,
                      std::function<void(int64_t)> on_end, ChunkSink sink) {
  if (requests.size() != choices_.size()) throw std::invalid_argument("ChoiceSet::Start: one request per choice");
  if (!sink) throw std::invalid_argument("ChoiceSet::Start: no sink");
  on_end_ = std::move(on_end);
  sink_ = std::move(sink);
  const auto self = shared_from_this();  // the hooks keep the set, and so the cancel sources, alive
  for (int32_t i = 0; i < size(); ++i) {
    Choice& choice = *choices_[static_cast<size_t>(i)];
    CallHooks hooks;
    hooks.deadline = deadline_;
    hooks.cancel = &choice.cancel;
    hooks.client_cancelled = [self] { return self->is_client_gone(); };
    hooks.write = [&choice, self, i](ferry::v1::GenerateChunk chunk) {
      self->completion_tokens_ += chunk.token_ids_size();
      const bool taken = !self->is_client_gone();
      if (taken) self->sink_(i, chunk);
      choice.call->WriteDone(taken);
    };
    hooks.done = [self, i](Status status, int64_t) { self->OnChoiceDone(i, status); };
    ferry::v1::GenerateRequest& one = requests[static_cast<size_t>(i)];
    if (size() > 1) one.set_request_id(one.request_id() + "-" + std::to_string(i));
    std::shared_ptr<GenerationCall> call = generator.NewCall(std::move(hooks));
    choice.call = call.get();  // set before Start: the hooks may run from there on
    call->Start(std::move(one));
  }
}

void ChoiceSet::OnChoiceDone(int32_t index, const Status& status) {
  bool last = false;
  {
    std::lock_guard lock(mu_);
    if (!status.ok() && !error_) {
      error_ = status;
      // The request has failed: the other choices stop (a choice that has not started yet sees
      // the cancel on its first stream).
      for (int32_t i = 0; i < size(); ++i) {
        if (i != index) choices_[static_cast<size_t>(i)]->cancel.Cancel();
      }
    }
    last = --num_open_ == 0;
  }
  if (!last) return;
  // Before the end is visible: once Next returns false the server may stop, while its owner
  // keeps what on_end uses (the Authenticator) for longer.
  on_end_(completion_tokens_);
  std::lock_guard lock(mu_);
  is_ended_ = true;
  cv_.notify_all();
}

void ChoiceSet::WaitEnded() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return is_ended_; });
}

Status ChoiceSet::status() {
  std::lock_guard lock(mu_);
  return error_.value_or(Status());
}

void ChoiceSet::ClientGone() {
  is_client_gone_ = true;
  for (auto& choice : choices_) choice->cancel.Cancel();
}

}  // namespace ferry::gateway::http
