#include "tools/launch/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/process.h"

namespace fs = std::filesystem;

namespace ferry::launch {

namespace {

using Clock = std::chrono::steady_clock;
// The restart cap's window; a unit that ran this long starts its backoff over.
constexpr auto kRestartWindow = std::chrono::seconds(60);
constexpr auto kFirstBackoff = std::chrono::milliseconds(500);
constexpr auto kMaxBackoff = std::chrono::seconds(8);

// Sets --name to value in argv, in whichever form it is there ("--name value" or
// "--name=value"), else appends it.
void SetFlag(std::vector<std::string>& argv, const std::string& name, const std::string& value) {
  bool found = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (argv[i] == name && i + 1 < argv.size()) {
      argv[++i] = value;
      found = true;
    } else if (argv[i].starts_with(name + "=")) {
      argv[i] = name + "=" + value;
      found = true;
    }
  }
  if (!found) argv.insert(argv.end(), {name, value});
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// 0.5 s, 1 s, 2 s, ... 8 s for the first, second, ... failure in a row.
Clock::duration Backoff(int failures_in_a_row) {
  Clock::duration delay = kFirstBackoff;
  for (int i = 1; i < failures_in_a_row && delay < kMaxBackoff; ++i) delay *= 2;
  return std::min<Clock::duration>(delay, kMaxBackoff);
}

}  // namespace

std::string Unit::Describe() const {
  if (members.size() == 1) return members[0].name;
  std::vector<std::string> names;
  for (const Member& m : members) names.push_back(m.name);
  return fmt::format("the worker group ({})", fmt::join(names, ", "));
}

const Unit& Supervisor::StartAndWait(Unit unit) {
  Unit& u = units_.emplace_back(std::move(unit));
  Spawn(u);
  while (true) {
    for (Member& m : u.members) {
      if (m.is_ready || TryReady(m)) continue;
      if (auto exit = m.child->Exited()) {
        throw std::runtime_error(fmt::format("{} (pid {}) {} before becoming ready", m.name, m.child->pid(), *exit));
      }
      if (Clock::now() - u.spawned_at > options_.ready_timeout) {
        throw std::runtime_error(fmt::format("{} not ready after {} s", m.name, options_.ready_timeout.count()));
      }
    }
    if (std::all_of(u.members.begin(), u.members.end(), [](const Member& m) { return m.is_ready; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  MarkRunning(u);
  return u;
}

// Starts every member at once: tensor-parallel ranks rendezvous while loading, so none may
// wait for another to be ready.
void Supervisor::Spawn(Unit& unit) {
  ++unit.generation;
  std::string store;
  if (unit.has_store) {
    // Every rank of the earlier generation is gone (reaped), so its directory can go too.
    if (unit.generation > 0) fs::remove_all(fmt::format("{}/gloo-{}", options_.run_dir, unit.generation - 1));
    store = fmt::format("{}/gloo-{}", options_.run_dir, unit.generation);
    fs::remove_all(store);
    fs::create_directories(store);
  }
  for (Member& m : unit.members) {
    const std::string ready = options_.run_dir + "/" + m.name + ".json";
    fs::remove(ready);
    fs::remove(ready + ".http.json");  // the gateway writes its HTTP port there first
    if (!store.empty()) SetFlag(m.argv, "--dist-store-dir", store);
    std::vector<std::string> argv = m.argv;
    argv.insert(argv.end(), {"--ready-file", ready, "--log-level", options_.log_level});
    m.probe.reset();
    m.is_ready = false;
    m.child = std::make_unique<ChildProcess>(m.name, std::move(argv));
  }
  unit.spawned_at = Clock::now();
  unit.state = Unit::State::kStarting;
}

bool Supervisor::TryReady(Member& m) {
  const std::string path = options_.run_dir + "/" + m.name + ".json";
  std::ifstream in(path);
  if (!in) return false;
  m.ready = nlohmann::json::parse(in);  // written atomically (common/process.h)
  if (m.has_http) m.ready["http_port"] = nlohmann::json::parse(std::ifstream(path + ".http.json")).at("http_port");
  m.ready["pid"] = m.child->pid();
  m.is_ready = true;
  // A restart comes back where the scheduler and the gateway (and whoever scrapes metrics) look.
  SetFlag(m.argv, "--port", std::to_string(m.ready.at("grpc_port").get<int>()));
  SetFlag(m.argv, "--metrics-port", std::to_string(m.ready.at("metrics_port").get<int>()));
  if (m.has_http) SetFlag(m.argv, "--http-port", std::to_string(m.ready.at("http_port").get<int>()));
  spdlog::info("{} ready: {}", m.name, m.ready.dump());
  return true;
}

void Supervisor::MarkRunning(Unit& unit) {
  unit.state = Unit::State::kRunning;
  for (Member& m : unit.members) {
    m.ready["restarts"] = unit.num_restarts;
    if (!m.is_worker) continue;
    m.probe = std::make_unique<WorkerProbe>("127.0.0.1:" + std::to_string(m.ready.at("grpc_port").get<int>()),
                                            options_.probe_tls);
  }
}

nlohmann::json Supervisor::State() const {
  nlohmann::json state = nlohmann::json::object();
  for (const Unit& unit : units_) {
    for (const Member& m : unit.members) {
      if (unit.key == "workers") {
        state[unit.key].push_back(m.ready);
      } else {
        state[unit.key] = m.ready;
      }
    }
  }
  return state;
}

void Supervisor::WriteState() const { ferry::WriteReadyFile(options_.ready_file, State()); }

int Supervisor::Run() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec tick{0, 100'000'000};
  while (true) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig > 0) {
      spdlog::info("signal {}: stopping the stack", sig);
      return 0;
    }
    for (Unit& unit : units_) {
      if (!Tick(unit)) return 1;
    }
  }
}

bool Supervisor::Tick(Unit& unit) {
  switch (unit.state) {
    case Unit::State::kWaiting:
      if (Clock::now() >= unit.restart_at) Spawn(unit);
      return true;
    case Unit::State::kStarting:
      return PollStarting(unit);
    case Unit::State::kRunning:
      return CheckRunning(unit);
  }
  return true;
}

bool Supervisor::PollStarting(Unit& unit) {
  for (Member& m : unit.members) {
    if (m.is_ready || TryReady(m)) continue;
    if (auto exit = m.child->Exited()) return OnFailure(unit, m, *exit + " before becoming ready");
    if (Clock::now() - unit.spawned_at > options_.ready_timeout) {
      m.child->Kill();
      return OnFailure(unit, m, fmt::format("was not ready after {} s (--ready-timeout-s); killed",
                                            options_.ready_timeout.count()));
    }
  }
  if (!std::all_of(unit.members.begin(), unit.members.end(), [](const Member& m) { return m.is_ready; })) return true;
  MarkRunning(unit);
  spdlog::info("{} is back (restart {})", unit.Describe(), unit.num_restarts);
  WriteState();
  return true;
}

bool Supervisor::CheckRunning(Unit& unit) {
  for (Member& m : unit.members) {
    if (auto exit = m.child->Exited()) return OnFailure(unit, m, *exit);
    if (m.probe && m.probe->silent_for() > options_.step_timeout) {
      // Alive but not serving (stopped, or stuck in a step): only a restart brings it back.
      const double silent_s = Seconds(m.probe->silent_for());
      const std::string how = m.child->Kill();
      return OnFailure(unit, m, fmt::format("had not answered Health ok for {:.1f} s (--step-timeout-s {}); {}",
                                            silent_s, options_.step_timeout.count(),
                                            how == "killed by signal 9" ? "killed" : how));
    }
  }
  return true;
}

bool Supervisor::OnFailure(Unit& unit, const Member& member, const std::string& how) {
  const std::string what = fmt::format("{} (pid {}) {}", member.name, member.child->pid(), how);
  if (!options_.restart) {
    spdlog::error("{}; stopping the stack (--restart-policy never)", what);
    return false;
  }
  const auto now = Clock::now();
  std::erase_if(unit.restarts, [&](Clock::time_point t) { return now - t >= kRestartWindow; });
  if (static_cast<int>(unit.restarts.size()) >= options_.max_restarts_per_minute) {
    const size_t n = unit.restarts.size();
    spdlog::critical("{}; {} was restarted {} within the last 60 s, the most --max-restarts-per-minute {} allows: "
                     "stopping the stack",
                     what, unit.Describe(), n == 1 ? "once" : fmt::format("{} times", n),
                     options_.max_restarts_per_minute);
    return false;
  }
  const bool ran_long = unit.state == Unit::State::kRunning && now - unit.spawned_at >= kRestartWindow;
  unit.failures_in_a_row = ran_long ? 1 : unit.failures_in_a_row + 1;
  const auto delay = Backoff(unit.failures_in_a_row);
  unit.restarts.push_back(now);
  ++unit.num_restarts;
  spdlog::warn("{}; restarting {} in {:.1f} s (restart {}; {} within the last 60 s, at most {})", what,
               unit.Describe(), Seconds(delay), unit.num_restarts, unit.restarts.size(),
               options_.max_restarts_per_minute);
  KillUnit(unit);
  unit.state = Unit::State::kWaiting;
  unit.restart_at = Clock::now() + delay;
  return true;
}

// Ranks rendezvous together: when one fails, the others wait on it in collectives and hold a
// rendezvous the next incarnation cannot join, so all go.
void Supervisor::KillUnit(Unit& unit) {
  for (Member& m : unit.members) {
    m.probe.reset();
    m.is_ready = false;
    if (m.child->Exited()) continue;
    const std::string how = m.child->Kill();
    spdlog::warn("{} (pid {}) {}: its group restarts together", m.name, m.child->pid(), how);
  }
}

void Supervisor::StopAll() {
  for (auto unit = units_.rbegin(); unit != units_.rend(); ++unit) {
    for (auto m = unit->members.rbegin(); m != unit->members.rend(); ++m) {
      m->probe.reset();
      if (!m->child) continue;
      const auto grace = m->name == "gateway" ? options_.gateway_stop_grace : std::chrono::seconds(10);
      spdlog::info("{} (pid {}) {}", m->name, m->child->pid(), m->child->Stop(grace));
    }
  }
}

}  // namespace ferry::launch
