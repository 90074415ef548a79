// SQLite, dlopen()ed: the GPU machines have libsqlite3.so.0 but no headers, so
// we declare the few functions we call ourselves (opaque handles) and load the
// library on first use (CC1D_SQLITE, then libsqlite3.so.0, then libsqlite3.so).
// Read-only use only: the runtime never writes a tuning DB.
#pragma once
#include <cstdint>
#include <string>

namespace cc1d::sqlite {

// Throws Error when the library cannot be loaded (message lists what was tried).
void ensure_loaded();

class Stmt;

// A read-only connection (SQLITE_OPEN_READONLY, busy timeout set). Throws
// Error with SQLite's message when the file cannot be opened.
class Db {
 public:
  // immutable: open as `file:PATH?mode=ro&immutable=1` (no locks, no -shm file),
  // for a WAL-mode DB in a folder the reader cannot write (a shipped DB in a
  // system site-packages); only right for a file nobody is writing.
  Db(const std::string& path, int busy_timeout_ms, bool immutable = false);
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  ~Db();
  // Throws Error carrying SQLite's message (e.g. "file is not a database").
  Stmt prepare(const char* sql);
  std::string errmsg() const;

 private:
  void* db_ = nullptr;  // sqlite3*
};

class Stmt {
 public:
  Stmt(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt();
  void bind_text(int index, const std::string& value);  // 1-based
  // true: a row is ready; false: done. Throws Error on failure (corrupt file, ...).
  bool step();
  bool is_null(int col) const;
  bool is_integer(int col) const;
  int64_t int64(int col) const;
  std::string text(int col) const;  // "" for NULL

 private:
  friend class Db;
  Stmt(void* stmt, const Db* db) : stmt_(stmt), db_(db) {}
  void* stmt_ = nullptr;  // sqlite3_stmt*
  const Db* db_ = nullptr;
};

}  // namespace cc1d::sqlite
