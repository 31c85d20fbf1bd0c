#pragma once
// Internals of run_store.cpp; not part of the API. Small RAII wrappers over the SQLite C API:
// the connection handle, prepared statements and write transactions. Every failure is a
// tandem::Error that names the database file and says what to do about it.

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::store::sqlite {

// `file` names the database when `db` cannot (it failed to open).
[[noreturn]] void throwSqlite(sqlite3* db, int rc, std::string_view doing,
                              const std::string& file_name = {});

struct DbCloser {
  void operator()(sqlite3* db) const;
};
using DbHandle = std::unique_ptr<sqlite3, DbCloser>;

void exec(sqlite3* db, const char* sql);

// One prepared statement. Bind indices are 1-based, column indices 0-based (as in SQLite).
class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bindInt(int index, int64_t value);
  // NaN becomes NULL: SQLite would store it as NULL anyway, this makes it explicit.
  Statement& bindReal(int index, double value);
  Statement& bindText(int index, std::string_view value);
  Statement& bindNull(int index);
  Statement& bindReal(int index, const std::optional<double>& value);
  Statement& bindTextOrNull(int index, std::string_view value);

  // True when a row is ready; false when the statement is done.
  bool step();
  void run();

  bool isNull(int col) const;
  int64_t integer(int col) const;
  double real(int col) const;
  std::string text(int col) const;
  std::optional<int64_t> optInteger(int col) const;
  std::optional<double> optReal(int col) const;

 private:
  Statement& check(int rc);

  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// BEGIN IMMEDIATE takes the write lock up front. A deferred transaction that reads and then
// writes can fail with SQLITE_BUSY_SNAPSHOT when another process committed in between, and
// busy_timeout does not help there; IMMEDIATE waits in busy_timeout instead.
class Transaction {
 public:
  explicit Transaction(sqlite3* db);
  ~Transaction();  // rolls back unless committed
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  void commit();

 private:
  sqlite3* db_;
};

// The first column of the first row of `pragma` (any single-value query), or 0 without a row.
int64_t pragmaInt(sqlite3* db, const char* pragma);

}  // namespace tandem::store::sqlite
