// ferry-launch's supervision: the stack's processes grouped into units that start, fail and
// restart together (a worker group: every tensor-parallel rank, as the ranks rendezvous
// together; the scheduler; the gateway), and the loop that watches them.
//
// A unit restarts on the ports of its first incarnation (the scheduler's --worker list and the
// gateway's --scheduler address stay valid), after a backoff that doubles from 0.5 s to 8 s for
// failures in a row and starts over once the unit has run 60 s. A worker group restarts with a
// fresh Gloo rendezvous directory: Gloo's FileStore never deletes a key, so an old one would
// hand the new ranks the dead ones' addresses. More restarts of a unit than
// max_restarts_per_minute within 60 s stop the stack (a crash loop is not hidden). A ready
// worker that does not answer Health ok for longer than the step timeout is killed (SIGKILL
// also ends a stopped process) and restarted with its group. After each restart the launcher's
// ready file is rewritten: it is the stack's state (scripts/chaos.sh reads it).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/launch/child_process.h"
#include "tools/launch/worker_probe.h"

namespace ferry::launch {

struct SupervisorOptions {
  std::string run_dir;     // children's ready files, Gloo rendezvous directories
  std::string ready_file;  // the launcher's own (the stack's state); may be empty
  std::string log_level = "info";
  bool restart = true;  // --restart-policy always; false: a failure stops the stack
  int max_restarts_per_minute = 5;
  std::chrono::seconds step_timeout{60};  // a ready worker silent this long is hung
  std::chrono::seconds ready_timeout{600};
  // The gateway drains in-flight calls on SIGTERM; the scheduler may take its worker recovery
  // timeout to end them, so the gateway gets at least that long plus a margin.
  std::chrono::seconds gateway_stop_grace{40};
  TlsFlags probe_tls;  // the launcher's identity for the worker probes (--tls auto), else empty
};

// One process of a unit.
struct Member {
  std::string name;               // "worker-0", "scheduler", "gateway": its ready file's name too
  std::vector<std::string> argv;  // ports pinned to the first incarnation's once it was ready
  bool is_worker = false;         // probed with ferry.v1.Worker/Health once ready
  bool has_http = false;          // the gateway with --http-port: its HTTP port file beside
  std::unique_ptr<ChildProcess> child;  // the current (or last) incarnation
  nlohmann::json ready;                 // its ports and pid, from the last incarnation that was ready
  bool is_ready = false;                // the current incarnation is
  std::unique_ptr<WorkerProbe> probe;   // workers, while the current incarnation is ready
};

// What starts and restarts together.
struct Unit {
  enum class State { kStarting, kRunning, kWaiting };

  std::string key;  // its entry in the ready file: "workers" (a list), "scheduler", "gateway"
  std::vector<Member> members;
  bool has_store = false;  // a tensor-parallel group: a fresh <run-dir>/gloo-<generation> per start
  int generation = -1;     // starts so far, less one
  State state = State::kStarting;
  std::chrono::steady_clock::time_point spawned_at;
  std::chrono::steady_clock::time_point restart_at;  // kWaiting
  int failures_in_a_row = 0;
  std::deque<std::chrono::steady_clock::time_point> restarts;  // those within the last 60 s
  int num_restarts = 0;

  std::string Describe() const;  // "worker-0", "the worker group (worker-0, worker-1)"
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options) : options_(std::move(options)) {}

  // Starts a unit and waits until every member is ready; throws std::runtime_error when one
  // exits first or is not ready in time (a stack that never served is not restarted). Returns
  // the unit, which stays valid.
  const Unit& StartAndWait(Unit unit);
  // Every unit's ports and pids: what the ready file holds.
  nlohmann::json State() const;
  void WriteState() const;
  // Watches the stack until SIGTERM/SIGINT (returns 0) or a failure that stops it (returns 1).
  int Run();
  // Stops every child, in reverse start order (the gateway stops taking requests first).
  void StopAll();

 private:
  void Spawn(Unit& unit);
  bool Tick(Unit& unit);  // false: stop the stack
  bool PollStarting(Unit& unit);
  bool CheckRunning(Unit& unit);
  bool TryReady(Member& member);  // reads its ready file once the child wrote it
  void MarkRunning(Unit& unit);
  bool OnFailure(Unit& unit, const Member& member, const std::string& how);
  void KillUnit(Unit& unit);

  SupervisorOptions options_;
  std::deque<Unit> units_;  // start order; a deque keeps references to units valid
};

}  // namespace ferry::launch
