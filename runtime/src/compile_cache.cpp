#include "compile_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "env.h"
#include "log.h"
#include "sha256.h"

namespace cc1d {
namespace {

std::atomic<uint64_t> g_compiles{0};  // compiler invocations (dispatch_stats().compiles)
std::atomic<uint64_t> g_corrupt{0};   // disk files that failed their hash check

constexpr char kMagic[8] = {'C', 'C', '1', 'D', 'B', 'I', 'N', '1'};

// Length-prefixed fields, so ("ab","c") and ("a","bc") hash differently.
void add_field(Sha256& h, const std::string& s) {
  uint64_t n = s.size();
  h.update(&n, sizeof n).update(s);
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

// Payload: [u64 binary size][binary][u64 log size][log]. The log is kept so a
// cache hit still shows the compiler's resource report.
std::string serialize(const CompileResult& r) {
  std::string p;
  put_u64(p, r.binary.size());
  p.append(reinterpret_cast<const char*>(r.binary.data()), r.binary.size());
  put_u64(p, r.log.size());
  p += r.log;
  return p;
}

bool deserialize(const std::string& p, CompileResult& r) {
  uint64_t n = 0, m = 0;
  if (p.size() < 16) return false;
  std::memcpy(&n, p.data(), 8);
  if (n > p.size() - 16) return false;
  std::memcpy(&m, p.data() + 8 + n, 8);
  if (m != p.size() - 16 - n) return false;
  r.binary.assign(p.begin() + 8, p.begin() + 8 + n);
  r.log.assign(p, 16 + n, m);
  return true;
}

bool make_dirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

class DiskCache {
 public:
  // Returns true and fills `r` on a valid hit. A corrupt file is reported
  // once and treated as a miss (it is overwritten by the rebuild).
  bool load(const std::string& target, const std::string& key, CompileResult& r) {
    if (!enabled()) return false;
    const std::string path = file(target, key);
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t head = sizeof kMagic + 64;
    if (data.size() >= head && std::memcmp(data.data(), kMagic, sizeof kMagic) == 0) {
      std::string payload = data.substr(head);
      if (data.compare(sizeof kMagic, 64, sha256_hex(payload)) == 0 && deserialize(payload, r)) return true;
    }
    g_corrupt.fetch_add(1, std::memory_order_relaxed);
    warn_once("corrupt:" + path, "compile cache file " + path + " fails its hash check; rebuilding it");
    return false;
  }

  void store(const std::string& target, const std::string& key, const CompileResult& r) {
    if (!enabled()) return;
    const std::string dir = env().kernels_dir() + "/" + target;
    const std::string payload = serialize(r);
    // Unique temp name in the same directory, then rename(): readers see
    // either no file or a complete one, whatever other processes do.
    static std::atomic<unsigned> counter{0};
    const std::string tmp = dir + "/." + key + "." + std::to_string(getpid()) + "." +
                            std::to_string(counter++) + ".tmp";
    bool ok = make_dirs(dir);
    if (ok) {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(kMagic, sizeof kMagic);
      out << sha256_hex(payload) << payload;
      out.close();
      ok = bool(out) && std::rename(tmp.c_str(), file(target, key).c_str()) == 0;
      if (!ok) std::remove(tmp.c_str());
    }
    if (!ok) {
      warn_once("unwritable-cache", "cannot write the compile cache in " + dir + " (" + std::strerror(errno) +
                                        "); keeping compiled kernels in memory only");
      disabled_ = true;
    }
  }

 private:
  bool enabled() const { return env().disk_cache && !disabled_; }
  static std::string file(const std::string& target, const std::string& key) {
    return env().kernels_dir() + "/" + target + "/" + key + ".bin";
  }
  std::atomic<bool> disabled_{false};
};

struct MemoryCache {
  std::mutex mu;
  std::map<std::string, std::shared_future<std::shared_ptr<const CompileResult>>> entries;
  std::map<std::string, std::string> versions;  // vendor -> compiler version
};

MemoryCache& memory() {
  static MemoryCache m;
  return m;
}

DiskCache& disk() {
  static DiskCache d;
  return d;
}

std::string version_of(Backend& backend) {
  auto& m = memory();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.versions.find(backend.vendor());
    if (it != m.versions.end()) return it->second;
  }
  std::string v = backend.compiler_version();  // may load the compiler: outside the lock
  std::lock_guard<std::mutex> lock(m.mu);
  return m.versions.emplace(backend.vendor(), v).first->second;
}

}  // namespace

uint64_t compile_count() { return g_compiles.load(std::memory_order_relaxed); }
uint64_t corrupt_cache_files() { return g_corrupt.load(std::memory_order_relaxed); }

std::string compile_key(const std::string& source, const std::string& target,
                        const std::vector<std::string>& options, const std::string& compiler_version) {
  Sha256 h;
  add_field(h, "cc1d-compile-v1");
  add_field(h, source);
  h.update(std::to_string(options.size()));
  for (const auto& o : options) add_field(h, o);
  add_field(h, compiler_version);
  add_field(h, target);
  return h.hex_digest();
}

CompileResult compile_cached(Backend& backend, const std::string& source, const std::string& target,
                             const std::vector<std::string>& options) {
  const std::string key = compile_key(source, target, options, version_of(backend));
  auto& m = memory();
  std::promise<std::shared_ptr<const CompileResult>> promise;
  std::shared_future<std::shared_ptr<const CompileResult>> future;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.entries.find(key);
    if (it != m.entries.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      m.entries.emplace(key, future);
      owner = true;
    }
  }
  if (owner) {
    // This thread compiles; others with the same key wait on the future.
    try {
      auto r = std::make_shared<CompileResult>();
      if (!disk().load(target, key, *r)) {
        g_compiles.fetch_add(1, std::memory_order_relaxed);
        *r = backend.compile(source, target, options);
        disk().store(target, key, *r);
      }
      promise.set_value(std::move(r));
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(m.mu);
        m.entries.erase(key);  // a later call retries
      }
      promise.set_exception(std::current_exception());
    }
  }
  return *future.get();
}

}  // namespace cc1d
