//! [`StoreError`]: why a write did not happen, on any store.

/// Why a write did not happen. Mapped to HTTP in `http::error`.
///
/// `Clone` because one failed transaction fails every job of its batch: the same error is
/// answered to each of them. That is also why the backend's error is kept as its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("the writer queue is full")]
    QueueFull,
    #[error("hookledger is shutting down")]
    ShuttingDown,
    /// SQLite: another process holds the write lock. PostgreSQL: a lock wait over the busy
    /// timeout, a deadlock or a serialization failure.
    #[error("the database is busy (a lock held elsewhere, or a deadlock): {0}")]
    Busy(String),
    #[error("the database cannot be reached: {0}")]
    Unavailable(String),
    #[error("the disk is full: {0}")]
    DiskFull(String),
    #[error("the database cannot be written (read-only file or file system): {0}")]
    ReadOnly(String),
    #[error("database error: {0}")]
    Database(String),
    /// The signature's single-use token was used by another event: a captured signature
    /// attached to another body (Mailgun signs a timestamp and a token, not the event).
    #[error("this signature was already used for another event (a replayed signature)")]
    ReplayedSignature,
}

impl StoreError {
    /// Whether the database is busy or unreachable (a 503): waiting again right away would
    /// wait just as long.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, StoreError::Busy(_) | StoreError::Unavailable(_))
    }

    /// The same error, its detail prefixed with `what` (for the log: which effect failed).
    pub(crate) fn context(self, what: &str) -> StoreError {
        match self {
            StoreError::Busy(d) => StoreError::Busy(format!("{what}: {d}")),
            StoreError::Unavailable(d) => StoreError::Unavailable(format!("{what}: {d}")),
            StoreError::DiskFull(d) => StoreError::DiskFull(format!("{what}: {d}")),
            StoreError::ReadOnly(d) => StoreError::ReadOnly(format!("{what}: {d}")),
            StoreError::Database(d) => StoreError::Database(format!("{what}: {d}")),
            other => other,
        }
    }
}
