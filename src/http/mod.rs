pub(crate) mod error;
pub(crate) mod ingest;
pub(crate) mod server;
