pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod ingest;
mod linger;
pub(crate) mod ops;
pub(crate) mod server;
