#include "worker/gpu/cuda_runner.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>

#include "common/sampling_limits.h"
#include "kernels/cuda/paged_attention.h"
#include "worker/comm/communicator.h"
#ifndef FERRY_GPU_NO_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace ferry::worker::gpu {
namespace {

using ferry::kMinTemperature;  // below it, greedy (common/sampling_limits.h)

[[noreturn]] void Invalid(const std::string& what) { throw std::invalid_argument(what); }

}  // namespace

struct CudaRunner::Planned {
  uint64_t seq_id = 0;
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
  int32_t logits_row = -1;  // row of the device logits; -1: nothing sampled
  int32_t host_slot = -1;   // row of host_logits_; -1: the device argmax is used
  int32_t device_slot = -1;  // row of the device sampler; -1: argmax or the host sampler
};

CudaRunner::CudaRunner(const CudaRunnerOptions& options) : options_(options) {
  const RunnerOptions& r = options.runner;
  if (r.comm != nullptr) throw std::runtime_error("the CUDA runner needs NCCL, not a host communicator");
  if (const std::string error = CudaRunnerOptionsError(options); !error.empty()) throw std::runtime_error(error);
  const AttentionImpls attention = AttentionImplsFromEnv();  // an unknown value refuses the start, before the GPU
  FERRY_CUDA_CHECK(cudaSetDevice(options.device));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaEventCreate(&start_));
  FERRY_CUDA_CHECK(cudaEventCreate(&stop_));
  if (options.tp_size > 1) {
#ifdef FERRY_GPU_NO_NCCL
    throw std::runtime_error("tensor parallelism needs NCCL, and this build has none");
#else
    comm_ = CreateNcclCommunicator(options.tp_rank, options.tp_size, options.nccl_unique_id, options.device, stream_,
                                   options.dist_timeout_s);
#endif
  }
  CudaModelOptions m;
  m.max_tokens = options.max_num_batched_tokens;
  m.max_seqs = options.max_num_seqs;
  m.max_model_len = r.max_model_len;
  m.block_size = r.block_size;
  m.comm = comm_.get();
  m.attention = attention;
  ValidateLoraOptions(r.lora);  // also refuses --lora-modules without --enable-lora
  if (r.lora.enable) {
    m.lora_slots = r.lora.max_loras;
    m.max_lora_rank = r.lora.max_lora_rank;
  }
  model_ = std::make_unique<CudaModel>(r.model_dir, m, stream_);
  if (r.lora.enable) {  // the slots are the model's, sized before the KV cache takes what is left
    lora_ = std::make_unique<LoraRegistry>(model_->config(), model_->shard(), r.lora, /*bf16_weights=*/true);
    lora_slots_ = std::make_unique<LoraSlotTable>(r.lora.max_loras);
    info_.max_loras = r.lora.max_loras;
    info_.max_lora_rank = r.lora.max_lora_rank;
  }
  builder_ = std::make_unique<BatchBuilder>(model_->layout(), model_->host_meta(), r.block_size);
  device_sampler_ = std::make_unique<DeviceSampler>(
      DeviceSamplerOptions{options.max_num_seqs, model_->config().vocab_size, options.sampler_max_entries});
  FERRY_CUDA_CHECK(cudaDeviceSynchronize());
  const int32_t num_blocks = r.num_kv_blocks > 0 ? r.num_kv_blocks : KvBlocksFromUtilization();
  model_->AllocateKvCache(num_blocks);
  host_ids_ = PinnedBuffer(size_t(options.max_num_seqs) * sizeof(int32_t));

  const ModelConfig& c = model_->config();
  info_.model = c.name;
  info_.dtype = "bfloat16";
  info_.num_kv_blocks = num_blocks;
  info_.block_size = r.block_size;
  info_.max_model_len = model_->max_model_len();
  info_.vocab_size = c.vocab_size;
  info_.eos_token_ids = c.eos_token_ids;
  info_.generation_defaults = {c.default_temperature, c.default_top_p, c.default_top_k, c.default_min_p,
                               c.default_repetition_penalty};
  info_.tp_rank = options.tp_rank;
  info_.tp_size = options.tp_size;
  seqs_ = SequenceTable(&info_, LoadGuidedVocab(r.model_dir, info_.vocab_size, info_.eos_token_ids));
  info_.supports_guided_decoding = seqs_.guided_vocab() != nullptr;
  // Graphs for tensor parallelism would capture NCCL calls too; eager there until measured.
  if (!options.enforce_eager && options.tp_size == 1) {
    const auto sizes = options.cuda_graph_sizes.empty() ? DefaultGraphSizes(options.max_num_seqs)
                                                        : options.cuda_graph_sizes;
    graphs_.Capture(*model_, *builder_, sizes, stream_);
  }
}

int32_t CudaRunner::KvBlocksFromUtilization() const {
  size_t free_bytes = 0, total_bytes = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Everything in use now (weights, activations, cuBLAS, the CUDA context, other processes)
  // counts against the budget, as in vLLM.
  const double budget = options_.gpu_memory_utilization * static_cast<double>(total_bytes) -
                        static_cast<double>(total_bytes - free_bytes);
  const int64_t blocks = budget > 0 ? static_cast<int64_t>(budget) / model_->kv_bytes_per_block() : 0;
  if (blocks < 1) {
    throw std::runtime_error("no GPU memory left for the KV cache: " + std::to_string(total_bytes - free_bytes) +
                             " of " + std::to_string(total_bytes) + " bytes in use after weights (" +
                             std::to_string(model_->weight_bytes()) +
                             ") and activations; raise --gpu-memory-utilization or lower "
                             "--max-num-batched-tokens / --max-num-seqs");
  }
  return static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
}

CudaRunner::~CudaRunner() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  model_.reset();
  comm_.reset();
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (stop_ != nullptr) cudaEventDestroy(stop_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// ---------------------------------------------------------------------------------------------
// Validation: the sequence table's (as the CPU engine), plus the capacities the device buffers
// were sized for. Nothing is changed unless the whole step can be applied.

void CudaRunner::Validate(const StepSpec& step) const {
  const int64_t num_tokens = seqs_.Validate(step);
  if (num_tokens > options_.max_num_batched_tokens) {
    Invalid("step computes " + std::to_string(num_tokens) + " tokens, more than the GPU worker's " +
            "--max-num-batched-tokens " + std::to_string(options_.max_num_batched_tokens));
  }
  if (static_cast<int64_t>(step.scheduled.size()) > options_.max_num_seqs) {
    Invalid("step schedules " + std::to_string(step.scheduled.size()) + " sequences, more than the GPU worker's " +
            "--max-num-seqs " + std::to_string(options_.max_num_seqs));
  }
}

// ---------------------------------------------------------------------------------------------
// Running

// Step is Submit then Collect. With overlap (the worker's Submit of step N+1 while step N runs),
// Submit first finishes step N: its samples are step N+1's inputs (the decodes' tokens, the
// penalties' counts, the guided matchers' states), and one set of host and device buffers then
// serves every step. What overlaps the device running N+1 is everything the worker does
// between steps: answering N over gRPC and taking in N+2, which the scheduler's async
// scheduling sends before it has N's answer. One synchronisation per step, at its readback.
std::vector<SampledTokenOut> CudaRunner::Step(const StepSpec& step) {
  Submit(step);
  return Collect();
}

void CudaRunner::Submit(const StepSpec& step) {
  if (in_flight_.size() >= static_cast<size_t>(kMaxSubmittedSteps)) {
    throw std::logic_error("CudaRunner::Submit: " + std::to_string(in_flight_.size()) +
                           " steps submitted and not collected");
  }
  if (!in_flight_.empty()) Finish(in_flight_.back());
  InFlight f;
  f.wall_start = std::chrono::steady_clock::now();
  Validate(step);
  if (!healthy_) throw std::runtime_error("GPU worker is unhealthy since an earlier failure: " + unhealthy_reason_);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters =
      AcquireStepAdapters(lora_.get(), step, [this](uint64_t id) { return seqs_.at(id).lora.get(); });
  seqs_.Apply(step);
  for (size_t i = 0; i < adapters.size(); ++i) seqs_.at(step.new_sequences[i].seq_id).lora = std::move(adapters[i]);
  f.step = step;
  try {
    if (!step.scheduled.empty()) {
      f.plan = BuildBatch(step);
      for (const Planned& p : f.plan) {
        f.timing.host_sampled_rows += p.logits_row >= 0 && p.device_slot < 0 && !ArgmaxSuffices(p.seq->sampling);
      }
      Launch(f.plan, &f.timing);
    }
  } catch (const std::exception& e) {
    std::rethrow_exception(Failed(step, e));
  }
  in_flight_.push_back(std::move(f));
}

bool CudaRunner::Ready() const {
  if (in_flight_.empty()) return true;
  const InFlight& f = in_flight_.front();
  return f.finished || f.plan.empty() || cudaEventQuery(stop_) != cudaErrorNotReady;
}

std::vector<SampledTokenOut> CudaRunner::Collect() {
  if (in_flight_.empty()) throw std::logic_error("CudaRunner::Collect with no step submitted");
  Finish(in_flight_.front());
  InFlight done = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (done.error) std::rethrow_exception(done.error);
  return std::move(done.samples);
}

// Waits for the step's device work and commits its samples; a failure is kept for Collect.
void CudaRunner::Finish(InFlight& f) {
  if (f.finished) return;
  f.finished = true;
  last_logits_.clear();
  if (f.plan.empty()) return;
  try {
    WaitForDevice(stop_);
    float ms = 0.f;
    FERRY_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    f.timing.gpu_seconds = ms / 1e3;
    f.samples = Commit(f.step, f.plan);
  } catch (const std::exception& e) {
    f.error = Failed(f.step, e);
    return;
  }
  f.timing.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.wall_start).count();
  busy_seconds_ += f.timing.gpu_seconds;
  if (observer_) observer_(f.timing);
}

// The step's sequences are aborted: forget them, so a re-send as new is accepted. Returns what
// the step fails with.
std::exception_ptr CudaRunner::Failed(const StepSpec& step, const std::exception& e) {
  for (const ScheduledSpec& s : step.scheduled) seqs_.Erase(s.seq_id);
  OnFailure(e);
  if (observer_) observer_(StepTiming{});  // lets metrics see the health change
  // A broken tensor-parallel group stays recognisable: the worker exits for a restart.
  if (dynamic_cast<const CommError*>(&e) != nullptr) {
    return std::make_exception_ptr(CommError(std::string("GPU step failed: ") + e.what()));
  }
  return std::make_exception_ptr(std::runtime_error(std::string("GPU step failed: ") + e.what()));
}

void CudaRunner::OnFailure(const std::exception& e) {
  if (!healthy_) return;
  cudaGetLastError();  // clears a non-sticky launch error
  // A sticky error (illegal address, ...) poisons the context: every later call returns it.
  const cudaError_t status = cudaStreamQuery(stream_);
  if (status != cudaSuccess && status != cudaErrorNotReady) {
    healthy_ = false;
    unhealthy_reason_ = std::string(e.what()) + " (device: " + cudaGetErrorString(status) + ")";
  } else if (status == cudaErrorNotReady) {
    // Work still queued behind the failure must finish before the next step reuses buffers.
    try {
      FERRY_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      WaitForDevice(stop_);
    } catch (const std::exception& wait_error) {
      healthy_ = false;
      unhealthy_reason_ = wait_error.what();
    }
  }
}

void CudaRunner::LoadLora(const std::string& name, const std::string& path) {
  if (lora_ == nullptr) ModelRunner::LoadLora(name, path);
  lora_->Load(name, path);
}

void CudaRunner::UnloadLora(const std::string& name) {
  if (lora_ == nullptr) ModelRunner::UnloadLora(name);
  lora_->Unload(name);
}

std::vector<std::string> CudaRunner::LoraNames() const { return lora_ ? lora_->Names() : std::vector<std::string>{}; }

// The step before has finished on the device (Submit waits for it), so a slot it used may take
// another adapter now; the copies go on the stream ahead of this step's kernels.
void CudaRunner::PlaceAdapters(const StepSpec& step) {
  seq_slot_.clear();
  if (lora_ == nullptr) return;
  std::vector<std::shared_ptr<const LoraAdapter>> distinct;
  for (const ScheduledSpec& s : step.scheduled) {
    const std::shared_ptr<const LoraAdapter>& a = seqs_.at(s.seq_id).lora;
    if (a && std::find(distinct.begin(), distinct.end(), a) == distinct.end()) distinct.push_back(a);
  }
  if (distinct.empty()) return;
  std::vector<std::pair<int32_t, std::shared_ptr<const LoraAdapter>>> placed;
  const std::vector<int32_t> slots = lora_slots_->Assign(distinct, placed);
  for (const auto& [slot, adapter] : placed) model_->lora()->Upload(slot, *adapter, stream_);
  for (const ScheduledSpec& s : step.scheduled) {
    const std::shared_ptr<const LoraAdapter>& a = seqs_.at(s.seq_id).lora;
    if (!a) continue;
    seq_slot_[s.seq_id] = slots[std::find(distinct.begin(), distinct.end(), a) - distinct.begin()];
  }
}

// Decodes (one token) first, then the rest, each group in scheduled order.
std::vector<CudaRunner::Planned> CudaRunner::BuildBatch(const StepSpec& step) {
  std::vector<Planned> plan;
  plan.reserve(step.scheduled.size());
  builder_->Reset();
  device_sampler_->Begin();
  PlaceAdapters(step);
  int32_t num_logits = 0, num_host = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const ScheduledSpec& s : step.scheduled) {
      if ((s.num_tokens == 1) != (pass == 0)) continue;
      Sequence& seq = seqs_.at(s.seq_id);
      const bool samples = seq.ReachesEnd(s.num_tokens);
      const auto slot = seq_slot_.find(s.seq_id);
      builder_->AddSequence(seq.token_ids.data() + seq.num_computed, s.num_tokens, seq.num_computed, seq.block_table,
                            samples, slot == seq_slot_.end() ? -1 : slot->second);
      Planned p{s.seq_id, &seq, s.num_tokens};
      if (samples) {
        p.logits_row = num_logits++;
        if (!ArgmaxSuffices(seq.sampling)) {
          p.device_slot = device_sampler_->Add({&seq.sampling, &seq.counts, seq.num_generated, seq.mask(), p.logits_row});
        }
        if (options_.runner.keep_logits) {
          p.host_slot = p.logits_row;
        } else if (!ArgmaxSuffices(seq.sampling) && p.device_slot < 0) {
          p.host_slot = num_host++;
        }
      }
      plan.push_back(p);
    }
  }
  const int32_t host_rows = options_.runner.keep_logits ? num_logits : num_host;
  const size_t need = size_t(host_rows) * info_.vocab_size * sizeof(float);
  if (host_logits_.bytes() < need) host_logits_ = PinnedBuffer(need);
  return plan;
}

void CudaRunner::Launch(const std::vector<Planned>& plan, StepTiming* timing) {
  BatchBuilder& b = *builder_;
  const int32_t num_logits = b.shape(1).num_logits;
  const bool decode_only = b.num_decode() == b.num_seqs() && num_logits == b.num_seqs();
  const int32_t graph_size = decode_only ? graphs_.SizeFor(b.num_seqs()) : 0;
  timing->phase = b.num_decode() == b.num_seqs() ? StepTiming::Phase::kDecode
                  : b.num_decode() == 0          ? StepTiming::Phase::kPrefill
                                                 : StepTiming::Phase::kMixed;
  timing->graph = graph_size > 0;
  const int32_t real_seqs = b.num_seqs(), table_cols = b.max_table_cols();
  FERRY_CUDA_CHECK(cudaEventRecord(start_, stream_));
  if (graph_size > 0) {
    b.PadDecodeTo(graph_size);
    model_->Upload(real_seqs, table_cols);
    graphs_.Replay(graph_size, stream_);
  } else {
    const int32_t splits = kernels::cuda::ChooseDecodeSplits(b.num_decode(), model_->shard().num_kv_heads,
                                                             model_->num_sms(), b.max_seq_len());
    model_->Upload(real_seqs, table_cols);
    model_->Forward(b.shape(splits));
  }
  device_sampler_->Enqueue(model_->logits(), stream_);
  const size_t row_bytes = size_t(info_.vocab_size) * sizeof(float);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(host_ids_.as<void>(), model_->argmax(), size_t(num_logits) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
  if (options_.runner.keep_logits && num_logits > 0) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(host_logits_.as<float>(), model_->logits(), num_logits * row_bytes,
                                     cudaMemcpyDeviceToHost, stream_));
  } else {
    for (const Planned& p : plan) {
      if (p.host_slot < 0) continue;
      FERRY_CUDA_CHECK(cudaMemcpyAsync(host_logits_.as<float>() + size_t(p.host_slot) * info_.vocab_size,
                                       model_->logits() + size_t(p.logits_row) * info_.vocab_size, row_bytes,
                                       cudaMemcpyDeviceToHost, stream_));
    }
  }
  FERRY_CUDA_CHECK(cudaEventRecord(stop_, stream_));  // Finish waits for it
}

// Polls rather than blocks, so a hung kernel turns into an error after step_timeout_s; with
// tensor-parallel peers it polls the communicator too, whose collectives are only enqueued (a peer's
// failure shows here, as CommError). Yields between polls rather than sleeping: a sleep's wake-up
// (tens of microseconds) would be added to every step.
void CudaRunner::WaitForDevice(cudaEvent_t event) {
  const auto start = std::chrono::steady_clock::now();
  const auto timeout = std::chrono::duration<double>(options_.step_timeout_s);
  for (int spins = 0;; ++spins) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) FERRY_CUDA_CHECK(status);
    if (comm_ && spins % 64 == 0) comm_->PollAsyncError();
    if (std::chrono::steady_clock::now() - start > timeout) {
      healthy_ = false;
      unhealthy_reason_ = "a GPU step did not finish within " + std::to_string(options_.step_timeout_s) + " s";
      // With peers, a replayed graph stuck in a collective looks like this; either way the
      // other ranks are mid-step and only a restarted group can serve.
      if (comm_) throw CommError(unhealthy_reason_ + " (tensor-parallel rank " + std::to_string(options_.tp_rank) + ")");
      throw std::runtime_error(unhealthy_reason_);
    }
    std::this_thread::yield();
  }
}

std::vector<SampledTokenOut> CudaRunner::Commit(const StepSpec& step, const std::vector<Planned>& plan) {
  std::unordered_map<uint64_t, const Planned*> by_id;
  for (const Planned& p : plan) by_id[p.seq_id] = &p;
  std::vector<SampledTokenOut> out;
  const int32_t vocab = info_.vocab_size;
  for (const ScheduledSpec& s : step.scheduled) {
    const Planned& p = *by_id.at(s.seq_id);
    Sequence& seq = *p.seq;
    seq.num_computed += p.num_tokens;
    if (p.logits_row < 0) continue;
    SampleResult r;
    if (p.device_slot >= 0) {
      r = ToSampleResult(device_sampler_->result(p.device_slot), seq.sampling, vocab);
    } else if (!ArgmaxSuffices(seq.sampling)) {
      r = sampler_.Sample(host_logits_.as<float>() + size_t(p.host_slot) * vocab, vocab, seq.sampling, &seq.counts,
                          seq.num_generated, seq.mask());
    } else {
      r.token_id = host_ids_.as<int32_t>()[p.logits_row];
    }
    if (options_.runner.keep_logits) {
      const float* row = host_logits_.as<float>() + size_t(p.host_slot) * vocab;
      last_logits_.insert(last_logits_.end(), row, row + vocab);
    }
    seq.Append(r.token_id);
    out.push_back({s.seq_id, r.token_id, seq.sampling.logprobs >= 0, r.logprob, std::move(r.top_logprobs)});
  }
  return out;
}

}  // namespace ferry::worker::gpu
