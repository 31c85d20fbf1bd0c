#include "engine/store/sqlite.h"

#include <cmath>

#include "engine/core/error.h"

namespace tandem::store::sqlite {
namespace {

std::string dbFile(sqlite3* db) {
  const char* name = db ? sqlite3_db_filename(db, "main") : nullptr;
  return name && *name ? name : "(run database)";
}

}  // namespace

void throwSqlite(sqlite3* db, int rc, std::string_view doing, const std::string& file_name) {
  const std::string file = file_name.empty() ? dbFile(db) : file_name;
  const std::string detail = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const std::string what = "run database " + file + ": " + std::string(doing) + ": " + detail;
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      throw Error(
          "run database " + file + " is damaged or is not an SQLite file (" + detail + ")",
          "move it away (mv '" + file + "' '" + file +
              ".damaged') and Tandem will start "
              "a new one; checkpoints and adapters in the output directories are not in it");
    case SQLITE_FULL: throw Error(what, "free disk space on the drive that holds " + file);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      throw Error(what + " (another process held it locked for more than 5 s)",
                  "find the process with `fuser " + file + "` and let it finish");
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
      throw Error(what, "check that " + file +
                            " and its directory are writable, or pass "
                            "another path with --db / TANDEM_HOME");
    default: throw Error(what);
  }
}

void DbCloser::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

void exec(sqlite3* db, const char* sql) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) throwSqlite(db, rc, sql);
}

// ---- Statement -----------------------------------------------------------------------------

Statement::Statement(sqlite3* db, std::string_view sql) : db_(db) {
  const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr);
  if (rc != SQLITE_OK) throwSqlite(db, rc, "preparing a query");
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::bindInt(int index, int64_t value) {
  return check(sqlite3_bind_int64(stmt_, index, value));
}

Statement& Statement::bindReal(int index, double value) {
  return std::isnan(value) ? bindNull(index) : check(sqlite3_bind_double(stmt_, index, value));
}

Statement& Statement::bindText(int index, std::string_view value) {
  return check(
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
}

Statement& Statement::bindNull(int index) { return check(sqlite3_bind_null(stmt_, index)); }

Statement& Statement::bindReal(int index, const std::optional<double>& value) {
  return value ? bindReal(index, *value) : bindNull(index);
}

Statement& Statement::bindTextOrNull(int index, std::string_view value) {
  return value.empty() ? bindNull(index) : bindText(index, value);
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throwSqlite(db_, rc, sqlite3_sql(stmt_));
}

void Statement::run() {
  while (step()) {
  }
}

bool Statement::isNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

int64_t Statement::integer(int col) const { return sqlite3_column_int64(stmt_, col); }

double Statement::real(int col) const { return sqlite3_column_double(stmt_, col); }

std::string Statement::text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : "";
}

std::optional<int64_t> Statement::optInteger(int col) const {
  return isNull(col) ? std::nullopt : std::optional<int64_t>(integer(col));
}

std::optional<double> Statement::optReal(int col) const {
  return isNull(col) ? std::nullopt : std::optional<double>(real(col));
}

Statement& Statement::check(int rc) {
  if (rc != SQLITE_OK) throwSqlite(db_, rc, "binding a query parameter");
  return *this;
}

// ---- Transaction ---------------------------------------------------------------------------

Transaction::Transaction(sqlite3* db) : db_(db) { exec(db_, "BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (db_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  exec(db_, "COMMIT");
  db_ = nullptr;
}

int64_t pragmaInt(sqlite3* db, const char* pragma) {
  Statement s(db, pragma);
  return s.step() ? s.integer(0) : 0;
}

}  // namespace tandem::store::sqlite
