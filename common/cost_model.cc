#include "common/cost_model.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ferry {
namespace {

void RequirePositive(const char* field, double value) {
  if (!(value > 0.0)) {
    throw std::invalid_argument(std::string("cost model ") + field + " = " +
                                std::to_string(value) + " must be > 0");
  }
}

void RequireNonNegative(const char* field, double value) {
  if (!(value >= 0.0)) {
    throw std::invalid_argument(std::string("cost model ") + field + " = " +
                                std::to_string(value) + " must be >= 0");
  }
}

void ReadFields(const nlohmann::json& j, CostModelParams& p);

}  // namespace

CostModel::CostModel(CostModelParams params) : params_(std::move(params)) {
  RequirePositive("bandwidth_bytes_per_s", params_.bandwidth_bytes_per_s);
  RequirePositive("bandwidth_efficiency", params_.bandwidth_efficiency);
  RequirePositive("peak_flops", params_.peak_flops);
  RequirePositive("flops_efficiency", params_.flops_efficiency);
  RequireNonNegative("fixed_s", params_.fixed_s);
  RequireNonNegative("batched_step_s", params_.batched_step_s);
  RequireNonNegative("per_seq_s", params_.per_seq_s);
  RequireNonNegative("per_context_token_s", params_.per_context_token_s);
  RequireNonNegative("weight_bytes", params_.weight_bytes);
  RequireNonNegative("kv_bytes_per_token", params_.kv_bytes_per_token);
  RequireNonNegative("flops_per_token", params_.flops_per_token);
  if (params_.kv_capacity_tokens < 0) RequireNonNegative("kv_capacity_tokens", -1.0);
}

double CostModel::MemorySeconds(const StepShape& shape) const {
  const double bytes = params_.weight_bytes +
                       params_.kv_bytes_per_token * static_cast<double>(shape.num_kv_tokens);
  return bytes / (params_.bandwidth_bytes_per_s * params_.bandwidth_efficiency);
}

double CostModel::ComputeSeconds(const StepShape& shape) const {
  return params_.flops_per_token * static_cast<double>(shape.num_tokens) /
         (params_.peak_flops * params_.flops_efficiency);
}

double CostModel::StepSeconds(const StepShape& shape) const {
  if (shape.num_tokens <= 0 && shape.num_seqs <= 0) return 0.0;
  const double batched = shape.num_seqs > 1 ? params_.batched_step_s : 0.0;
  return params_.fixed_s + batched + params_.per_seq_s * shape.num_seqs +
         params_.per_context_token_s * static_cast<double>(shape.num_kv_tokens) +
         std::max(MemorySeconds(shape), ComputeSeconds(shape));
}

CostModelParams CostModelParamsFromJson(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("cost model JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("cost model JSON must be an object");
  CostModelParams p;
  try {
    ReadFields(j, p);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("cost model JSON: ") + e.what());
  }
  CostModel check(p);  // validates
  return p;
}

namespace {
void ReadFields(const nlohmann::json& j, CostModelParams& p) {
  for (const auto& [key, value] : j.items()) {
    auto num = [&](double& field) {
      if (!value.is_number()) throw std::invalid_argument("cost model " + key + " must be a number");
      field = value.get<double>();
    };
    if (key == "name") p.name = value.get<std::string>();
    else if (key == "source") p.source = value.get<std::string>();
    else if (key == "fixed_s") num(p.fixed_s);
    else if (key == "batched_step_s") num(p.batched_step_s);
    else if (key == "per_seq_s") num(p.per_seq_s);
    else if (key == "per_context_token_s") num(p.per_context_token_s);
    else if (key == "weight_bytes") num(p.weight_bytes);
    else if (key == "kv_bytes_per_token") num(p.kv_bytes_per_token);
    else if (key == "bandwidth_bytes_per_s") num(p.bandwidth_bytes_per_s);
    else if (key == "bandwidth_efficiency") num(p.bandwidth_efficiency);
    else if (key == "flops_per_token") num(p.flops_per_token);
    else if (key == "peak_flops") num(p.peak_flops);
    else if (key == "flops_efficiency") num(p.flops_efficiency);
    else if (key == "kv_capacity_tokens") {
      if (!value.is_number_integer()) throw std::invalid_argument("cost model kv_capacity_tokens must be an integer");
      p.kv_capacity_tokens = value.get<int64_t>();
    } else if (key.starts_with("_")) {
      continue;  // comments
    } else {
      throw std::invalid_argument("cost model JSON: unknown key \"" + key + "\"");
    }
  }
}
}  // namespace

std::string CostModelParamsToJson(const CostModelParams& p) {
  nlohmann::json j = {{"name", p.name},
                      {"source", p.source},
                      {"fixed_s", p.fixed_s},
                      {"batched_step_s", p.batched_step_s},
                      {"per_seq_s", p.per_seq_s},
                      {"per_context_token_s", p.per_context_token_s},
                      {"weight_bytes", p.weight_bytes},
                      {"kv_bytes_per_token", p.kv_bytes_per_token},
                      {"bandwidth_bytes_per_s", p.bandwidth_bytes_per_s},
                      {"bandwidth_efficiency", p.bandwidth_efficiency},
                      {"flops_per_token", p.flops_per_token},
                      {"peak_flops", p.peak_flops},
                      {"flops_efficiency", p.flops_efficiency},
                      {"kv_capacity_tokens", p.kv_capacity_tokens}};
  return j.dump(2);
}

CostModelParams LoadCostModelParams(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read cost model preset " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return CostModelParamsFromJson(ss.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace ferry
