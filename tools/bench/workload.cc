#include "tools/bench/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "scheduler/sim/workload.h"

namespace ferry::bench {

double Rng::Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Uniform() * static_cast<double>(span)) % static_cast<int64_t>(span);
}

double Rng::Normal() { return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(2.0 * std::numbers::pi * Uniform()); }

// Marsaglia-Tsang; shapes below 1 through the boost Gamma(a) = Gamma(a + 1) * U^(1/a).
double Rng::Gamma(double shape) {
  if (shape < 1.0) return Gamma(shape + 1.0) * std::pow(Uniform(), 1.0 / shape);
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    const double x = Normal();
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    if (std::log(Uniform()) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

namespace {

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  return parts;
}

double ParseNumber(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw std::invalid_argument(what + ": \"" + text + "\" is not a number");
  }
  return value;
}

}  // namespace

LengthSpec ParseLengthSpec(const std::string& text) {
  const std::vector<std::string> parts = Split(text, ':');
  const std::string what = "length \"" + text + "\"";
  LengthSpec spec;
  if (parts.size() == 1) {
    spec.a = ParseNumber(parts[0], what);
  } else if ((parts.size() == 3 || parts.size() == 5) &&
             (parts[0] == "uniform" || parts[0] == "normal" || parts[0] == "lognormal")) {
    spec.kind = parts[0] == "uniform" ? LengthSpec::Kind::kUniform
                : parts[0] == "normal" ? LengthSpec::Kind::kNormal
                                       : LengthSpec::Kind::kLogNormal;
    spec.a = ParseNumber(parts[1], what);
    spec.b = ParseNumber(parts[2], what);
    if (parts.size() == 5) {
      spec.min = static_cast<int32_t>(ParseNumber(parts[3], what));
      spec.max = static_cast<int32_t>(ParseNumber(parts[4], what));
      if (spec.min < 1 || spec.max < spec.min) throw std::invalid_argument(what + ": needs 1 <= MIN <= MAX");
    }
    if (spec.kind == LengthSpec::Kind::kUniform && spec.b < spec.a) {
      throw std::invalid_argument(what + ": uniform needs low <= high");
    }
    if (spec.kind != LengthSpec::Kind::kUniform && spec.b < 0) {
      throw std::invalid_argument(what + ": the spread must be >= 0");
    }
  } else {
    throw std::invalid_argument(what + " is not N, uniform:LOW:HIGH, normal:MEAN:SD or lognormal:MEAN:SIGMA "
                                       "(the last three with optional :MIN:MAX)");
  }
  if (spec.a < 1) throw std::invalid_argument(what + ": lengths must be >= 1");
  return spec;
}

std::string LengthSpecName(const LengthSpec& spec) {
  auto num = [](double x) {
    std::ostringstream out;
    out << x;
    return out.str();
  };
  switch (spec.kind) {
    case LengthSpec::Kind::kFixed: return num(spec.a);
    case LengthSpec::Kind::kUniform: return "uniform:" + num(spec.a) + ":" + num(spec.b);
    case LengthSpec::Kind::kNormal:
    case LengthSpec::Kind::kLogNormal: {
      const bool is_clipped = spec.min != LengthSpec{}.min || spec.max != LengthSpec{}.max;
      return std::string(spec.kind == LengthSpec::Kind::kNormal ? "normal:" : "lognormal:") + num(spec.a) + ":" +
             num(spec.b) + (is_clipped ? ":" + num(spec.min) + ":" + num(spec.max) : "");
    }
  }
  return "?";
}

int32_t SampleLength(const LengthSpec& spec, Rng& rng) {
  double x = spec.a;
  if (spec.kind == LengthSpec::Kind::kUniform) {
    x = static_cast<double>(rng.UniformInt(std::llround(spec.a), std::llround(spec.b)));
  } else if (spec.kind == LengthSpec::Kind::kNormal) {
    x = spec.a + spec.b * rng.Normal();
  } else if (spec.kind == LengthSpec::Kind::kLogNormal) {  // E[x] = a
    x = spec.a * std::exp(spec.b * rng.Normal() - 0.5 * spec.b * spec.b);
  }
  const int64_t rounded = std::llround(x);
  return static_cast<int32_t>(std::clamp<int64_t>(rounded, std::max(1, spec.min), std::max(1, spec.max)));
}

bool IsOpenLoop(const ArrivalSpec& spec) { return spec.rate_per_s > 0 && std::isfinite(spec.rate_per_s); }

std::vector<double> ArrivalTimes(const ArrivalSpec& spec, int64_t n, Rng& rng) {
  std::vector<double> times(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!IsOpenLoop(spec) || n <= 0) return times;
  if (!(spec.burstiness > 0)) throw std::invalid_argument("burstiness must be > 0");
  if (spec.ramp_end_rate_per_s < 0) throw std::invalid_argument("ramp end rate must be >= 0");
  std::vector<double> gaps(times.size());
  double sum = 0;
  for (double& g : gaps) {
    g = rng.Gamma(spec.burstiness) / spec.burstiness;  // mean 1, CV 1/sqrt(burstiness)
    sum += g;
  }
  const double scale = static_cast<double>(n) / sum;
  const bool is_ramp = spec.ramp_end_rate_per_s > 0;
  double t = 0;
  for (size_t i = 0; i < gaps.size(); ++i) {
    const double f = gaps.size() > 1 ? static_cast<double>(i) / static_cast<double>(gaps.size() - 1) : 0.0;
    const double rate = is_ramp ? spec.rate_per_s + (spec.ramp_end_rate_per_s - spec.rate_per_s) * f
                                : spec.rate_per_s;
    t += gaps[i] * scale / rate;
    times[i] = t;
  }
  return times;
}

LaneShare ParseLaneShare(const std::string& text) {
  const size_t eq = text.find('=');
  LaneShare lane;
  lane.name = text.substr(0, eq);
  if (eq != std::string::npos) lane.share = ParseNumber(text.substr(eq + 1), "lane \"" + text + "\"");
  if (lane.name.empty() || !(lane.share > 0)) {
    throw std::invalid_argument("lane \"" + text + "\" is not NAME or NAME=SHARE with SHARE > 0");
  }
  return lane;
}

std::vector<PromptEntry> ReadPromptsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read prompts file " + path);
  std::vector<PromptEntry> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      PromptEntry e;
      e.text = j.at("prompt").get<std::string>();
      e.output_tokens = j.value("output_tokens", 0);
      if (e.text.empty() || e.output_tokens < 0) throw std::invalid_argument("empty prompt or output_tokens < 0");
      out.push_back(std::move(e));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  if (out.empty()) throw std::runtime_error(path + ": no prompts");
  return out;
}

namespace {

const std::string& PickLane(const std::vector<LaneShare>& lanes, double total, Rng& rng) {
  double pick = rng.Uniform() * total;
  for (const LaneShare& l : lanes) {
    if (pick < l.share) return l.name;
    pick -= l.share;
  }
  return lanes.back().name;
}

std::vector<int32_t> RandomIds(int32_t n, const WorkloadSpec& spec, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.UniformInt(spec.token_id_min, spec.token_id_max - 1));
  return ids;
}

void CheckTokenRange(const WorkloadSpec& spec) {
  if (spec.token_id_min < 0 || spec.token_id_max <= spec.token_id_min) {
    throw std::invalid_argument("token id range must satisfy 0 <= min < max");
  }
}

}  // namespace

std::vector<BenchRequest> GenerateWorkload(const WorkloadSpec& spec) {
  CheckTokenRange(spec);
  Rng rng(spec.seed);
  const std::vector<double> arrivals = ArrivalTimes(spec.arrivals, spec.num_requests, rng);
  double total_share = 0;
  for (const LaneShare& l : spec.lanes) total_share += l.share;
  std::vector<BenchRequest> out(arrivals.size());
  for (size_t i = 0; i < out.size(); ++i) {
    BenchRequest& r = out[i];
    r.index = static_cast<int64_t>(i);
    r.arrival_s = arrivals[i];
    r.seed = spec.seed * 1'000'003 + i + 1;
    if (!spec.lanes.empty()) r.lane = PickLane(spec.lanes, total_share, rng);
    if (!spec.loras.empty()) r.lora_name = spec.loras[i % spec.loras.size()];
    if (!spec.prompts.empty()) {
      const PromptEntry& p = spec.prompts[rng.UniformInt(0, static_cast<int64_t>(spec.prompts.size()) - 1)];
      r.prompt_text = p.text;
      r.max_tokens = p.output_tokens > 0 ? p.output_tokens : SampleLength(spec.output, rng);
    } else {
      r.prompt_token_ids = RandomIds(SampleLength(spec.input, rng), spec, rng);
      r.max_tokens = SampleLength(spec.output, rng);
    }
  }
  return out;
}

std::vector<BenchRequest> RequestsFromTrace(const std::vector<sim::TraceRequest>& trace, const WorkloadSpec& spec,
                                            int64_t max_requests) {
  CheckTokenRange(spec);
  Rng rng(spec.seed);
  size_t n = trace.size();
  if (max_requests > 0) n = std::min(n, static_cast<size_t>(max_requests));
  std::vector<BenchRequest> out(n);
  for (size_t i = 0; i < n; ++i) {
    const sim::TraceRequest& t = trace[i];
    BenchRequest& r = out[i];
    r.index = static_cast<int64_t>(i);
    r.arrival_s = t.arrival_s;
    r.lane = t.lane == "default" ? "" : t.lane;  // the trace's "default" is the server's default lane
    r.max_tokens = t.output_tokens;
    r.seed = spec.seed * 1'000'003 + i + 1;
    if (!spec.loras.empty()) r.lora_name = spec.loras[i % spec.loras.size()];
    if (t.prefix_id >= 0 && t.prefix_tokens > 0) {
      Rng prefix_rng(spec.seed ^ (0x5bd1e995ull * static_cast<uint64_t>(t.prefix_id + 1)));
      r.prompt_token_ids = RandomIds(t.prefix_tokens, spec, prefix_rng);
    }
    const std::vector<int32_t> rest = RandomIds(t.prompt_tokens - static_cast<int32_t>(r.prompt_token_ids.size()),
                                                spec, rng);
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), rest.begin(), rest.end());
  }
  return out;
}

}  // namespace ferry::bench
