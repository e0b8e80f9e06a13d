//! The PostgreSQL side of [`Tx`](crate::sql::Tx): one connection, its prepared statements
//! cached by SQL text, values converted to whatever type the server inferred for a parameter
//! (so `$1` bound from an `i64` may fill an `integer`, a `bigint` or a `jsonb` column).
//!
//! Through a transaction pooler (`pooler=transaction` on the URL) nothing outlives a
//! transaction: a statement's parameter types are inferred once, by a named statement prepared
//! and closed inside one transaction, and each run is an unnamed statement sent in one round
//! trip with those types; the session's settings go with each `BEGIN` as `SET LOCAL`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, IsNull, Kind, ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};

use crate::sql::StoreError;
use crate::sql::{Dialect, Param, Row, Session, ToParam, Value};

/// Prepared statements kept per connection: the store's, the handlers' and the effects', with
/// room to spare.
const STATEMENT_CACHE: usize = 256;

/// One connection and its statement cache. The writer owns one; each CLI command opens one.
///
/// It is tokio-postgres on a runtime of its own (one thread: the caller's), so that a
/// transaction's `BEGIN` can travel with its first statement: [`PgSession::begin`] only notes
/// it, and the next statement sends both in one round trip.
pub(crate) struct PgSession {
    conn: RefCell<Conn>,
}

struct Conn {
    runtime: OwnRuntime,
    client: Client,
    statements: HashMap<String, Prepared>,
    /// Through a transaction pooler: what each `BEGIN` carries (`SET LOCAL …`).
    pooler: Option<String>,
    /// Whether a transaction is open on the connection (its `BEGIN` sent): through a
    /// transaction pooler a statement's types are inferred in it, else in one of their own.
    in_tx: bool,
    /// A `BEGIN` to send with the next statement.
    begin_pending: bool,
    /// Statements to send with the `COMMIT` ([`Session::defer`]).
    deferred: Vec<(Prepared, Vec<Value>)>,
    /// The running handler's deadline ([`PgSession::limit`]).
    deadline: Option<Instant>,
    /// Whether a handler's `statement_timeout` may be in force in the open transaction (set
    /// back to the session's own with each later statement: a savepoint's rollback may undo
    /// the reset).
    limited: bool,
}

/// The session's own runtime, shut down without waiting when the session is dropped: the
/// last handle to a store may go inside the server's runtime (at a graceful stop), where a
/// plain drop of a runtime panics ("Cannot drop a runtime in a context where blocking is not
/// allowed") and the process exits 101. Its one task, the connection, ends with the client.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0
            .as_ref()
            .expect("the runtime lives until the session is dropped")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why a commit did not happen.
pub(crate) enum CommitError {
    /// A deferred statement failed: the transaction rolled back, nothing of it stands.
    Deferred(StoreError),
    /// The COMMIT itself failed (or the connection did).
    Commit(StoreError),
}

/// A statement as the session runs it: prepared once and named, or, through a transaction
/// pooler, unnamed with the parameter types the server inferred for it.
#[derive(Clone)]
enum Prepared {
    Named(Statement),
    Unnamed(std::sync::Arc<Unnamed>),
}

struct Unnamed {
    sql: String,
    params: Vec<Type>,
    returns_rows: bool,
}

impl Prepared {
    fn params(&self) -> usize {
        match self {
            Prepared::Named(s) => s.params().len(),
            Prepared::Unnamed(u) => u.params.len(),
        }
    }

    fn returns_rows(&self) -> bool {
        match self {
            Prepared::Named(s) => !s.columns().is_empty(),
            Prepared::Unnamed(u) => u.returns_rows,
        }
    }

    async fn execute(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self {
            Prepared::Named(s) => client.execute(s, params).await,
            Prepared::Unnamed(u) => client.execute_typed(&u.sql, &u.typed(params)).await,
        }
    }

    async fn query(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        match self {
            Prepared::Named(s) => client.query(s, params).await,
            Prepared::Unnamed(u) => client.query_typed(&u.sql, &u.typed(params)).await,
        }
    }
}

impl Unnamed {
    /// `params` with the types the server inferred (a count that does not match is the
    /// server's error, as with a named statement).
    fn typed<'p>(&self, params: &[&'p (dyn ToSql + Sync)]) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
        params
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, self.params.get(i).cloned().unwrap_or(Type::UNKNOWN)))
            .collect()
    }
}

impl PgSession {
    /// Connects with `config`; `pooler`: through a transaction pooler, with what each `BEGIN`
    /// carries.
    pub(crate) fn connect(
        config: &tokio_postgres::Config,
        pooler: Option<&str>,
    ) -> Result<PgSession, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("cannot start a runtime: {e}")))?;
        let (client, connection) = runtime.block_on(config.connect(NoTls))?;
        // Driven whenever the session waits for an answer (block_on); it ends with the client.
        runtime.spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("PostgreSQL connection ended: {e}");
            }
        });
        Ok(PgSession {
            conn: RefCell::new(Conn {
                runtime: OwnRuntime(Some(runtime)),
                client,
                statements: HashMap::new(),
                pooler: pooler.map(str::to_string),
                in_tx: false,
                begin_pending: false,
                deferred: Vec::new(),
                deadline: None,
                limited: false,
            }),
        })
    }

    /// Opens a transaction: `BEGIN` goes with the next statement (no round trip of its own).
    pub(crate) fn begin(&self) {
        let mut conn = self.conn.borrow_mut();
        conn.begin_pending = true;
        conn.limited = false;
    }

    /// Bounds the statements from now on to `limit` in all (`None`: unbounds them): a
    /// handler's run. Each statement goes with `SET LOCAL statement_timeout` to the time left,
    /// in the same round trip (so that no statement of the handler can lift it for the next),
    /// and the server cancels one that runs past it: an error of that event alone, not a
    /// busy database.
    pub(crate) fn limit(&self, limit: Option<Duration>) {
        self.conn.borrow_mut().deadline = limit.map(|limit| Instant::now() + limit);
    }

    /// Commits the open transaction, its deferred statements in the same round trip (nothing
    /// to send if it never ran a statement). After a deferred statement failed, PostgreSQL
    /// answers the COMMIT with a rollback.
    pub(crate) fn commit(&self) -> Result<(), CommitError> {
        let mut conn = self.conn.borrow_mut();
        let deferred = std::mem::take(&mut conn.deferred);
        let begin = std::mem::take(&mut conn.begin_pending);
        let limited = std::mem::take(&mut conn.limited);
        conn.in_tx = false;
        if begin && deferred.is_empty() {
            return Ok(());
        }
        let begin_sql = conn.begin_sql();
        let params: Vec<Vec<Param<'_>>> = deferred
            .iter()
            .map(|(_, values)| values.iter().map(Value::to_param).collect())
            .collect();
        let refs: Vec<Vec<&(dyn ToSql + Sync)>> = params
            .iter()
            .map(|p| p.iter().map(|v| v as _).collect())
            .collect();
        let client = &conn.client;
        let (ran, ended) = conn.runtime.block_on(async {
            let mut pipeline: Vec<Pending<'_>> = Vec::with_capacity(deferred.len() + 1);
            if begin {
                // First: the deferred statements run in the transaction.
                pipeline.push(Box::pin(client.batch_execute(&begin_sql)));
            }
            if limited {
                pipeline.push(Box::pin(client.batch_execute(UNLIMITED)));
            }
            for ((stmt, _), params) in deferred.iter().zip(&refs) {
                pipeline.push(Box::pin(async move {
                    stmt.execute(client, params).await.map(|_| ())
                }));
            }
            // Each one's first poll writes it, or fails before anything is written (a
            // parameter that does not encode): then the transaction must not commit.
            let mut done: Vec<Option<Result<(), tokio_postgres::Error>>> =
                pipeline.iter().map(|_| None).collect();
            poll_pending(&mut pipeline, &mut done).await;
            let failed_early = done.iter().any(|d| matches!(d, Some(Err(_))));
            let end = client.batch_execute(if failed_early { "ROLLBACK" } else { "COMMIT" });
            let (_, ended) = tokio::join!(biased; drive(&mut pipeline, &mut done), end);
            let ran: Vec<_> = done.into_iter().flatten().collect();
            (ran, if failed_early { Ok(()) } else { ended })
        });
        if let Some(e) = ran.into_iter().find_map(Result::err) {
            return Err(CommitError::Deferred(e.into()));
        }
        ended.map_err(|e| CommitError::Commit(e.into()))
    }

    /// Ends the open transaction without committing.
    pub(crate) fn rollback(&self) -> Result<(), tokio_postgres::Error> {
        let mut conn = self.conn.borrow_mut();
        conn.deferred.clear();
        conn.limited = false;
        conn.in_tx = false;
        if std::mem::take(&mut conn.begin_pending) {
            return Ok(());
        }
        conn.runtime.block_on(conn.client.batch_execute("ROLLBACK"))
    }

    /// Runs `sql` (one or more statements, no parameters) as it is: transaction control and
    /// migrations.
    pub(crate) fn batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let mut conn = self.conn.borrow_mut();
        let pending = std::mem::take(&mut conn.begin_pending);
        if conn.pooler.is_none() {
            let sql = match pending {
                true => format!("BEGIN; {sql}"),
                false => sql.to_string(),
            };
            return conn.runtime.block_on(conn.client.batch_execute(&sql));
        }
        // Through a transaction pooler: a batch that opens a transaction (hookledger's own
        // start with `BEGIN`) carries the session's settings with it, and one that ends with
        // `COMMIT` or `ROLLBACK` closes it; the statements between (a migration's) are sent
        // as written.
        let upper = sql.trim().to_ascii_uppercase();
        let opens = upper.starts_with("BEGIN");
        let sql = match (pending, opens) {
            (_, true) => format!("{}{}", conn.begin_sql(), &sql.trim_start()["BEGIN".len()..]),
            (true, false) => format!("{}; {sql}", conn.begin_sql()),
            (false, false) => sql.to_string(),
        };
        let closes = upper.ends_with("COMMIT") || upper.ends_with("ROLLBACK");
        let result = conn.runtime.block_on(conn.client.batch_execute(&sql));
        // A failed statement aborts an open transaction, which stays open until it ends.
        conn.in_tx = (conn.in_tx || pending || opens) && !closes;
        result
    }

    /// Whether the connection is gone (the server restarted, the network broke).
    pub(crate) fn is_closed(&self) -> bool {
        self.conn.borrow().client.is_closed()
    }

    /// Prepares `sql` without running it: its parameter count and whether it returns rows.
    pub(crate) fn describe(&self, sql: &str) -> Result<(usize, bool), StoreError> {
        let mut conn = self.conn.borrow_mut();
        let stmt = conn.statement(sql)?;
        Ok((stmt.params(), stmt.returns_rows()))
    }

    /// PostgreSQL's plan of `sql` (one statement, which [`PgSession::describe`] took, with
    /// `parameters` parameters), as `EXPLAIN (VERBOSE, FORMAT JSON)` shows it: a generic plan
    /// (no parameter's value plays a part, none is folded), made in a transaction that is
    /// rolled back, never run. `None` for a statement that has no plan: a utility statement
    /// (DDL, VACUUM, TRUNCATE, CALL, …), which `PREPARE` does not take.
    pub(crate) fn plan(
        &self,
        sql: &str,
        parameters: usize,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let conn = self.conn.borrow();
        let arguments = match parameters {
            0 => String::new(),
            n => format!("({})", vec!["NULL"; n].join(", ")),
        };
        // `sql` is one statement (the server parsed it alone); on lines of their own, so that
        // nothing of it runs into what follows.
        let prepare = format!(
            "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan;
             PREPARE hookledger_check AS
{sql}
;"
        );
        let explain = format!("EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE hookledger_check{arguments}");
        let client = &conn.client;
        let (prepared, planned) = conn.runtime.block_on(async {
            let prepared = client.batch_execute(&prepare).await;
            let planned = match prepared {
                Ok(()) => Some(client.simple_query(&explain).await),
                Err(_) => None,
            };
            // A prepared statement outlives the transaction: deallocated in it, before the
            // rollback (a transaction pooler may hand the next statement another server).
            let _ = client.batch_execute("DEALLOCATE hookledger_check").await;
            let _ = client.batch_execute("ROLLBACK").await;
            (prepared, planned)
        });
        match prepared {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::SYNTAX_ERROR) => {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
            Ok(()) => {}
        }
        let text = planned
            .transpose()?
            .into_iter()
            .flatten()
            .find_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .ok_or_else(|| StoreError::Database("EXPLAIN showed no plan".into()))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Database(format!("EXPLAIN's plan is not JSON: {e}")))
    }

    /// Runs the store's own `sql` with typed parameters (arrays, for one statement per batch).
    pub(crate) fn query_typed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let mut conn = self.conn.borrow_mut();
        let stmt = conn.statement(sql)?;
        conn.run(|client| stmt.query(client, params))
    }
}

/// A request in a pipeline, its result not read yet.
type Pending<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tokio_postgres::Error>> + 'a>>;

/// Polls each unfinished request of `pipeline` once, in order (the first poll writes it),
/// noting those that finished in `done`; whether all have.
fn poll_each(
    pipeline: &mut [Pending<'_>],
    done: &mut [Option<Result<(), tokio_postgres::Error>>],
    cx: &mut std::task::Context<'_>,
) -> bool {
    let mut all = true;
    for (request, slot) in pipeline.iter_mut().zip(done.iter_mut()) {
        if slot.is_none() {
            match request.as_mut().poll(cx) {
                std::task::Poll::Ready(result) => *slot = Some(result),
                std::task::Poll::Pending => all = false,
            }
        }
    }
    all
}

/// One pass of [`poll_each`]: writes what is not written yet.
async fn poll_pending(
    pipeline: &mut [Pending<'_>],
    done: &mut [Option<Result<(), tokio_postgres::Error>>],
) {
    std::future::poll_fn(|cx| std::task::Poll::Ready(poll_each(pipeline, done, cx))).await;
}

/// Waits until every request of `pipeline` finished.
async fn drive(
    pipeline: &mut [Pending<'_>],
    done: &mut [Option<Result<(), tokio_postgres::Error>>],
) {
    std::future::poll_fn(|cx| {
        if poll_each(pipeline, done, cx) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

impl Conn {
    /// `BEGIN`, with the session's settings through a transaction pooler.
    fn begin_sql(&self) -> std::borrow::Cow<'static, str> {
        match &self.pooler {
            Some(settings) => format!("BEGIN; {settings}").into(),
            None => "BEGIN".into(),
        }
    }

    fn statement(&mut self, sql: &str) -> Result<Prepared, StoreError> {
        if let Some(stmt) = self.statements.get(sql) {
            return Ok(stmt.clone());
        }
        refuse_transaction_control(sql)?;
        let stmt = match self.pooler {
            None => Prepared::Named(self.runtime.block_on(self.client.prepare(sql))?),
            Some(_) => Prepared::Unnamed(std::sync::Arc::new(self.infer(sql)?)),
        };
        // Bounded, like SQLite's cache: a handler that builds its SQL at run time must not
        // grow it (and the server's prepared statements) without end.
        if self.statements.len() >= STATEMENT_CACHE {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), stmt.clone());
        Ok(stmt)
    }

    /// The parameter types of `sql` as the server infers them, through a transaction pooler: a
    /// named statement prepared and closed within one transaction (the open one, or one of its
    /// own that is rolled back), so that it never outlives the server connection it was on.
    fn infer(&mut self, sql: &str) -> Result<Unnamed, StoreError> {
        let own = !self.in_tx;
        let client = &self.client;
        let inferred = self.runtime.block_on(async {
            if own {
                client.batch_execute("BEGIN").await?;
            }
            // Dropped (its Close sent) before the transaction ends.
            let inferred = client.prepare(sql).await.map(|stmt| Unnamed {
                sql: sql.to_string(),
                params: stmt.params().to_vec(),
                returns_rows: !stmt.columns().is_empty(),
            });
            if own {
                client.batch_execute("ROLLBACK").await?;
            }
            inferred
        })?;
        Ok(inferred)
    }

    /// Runs `op` on the client, after a pending `BEGIN` and the handler's time left (or the
    /// session's own `statement_timeout` again) in the same round trip (pipelined: all are
    /// written before any answer is read, and run in that order).
    fn run<'a, T, F>(&'a mut self, op: impl FnOnce(&'a Client) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let left = match self.deadline {
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Err(over_time()),
            },
            None => None,
        };
        let mut first = Vec::new();
        if std::mem::take(&mut self.begin_pending) {
            first.push(self.begin_sql().into_owned());
            self.in_tx = true;
        }
        match left {
            Some(left) => {
                self.limited = true;
                first.push(format!(
                    "SET LOCAL statement_timeout = {}",
                    left.as_millis().max(1)
                ));
            }
            None if self.limited => first.push(UNLIMITED.to_string()),
            None => {}
        }
        let client = &self.client;
        let op = op(client);
        let result = if first.is_empty() {
            self.runtime.block_on(op)
        } else {
            let first = first.join("; ");
            let (done, result) = self
                .runtime
                .block_on(async { tokio::join!(biased; client.batch_execute(&first), op) });
            done?;
            result
        };
        result.map_err(|e| match left {
            Some(_) if e.code() == Some(&SqlState::QUERY_CANCELED) => over_time(),
            _ => e.into(),
        })
    }
}

impl Session for PgSession {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> Result<u64, StoreError> {
        let mut conn = self.conn.borrow_mut();
        let stmt = conn.statement(sql)?;
        let values: Vec<Param<'_>> = params.iter().map(|p| p.to_param()).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        conn.run(|client| stmt.execute(client, &refs))
    }

    fn defer(&self, sql: &str, params: &[&dyn ToParam]) -> Result<(), StoreError> {
        let mut conn = self.conn.borrow_mut();
        let stmt = conn.statement(sql)?;
        let values = params.iter().map(|p| p.to_param().into()).collect();
        conn.deferred.push((stmt, values));
        Ok(())
    }

    fn query(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.conn.borrow_mut();
        let stmt = conn.statement(sql)?;
        let values: Vec<Param<'_>> = params.iter().map(|p| p.to_param()).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        conn.run(|client| stmt.query(client, &refs))?
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<_, Value>(i).map_err(StoreError::from))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Row)
            })
            .collect()
    }
}

/// Sets `statement_timeout` back to the session's own, in the open transaction.
const UNLIMITED: &str = "SET LOCAL statement_timeout TO DEFAULT";

/// What a handler's statement cancelled at its deadline fails with: an error of its event (a
/// 500, which its sender retries), not a busy database.
fn over_time() -> StoreError {
    StoreError::Database("ran over its time limit (writer.effect_timeout)".to_string())
}

/// The batch's transaction belongs to the writer: a handler's statement may not end it or
/// touch its savepoints.
fn refuse_transaction_control(sql: &str) -> Result<(), StoreError> {
    // split_statements drops comments, so `/* … */ COMMIT` is seen for what it is.
    let first = crate::config::split_statements(sql)
        .first()
        .map(|s| {
            s.trim_start_matches(|c: char| c.is_whitespace() || c == '(')
                .to_string()
        })
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    const REFUSED: &[&str] = &[
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "PREPARE",
    ];
    if REFUSED.contains(&first.as_str()) {
        return Err(StoreError::Database(format!(
            "{first} is not allowed here: hookledger owns the transaction"
        )));
    }
    Ok(())
}

type BoxError = Box<dyn Error + Sync + Send>;

/// Types whose binary format for a string is the string itself (or jsonb's, which `to_sql`
/// writes), and bytea: the others take a string in the text format.
fn binary_text(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::TEXT
            | Type::VARCHAR
            | Type::BPCHAR
            | Type::NAME
            | Type::UNKNOWN
            | Type::JSON
            | Type::JSONB
            | Type::BYTEA
    ) || matches!(ty.kind(), Kind::Enum(_))
}

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match *self {
            Param::Null => Ok(IsNull::Yes),
            Param::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                Type::BOOL => (i != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    i.to_string().as_str().to_sql(ty, out)
                }
                _ => Err(format!("an integer parameter cannot fill a {ty}").into()),
            },
            Param::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (f as f32).to_sql(ty, out),
                _ => Err(format!("a real parameter cannot fill a {ty}").into()),
            },
            Param::Text(s) => match *ty {
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                Type::JSON => {
                    out.put_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                Type::JSONB => {
                    out.put_u8(1); // jsonb's binary format: a version byte, then the text
                    out.put_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                // Text, varchar, names, enums: the binary format is UTF-8. Any other type gets
                // the text in the text format (see `encode_format`): PostgreSQL parses it as
                // it would a literal, so "12345678" fills a bigint and an id fills a uuid.
                _ => {
                    out.put_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
            },
            Param::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ => match std::str::from_utf8(b) {
                    Ok(s) => Param::Text(s).to_sql(ty, out),
                    Err(_) => Err(format!("bytes that are not UTF-8 cannot fill a {ty}").into()),
                },
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, ty: &Type) -> tokio_postgres::types::Format {
        use tokio_postgres::types::Format;
        let text = match *self {
            Param::Text(_) => !binary_text(ty),
            Param::Blob(b) => !binary_text(ty) && std::str::from_utf8(b).is_ok(),
            _ => false,
        };
        if text {
            Format::Text
        } else {
            Format::Binary
        }
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::JSONB => Value::Text(std::str::from_utf8(raw.get(1..).unwrap_or(&[]))?.into()),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::JSON | Type::UNKNOWN => {
                Value::Text(std::str::from_utf8(raw)?.into())
            }
            _ if matches!(ty.kind(), Kind::Enum(_)) => {
                Value::Text(std::str::from_utf8(raw)?.into())
            }
            _ => {
                return Err(format!(
                    "a {ty} column cannot be read; cast it to text, bigint or bytea in the query"
                )
                .into())
            }
        })
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A `numeric` (what `sum(bigint)` returns): an integer when it has no fraction and fits,
/// else a real.
fn numeric(raw: &[u8]) -> Result<Value, BoxError> {
    let word = |i: usize| -> Result<i16, BoxError> {
        let b = raw.get(i..i + 2).ok_or("a truncated numeric")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    };
    let (ndigits, weight, sign) = (word(0)?, word(2)?, word(4)? as u16);
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut value = 0f64;
    let mut whole: Option<i64> = Some(0);
    for d in 0..ndigits.max(0) as usize {
        let digit = word(8 + 2 * d)?;
        let power = i32::from(weight) - d as i32;
        value += f64::from(digit) * 10000f64.powi(power);
        whole = if power >= 0 {
            whole.and_then(|n| {
                10000i64
                    .checked_pow(power as u32)
                    .and_then(|m| i64::from(digit).checked_mul(m))
                    .and_then(|x| n.checked_add(x))
            })
        } else if digit != 0 {
            None
        } else {
            whole
        };
    }
    let negative = sign == 0x4000;
    Ok(match whole {
        Some(n) => Value::Integer(if negative { -n } else { n }),
        None => Value::Real(if negative { -value } else { value }),
    })
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        let text = match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        };
        match e.code() {
            Some(c)
                if *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::LOCK_NOT_AVAILABLE
                    || *c == SqlState::QUERY_CANCELED =>
            {
                StoreError::Busy(text)
            }
            Some(c) if *c == SqlState::DISK_FULL => StoreError::DiskFull(text),
            Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => StoreError::ReadOnly(text),
            Some(c)
                if c.code().starts_with("08")
                    || *c == SqlState::ADMIN_SHUTDOWN
                    || *c == SqlState::CRASH_SHUTDOWN
                    || *c == SqlState::CANNOT_CONNECT_NOW
                    || *c == SqlState::TOO_MANY_CONNECTIONS =>
            {
                StoreError::Unavailable(text)
            }
            Some(_) => StoreError::Database(text),
            // No SQLSTATE: the connection broke, or never came up.
            None if e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()) => {
                StoreError::Unavailable(text)
            }
            None => StoreError::Database(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::scratch::Scratch;

    fn session(scratch: &Scratch) -> PgSession {
        PgSession::connect(&scratch.url.parse().unwrap(), None).unwrap()
    }

    #[test]
    fn text_parameters_fill_columns_of_other_types_as_literals_would() {
        let Some(db) = Scratch::new() else { return };
        let s = session(&db);
        s.batch("CREATE TABLE t (n BIGINT, u UUID, b BOOLEAN, j JSONB, x TEXT)")
            .unwrap();
        let n = s
            .execute(
                "INSERT INTO t VALUES ($1, $2, $3, $4, $5)",
                &[
                    &"12345678",
                    &"6f1c1e4e-2a3b-4c5d-8e9f-0a1b2c3d4e5f",
                    &"true",
                    &r#"{"a": 1}"#,
                    &"plain",
                ],
            )
            .unwrap();
        assert_eq!(n, 1);
        let row = s
            .query("SELECT n, u::text, b, j ->> 'a', x FROM t", &[])
            .unwrap()
            .remove(0);
        assert_eq!(row.get::<i64>(0), Ok(12_345_678));
        assert_eq!(
            row.get::<String>(1).unwrap(),
            "6f1c1e4e-2a3b-4c5d-8e9f-0a1b2c3d4e5f"
        );
        assert_eq!(row.get::<i64>(2), Ok(1));
        assert_eq!(row.get::<String>(3).unwrap(), "1");
        // Not a number: refused, not stored as bytes.
        assert!(s
            .execute("INSERT INTO t (n) VALUES ($1)", &[&"evt_1"])
            .is_err());
    }

    #[test]
    fn a_deferred_statement_that_fails_commits_nothing_of_its_transaction() {
        let Some(db) = Scratch::new() else { return };
        let s = session(&db);
        s.batch("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")
            .unwrap();
        let count = |s: &PgSession| {
            s.query("SELECT count(*) FROM t", &[]).unwrap()[0]
                .get::<i64>(0)
                .unwrap()
        };
        // It fails on the server: the pipelined COMMIT is answered with a rollback.
        s.begin();
        s.execute("INSERT INTO t VALUES ('a', 1)", &[]).unwrap();
        s.defer("INSERT INTO t VALUES ('a', 2)", &[]).unwrap();
        assert!(matches!(s.commit(), Err(CommitError::Deferred(_))));
        assert_eq!(count(&s), 0);
        // It fails before it is sent (a value that does not fit an integer): no COMMIT goes.
        s.begin();
        s.execute("INSERT INTO t VALUES ('b', 1)", &[]).unwrap();
        s.defer("INSERT INTO t VALUES ('c', $1)", &[&(i64::MAX)])
            .unwrap();
        assert!(matches!(s.commit(), Err(CommitError::Deferred(_))));
        assert_eq!(count(&s), 0);
        // Only deferred statements, BEGIN still pending: they run in one transaction.
        s.begin();
        s.defer("INSERT INTO t VALUES ('d', 1)", &[]).unwrap();
        s.defer("INSERT INTO t VALUES ('d', 2)", &[]).unwrap();
        assert!(matches!(s.commit(), Err(CommitError::Deferred(_))));
        assert_eq!(count(&s), 0);
        // And when they succeed, they commit.
        s.begin();
        s.defer("INSERT INTO t VALUES ('e', 1)", &[]).unwrap();
        assert!(s.commit().is_ok());
        assert_eq!(count(&s), 1);
    }

    fn numeric_of(ndigits: i16, weight: i16, sign: u16, scale: i16, digits: &[i16]) -> Vec<u8> {
        let mut raw = Vec::new();
        for w in [ndigits, weight, sign as i16, scale].iter().chain(digits) {
            raw.extend_from_slice(&w.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numerics_read_as_integers_when_whole() {
        // 1_2345_0000 = 123450000
        let raw = numeric_of(2, 2, 0, 0, &[1, 2345]);
        assert_eq!(numeric(&raw).unwrap(), Value::Integer(123_450_000));
        let raw = numeric_of(1, 0, 0x4000, 0, &[42]);
        assert_eq!(numeric(&raw).unwrap(), Value::Integer(-42));
        let raw = numeric_of(0, 0, 0, 0, &[]);
        assert_eq!(numeric(&raw).unwrap(), Value::Integer(0));
        // 1.5
        let raw = numeric_of(2, 0, 0, 1, &[1, 5000]);
        assert_eq!(numeric(&raw).unwrap(), Value::Real(1.5));
    }

    #[test]
    fn a_handler_may_not_end_the_transaction() {
        for sql in [
            "COMMIT",
            " commit",
            "ROLLBACK TO x",
            "savepoint a",
            "BEGIN",
            "end",
            "/* why */ COMMIT",
            "-- a note\nrollback",
        ] {
            assert!(refuse_transaction_control(sql).is_err(), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE ends SET x = 1",
            "WITH x AS (SELECT 1) SELECT 1",
        ] {
            assert!(refuse_transaction_control(sql).is_ok(), "{sql}");
        }
    }
}
