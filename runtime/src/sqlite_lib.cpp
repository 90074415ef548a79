#include "sqlite_lib.h"

#include <cstdlib>
#include <vector>
#include <utility>

#include "cc1d/cc1d.h"
#include "dynlib.h"

namespace cc1d::sqlite {
namespace {

// The subset of sqlite3.h we use; values from the stable C API.
constexpr int kOk = 0, kRow = 100, kDone = 101;
constexpr int kInteger = 1, kNull = 5;
constexpr int kOpenReadOnly = 0x00000001, kOpenUri = 0x00000040;
using Destructor = void (*)(void*);
const Destructor kTransient = reinterpret_cast<Destructor>(-1);  // SQLITE_TRANSIENT: SQLite copies

struct Api {
  DynLib lib;
  int (*open_v2)(const char*, void**, int, const char*) = nullptr;
  int (*close_v2)(void*) = nullptr;
  int (*busy_timeout)(void*, int) = nullptr;
  const char* (*errmsg)(void*) = nullptr;
  int (*prepare_v2)(void*, const char*, int, void**, const char**) = nullptr;
  int (*bind_text)(void*, int, const char*, int, Destructor) = nullptr;
  int (*step)(void*) = nullptr;
  int (*finalize)(void*) = nullptr;
  int (*column_type)(void*, int) = nullptr;
  int64_t (*column_int64)(void*, int) = nullptr;
  const unsigned char* (*column_text)(void*, int) = nullptr;
  int (*column_bytes)(void*, int) = nullptr;
};

const Api& api() {
  static const Api a = [] {
    Api a;
    std::vector<std::string> names;
    if (const char* e = std::getenv("CC1D_SQLITE"); e && *e) names.push_back(e);
    names.push_back("libsqlite3.so.0");
    names.push_back("libsqlite3.so");
    a.lib = DynLib::open_first(names, "SQLite (needed to read tuning DBs; set CC1D_SQLITE)", "sqlite3_open_v2");
    a.lib.get(a.open_v2, "sqlite3_open_v2");
    a.lib.get(a.close_v2, "sqlite3_close_v2");
    a.lib.get(a.busy_timeout, "sqlite3_busy_timeout");
    a.lib.get(a.errmsg, "sqlite3_errmsg");
    a.lib.get(a.prepare_v2, "sqlite3_prepare_v2");
    a.lib.get(a.bind_text, "sqlite3_bind_text");
    a.lib.get(a.step, "sqlite3_step");
    a.lib.get(a.finalize, "sqlite3_finalize");
    a.lib.get(a.column_type, "sqlite3_column_type");
    a.lib.get(a.column_int64, "sqlite3_column_int64");
    a.lib.get(a.column_text, "sqlite3_column_text");
    a.lib.get(a.column_bytes, "sqlite3_column_bytes");
    return a;
  }();  // a throw leaves it uninitialised: the next call tries again
  return a;
}

}  // namespace

void ensure_loaded() {
  try {
    api();
  } catch (const BackendError& e) {
    throw Error(e.what());
  }
}

Db::Db(const std::string& path, int busy_timeout_ms, bool immutable) {
  ensure_loaded();
  const Api& a = api();
  std::string name = path;
  if (immutable) {
    name = "file:";
    for (char c : path) {
      if (c == '%') name += "%25";
      else if (c == '?') name += "%3f";
      else if (c == '#') name += "%23";
      else name += c;
    }
    name += "?mode=ro&immutable=1";
  }
  void* db = nullptr;
  const int rc = a.open_v2(name.c_str(), &db, kOpenReadOnly | (immutable ? kOpenUri : 0), nullptr);
  if (rc != kOk) {
    std::string msg = db ? a.errmsg(db) : "out of memory";
    if (db) a.close_v2(db);
    throw Error(msg);
  }
  db_ = db;
  a.busy_timeout(db_, busy_timeout_ms);
}

Db::~Db() {
  if (db_) api().close_v2(db_);
}

std::string Db::errmsg() const { return db_ ? api().errmsg(db_) : "no connection"; }

Stmt Db::prepare(const char* sql) {
  void* stmt = nullptr;
  if (api().prepare_v2(db_, sql, -1, &stmt, nullptr) != kOk) {
    if (stmt) api().finalize(stmt);
    throw Error(errmsg());
  }
  return Stmt(stmt, this);
}

Stmt::Stmt(Stmt&& o) noexcept : stmt_(std::exchange(o.stmt_, nullptr)), db_(o.db_) {}

Stmt::~Stmt() {
  if (stmt_) api().finalize(stmt_);
}

void Stmt::bind_text(int index, const std::string& value) {
  if (api().bind_text(stmt_, index, value.data(), int(value.size()), kTransient) != kOk)
    throw Error(db_->errmsg());
}

bool Stmt::step() {
  const int rc = api().step(stmt_);
  if (rc == kRow) return true;
  if (rc == kDone) return false;
  throw Error(db_->errmsg());
}

bool Stmt::is_null(int col) const { return api().column_type(stmt_, col) == kNull; }
bool Stmt::is_integer(int col) const { return api().column_type(stmt_, col) == kInteger; }
int64_t Stmt::int64(int col) const { return api().column_int64(stmt_, col); }

std::string Stmt::text(int col) const {
  const unsigned char* p = api().column_text(stmt_, col);  // before column_bytes, as SQLite asks
  const int n = api().column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), std::size_t(n)) : std::string();
}

}  // namespace cc1d::sqlite
