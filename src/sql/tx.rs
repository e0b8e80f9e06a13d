//! [`Tx`]: what a handler gets inside the claim's transaction, the same on every store.
//!
//! A handler writes its SQL once, with positional parameters `$1, $2, …` (PostgreSQL's
//! spelling; the SQLite store binds them by that name), and passes values that are plain Rust
//! types (`i64`, `&str`, `String`, `&[u8]`, `Option` of those). Rows come back as [`Row`]s of
//! [`Value`]s. SQL that both SQLite and PostgreSQL accept (`INSERT … ON CONFLICT … DO UPDATE
//! … WHERE`, row values, `RETURNING`, `coalesce`, `CASE`) runs on either store unchanged.

use crate::sql::StoreError;

/// The writer's open transaction, as a handler sees it: it runs statements, and cannot
/// COMMIT, ROLLBACK, BEGIN or touch savepoints (the store refuses to prepare them while a
/// handler runs), because the transaction holds a whole batch of other events.
pub struct Tx<'c> {
    conn: &'c dyn Session,
}

/// Which SQL a store speaks, for a handler that writes a statement per store (most need not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A store's side of [`Tx`]: one open transaction.
pub(crate) trait Session {
    fn dialect(&self) -> Dialect;
    /// Runs `sql` with `params`; the number of rows it changed.
    fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> Result<u64, StoreError>;
    /// Runs `sql` with `params`; every row it returned.
    fn query(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Vec<Row>, StoreError>;
    /// Runs `sql` with `params` before the transaction commits, or now (the default).
    fn defer(&self, sql: &str, params: &[&dyn ToParam]) -> Result<(), StoreError> {
        self.execute(sql, params).map(|_| ())
    }
}

impl<'c> Tx<'c> {
    pub(crate) fn new(conn: &'c dyn Session) -> Self {
        Tx { conn }
    }

    /// The store's side, for the crate's own SQL helpers (an outbox row a handler queues).
    pub(crate) fn session(&self) -> &'c dyn Session {
        self.conn
    }

    /// Which store runs the statements.
    pub fn dialect(&self) -> Dialect {
        self.conn.dialect()
    }

    /// Runs one statement (prepared once per connection and cached) and returns the number
    /// of rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn ToParam]) -> Result<u64, StoreError> {
        self.conn.execute(sql, params)
    }

    /// Runs one statement whose count nobody needs when the transaction commits: on
    /// PostgreSQL in the round trip of the COMMIT (after any statement run meanwhile), on
    /// SQLite now. Only for a [`Handler::handle_all`](crate::Handler::handle_all) on the
    /// PostgreSQL store's batch path, where a failure at commit runs the batch again job by
    /// job (and `handle` runs, which must not defer).
    pub(crate) fn defer(&self, sql: &str, params: &[&dyn ToParam]) -> Result<(), StoreError> {
        self.conn.defer(sql, params)
    }

    /// Runs a query and returns every row.
    pub fn query(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Vec<Row>, StoreError> {
        self.conn.query(sql, params)
    }

    /// Runs a query and returns its first row, if it returned one.
    pub fn query_opt(&self, sql: &str, params: &[&dyn ToParam]) -> Result<Option<Row>, StoreError> {
        Ok(self.conn.query(sql, params)?.into_iter().next())
    }
}

/// A parameter as the stores bind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

/// A Rust value that can be a statement's parameter.
pub trait ToParam {
    fn to_param(&self) -> Param<'_>;
}

impl ToParam for i64 {
    fn to_param(&self) -> Param<'_> {
        Param::Integer(*self)
    }
}

impl ToParam for i32 {
    fn to_param(&self) -> Param<'_> {
        Param::Integer(i64::from(*self))
    }
}

impl ToParam for bool {
    fn to_param(&self) -> Param<'_> {
        Param::Integer(i64::from(*self))
    }
}

impl ToParam for f64 {
    fn to_param(&self) -> Param<'_> {
        Param::Real(*self)
    }
}

impl ToParam for str {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for String {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for std::sync::Arc<str> {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for [u8] {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}

impl ToParam for Vec<u8> {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}

impl ToParam for Value {
    fn to_param(&self) -> Param<'_> {
        match self {
            Value::Null => Param::Null,
            Value::Integer(i) => Param::Integer(*i),
            Value::Real(f) => Param::Real(*f),
            Value::Text(s) => Param::Text(s),
            Value::Blob(b) => Param::Blob(b),
        }
    }
}

impl ToParam for Param<'_> {
    fn to_param(&self) -> Param<'_> {
        *self
    }
}

impl<T: ToParam + ?Sized> ToParam for &T {
    fn to_param(&self) -> Param<'_> {
        (**self).to_param()
    }
}

impl<T: ToParam> ToParam for Option<T> {
    fn to_param(&self) -> Param<'_> {
        match self {
            Some(v) => v.to_param(),
            None => Param::Null,
        }
    }
}

/// A value read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl From<Param<'_>> for Value {
    fn from(param: Param<'_>) -> Self {
        match param {
            Param::Null => Value::Null,
            Param::Integer(i) => Value::Integer(i),
            Param::Real(f) => Value::Real(f),
            Param::Text(s) => Value::Text(s.to_string()),
            Param::Blob(b) => Value::Blob(b.to_vec()),
        }
    }
}

/// One row a query returned.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub(crate) Vec<Value>);

impl Row {
    /// Column `i` (from 0) as a `T`; a NULL is an error unless `T` is an `Option`.
    pub fn get<T: FromValue>(&self, i: usize) -> Result<T, StoreError> {
        let value = self.0.get(i).ok_or_else(|| {
            StoreError::Database(format!("column {i} is not in a row of {}", self.0.len()))
        })?;
        T::from_value(value)
            .ok_or_else(|| StoreError::Database(format!("column {i}: unexpected {value:?}")))
    }

    /// The row's values, in column order.
    pub fn values(&self) -> &[Value] {
        &self.0
    }
}

/// A Rust type a column can be read as.
pub trait FromValue: Sized {
    /// `None` if `value` is not of this type.
    fn from_value(value: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Integer(i) => Some(*i),
            _ => None,
        }
    }
}

impl FromValue for f64 {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Real(f) => Some(*f),
            Value::Integer(i) => Some(*i as f64),
            _ => None,
        }
    }
}

impl FromValue for String {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Blob(b) => Some(b.clone()),
            Value::Text(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }
}

impl FromValue for Value {
    fn from_value(value: &Value) -> Option<Self> {
        Some(value.clone())
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// `$1` … `$32`: the names the SQLite store binds positional parameters by, without
/// formatting one per call.
pub(crate) const DOLLAR_NAMES: [&str; 32] = [
    "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "$11", "$12", "$13", "$14", "$15",
    "$16", "$17", "$18", "$19", "$20", "$21", "$22", "$23", "$24", "$25", "$26", "$27", "$28",
    "$29", "$30", "$31", "$32",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_as_the_type_asked_for_and_refuse_others() {
        let row = Row(vec![
            Value::Integer(7),
            Value::Null,
            Value::Text("a".into()),
        ]);
        assert_eq!(row.get::<i64>(0), Ok(7));
        assert_eq!(row.get::<Option<i64>>(1), Ok(None));
        assert_eq!(row.get::<Option<String>>(2), Ok(Some("a".into())));
        assert!(row.get::<i64>(1).is_err());
        assert!(row.get::<i64>(2).is_err());
        assert!(row.get::<i64>(3).is_err());
    }

    #[test]
    fn parameters_come_from_plain_rust_values() {
        let id = String::from("sub_1");
        let none: Option<&str> = None;
        let params: [&dyn ToParam; 5] = [&id, &"x", &5_i64, &none, &&b"ab"[..]];
        let got: Vec<Param<'_>> = params.iter().map(|p| p.to_param()).collect();
        assert_eq!(
            got,
            [
                Param::Text("sub_1"),
                Param::Text("x"),
                Param::Integer(5),
                Param::Null,
                Param::Blob(b"ab")
            ]
        );
    }
}
