pub(crate) mod error;
pub(crate) mod ingest;
mod linger;
pub(crate) mod server;
