//! The database side of the harness: [`Db`], one handle for a test's assertions and injected
//! faults, whatever the store behind it.
//!
//! Test SQL is written once, with `$1, $2` placeholders.

use std::path::Path;
use std::time::Duration;

/// A test's temp directory, where a server keeps its database (and the test its files).
pub struct TestDir(tempfile::TempDir);

pub fn test_dir() -> TestDir {
    TestDir(tempfile::tempdir().unwrap())
}

impl TestDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The `--db` of a server in `dir`: `dir/hookledger.db`.
pub fn db_arg_in(dir: &Path) -> String {
    dir.join("hookledger.db").to_str().unwrap().to_string()
}

/// Whether anything made the database of `dir` (for "nothing is created before the config
/// is valid"): the file exists.
pub fn database_created(dir: &Path) -> bool {
    dir.join("hookledger.db").exists()
}

/// A connection to a test's database, for assertions and fault injection. Reads are typed by
/// what the test expects ([`Row`]); parameters are `$1, $2`, bound from [`Param`]s.
pub enum Db {
    Sqlite(rusqlite::Connection),
}

impl Db {
    /// Opens the database hookledger was given as `--db` (a SQLite path).
    pub fn open(db_arg: &str) -> Db {
        let conn =
            rusqlite::Connection::open(db_arg).unwrap_or_else(|e| panic!("opening {db_arg}: {e}"));
        // The server's writer holds the lock for a batch at a time: wait for it.
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        Db::Sqlite(conn)
    }

    /// Every row of `sql`.
    pub fn all<T: Row>(&self, sql: &str, params: &[&dyn Param]) -> Vec<T> {
        match self {
            Db::Sqlite(conn) => {
                let sql = sqlite_placeholders(sql);
                let params: Vec<&dyn rusqlite::ToSql> = params.iter().map(|p| p.sqlite()).collect();
                let mut stmt = conn.prepare(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                let mut rows = stmt
                    .query(params.as_slice())
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                let mut all = Vec::new();
                while let Some(row) = rows.next().unwrap_or_else(|e| panic!("{sql}: {e}")) {
                    all.push(T::from_sqlite(row, &sql));
                }
                all
            }
        }
    }

    /// The one row of `sql` (a test failure if there is none, or more).
    #[track_caller]
    pub fn one<T: Row>(&self, sql: &str, params: &[&dyn Param]) -> T {
        let mut rows = self.all(sql, params);
        assert_eq!(rows.len(), 1, "{sql}: expected one row");
        rows.remove(0)
    }

    /// The row of `sql` if there is one (a test failure if there are more).
    #[track_caller]
    pub fn opt<T: Row>(&self, sql: &str, params: &[&dyn Param]) -> Option<T> {
        let mut rows = self.all(sql, params);
        assert!(
            rows.len() <= 1,
            "{sql}: {} rows, expected at most one",
            rows.len()
        );
        rows.pop()
    }

    /// The number `sql` selects, e.g. `SELECT count(*) FROM …`.
    #[track_caller]
    pub fn count(&self, sql: &str) -> i64 {
        self.one(sql, &[])
    }

    /// The first column of every row of `sql`, as strings.
    pub fn strings(&self, sql: &str) -> Vec<String> {
        self.all(sql, &[])
    }

    /// Runs one statement; returns the number of rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn Param]) -> u64 {
        match self {
            Db::Sqlite(conn) => {
                let sql = sqlite_placeholders(sql);
                let params: Vec<&dyn rusqlite::ToSql> = params.iter().map(|p| p.sqlite()).collect();
                conn.execute(&sql, params.as_slice())
                    .unwrap_or_else(|e| panic!("{sql}: {e}")) as u64
            }
        }
    }

    /// Runs statements without parameters, e.g. `BEGIN`.
    pub fn batch(&self, sql: &str) {
        match self {
            Db::Sqlite(conn) => conn
                .execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Makes every `statement` (`INSERT`, `UPDATE`) on `table` for which `condition` holds
    /// (on the `new` row) fail with `message`, as if the database refused it, until
    /// [`Db::remove_failure`]: a trigger named `name`.
    pub fn inject_failure(
        &self,
        name: &str,
        statement: &str,
        table: &str,
        condition: &str,
        message: &str,
    ) {
        match self {
            Db::Sqlite(_) => self.batch(&format!(
                "CREATE TRIGGER {name} BEFORE {statement} ON {table} WHEN ({condition})
                 BEGIN SELECT RAISE(ABORT, '{message}'); END;"
            )),
        }
    }

    /// Ends [`Db::inject_failure`]'s failure `name` on `table`.
    pub fn remove_failure(&self, name: &str, table: &str) {
        match self {
            Db::Sqlite(_) => {
                let _ = table;
                self.batch(&format!("DROP TRIGGER {name}"))
            }
        }
    }

    /// The names of the tables (hookledger's and the app's), sorted.
    pub fn tables(&self) -> Vec<String> {
        match self {
            Db::Sqlite(_) => {
                self.strings("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            }
        }
    }

    /// Every row of `table`, each as one string, sorted.
    pub fn rows_as_text(&self, table: &str) -> Vec<String> {
        let mut rows = match self {
            Db::Sqlite(conn) => {
                let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
                let columns = stmt.column_count();
                stmt.query_map([], |r| {
                    let cells: Vec<String> = (0..columns)
                        .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                        .collect();
                    Ok(cells.join("|"))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect::<Vec<String>>()
            }
        };
        rows.sort();
        rows
    }
}

/// `$1` → `?1`: SQLite takes numbered parameters with a `?`.
fn sqlite_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

/// A value a test binds to a `$n` parameter, on either store.
pub trait Param {
    fn sqlite(&self) -> &dyn rusqlite::ToSql;
}

impl<T: rusqlite::ToSql> Param for T {
    fn sqlite(&self) -> &dyn rusqlite::ToSql {
        self
    }
}

/// A value a test reads from one column, on either store.
pub trait Cell: Sized {
    fn from_sqlite(row: &rusqlite::Row, i: usize, sql: &str) -> Self;
}

macro_rules! cells {
    ($($t:ty),*) => {$(
        impl Cell for $t {
            fn from_sqlite(row: &rusqlite::Row, i: usize, sql: &str) -> Self {
                row.get(i).unwrap_or_else(|e| panic!("{sql}: column {i}: {e}"))
            }
        }
    )*};
}

cells!(
    i64,
    String,
    Vec<u8>,
    Option<i64>,
    Option<String>,
    Option<Vec<u8>>
);

/// What a test reads from one row: a [`Cell`], or a tuple of them (one per column).
pub trait Row: Sized {
    fn from_sqlite(row: &rusqlite::Row, sql: &str) -> Self;
}

impl<T: Cell> Row for T {
    fn from_sqlite(row: &rusqlite::Row, sql: &str) -> Self {
        T::from_sqlite(row, 0, sql)
    }
}

macro_rules! rows {
    ($(($($t:ident $i:tt),*)),*) => {$(
        impl<$($t: Cell),*> Row for ($($t,)*) {
            fn from_sqlite(row: &rusqlite::Row, sql: &str) -> Self {
                ($(<$t as Cell>::from_sqlite(row, $i, sql),)*)
            }
        }
    )*};
}

rows!((A 0, B 1), (A 0, B 1, C 2));
