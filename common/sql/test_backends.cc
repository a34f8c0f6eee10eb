#include "common/sql/test_backends.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "common/temp_dir.h"

namespace ferry::sql::testbed {
namespace {

namespace fs = std::filesystem;

// Runs argv to completion with stdout and stderr appended to log_path; returns the exit status.
int RunLogged(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Tail(const std::string& path, size_t max_chars = 2000) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > max_chars ? all.substr(all.size() - max_chars) : all;
}

// The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl, or "".
std::string FindPostgresBinDir() {
  if (const char* dir = std::getenv("FERRY_PG_BINDIR")) return fs::exists(fs::path(dir) / "initdb") ? dir : "";
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const fs::path bin = entry.path() / "bin";
    if (!fs::exists(bin / "initdb") || !fs::exists(bin / "pg_ctl")) continue;
    const int version = std::atoi(entry.path().filename().c_str());
    if (version > best_version) {
      best_version = version;
      best = bin.string();
    }
  }
  return best;
}

// One server per test binary. Tests run as root here, and postgres refuses root: the data
// directory then belongs to the postgres user and every server binary runs through runuser.
class PostgresServer {
 public:
  // Empty skip_reason and a running server, or a skip_reason when this machine cannot run one.
  explicit PostgresServer(std::string* skip_reason);
  ~PostgresServer() { Stop(); }

  std::string NewDatabase();
  int port() const { return port_; }

 private:
  std::vector<std::string> Command(const std::string& binary, std::vector<std::string> args) const;
  void InitDb();
  bool TryStart();
  void Stop();

  std::string bin_dir_;
  bool needs_runuser_ = false;
  std::string dir_;  // data/, the socket and the logs
  int port_ = 0;
  bool is_running_ = false;
  std::unique_ptr<Db> admin_;
  int num_databases_ = 0;
};

PostgresServer::PostgresServer(std::string* skip_reason) {
  bin_dir_ = FindPostgresBinDir();
  if (bin_dir_.empty()) {
    *skip_reason =
        "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb; apt install "
        "postgresql, or set FERRY_PG_BINDIR): PostgreSQL tests skipped";
    return;
  }
  const passwd* postgres_user = ::getpwnam("postgres");
  needs_runuser_ = ::geteuid() == 0;
  if (needs_runuser_ && (postgres_user == nullptr || !fs::exists("/usr/sbin/runuser"))) {
    *skip_reason = "running as root, and the server needs the 'postgres' user and /usr/sbin/runuser";
    return;
  }
  dir_ = (fs::temp_directory_path() / ("ferry_sql_pg_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  if (needs_runuser_ && ::chown(dir_.c_str(), postgres_user->pw_uid, postgres_user->pw_gid) != 0) {
    throw std::runtime_error("cannot chown " + dir_ + " to postgres");
  }
  ::chmod(dir_.c_str(), 0700);
  try {
    InitDb();
    // The kernel's free port may be taken again before the server binds it: try a few.
    for (int attempt = 0; attempt < 3 && !is_running_; ++attempt) is_running_ = TryStart();
    if (!is_running_) throw std::runtime_error("postgres did not start:\n" + Tail(dir_ + "/server.log"));
    admin_ = OpenDb("postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres");
  } catch (...) {
    Stop();  // the destructor does not run for a constructor that throws
    throw;
  }
}

std::vector<std::string> PostgresServer::Command(const std::string& binary, std::vector<std::string> args) const {
  std::vector<std::string> argv;
  if (needs_runuser_) argv = {"/usr/sbin/runuser", "-u", "postgres", "--"};
  argv.push_back(bin_dir_ + "/" + binary);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

void PostgresServer::InitDb() {
  // Trust auth on loopback only; C locale so text sorts bytewise, as SQLite's BINARY collation.
  const int status = RunLogged(Command("initdb", {"-D", dir_ + "/data", "--auth=trust", "-U", "postgres", "-E", "UTF8",
                                                  "--locale=C", "--no-sync"}),
                               dir_ + "/initdb.log");
  if (status != 0) throw std::runtime_error("initdb failed:\n" + Tail(dir_ + "/initdb.log"));
}

bool PostgresServer::TryStart() {
  port_ = FreeLoopbackPort();
  // fsync off: the tests check what a connection sees, not the server's crash safety. Small
  // memory: ctest runs each test in its own process, so several servers may run at once.
  const std::string options = "-p " + std::to_string(port_) + " -c listen_addresses=127.0.0.1 -k " + dir_ +
                              " -c fsync=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=40";
  const int status = RunLogged(
      Command("pg_ctl", {"-D", dir_ + "/data", "-l", dir_ + "/server.log", "-w", "-t", "30", "-o", options, "start"}),
      dir_ + "/pg_ctl.log");
  return status == 0;
}

void PostgresServer::Stop() {
  admin_.reset();
  if (is_running_) {
    RunLogged(Command("pg_ctl", {"-D", dir_ + "/data", "-m", "fast", "-w", "stop"}), dir_ + "/pg_ctl.log");
    is_running_ = false;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string PostgresServer::NewDatabase() {
  const std::string name = "t_" + std::to_string(++num_databases_);
  admin_->Exec("CREATE DATABASE " + name);
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/" + name;
}

std::mutex server_mutex;
std::unique_ptr<PostgresServer> server;  // guarded by server_mutex
std::string server_skip_reason;          // guarded by server_mutex
std::string server_failure;              // guarded by server_mutex: why it did not start
bool is_server_tried = false;            // guarded by server_mutex

// Stops the server when the tests end (a static's destructor would run after gtest reports).
class PostgresEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    std::lock_guard lock(server_mutex);
    server.reset();
  }
};
[[maybe_unused]] ::testing::Environment* const environment =
    ::testing::AddGlobalTestEnvironment(new PostgresEnvironment);

}  // namespace

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    throw std::runtime_error("cannot bind a loopback port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string NewPostgresDatabase(std::string* skip_reason) {
  std::lock_guard lock(server_mutex);
  if (!is_server_tried) {
    is_server_tried = true;
    try {
      auto started = std::make_unique<PostgresServer>(&server_skip_reason);
      if (server_skip_reason.empty()) server = std::move(started);
    } catch (const std::exception& error) {
      server_failure = error.what();
    }
  }
  if (!server_failure.empty()) throw std::runtime_error("PostgreSQL test server: " + server_failure);
  if (!server) {
    *skip_reason = server_skip_reason;
    return "";
  }
  return server->NewDatabase();
}

int PostgresPort() {
  std::lock_guard lock(server_mutex);
  return server ? server->port() : 0;
}

std::string SqliteBackend::NewDatabase(std::string*) {
  static ferry::testing::TempDir dir("sql_sqlite");
  static std::atomic<int> num_databases{0};
  return dir / ("db_" + std::to_string(++num_databases) + ".db");
}

}  // namespace ferry::sql::testbed
