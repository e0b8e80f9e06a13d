//! The SQLite side of [`Tx`](crate::sql::Tx): statements on the writer's connection, cached,
//! with `$1, $2, …` bound by name.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{CachedStatement, Connection};

use crate::sql::StoreError;
use crate::sql::{Dialect, Param, Row, Session, ToParam, Value, DOLLAR_NAMES};

/// The cached statement for `sql` with `params` bound: `$n` by name, else the n-th.
fn bound<'c>(
    conn: &'c Connection,
    sql: &str,
    params: &[&dyn ToParam],
) -> rusqlite::Result<CachedStatement<'c>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let expected = stmt.parameter_count();
    if expected != params.len() {
        return Err(rusqlite::Error::InvalidParameterCount(
            params.len(),
            expected,
        ));
    }
    for (i, param) in params.iter().enumerate() {
        let index = match DOLLAR_NAMES.get(i) {
            Some(name) => stmt.parameter_index(name)?.unwrap_or(i + 1),
            None => i + 1,
        };
        stmt.raw_bind_parameter(index, param.to_param())?;
    }
    Ok(stmt)
}

/// The writer's connection is a handler's [`Session`].
impl Session for Connection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> Result<u64, StoreError> {
        Ok(bound(self, sql, params)?.raw_execute()? as u64)
    }

    fn query(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Vec<Row>, StoreError> {
        let mut stmt = bound(self, sql, params)?;
        let columns = stmt.column_count();
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let values = (0..columns)
                .map(|i| row.get_ref(i).map(value_of))
                .collect::<rusqlite::Result<_>>()?;
            out.push(Row(values));
        }
        Ok(out)
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Null => ValueRef::Null,
            Param::Integer(i) => ValueRef::Integer(i),
            Param::Real(f) => ValueRef::Real(f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn value_of(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// Whether a handler is running on the writer's connection: while it is, the authorizer
/// refuses to prepare what a handler may not do, and notes why, and the progress handler
/// interrupts it past its deadline. The store sets it around each handler call. Shared with
/// those callbacks, which SQLite calls on the same (writer) thread.
#[derive(Clone, Default)]
pub(crate) struct HandlerGuard(Arc<Guarded>);

struct Guarded {
    running: AtomicBool,
    /// Why the authorizer last refused a handler's statement.
    refusal: Mutex<Option<String>>,
    /// When the running handler must stop, in nanoseconds after `epoch`; 0: no deadline.
    deadline: AtomicU64,
    /// Whether the progress handler interrupted the running handler at its deadline.
    interrupted: AtomicBool,
    epoch: Instant,
}

impl Default for Guarded {
    fn default() -> Self {
        Guarded {
            running: AtomicBool::new(false),
            refusal: Mutex::new(None),
            deadline: AtomicU64::new(0),
            interrupted: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

impl HandlerGuard {
    pub(crate) fn running(&self) -> bool {
        self.0.running.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, running: bool) {
        self.0.running.store(running, Ordering::Relaxed);
    }

    /// Notes why the authorizer refused a statement.
    pub(crate) fn refuse(&self, why: String) {
        *self.0.refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// Why the authorizer refused a statement since the last call, if it did.
    pub(crate) fn take_refusal(&self) -> Option<String> {
        self.0
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// A handler starts, to be interrupted after `limit`.
    pub(crate) fn start(&self, limit: Duration) {
        let at = (self.0.epoch.elapsed() + limit).as_nanos();
        self.0.interrupted.store(false, Ordering::Relaxed);
        self.0.deadline.store(
            u64::try_from(at).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        self.set(true);
    }

    /// The handler ended: whether it was interrupted at its deadline.
    pub(crate) fn stop(&self) -> bool {
        self.set(false);
        self.0.deadline.store(0, Ordering::Relaxed);
        self.0.interrupted.swap(false, Ordering::Relaxed)
    }

    /// For SQLite's progress handler: whether to interrupt the statement running now (a
    /// handler's, past its deadline).
    pub(crate) fn past_deadline(&self) -> bool {
        let deadline = self.0.deadline.load(Ordering::Relaxed);
        if deadline == 0 || (self.0.epoch.elapsed().as_nanos() as u64) < deadline {
            return false;
        }
        self.0.interrupted.store(true, Ordering::Relaxed);
        true
    }
}
