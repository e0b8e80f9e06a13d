//! The SQL types handlers and stores share, the same on every store: [`Tx`] (the transaction
//! as a handler sees it), the [`Session`] a store implements behind it, parameters and rows,
//! and [`StoreError`]. A leaf: it imports nothing of the crate.

mod error;
mod tx;

pub use error::StoreError;
pub use tx::{Dialect, FromValue, Param, Row, ToParam, Tx, Value};
pub(crate) use tx::{Session, DOLLAR_NAMES};
