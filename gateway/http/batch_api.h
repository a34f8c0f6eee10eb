// OpenAI's Files and Batch APIs over HTTP: /v1/files (multipart upload with purpose "batch", list,
// retrieve, content, delete) and /v1/batches (create, retrieve, list, cancel), on the durable
// stores of gateway/store. This layer reads and answers HTTP; the stores own the state and the
// rules (README.md there). Running a batch's lines is BatchRunner's (gateway/batch_runner.h).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "gateway/auth/authenticator.h"
#include "gateway/store/batch_input.h"
#include "gateway/store/batch_store.h"
#include "gateway/store/file_store.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace ferry::gateway::http {

class BatchApi {
 public:
  // on_batch_created: called after a batch is written, so its lines are claimed without waiting
  // for the runner's next poll (may be empty).
  BatchApi(Authenticator& auth, store::FileStore& files, store::BatchStore& batches, store::BatchInputLimits input,
           std::function<void()> on_batch_created);

  // Adds the routes; every one identifies its tenant by key (charging nothing) and answers
  // another tenant's id exactly as an unknown one.
  void AddRoutes(httplib::Server& server);

 private:
  // The caller's tenant, or nullopt after answering 401.
  std::optional<std::string> Tenant(const httplib::Request& req, httplib::Response& res);
  void UploadFile(const httplib::Request& req, httplib::Response& res);
  void ListFiles(const httplib::Request& req, httplib::Response& res);
  void GetFile(const httplib::Request& req, httplib::Response& res);
  void FileContent(const httplib::Request& req, httplib::Response& res);
  void DeleteFile(const httplib::Request& req, httplib::Response& res);
  void CreateBatch(const httplib::Request& req, httplib::Response& res);
  void GetBatch(const httplib::Request& req, httplib::Response& res);
  void ListBatches(const httplib::Request& req, httplib::Response& res);
  void CancelBatch(const httplib::Request& req, httplib::Response& res);

  Authenticator& auth_;
  store::FileStore& files_;
  store::BatchStore& batches_;
  const store::BatchInputLimits input_;
  const std::function<void()> on_batch_created_;
};

}  // namespace ferry::gateway::http
