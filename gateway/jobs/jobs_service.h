// gRPC adapter of ferry.v1.Jobs over the JobStore and JobRunner.
#pragma once

#include "ferry/v1/jobs.grpc.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"
#include "gateway/jobs/job_runner.h"
#include "gateway/jobs/job_store.h"

namespace ferry::gateway {

class JobsService final : public ferry::v1::Jobs::Service {
 public:
  JobsService(JobStore& store, JobRunner& runner, Generator& generator, Authenticator& auth)
      : store_(store), runner_(runner), generator_(generator), auth_(auth) {}

  grpc::Status Submit(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                      ferry::v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const ferry::v1::GetJobRequest* request,
                      ferry::v1::Job* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const ferry::v1::CancelJobRequest* request,
                         ferry::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const ferry::v1::ListJobsRequest* request,
                        ferry::v1::ListJobsResponse* response) override;

 private:
  JobStore& store_;
  JobRunner& runner_;
  Generator& generator_;
  Authenticator& auth_;
};

}  // namespace ferry::gateway
