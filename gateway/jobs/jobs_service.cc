#include "gateway/jobs/jobs_service.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "common/sql/error.h"

#include "gateway/grpc_admission.h"
#include "gateway/request_validation.h"

namespace ferry::gateway {

namespace {

ferry::v1::JobState ToProto(JobState s) {
  switch (s) {
    case JobState::kQueued: return ferry::v1::JOB_STATE_QUEUED;
    case JobState::kRunning: return ferry::v1::JOB_STATE_RUNNING;
    case JobState::kDone: return ferry::v1::JOB_STATE_DONE;
    case JobState::kFailed: return ferry::v1::JOB_STATE_FAILED;
    case JobState::kCancelled: return ferry::v1::JOB_STATE_CANCELLED;
  }
  return ferry::v1::JOB_STATE_UNSPECIFIED;
}

void ToProto(const JobView& v, ferry::v1::Job& out) {
  out.set_job_id(v.id);
  out.set_state(ToProto(v.state));
  if (v.state == JobState::kDone) *out.mutable_result() = v.result;
  if (v.state == JobState::kFailed) {
    out.set_error_code(v.error_code);
    out.set_error_message(v.error_message);
  }
  out.set_created_unix_s(v.created_unix_s);
  out.set_started_unix_s(v.started_unix_s);
  out.set_finished_unix_s(v.finished_unix_s);
  out.set_lane(v.lane);
}

const grpc::Status kNotFound(grpc::StatusCode::NOT_FOUND, "no such job");

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The store's engine failed (PostgreSQL unreachable, a full disk): the call may be retried.
grpc::Status StoreUnavailable(const std::exception& e) {
  spdlog::warn("job store: {}", e.what());
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string("job store unavailable: ") + e.what());
}

}  // namespace

grpc::Status JobsService::Submit(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                                 ferry::v1::SubmitJobResponse* response) {
  if (std::string e = CheckIdempotencyKey(request->idempotency_key()); !e.empty()) {
    generator_.CountRejection("invalid", request->lane(), StatusCode::kInvalidArgument);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e);
  }
  const Admission admission = AdmitCall(auth_, generator_, *context, *request);
  if (!admission.status.ok()) {
    const bool limited = admission.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    generator_.CountRejection(limited ? "rate_limit" : "auth", request->lane(),
                              static_cast<StatusCode>(admission.status.error_code()));
    return admission.status;
  }
  // Bad input is refused now, naming the field, rather than accepted and failed later.
  const auto validated = ValidateRequest(*request, generator_.options().limits, generator_.options().lanes,
                                         generator_.tokenizer());
  if (const auto* error = std::get_if<ValidationError>(&validated)) {
    auth_.Refund(admission.tenant, admission.reserved_completion_tokens);
    generator_.CountRejection("invalid", request->lane(), StatusCode::kInvalidArgument);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error->message);
  }
  ferry::v1::GenerateRequest scoped = *request;
  if (!scoped.idempotency_key().empty()) {
    scoped.set_idempotency_key(ScopeIdempotencyKey(admission.tenant, request->idempotency_key()));
  }
  std::optional<std::string> id;
  try {
    id = store_.Submit(admission.tenant, scoped, runner_.owner(), admission.reserved_completion_tokens, UnixNow());
  } catch (const ferry::sql::DbError& e) {
    auth_.Refund(admission.tenant, admission.reserved_completion_tokens);
    return StoreUnavailable(e);
  }
  if (!id) {
    auth_.Refund(admission.tenant, admission.reserved_completion_tokens);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "job store full: every kept job is queued or running");
  }
  spdlog::debug("job={} submitted tenant={}", id->substr(0, 8), admission.tenant);
  runner_.Wake();
  response->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status JobsService::GetJob(grpc::ServerContext* context, const ferry::v1::GetJobRequest* request,
                                 ferry::v1::Job* response) {
  const auto tenant = auth_.Identify(BearerToken(*context));
  if (!tenant) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
  std::optional<JobView> view;
  try {
    view = store_.Get(*tenant, request->job_id(), UnixNow());
  } catch (const ferry::sql::DbError& e) {
    return StoreUnavailable(e);
  }
  if (!view) return kNotFound;
  ToProto(*view, *response);
  return grpc::Status::OK;
}

grpc::Status JobsService::CancelJob(grpc::ServerContext* context, const ferry::v1::CancelJobRequest* request,
                                    ferry::v1::Job* response) {
  const auto tenant = auth_.Identify(BearerToken(*context));
  if (!tenant) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
  std::optional<JobView> view;
  bool was_queued = false;
  try {
    view = store_.Cancel(*tenant, request->job_id(), UnixNow(), &was_queued);
  } catch (const ferry::sql::DbError& e) {
    return StoreUnavailable(e);
  }
  if (!view) return kNotFound;
  if (was_queued) {  // never claimed: the whole reservation comes back (to the gateway that took it)
    if (view->submitted_by == runner_.owner()) auth_.Refund(*tenant, view->reserved_tokens);
  } else {
    runner_.CancelLocal(view->id);  // running here: stopped now; elsewhere: at that runner's next renewal
  }
  ToProto(*view, *response);
  return grpc::Status::OK;
}

grpc::Status JobsService::ListJobs(grpc::ServerContext* context, const ferry::v1::ListJobsRequest* request,
                                   ferry::v1::ListJobsResponse* response) {
  const auto tenant = auth_.Identify(BearerToken(*context));
  if (!tenant) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
  const int page_size = std::min(request->page_size(), 1000);
  JobPage page;
  try {
    page = store_.List(*tenant, page_size, request->page_token(), UnixNow());
  } catch (const ferry::sql::DbError& e) {
    return StoreUnavailable(e);
  }
  for (const JobView& v : page.jobs) ToProto(v, *response->add_jobs());
  response->set_next_page_token(page.next_page_token);
  return grpc::Status::OK;
}

}  // namespace ferry::gateway
