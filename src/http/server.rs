//! The HTTP lifecycle: routes, connection limits, the accept loop and graceful shutdown.
//!
//! The accept loop is ours (hyper-util under axum's router) rather than `axum::serve`, because
//! a webhook endpoint faces the internet and needs what `axum::serve` does not expose: a header
//! size limit (431), a header read timeout against slow senders, and a connection cap that
//! refuses at once instead of queueing. The admin listener runs the same loop with a smaller
//! cap ([`ADMIN_MAX_CONNECTIONS`]): idle connections to it must not use up the process's files.
//!
//! Every connection is a file descriptor. At start the soft limit of open files is raised to
//! the hard limit, and the webhook port's cap is lowered (and logged) when the limit leaves
//! too little room for it and everything else ([`RESERVED_FDS`]): past the limit, `accept`
//! fails instead of the cap answering 503.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::config::HttpConfig;
use crate::http::error::Rejection;
use crate::http::ingest::{self, Ingest};
use crate::http::linger::Lingering;
use crate::log_budget::LogBudget;

/// A request header block larger than this is refused with 431. Stripe's headers are well
/// under 2 KB; 16 KiB leaves room for proxies that add their own.
const MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long shutdown waits for requests in flight before it gives up on them. Longer than
/// the read timeout plus the busy timeout, so a request that is being answered gets its answer.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How long the open connections get, once a stop begins, to begin their requests before the
/// graceful shutdown closes those that have none in flight.
const SETTLE: Duration = Duration::from_millis(500);

/// The admin listener's connection cap: operators and a metrics scraper need a few.
pub(crate) const ADMIN_MAX_CONNECTIONS: usize = 64;

/// File descriptors kept for everything but the webhook port's connections: the admin
/// listener's, the database's files and connections, outgoing deliveries and API calls,
/// connections being refused with a 503, logs.
const RESERVED_FDS: u64 = ADMIN_MAX_CONNECTIONS as u64 + 192;

/// What the soft limit of open files is raised to when the hard limit is unlimited (Linux's
/// default `fs.nr_open`).
const UNLIMITED_FDS: u64 = 1 << 20;

/// One listener's limits.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// For log lines: `webhook` or `admin`.
    name: &'static str,
    max_connections: usize,
    /// How long a connection may take to send a request's headers (also: how long an idle
    /// connection stays open).
    header_timeout: Duration,
}

/// Builds the router: `POST /webhooks/{source}`, a health check, JSON 404/405 for the rest.
pub(crate) fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route(
            "/webhooks/{source}",
            post(ingest::webhook).fallback(wrong_method),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(|| async { Rejection::not_found() })
        .method_not_allowed_fallback(|| async { Rejection::method_not_allowed() })
        .with_state(ingest)
}

/// Another method than POST on `/webhooks/{source}`: 405 for a source, 404 for the rest.
async fn wrong_method(State(ingest): State<Arc<Ingest>>, Path(name): Path<String>) -> Response {
    if ingest.sources.load().contains_key(name.as_str()) {
        Rejection::method_not_allowed().into_response()
    } else {
        Rejection::unknown_source().into_response()
    }
}

/// Serves `app` on an already bound listener until `shutdown` resolves, then stops accepting
/// and lets requests in flight finish (at most [`SHUTDOWN_GRACE`]). First raises the limit
/// of open files and fits the connection cap under it (see the module doc).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    config: &HttpConfig,
    shutdown: impl Future<Output = ()>,
) {
    let fds = raise_fd_limit();
    let max_connections = connection_cap(config.max_connections, fds);
    if max_connections < config.max_connections {
        log::warn!(
            "--max-connections (http.max_connections) {} lowered to {max_connections}: this \
             process may open {} files (raise its hard limit, e.g. systemd's LimitNOFILE=, for \
             more)",
            config.max_connections,
            fds.unwrap_or_default()
        );
    }
    let limits = Limits {
        name: "webhook",
        max_connections,
        header_timeout: config.read_timeout,
    };
    accept_loop(listener, app, limits, shutdown).await;
}

/// Serves the admin router (`app`) on `listener` with the webhook port's accept loop and
/// limits, at most [`ADMIN_MAX_CONNECTIONS`] connections, until the runtime ends.
pub(crate) async fn serve_admin(listener: TcpListener, app: Router, config: &HttpConfig) {
    let limits = Limits {
        name: "admin",
        max_connections: ADMIN_MAX_CONNECTIONS,
        header_timeout: config.read_timeout,
    };
    accept_loop(listener, app, limits, std::future::pending()).await;
}

/// The accept loop of one listener: a connection over the cap gets a 503, the others the
/// header size limit and the header read timeout.
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    let service = TowerToHyperService::new(app);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning, and log within a budget.
                    if let Some(line) = accept_failed(&ACCEPT_LOG, crate::time::unix_now(), limits.name, &e) {
                        log::warn!("{line}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, peer, limits.name));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let stream = TokioIo::new(Lingering::new(stream));
        let connection = graceful.watch(http.serve_connection(stream, service.clone()));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("connection from {peer}: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    log::info!("shutting down: no new connections, finishing requests in flight");
    // A connection accepted just now may not have sent its request yet, and a graceful
    // shutdown closes a connection with no request begun: its client would read an EOF.
    // Open connections get a moment to begin theirs first.
    if slots.available_permits() < limits.max_connections {
        tokio::time::sleep(SETTLE).await;
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            log::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; closing them");
        }
    }
}

/// Lines about refused connections, at most ten a second (a connection flood is not a log
/// flood).
static REFUSED_LOG: LogBudget = LogBudget::new();

/// Lines about failed accepts (out of files), at most ten a second.
static ACCEPT_LOG: LogBudget = LogBudget::new();

/// The line to log for a failed accept on listener `name` at `now`, unless `budget` holds it
/// back (then it is counted, and the count goes with the next line).
fn accept_failed(
    budget: &LogBudget,
    now: i64,
    name: &str,
    error: &std::io::Error,
) -> Option<String> {
    let more = budget.admit(now, "accept failures")?;
    Some(format!("{name} listener: accept failed: {error}{more}"))
}

/// Answers a connection over the cap with a 503 and closes it (lingering, so the answer
/// arrives), without reading the request.
async fn refuse(stream: TcpStream, peer: SocketAddr, name: &'static str) {
    if let Some(more) = REFUSED_LOG.admit(crate::time::unix_now(), "refusals") {
        log::warn!("{name} connection limit reached; refusing {peer}{more}");
    }
    let response = Rejection::too_many_connections().to_http1();
    let mut stream = Lingering::new(stream);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Raises the soft limit of open files to the hard limit; returns the soft limit now in force
/// (`None`: unlimited). A failure is logged, and the limit stays as it was.
fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let want = limit.maximum.unwrap_or(UNLIMITED_FDS);
    if limit.current.is_some_and(|current| current < want) {
        let raised = Rlimit {
            current: Some(want),
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            log::warn!(
                "cannot raise the limit of open files from {} to {want}: {e}",
                limit.current.unwrap_or_default()
            );
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The webhook port's connection cap: `requested`, lowered to leave [`RESERVED_FDS`] of a
/// limit of `fds` open files (`None`: unlimited) for everything else, or half of a limit too
/// small for that; at least 1.
fn connection_cap(requested: usize, fds: Option<u64>) -> usize {
    let Some(fds) = fds else {
        return requested;
    };
    let room = fds.saturating_sub(RESERVED_FDS).max(fds / 2).max(1);
    requested.min(usize::try_from(room).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_room_for_the_rest_under_the_limit_of_open_files() {
        // The usual soft limit: 1024 connections would leave nothing for the database.
        assert_eq!(
            connection_cap(1024, Some(1024)),
            1024 - RESERVED_FDS as usize
        );
        assert_eq!(connection_cap(1024, Some(65_536)), 1024);
        assert_eq!(connection_cap(100, Some(1024)), 100);
        assert_eq!(connection_cap(1024, None), 1024);
        // A limit too small for the reserve: half of it.
        assert_eq!(connection_cap(1024, Some(256)), 128);
        assert_eq!(connection_cap(1024, Some(1)), 1);
        assert_eq!(connection_cap(1024, Some(0)), 1);
    }

    #[test]
    fn the_soft_limit_of_open_files_is_raised_to_the_hard_limit() {
        let after = raise_fd_limit();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(after, limit.current);
        if let (Some(current), Some(maximum)) = (limit.current, limit.maximum) {
            assert_eq!(current, maximum);
        }
    }

    #[test]
    fn failed_accepts_log_ten_lines_a_second_and_count_the_rest() {
        let budget = LogBudget::new();
        let emfile = std::io::Error::from_raw_os_error(24);
        let lines: Vec<String> = (0..1000)
            .filter_map(|_| accept_failed(&budget, 100, "webhook", &emfile))
            .collect();
        assert_eq!(lines.len(), 10);
        assert!(
            lines[0].starts_with("webhook listener: accept failed: "),
            "{}",
            lines[0]
        );
        let next = accept_failed(&budget, 101, "webhook", &emfile).unwrap();
        assert!(
            next.ends_with(" (990 earlier accept failures not logged)"),
            "{next}"
        );
    }
}
