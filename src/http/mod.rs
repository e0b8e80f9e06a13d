pub mod ingest;
pub mod server;
