//! The database side of the harness: which store the tests run against, a database per test
//! directory, and [`Db`], one handle for a test's assertions and injected faults.
//!
//! `HOOKLEDGER_TEST_STORE` picks the store: `sqlite` (the default; each test directory holds
//! its `hookledger.db`) or `postgres` (each test directory gets a database of its own,
//! `hl_t_<random>`, created on the server at `HOOKLEDGER_TEST_POSTGRES` and dropped with the
//! directory). Test SQL is written once, with `$1, $2` placeholders; where a statement cannot be
//! portable the test picks its variant by [`store()`]. The tests of PostgreSQL itself
//! (`postgres.rs`) take a database on that server in either mode ([`postgres_db_in`]).
//!
//! Failure modes: a test run killed before its directories are dropped (SIGKILL, ^C) leaves
//! its `hl_t_*` databases behind; drop them with (`_` escaped: it matches any character)
//! `psql "$HOOKLEDGER_TEST_POSTGRES" -Atc "SELECT format('DROP DATABASE %I WITH (FORCE);', datname) FROM pg_database WHERE datname LIKE 'hl\_t\_%'" | psql "$HOOKLEDGER_TEST_POSTGRES"`.

use std::cell::RefCell;
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// The store the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Postgres,
}

/// The store under test, decided once per test binary from `HOOKLEDGER_TEST_STORE`.
///
/// On PostgreSQL without a server to talk to, the run is skipped as a whole: a test cannot
/// skip itself from a helper, so the binary says so on stderr and exits with success the
/// first time a test needs the store (before any server of this run has started). With
/// `HOOKLEDGER_REQUIRE_POSTGRES` set (as `.ci/run` does) each such test fails instead.
pub fn store() -> Store {
    static STORE: OnceLock<Store> = OnceLock::new();
    *STORE.get_or_init(|| match std::env::var("HOOKLEDGER_TEST_STORE").as_deref() {
        Err(_) | Ok("" | "sqlite") => Store::Sqlite,
        Ok("postgres") if !cfg!(feature = "postgres") => panic!(
            "HOOKLEDGER_TEST_STORE=postgres, but this build has no PostgreSQL store \
             (--no-default-features)"
        ),
        Ok("postgres") => {
            if let Err(e) = admin() {
                let what = format!(
                    "no PostgreSQL server at {} (HOOKLEDGER_TEST_POSTGRES): {}",
                    redacted(&admin_url()),
                    pg_error(&e)
                );
                assert!(
                    std::env::var_os("HOOKLEDGER_REQUIRE_POSTGRES").is_none(),
                    "HOOKLEDGER_REQUIRE_POSTGRES is set: {what}"
                );
                // Past the test harness's capture: this is the run's last word.
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped on postgres: {what}; the postgres run stops here"
                );
                std::process::exit(0);
            }
            Store::Postgres
        }
        Ok(other) => panic!("HOOKLEDGER_TEST_STORE={other}: expected sqlite or postgres"),
    })
}

/// For a test about SQLite itself (its file, its lock, its shell): whether it is skipped,
/// as it is on PostgreSQL, saying `why`.
pub fn skipped_on_postgres(why: &str) -> bool {
    let skipped = store() == Store::Postgres;
    if skipped {
        eprintln!("skipped on postgres: {why}");
    }
    skipped
}

/// Whether the test is skipped because its databases are reached through a transaction pooler
/// (`HOOKLEDGER_TEST_POOLER`): a test of what a kill -9 leaves, whose outbox rows would wait
/// for their lease (there, a killed instance's leases end with `outbox_lease` only).
pub fn skipped_through_pooler(why: &str) -> bool {
    let skipped =
        store() == Store::Postgres && std::env::var_os("HOOKLEDGER_TEST_POOLER").is_some();
    if skipped {
        eprintln!("skipped through the pooler: {why}");
    }
    skipped
}

/// The PostgreSQL server the tests' databases are created on, as a role that may create and
/// drop databases.
fn admin_url() -> String {
    std::env::var("HOOKLEDGER_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://hookledger:hookledger@127.0.0.1:5432/postgres".into())
}

fn admin() -> Result<postgres::Client, postgres::Error> {
    connect(&admin_url())
}

fn connect(url: &str) -> Result<postgres::Client, postgres::Error> {
    let mut config: postgres::Config = direct(url).parse()?;
    // A server that does not answer is a skipped run, not a hung one.
    config.connect_timeout(Duration::from_secs(5));
    config.connect(postgres::NoTls)
}

/// `url` without its password, for messages.
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => url.to_string(),
    }
}

/// A PostgreSQL error with its causes: its own text says only "db error" or "error
/// connecting to server", the server's message is in its source.
fn pg_error(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Where a test directory remembers the URL of the database made for it on PostgreSQL, so a
/// restart on the same directory finds the same database.
const DATABASE_URL_FILE: &str = "database-url";

/// A test's temp directory, where a server keeps its database (and the test its files). On
/// PostgreSQL it owns the database made for it ([`db_arg_in`]) and drops it with itself.
pub struct TestDir(tempfile::TempDir);

pub fn test_dir() -> TestDir {
    TestDir(tempfile::tempdir().unwrap())
}

impl TestDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let Ok(url) = std::fs::read_to_string(self.path().join(DATABASE_URL_FILE)) else {
            return;
        };
        // FORCE: a server or a Db handle the test leaked must not keep the database alive.
        let name = database_name(&url);
        let dropped = admin().and_then(|mut admin| {
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        });
        if let Err(e) = dropped {
            // Not a panic: this may run while a failed test unwinds.
            eprintln!("database {name} left behind: {}", pg_error(&e));
        }
    }
}

/// The `--db` of a server in `dir`: on SQLite `dir/hookledger.db`; on PostgreSQL the URL of a
/// database made for `dir` the first time it is asked for. Use it with a [`TestDir`], which
/// drops that database; any other directory leaves it behind.
pub fn db_arg_in(dir: &Path) -> String {
    match store() {
        Store::Sqlite => dir.join("hookledger.db").to_str().unwrap().to_string(),
        Store::Postgres => postgres_db_in(dir),
    }
}

/// The URL of the PostgreSQL database made for `dir` (the first time it is asked for),
/// whatever the store under test: for the tests of PostgreSQL itself, after
/// [`postgres_reachable`]. As with [`db_arg_in`], the [`TestDir`] drops it.
pub fn postgres_db_in(dir: &Path) -> String {
    let file = dir.join(DATABASE_URL_FILE);
    if let Ok(url) = std::fs::read_to_string(&file) {
        return url;
    }
    let url = create_database();
    std::fs::write(&file, &url).unwrap();
    url
}

/// For the tests of PostgreSQL itself (several instances on one database, `migrate-to`), which
/// run in both modes: whether the server at `HOOKLEDGER_TEST_POSTGRES` answers. Where none
/// does the test is skipped with a message, or fails under `HOOKLEDGER_REQUIRE_POSTGRES`.
pub fn postgres_reachable() -> bool {
    if !cfg!(feature = "postgres") {
        eprintln!("skipped: this build has no PostgreSQL store (--no-default-features)");
        return false;
    }
    static REACHABLE: OnceLock<Result<(), String>> = OnceLock::new();
    let reachable = REACHABLE.get_or_init(|| admin().map(drop).map_err(|e| pg_error(&e)));
    let what = match reachable {
        Ok(()) => String::new(),
        Err(e) => format!(
            "needs PostgreSQL: no server at {} (HOOKLEDGER_TEST_POSTGRES): {e}",
            redacted(&admin_url())
        ),
    };
    super::prerequisite(reachable.is_ok(), "HOOKLEDGER_REQUIRE_POSTGRES", &what)
}

/// A new, empty database on the server; its URL. With `HOOKLEDGER_TEST_POOLER` (the
/// `host:port` of a transaction pooler in front of that server, such as PgBouncer with
/// `pool_mode = transaction`), the URL hookledger is given goes through the pooler
/// (`pooler=transaction`); the tests' own reads ([`Db`]) go to the server directly.
fn create_database() -> String {
    let name = format!("hl_t_{:016x}", fastrand::u64(..));
    admin()
        .and_then(|mut admin| admin.batch_execute(&format!("CREATE DATABASE \"{name}\"")))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {}", pg_error(&e)));
    let mut url = url::Url::parse(&admin_url()).expect("HOOKLEDGER_TEST_POSTGRES is a URL");
    url.set_path(&format!("/{name}"));
    if let Ok(pooler) = std::env::var("HOOKLEDGER_TEST_POOLER") {
        let (host, port) = pooler
            .rsplit_once(':')
            .expect("HOOKLEDGER_TEST_POOLER is host:port");
        url.set_host(Some(host)).unwrap();
        url.set_port(Some(port.parse().expect("a port"))).unwrap();
        url.query_pairs_mut().append_pair("pooler", "transaction");
    }
    url.to_string()
}

/// `url` to the server itself: a URL through the tests' pooler ([`create_database`]) with the
/// server's host and port, without `pooler`.
fn direct(url: &str) -> String {
    if !url.contains("pooler=transaction") {
        return url.to_string();
    }
    let server = url::Url::parse(&admin_url()).expect("HOOKLEDGER_TEST_POSTGRES is a URL");
    let mut url = url::Url::parse(url).expect("a database URL");
    url.set_host(server.host_str()).unwrap();
    url.set_port(server.port()).unwrap();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "pooler")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(kept);
    }
    url.to_string()
}

fn database_name(url: &str) -> String {
    let url = url::Url::parse(url).expect("a database URL");
    url.path().trim_start_matches('/').to_string()
}

/// Whether anything made the database of `dir` (for "nothing is created before the config
/// is valid"): on SQLite the file exists, on PostgreSQL (where the harness made the database)
/// it has a table.
pub fn database_created(dir: &Path) -> bool {
    match store() {
        Store::Sqlite => dir.join("hookledger.db").exists(),
        Store::Postgres => !Db::open(&db_arg_in(dir)).tables().is_empty(),
    }
}

/// A connection to a test's database, for assertions and fault injection. Reads are typed by
/// what the test expects ([`Row`]); parameters are `$1, $2`, bound from [`Param`]s.
pub enum Db {
    Sqlite(rusqlite::Connection),
    /// In a cell: the client's calls take `&mut`, the tests' handle is shared.
    Postgres(RefCell<postgres::Client>),
}

impl Db {
    /// Opens the database hookledger was given as `--db`: a `postgres://` URL or a SQLite path.
    pub fn open(db_arg: &str) -> Db {
        if db_arg.starts_with("postgres://") || db_arg.starts_with("postgresql://") {
            let client = connect(db_arg)
                .unwrap_or_else(|e| panic!("connecting to {}: {}", redacted(db_arg), pg_error(&e)));
            return Db::Postgres(RefCell::new(client));
        }
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
            Db::Postgres(client) => {
                let params: Vec<_> = params.iter().map(|p| p.postgres()).collect();
                let rows = client
                    .borrow_mut()
                    .query(sql, &params)
                    .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)));
                rows.iter().map(|row| T::from_postgres(row, sql)).collect()
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
            Db::Postgres(client) => {
                let params: Vec<_> = params.iter().map(|p| p.postgres()).collect();
                client
                    .borrow_mut()
                    .execute(sql, &params)
                    .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)))
            }
        }
    }

    /// Runs statements without parameters, e.g. `BEGIN`.
    pub fn batch(&self, sql: &str) {
        match self {
            Db::Sqlite(conn) => conn
                .execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            Db::Postgres(client) => client
                .borrow_mut()
                .batch_execute(sql)
                .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e))),
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
        self.batch(&match self {
            Db::Sqlite(_) => format!(
                "CREATE TRIGGER {name} BEFORE {statement} ON {table} WHEN ({condition})
                 BEGIN SELECT RAISE(ABORT, '{message}'); END;"
            ),
            Db::Postgres(_) => format!(
                "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RAISE EXCEPTION '{message}'; END $$;
                 CREATE TRIGGER {name} BEFORE {statement} ON {table}
                 FOR EACH ROW WHEN ({condition}) EXECUTE FUNCTION {name}();"
            ),
        });
    }

    /// Ends [`Db::inject_failure`]'s failure `name` on `table`.
    pub fn remove_failure(&self, name: &str, table: &str) {
        self.batch(&match self {
            Db::Sqlite(_) => format!("DROP TRIGGER {name}"),
            Db::Postgres(_) => format!("DROP TRIGGER {name} ON {table}; DROP FUNCTION {name}();"),
        });
    }

    /// The names of the tables (hookledger's and the app's), sorted.
    pub fn tables(&self) -> Vec<String> {
        self.strings(match self {
            Db::Sqlite(_) => "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
            Db::Postgres(_) => {
                "SELECT CAST(table_name AS text) FROM information_schema.tables
                 WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
            }
        })
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
            // PostgreSQL's own text for a row: `(a,b,)`, a NULL empty, an empty string `""`,
            // bytes as `\x…`.
            Db::Postgres(_) => self.strings(&format!(
                "SELECT CAST(ROW(r.*) AS text) FROM \"{table}\" AS r"
            )),
        };
        rows.sort();
        rows
    }
}

/// After kills: SQLite's own check of the database file. On PostgreSQL there is no file of
/// ours to check (a killed client cannot corrupt the server's).
#[track_caller]
pub fn assert_file_intact(db: &Db) {
    if let Db::Sqlite(_) = db {
        assert_eq!(db.one::<String>("PRAGMA integrity_check", &[]), "ok");
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
    fn postgres(&self) -> &(dyn postgres::types::ToSql + Sync);
}

impl<T: rusqlite::ToSql + postgres::types::ToSql + Sync> Param for T {
    fn sqlite(&self) -> &dyn rusqlite::ToSql {
        self
    }

    fn postgres(&self) -> &(dyn postgres::types::ToSql + Sync) {
        self
    }
}

/// A value a test reads from one column, on either store. On PostgreSQL the column's type must
/// be the one the test reads (an `i64` from a BIGINT, bytes from a BYTEA), as the src side's
/// schema promises.
pub trait Cell: Sized {
    fn from_sqlite(row: &rusqlite::Row, i: usize, sql: &str) -> Self;
    fn from_postgres(row: &postgres::Row, i: usize, sql: &str) -> Self;
}

macro_rules! cells {
    ($($t:ty),*) => {$(
        impl Cell for $t {
            fn from_sqlite(row: &rusqlite::Row, i: usize, sql: &str) -> Self {
                row.get(i).unwrap_or_else(|e| panic!("{sql}: column {i}: {e}"))
            }

            fn from_postgres(row: &postgres::Row, i: usize, sql: &str) -> Self {
                row.try_get(i).unwrap_or_else(|e| panic!("{sql}: column {i}: {}", pg_error(&e)))
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
    fn from_postgres(row: &postgres::Row, sql: &str) -> Self;
}

impl<T: Cell> Row for T {
    fn from_sqlite(row: &rusqlite::Row, sql: &str) -> Self {
        T::from_sqlite(row, 0, sql)
    }

    fn from_postgres(row: &postgres::Row, sql: &str) -> Self {
        T::from_postgres(row, 0, sql)
    }
}

macro_rules! rows {
    ($(($($t:ident $i:tt),*)),*) => {$(
        impl<$($t: Cell),*> Row for ($($t,)*) {
            fn from_sqlite(row: &rusqlite::Row, sql: &str) -> Self {
                ($(<$t as Cell>::from_sqlite(row, $i, sql),)*)
            }

            fn from_postgres(row: &postgres::Row, sql: &str) -> Self {
                ($(<$t as Cell>::from_postgres(row, $i, sql),)*)
            }
        }
    )*};
}

rows!((A 0, B 1), (A 0, B 1, C 2));
