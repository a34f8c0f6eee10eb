#include "gateway/http/batch_api.h"

#include <cctype>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "common/sql/error.h"
#include "gateway/http/http_reply.h"
#include "gateway/store/store_error.h"

namespace ferry::gateway::http {

namespace {

using store::StoreError;
using store::StoreErrorKind;

double Now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// The field a store message names: its text before ": " when that is a field name.
std::string ParamOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; ++i) {
    const char c = message[i];
    if (!std::islower(static_cast<unsigned char>(c)) && c != '_' && c != '.') return "";
  }
  return message.substr(0, colon);
}

ApiError FromStoreError(const StoreError& e) {
  ApiError error = InvalidField(ParamOf(e.what()), e.what());
  switch (e.kind()) {
    case StoreErrorKind::kNotFound: error.http_status = 404; error.code = "not_found"; break;
    case StoreErrorKind::kInvalid: break;
    case StoreErrorKind::kTooLarge: error.http_status = 413; error.code = "file_too_large"; break;
    // 507: the request is fine; the store has no room for it (the tenant's or everyone's limit).
    case StoreErrorKind::kFull: error.http_status = 507; error.code = "store_full"; break;
    case StoreErrorKind::kConflict: error.http_status = 409; error.code = "conflict"; break;
  }
  return error;
}

ApiError FromDbError(const ferry::sql::DbError& e) {
  ApiError error = InvalidField("", "");
  error.type = "server_error";
  switch (e.kind()) {
    case ferry::sql::DbErrorKind::kFull:
      error.http_status = 507, error.code = "store_full";
      error.message = std::string("the store's disk is full: ") + e.what();
      break;
    case ferry::sql::DbErrorKind::kUnavailable:
    case ferry::sql::DbErrorKind::kBusyOrConflict:
      error.http_status = 503, error.code = "store_unavailable", error.retry_after_s = 1;
      error.message = std::string("the store is unavailable: ") + e.what();
      break;
    default:
      error.http_status = 500, error.code = "store_error";
      error.message = std::string("the store failed: ") + e.what();
  }
  return error;
}

// Runs one route's body; a store refusal or failure becomes OpenAI's error shape. Nothing a
// refused call began is visible: each store call is one transaction.
template <typename Fn>
void Guarded(const httplib::Request& req, httplib::Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const StoreError& e) {
    SendError(res, FromStoreError(e));
  } catch (const ferry::sql::DbError& e) {
    spdlog::error("HTTP {} {}: {}", req.method, req.path, e.what());
    SendError(res, FromDbError(e));
  }
}

void SendJson(httplib::Response& res, const json& body) {
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// An integer query parameter in [min, max]; `fallback` when absent.
std::variant<int64_t, ApiError> IntParam(const httplib::Request& req, const char* name, int64_t fallback, int64_t min,
                                         int64_t max) {
  if (!req.has_param(name)) return fallback;
  const std::string text = req.get_param_value(name);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
    return InvalidField(name, fmt::format("{} = \"{}\" must be an integer in {}..{}", name, text, min, max));
  }
  return static_cast<int64_t>(v);
}

// OpenAI's list page: data, first_id, last_id, has_more.
template <typename Items>
json ListJson(const Items& items, bool has_more) {
  json data = json::array();
  for (const auto& item : items) data.push_back(item.ToJson());
  return {{"object", "list"},
          {"data", std::move(data)},
          {"first_id", items.empty() ? json() : json(items.front().id)},
          {"last_id", items.empty() ? json() : json(items.back().id)},
          {"has_more", has_more}};
}

std::optional<std::string> OptionalParam(const httplib::Request& req, const char* name) {
  if (!req.has_param(name)) return std::nullopt;
  return req.get_param_value(name);
}

}  // namespace

BatchApi::BatchApi(Authenticator& auth, store::FileStore& files, store::BatchStore& batches,
                   store::BatchInputLimits input, std::function<void()> on_batch_created)
    : auth_(auth), files_(files), batches_(batches), input_(input), on_batch_created_(std::move(on_batch_created)) {}

void BatchApi::AddRoutes(httplib::Server& server) {
  using Req = const httplib::Request&;
  using Res = httplib::Response&;
  server.Post("/v1/files", [this](Req req, Res res) { UploadFile(req, res); });
  server.Get("/v1/files", [this](Req req, Res res) { ListFiles(req, res); });
  server.Get(R"(/v1/files/([^/]+))", [this](Req req, Res res) { GetFile(req, res); });
  server.Get(R"(/v1/files/([^/]+)/content)", [this](Req req, Res res) { FileContent(req, res); });
  server.Delete(R"(/v1/files/([^/]+))", [this](Req req, Res res) { DeleteFile(req, res); });
  server.Post("/v1/batches", [this](Req req, Res res) { CreateBatch(req, res); });
  server.Get("/v1/batches", [this](Req req, Res res) { ListBatches(req, res); });
  server.Get(R"(/v1/batches/([^/]+))", [this](Req req, Res res) { GetBatch(req, res); });
  server.Post(R"(/v1/batches/([^/]+)/cancel)", [this](Req req, Res res) { CancelBatch(req, res); });
}

std::optional<std::string> BatchApi::Tenant(const httplib::Request& req, httplib::Response& res) {
  if (auto tenant = auth_.Identify(Bearer(req))) return tenant;
  ApiError error = InvalidField("", "missing or invalid API key");
  error.http_status = 401;
  error.code = "invalid_api_key";
  SendError(res, error);
  return std::nullopt;
}

void BatchApi::UploadFile(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  if (!req.is_multipart_form_data()) {
    return SendError(res, InvalidField("file", "upload a file as multipart/form-data with fields `file` and "
                                               "`purpose`"));
  }
  if (!req.has_file("purpose")) return SendError(res, InvalidField("purpose", "purpose is required"));
  if (!req.has_file("file")) return SendError(res, InvalidField("file", "file is required"));
  const std::string purpose = req.get_file_value("purpose").content;
  if (purpose != "batch") {
    return SendError(res, InvalidField("purpose", fmt::format("purpose = \"{}\": this server stores files for the "
                                                              "Batch API only (purpose \"batch\")",
                                                              purpose)));
  }
  const httplib::MultipartFormData file = req.get_file_value("file");
  const std::string filename = file.filename.empty() ? "file" : file.filename;
  Guarded(req, res, [&] { SendJson(res, files_.Create(*tenant, purpose, filename, file.content, Now()).ToJson()); });
}

void BatchApi::ListFiles(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  store::FileListOptions options;
  auto limit = IntParam(req, "limit", 10000, 1, 10000);
  if (auto* error = std::get_if<ApiError>(&limit)) return SendError(res, *error);
  options.limit = std::get<int64_t>(limit);
  options.purpose = OptionalParam(req, "purpose");
  options.after = OptionalParam(req, "after");
  if (auto order = OptionalParam(req, "order")) {
    if (*order != "asc" && *order != "desc") {
      return SendError(res, InvalidField("order", fmt::format("order = \"{}\" must be asc or desc", *order)));
    }
    options.order = *order == "asc" ? store::SortOrder::kAsc : store::SortOrder::kDesc;
  }
  Guarded(req, res, [&] {
    const store::FilePage page = files_.List(*tenant, options);
    SendJson(res, ListJson(page.data, page.has_more));
  });
}

void BatchApi::GetFile(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  const std::string id = req.matches[1];
  Guarded(req, res, [&] {
    const auto file = files_.Get(*tenant, id);
    if (!file) throw StoreError(StoreErrorKind::kNotFound, "file_id: no file " + id);
    SendJson(res, file->ToJson());
  });
}

void BatchApi::FileContent(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  const std::string id = req.matches[1];
  Guarded(req, res, [&] { res.set_content(files_.Content(*tenant, id), "application/octet-stream"); });
}

void BatchApi::DeleteFile(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  const std::string id = req.matches[1];
  Guarded(req, res, [&] {
    if (!files_.Delete(*tenant, id)) throw StoreError(StoreErrorKind::kNotFound, "file_id: no file " + id);
    SendJson(res, {{"id", id}, {"object", "file"}, {"deleted", true}});
  });
}

void BatchApi::CreateBatch(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  if (NestsDeeperThan(req.body, kMaxJsonDepth)) {
    return SendError(res, InvalidField("", fmt::format("the body nests more than {} levels deep", kMaxJsonDepth)));
  }
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return SendError(res, InvalidField("", "the body must be a JSON object"));
  for (const auto& [key, value] : body.items()) {
    if (key != "input_file_id" && key != "endpoint" && key != "completion_window" && key != "metadata") {
      return SendError(res, InvalidField(key, fmt::format("{} is not a field of a batch (input_file_id, endpoint, "
                                                          "completion_window, metadata)",
                                                          key)));
    }
  }
  for (const char* field : {"input_file_id", "endpoint", "completion_window"}) {
    if (!body.contains(field)) return SendError(res, InvalidField(field, fmt::format("{} is required", field)));
    if (!body[field].is_string()) return SendError(res, *WrongType(field, body[field], "a string"));
  }
  const std::string file_id = body["input_file_id"], endpoint = body["endpoint"];
  const std::string window = body["completion_window"];
  const std::string metadata = body.contains("metadata") && !body["metadata"].is_null() ? body["metadata"].dump() : "";
  Guarded(req, res, [&] {
    std::string content;
    try {
      content = files_.Content(*tenant, file_id);
    } catch (const StoreError& e) {
      if (e.kind() != StoreErrorKind::kNotFound) throw;
      throw StoreError(StoreErrorKind::kNotFound, "input_file_id: no file " + file_id);
    }
    // An unknown endpoint makes every line's url an error here, but Create refuses the endpoint
    // before it looks at the lines, naming the endpoint.
    const store::ParsedInput input = store::ParseBatchInput(content, endpoint, input_);
    SendJson(res, batches_.Create(*tenant, file_id, endpoint, window, metadata, input, Now()).ToJson());
  });
  if (res.status == -1 && on_batch_created_) on_batch_created_();
}

void BatchApi::GetBatch(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  const std::string id = req.matches[1];
  Guarded(req, res, [&] {
    const auto batch = batches_.Get(*tenant, id);
    if (!batch) throw StoreError(StoreErrorKind::kNotFound, "batch_id: no batch " + id);
    SendJson(res, batch->ToJson());
  });
}

void BatchApi::ListBatches(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  auto limit = IntParam(req, "limit", 20, 1, 100);
  if (auto* error = std::get_if<ApiError>(&limit)) return SendError(res, *error);
  Guarded(req, res, [&] {
    const store::BatchPage page = batches_.List(*tenant, std::get<int64_t>(limit), OptionalParam(req, "after"));
    SendJson(res, ListJson(page.data, page.has_more));
  });
}

void BatchApi::CancelBatch(const httplib::Request& req, httplib::Response& res) {
  const auto tenant = Tenant(req, res);
  if (!tenant) return;
  const std::string id = req.matches[1];
  Guarded(req, res, [&] { SendJson(res, batches_.Cancel(*tenant, id, Now()).ToJson()); });
}

}  // namespace ferry::gateway::http
