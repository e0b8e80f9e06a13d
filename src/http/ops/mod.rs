//! The admin listener's routes (`--admin-listen`, 127.0.0.1:9090 by default): for whoever
//! runs hookledger, never on the webhook port.
//!
//! - `GET /healthz`: the process serves HTTP.
//! - `GET /readyz`: a heartbeat row is rewritten through the writer and committed, so a 200
//!   means the writer is alive, the database answers and takes writes. On SQLite the file
//!   system of the database must also have [`MIN_FREE_BYTES`](probes::MIN_FREE_BYTES) free: a heartbeat alone can
//!   commit on a full disk, into pages the database already has. Otherwise 503 with the
//!   reason (the same kinds as the webhook port's 503s).
//! - `GET /metrics`: Prometheus (OpenMetrics text when asked for, else text 0.0.4), see
//!   [`crate::metrics`].
//! - `GET /status`: an HTML page for people; `POST /status/retry-dead` puts the dead outbox rows
//!   back to pending (see [`status`]).
//! - `GET /events`, `GET /event`: the events browser, and an event's page with its payload and
//!   outbox rows; `POST /event/replay` (see [`events`]).
//! - `GET /outbox`, `GET /outbox/row`: the outbox by kind and status, one row; `POST
//!   /outbox/retry` (one dead row) and `POST /outbox/retry-dead` (the dead rows of a kind)
//!   (see [`outbox`]).
//!
//! # Who may do what
//! Nothing changes data without the admin token (`--admin-token`), sent as
//! `Authorization: Bearer <token>`, as the password of HTTP basic auth, or as the `token` field
//! of the page's form. `/metrics` and `/status` need it too when the listener is not on
//! loopback (start-up refuses such a listener without a token). Health and readiness never do:
//! load balancers and probes call them, and they show nothing about events. Both checks are
//! layers on the routes in [`router`], so that no handler can leave its check out.

mod events;
mod html;
mod outbox;
mod probes;
mod state;
mod status;
mod token;

use std::sync::Arc;

use axum::middleware;
use axum::routing::{get, post, MethodRouter};
use axum::Router;

pub(crate) use state::Admin;

use crate::http::error::Rejection;

pub(crate) fn router(admin: Admin) -> Router {
    let admin = Arc::new(admin);
    // On each method's route, not on the router: a GET of a POST route stays a 405.
    let read = |route: MethodRouter<Arc<Admin>>| {
        route.route_layer(middleware::from_fn_with_state(admin.clone(), token::reads))
    };
    let change = |route: MethodRouter<Arc<Admin>>| {
        route.route_layer(middleware::from_fn_with_state(
            admin.clone(),
            token::changes,
        ))
    };
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(probes::ready))
        .route("/metrics", read(get(probes::metrics)))
        .route("/status", read(get(status::page)))
        .route("/status/retry-dead", change(post(status::retry_dead)))
        .route("/events", read(get(events::list)))
        .route("/event", read(get(events::show)))
        .route("/event/replay", change(post(events::replay)))
        .route("/outbox", read(get(outbox::list)))
        .route("/outbox/row", read(get(outbox::show)))
        .route("/outbox/retry", change(post(outbox::retry)))
        .route("/outbox/retry-dead", change(post(outbox::retry_dead)))
        .fallback(|| async { Rejection::not_found() })
        .with_state(admin)
}
