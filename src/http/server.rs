//! The HTTP lifecycle: routes, connection limits, the accept loop and graceful shutdown.
//!
//! The accept loop is ours (hyper-util under axum's router) rather than `axum::serve`, because
//! a webhook endpoint faces the internet and needs what `axum::serve` does not expose: a header
//! size limit (431), a header read timeout against slow senders, and a connection cap that
//! refuses at once instead of queueing.
//!
//! # Shutdown ordering
//! 1. the shutdown future resolves (SIGTERM/SIGINT, or `RunningServer::stop`);
//! 2. the listener closes: no new connections;
//! 3. requests in flight finish: their events commit and they get their answer;
//! 4. the writer's last handle is dropped, it drains its queue and its thread ends;
//! 5. background workers stop after their current step.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::http::ingest::{self, Ingest};
use crate::retention::Retention;
use crate::store::sqlite as db;
use crate::{delivery, writer};

/// A request header block larger than this is refused with 431. Stripe's headers are well
/// under 2 KB; 16 KiB leaves room for proxies that add their own.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long shutdown waits for requests in flight before it gives up on them. Longer than
/// the read timeout plus the busy timeout, so a request that is being answered gets its answer.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Builds the router: `POST /webhooks/stripe`, a health check, JSON 404/405 for the rest.
pub fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route("/webhooks/stripe", post(ingest::stripe_webhook))
        .route("/webhooks/{source}", any(unknown_source))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(ingest)
}

fn json_error(code: StatusCode, kind: &str, message: &str) -> Response {
    (
        code,
        axum::Json(json!({ "error": kind, "message": message })),
    )
        .into_response()
}

async fn unknown_source() -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "unknown_source",
        "no such webhook source; this hookledger receives POST /webhooks/stripe",
    )
}

async fn not_found() -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such path; webhooks go to POST /webhooks/stripe",
    )
}

async fn method_not_allowed() -> Response {
    let mut response = json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "webhooks must be sent with POST",
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    response
}

/// hookledger opened and ready to serve: database migrated, writer running, routes built.
/// Opening is synchronous so that start-up errors surface before anything listens.
pub struct Hookledger {
    config: Config,
    app: Router,
    writer: writer::Writer,
    /// Delivers outbox rows to the app; `None` without `--forward-to`.
    worker: Option<delivery::Worker>,
    retention: Retention,
}

impl Hookledger {
    pub fn open(config: Config) -> anyhow::Result<Hookledger> {
        config.validate()?;
        let conn = db::open_writer(&config.db, config.busy_timeout)?;
        let (waker, woken) = delivery::Worker::channel();
        let on_commit = waker.clone();
        let (handle, writer) = writer::spawn(
            conn,
            writer::WriterConfig {
                batch_max: config.batch_max,
                queue_depth: config.queue_depth,
                credits_per_invoice: config.credits_per_invoice,
                forward: config.forward.is_some(),
                busy_timeout: config.busy_timeout,
            },
            Some(Box::new(move || on_commit.wake())),
        )?;
        let worker = match &config.forward {
            Some(forward) => Some(delivery::Worker::spawn(
                forward.clone(),
                db::read_pool(&config.db, 2)?,
                handle.clone(),
                waker,
                woken,
            )?),
            None => None,
        };
        let retention = Retention::spawn(handle.clone(), config.retention_days)?;
        let ingest = Arc::new(Ingest {
            stripe_secrets: config.stripe_secrets.clone(),
            tolerance_secs: config.tolerance_secs,
            max_body: config.max_body,
            read_timeout: config.read_timeout,
            writer: handle,
        });
        Ok(Hookledger {
            app: router(ingest),
            config,
            writer,
            worker,
            retention,
        })
    }

    /// Serves on an already bound listener until `shutdown` resolves, then shuts down in the
    /// order described in the module doc. Tests and the demo bind port 0.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Hookledger {
            config,
            app,
            writer,
            worker,
            retention,
        } = self;
        accept_loop(listener, app, &config, shutdown).await;
        // The router is gone; the worker finishes its current attempt, retention its batch.
        // Then the last writer handle is dropped: the writer commits its queue and ends.
        tokio::task::spawn_blocking(move || {
            if let Some(worker) = worker {
                worker.stop();
            }
            retention.stop();
            writer.join();
        })
        .await
        .context("waiting for the writer")?;
        log::info!("hookledger stopped");
        Ok(())
    }
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.read_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    let service = TowerToHyperService::new(app);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, peer));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection =
            graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("connection from {peer}: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    log::info!("shutting down: no new connections, finishing requests in flight");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            log::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; closing them");
        }
    }
}

/// Answers a connection over the cap with a 503 and closes it, without reading the request.
async fn refuse(mut stream: TcpStream, peer: SocketAddr) {
    log::warn!("connection limit reached; refusing {peer}");
    let body =
        r#"{"error":"too_many_connections","message":"connection limit reached; retry later"}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A server running on its own runtime thread (for the demo, the load generator and tests).
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl RunningServer {
    /// Binds `config.listen` (port 0 picks a free port) and starts serving.
    pub fn start(config: Config) -> anyhow::Result<RunningServer> {
        let listen = config.listen;
        let hookledger = Hookledger::open(config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let listener = runtime
            .block_on(TcpListener::bind(listen))
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("hookledger-server".into())
            .spawn(move || {
                runtime.block_on(hookledger.serve(listener, async {
                    let _ = stopped.await;
                }))
            })?;
        Ok(RunningServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Shuts down gracefully and waits until everything acknowledged is committed.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
