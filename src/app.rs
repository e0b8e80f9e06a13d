//! [`Hookledger`]: the receiver opened and ready to serve, for the CLI and for embedding.
//!
//! Opening is synchronous and comes first: the config is checked, the database migrated, the
//! writer and the background workers started and the routes built before anything listens, so
//! a bad config or database is reported before a port is bound.
//!
//! # Shutdown ordering
//! 1. the shutdown future resolves (SIGTERM/SIGINT, or `RunningServer::stop`);
//! 2. the listener closes: no new connections;
//! 3. requests in flight finish: their events commit and they get their answer;
//! 4. background workers stop after their current step;
//! 5. the writer's last handle is dropped, it drains its queue and its thread ends.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use crate::config::{
    bind_parameters, split_statements, Config, Database, EffectConfig, ForwardConfig, Secret,
    SourceConfig,
};
use crate::delivery;
use crate::error::Error;
use crate::handler::sql::{SqlEffect, SqlEffects};
use crate::handler::{Handler, Schema};
use crate::http::body::BodyBudget;
use crate::http::ingest::Ingest;
use crate::http::server;
use crate::metrics::Metrics;
/// What a reconcile found and did.
pub(crate) use crate::recover::Counts;
use crate::retention::Retention;
use crate::source::{LiveSources, Source, Sources};
use crate::store::{self, Reader, ServeGuard, Store};
use crate::stripe;
use crate::trace::Tracer;
use crate::writer::{self, Background};

/// What a [`Hookledger`] is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// A server: background workers, the serve lock.
    Serve,
    /// One command next to a running server; `forward`: queue `forward` rows.
    Command { forward: bool },
}

impl Access {
    fn store(self) -> store::Access {
        match self {
            Access::Serve => store::Access::Serve,
            Access::Command { .. } => store::Access::Command,
        }
    }
}

/// hookledger opened and ready to serve: database migrated, writer running, routes built.
pub struct Hookledger {
    config: Config,
    app: Router,
    writer: writer::Writer,
    /// For the admin routes' heartbeat and for reconcile.
    writer_handle: writer::WriterHandle,
    /// Pooled read connections: the admin pages, reconcile's lookups.
    reader: Reader,
    /// Each source with its handlers, by name, as opened (for reconcile).
    sources: Sources,
    /// What the request path reads, and a reload swaps.
    reload: Reloader,
    /// What `/metrics` and `/status` show.
    metrics: Arc<Metrics>,
    /// Background work that stops before the writer: the outbox worker, retention, a
    /// provider wing's periodic runs. Empty for a command.
    workers: Vec<Box<dyn Background>>,
    /// No second server on this database while this one lives.
    lock: ServeGuard,
    /// When it was opened (Unix seconds): the console's uptime.
    started_at: i64,
    /// Set when [`Hookledger::serve`]'s shutdown begins: `/readyz` answers 503 from then on,
    /// so that a balancer stops sending here while the requests in flight drain.
    stopping: Arc<AtomicBool>,
}

/// Builds a [`Hookledger`] in code: its config (or parts of it) and the app's own Rust
/// handlers. `Hookledger::builder().database("app.db").source(SourceConfig::stripe(secrets))
/// .handler("stripe", MyHandler).build()?`
#[derive(Default)]
pub struct Builder {
    config: Config,
    handlers: Vec<(String, Arc<dyn Handler>)>,
}

impl Builder {
    /// Starts from `config` (a file's, say); later calls change it.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The store: a SQLite database file, or a PostgreSQL URL.
    pub fn database(mut self, database: impl Into<Database>) -> Self {
        self.config.database = database.into();
        self
    }

    /// Adds a source: `POST /webhooks/{name}`.
    pub fn source(mut self, source: SourceConfig) -> Self {
        self.config.sources.push(source);
        self
    }

    /// Runs `handler` for every new event of `source`, inside the claim's transaction, after
    /// the source's built-in handlers and before its SQL effects.
    pub fn handler(mut self, source: &str, handler: impl Handler) -> Self {
        self.handlers.push((source.to_string(), Arc::new(handler)));
        self
    }

    /// Applies the app's own migrations in `folder` (`*.sql`, once each, in name order) when
    /// it opens: its tables, in the same database as the ledger.
    pub fn migrations(mut self, folder: impl Into<std::path::PathBuf>) -> Self {
        self.config.schema.migrations = Some(folder.into());
        self
    }

    /// Forwards every processed event to the app at `forward.url`.
    pub fn forward(mut self, forward: ForwardConfig) -> Self {
        self.config.forward = Some(forward);
        self
    }

    /// Checks everything, opens (and migrates) the database and starts the writer and the
    /// background workers. Nothing listens yet.
    pub fn build(self) -> Result<Hookledger, Error> {
        Hookledger::start(self.config, self.handlers, Access::Serve).map_err(Error::from)
    }
}

impl Hookledger {
    /// A [`Builder`], to set hookledger up in code (and add Rust handlers).
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Checks `config`, opens (and migrates) the database and starts the writer and the
    /// background workers. Nothing listens yet.
    pub fn open(config: Config) -> Result<Hookledger, Error> {
        Hookledger::start(config, Vec::new(), Access::Serve).map_err(Error::from)
    }

    /// Opens `config`'s existing database for one command next to a running `serve`: the
    /// writer and the readers, no background work and no serve lock. With `forward`, new
    /// events get a `forward` row even without a `[forward]` target here (the serve that has
    /// one delivers them).
    pub(crate) fn open_for_command(config: Config, forward: bool) -> anyhow::Result<Hookledger> {
        Hookledger::start(config, Vec::new(), Access::Command { forward })
    }

    fn start(
        config: Config,
        handlers: Vec<(String, Arc<dyn Handler>)>,
        access: Access,
    ) -> anyhow::Result<Hookledger> {
        // Opening blocks (on the database, and PostgreSQL's synchronous client runs its own
        // runtime, which may not start inside another): an app calling this from async code
        // gets it done on a thread of its own.
        if tokio::runtime::Handle::try_current().is_ok() {
            return std::thread::scope(|s| {
                s.spawn(|| Hookledger::open_blocking(config, handlers, access))
                    .join()
                    .map_err(|_| anyhow::anyhow!("opening hookledger panicked"))?
            });
        }
        Hookledger::open_blocking(config, handlers, access)
    }

    /// The one composition root: everything below is built here, once, in this order (a bad
    /// config stops start-up before the database is created).
    fn open_blocking(
        config: Config,
        handlers: Vec<(String, Arc<dyn Handler>)>,
        access: Access,
    ) -> anyhow::Result<Hookledger> {
        // A command (reconcile) reads no webhooks: its sources need no signing secrets.
        if access == Access::Serve {
            config.validate()?;
        }
        stripe::check(&config)?;
        for (source, handler) in &handlers {
            if !config.sources.iter().any(|s| s.name == *source) {
                anyhow::bail!(
                    "handler `{}`: there is no source `{source}`",
                    handler.name()
                );
            }
        }
        // Traces, when a collector is named: its exporter thread starts here, and spans dropped
        // are counted in `/metrics`.
        let spans_dropped = prometheus_client::metrics::counter::Counter::default();
        let tracer = match &config.otlp_endpoint {
            Some(endpoint) => Some(Arc::new(
                Tracer::start(endpoint, spans_dropped.clone())
                    .context("cannot start the OTLP exporter thread")?,
            )),
            None => None,
        };
        let mut targets = delivery::Targets::of(&config, tracer.as_ref())?;
        stripe::add_targets(&config, &mut targets);
        crate::alerts::add_targets(&config, &mut targets)?;
        let forward = config.forward.is_some() || access == Access::Command { forward: true };
        let dictionaries = Arc::new(crate::payload::Dictionaries::default());
        let sources = sources_of(&config, forward, &dictionaries)?;
        if access == Access::Serve
            && (config.schema.migrations.is_some() || !config.effects.is_empty())
        {
            // A new SQLite file: the app's migrations and effects are tried in memory first,
            // so that a bad one stops start-up before the file is created.
            if let Some(mut scratch) = store::scratch(&config.database)? {
                with_handlers(&config, &mut *scratch, HashMap::new(), Vec::new())?;
            }
        }
        let store::Stores {
            mut writer,
            reader,
            outbox,
            guard,
        } = store::open(&config.database, &config.storage, access.store())?;
        writer.limit_handlers(config.writer.effect_timeout);
        let wal_behind = writer.wal_behind();
        let sources = with_handlers(&config, &mut *writer, sources, handlers.clone())?;
        let names: Vec<Arc<str>> = sources.keys().cloned().collect();
        crate::training::load(&reader, &names, &dictionaries)
            .context("cannot read the payload dictionaries")?;
        let metrics =
            Arc::new(Metrics::new(&in_order(&config), spans_dropped).with_wal(writer.wal_watch()));
        let serving = access == Access::Serve;
        let (waker, woken) = delivery::Worker::channel();
        let on_commit = waker.clone();
        let (handle, writer) = writer::spawn(
            writer,
            config.writer.clone(),
            serving.then(|| Box::new(move || on_commit.wake()) as Box<dyn Fn() + Send>),
            metrics.writer(),
        )
        .context("cannot start the writer thread")?;
        let refusals = Arc::new(crate::refusals::Refusals::default());
        let mut workers: Vec<Box<dyn Background>> = Vec::new();
        if serving {
            // Read before the first beat: the time since the last one is the downtime.
            match crate::heartbeat::downtime(&reader, crate::time::unix_now()) {
                Ok(down) => metrics.set_downtime(down),
                Err(e) => log::warn!("heartbeat: the last one cannot be read: {e:#}"),
            }
            workers.push(Box::new(crate::heartbeat::Heartbeat::spawn(
                handle.clone(),
            )?));
            let watch =
                crate::alerts::Watch::new(&config, handle.clone(), reader.clone(), metrics.clone());
            if let Some(watch) = &watch {
                targets.observe(watch.clone());
            }
            if !targets.is_empty() {
                workers.push(Box::new(delivery::Worker::spawn(
                    targets,
                    outbox,
                    handle.clone(),
                    waker,
                    woken,
                    metrics.clone(),
                )?));
            }
            if let Some(watch) = &watch {
                workers.push(Box::new(watch.spawn()?));
            }
            workers.push(Box::new(Retention::spawn(
                handle.clone(),
                config.retention.clone(),
                reader.clone(),
                wal_behind,
            )?));
            workers.push(Box::new(crate::training::Trainer::spawn(
                handle.clone(),
                reader.clone(),
                names,
                dictionaries.clone(),
            )?));
            workers.extend(stripe::background(
                &config, &sources, &handle, &reader, &metrics,
            )?);
            for recovery in crate::recover::periodic(&config, &sources, &handle, &reader, &metrics)?
            {
                workers.push(Box::new(recovery));
            }
            workers.push(Box::new(crate::refusals::Flusher::spawn(
                refusals.clone(),
                handle.clone(),
            )?));
        }
        let live = Arc::new(LiveSources::from_pointee(sources.clone()));
        metrics.config_loaded(crate::time::unix_now(), None);
        let reload = Reloader(Arc::new(Reload {
            live: live.clone(),
            writer: handle.clone(),
            handlers,
            forward,
            dictionaries: dictionaries.clone(),
            metrics: metrics.clone(),
            serving: std::sync::Mutex::new(config.clone()),
        }));
        let ingest = Arc::new(Ingest {
            sources: live,
            http: config.http.clone(),
            budget: BodyBudget::new(config.http.body_budget),
            writer: handle.clone(),
            rejection_log: Default::default(),
            metrics: metrics.clone(),
            refusals,
            tracer,
        });
        Ok(Hookledger {
            app: server::router(ingest),
            config,
            writer,
            writer_handle: handle,
            reader,
            sources,
            reload,
            metrics,
            workers,
            lock: guard,
            started_at: crate::time::unix_now(),
            stopping: Arc::default(),
        })
    }

    /// What applies a config read again to this running instance (`serve`'s SIGHUP).
    pub fn reloader(&self) -> Reloader {
        self.reload.clone()
    }

    /// The routes (`POST /webhooks/{source}`, `/healthz`), to mount in an app's own axum
    /// server. The writer and the workers keep running until [`Hookledger::serve`] returns or
    /// the `Hookledger` is dropped.
    pub fn router(&self) -> Router {
        self.app.clone()
    }

    /// The operators' routes (`/healthz`, `/readyz`, `/metrics`, `/status`), to serve on a
    /// listener of their own, never on the webhook port (`serve` binds `--admin-listen`).
    /// `/metrics` and `/status` ask for the admin token when the config's `admin_listen` is not
    /// loopback: an app serving this router elsewhere should set `admin_listen` to where.
    pub fn admin_router(&self) -> Router {
        crate::http::ops::router(crate::http::ops::Admin {
            writer: self.writer_handle.clone(),
            reader: self.reader.clone(),
            database: self.config.database.clone(),
            metrics: self.metrics.clone(),
            retention: self.config.retention.clone(),
            token: self.config.admin_token.clone(),
            reads_need_token: self
                .config
                .admin_listen
                .is_some_and(|at| !at.ip().is_loopback()),
            targets: shown_targets(&self.config),
            started_at: self.started_at,
            stopping: self.stopping.clone(),
        })
    }

    /// Reconciles source `name` with what its provider's API has and the ledger lacks, over the
    /// last `since`: one run through this instance's writer and readers (the CLI's
    /// `reconcile`). `api_base` and `api_key` override the source's own.
    pub(crate) fn reconcile(
        &self,
        name: &str,
        since: Duration,
        dry_run: bool,
        api_base: Option<&str>,
        api_key: Option<Secret>,
    ) -> anyhow::Result<Counts> {
        let (Some(config), Some(source)) = (
            self.config.sources.iter().find(|s| s.name == name),
            self.sources.get(name),
        ) else {
            anyhow::bail!("there is no source `{name}`");
        };
        let never = AtomicBool::new(false);
        let claim_days = self.config.retention.claim_days;
        if since > Duration::from_secs(claim_days.saturating_mul(86_400)) {
            anyhow::bail!(
                "--since must be at most retention.claim_days ({claim_days} days): an event whose \
                 claim was pruned would be applied again"
            );
        }
        if config.scheme == crate::config::SchemeName::Github {
            let run = crate::recover::github::Run::new(config, since, dry_run, api_base, api_key)?;
            return Ok(run.once(source, &self.writer_handle, &self.reader, &never)?);
        }
        if crate::recover::gitlab::is_gitlab(config) {
            let run = crate::recover::gitlab::Run::new(config, since, dry_run, api_base, api_key)?;
            return Ok(run.once(source, &self.writer_handle, &self.reader, &never)?);
        }
        if crate::recover::paddle::is_paddle(config) {
            let run = crate::recover::paddle::run(config, since, dry_run, api_base, api_key)?;
            return Ok(run.once(source, &self.writer_handle, &self.reader, &never)?);
        }
        if crate::recover::workos::is_workos(config) {
            let run = crate::recover::workos::run(config, since, dry_run, api_base, api_key)?;
            return Ok(run.once(source, &self.writer_handle, &self.reader, &never)?);
        }
        let run = stripe::reconcile::Run::new(config, since, dry_run, api_base, api_key)?;
        Ok(run.once(source, &self.writer_handle, &self.reader, &never)?)
    }

    /// Serves on an already bound listener until `shutdown` resolves, then shuts down in the
    /// order described in the module doc. Tests and the demo bind port 0.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let stopping = self.stopping.clone();
        let shutdown = async move {
            shutdown.await;
            stopping.store(true, Ordering::SeqCst);
        };
        server::serve(listener, self.app.clone(), &self.config.http, shutdown).await;
        self.shutdown().await
    }

    /// Stops the background workers and the writer once everything queued is committed. For
    /// an app that mounted [`Hookledger::router`] in its own server: call it after that server
    /// has stopped and dropped the router (the writer ends when the last route is gone).
    pub async fn shutdown(self) -> Result<(), Error> {
        tokio::task::spawn_blocking(move || self.close())
            .await
            .context("waiting for the writer")?;
        log::info!("hookledger stopped");
        Ok(())
    }

    /// The blocking part of [`Hookledger::shutdown`]: each worker finishes its current step
    /// (an attempt, a batch, a page); then the last writer handle is dropped and the writer
    /// commits its queue and ends.
    pub(crate) fn close(self) {
        let Hookledger {
            app,
            writer,
            writer_handle,
            sources,
            workers,
            lock,
            ..
        } = self;
        drop(app);
        drop(sources);
        drop(writer_handle);
        for worker in workers {
            worker.stop();
        }
        writer.join();
        drop(lock);
    }
}

/// Applies a config read again to a running [`Hookledger`]: sources added and removed,
/// secrets rotated, handlers and effects changed are swapped in place between two requests
/// (a request keeps the source it started with); what the background threads were started
/// with is for a restart (see [`crate::config::Change`]). Clones share one instance.
#[derive(Clone)]
pub struct Reloader(Arc<Reload>);

struct Reload {
    live: Arc<LiveSources>,
    writer: writer::WriterHandle,
    /// The app's Rust handlers, attached again to the sources they name.
    handlers: Vec<(String, Arc<dyn Handler>)>,
    forward: bool,
    dictionaries: Arc<crate::payload::Dictionaries>,
    metrics: Arc<Metrics>,
    /// The config the request path serves; one reload at a time holds it.
    serving: std::sync::Mutex<Config>,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reloaded {
    /// The new config is the one serving.
    Unchanged,
    /// The sources were swapped: the names of those added, removed and changed.
    Swapped {
        added: Vec<String>,
        removed: Vec<String>,
        changed: Vec<String>,
    },
    /// Nothing was applied: these keys need a restart (the same sockets: SIGUSR2 for `serve`).
    NeedsRestart(Vec<String>),
}

impl Reloader {
    /// Checks `new` as a start would, then applies it, or refuses it with the key named and
    /// leaves the serving config as it is. `sha256`: of the file it was read from, for
    /// `/status`. Blocks (on the writer, which compiles the new effects between two
    /// transactions): call it from a thread of its own.
    pub fn reload(&self, new: Config, sha256: Option<String>) -> Result<Reloaded, Error> {
        let reloaded = self.apply(new, sha256);
        if reloaded.is_err() {
            self.0.metrics.reload_refused();
        }
        reloaded
    }

    fn apply(&self, new: Config, sha256: Option<String>) -> Result<Reloaded, Error> {
        let reload = &*self.0;
        let mut serving = reload.serving.lock().unwrap_or_else(|e| e.into_inner());
        new.validate()?;
        stripe::check(&new)?;
        if new.sources.is_empty() {
            return Err(crate::config::ConfigError::new(
                "source",
                "the new config has no source: the running config is kept",
            )
            .into());
        }
        for (source, handler) in &reload.handlers {
            if !new.sources.iter().any(|s| s.name == *source) {
                return Err(anyhow::anyhow!(
                    "handler `{}`: there is no source `{source}` in the new config",
                    handler.name()
                )
                .into());
            }
        }
        let sources = match crate::config::change(&serving, &new)? {
            crate::config::Change::Nothing => {
                reload
                    .metrics
                    .config_loaded(crate::time::unix_now(), sha256);
                return Ok(Reloaded::Unchanged);
            }
            crate::config::Change::Restart(keys) => {
                // The restart reads the file again: what would stop its start-up (a source
                // that does not build) is refused here, while this process still serves.
                sources_of(&new, reload.forward, &reload.dictionaries)?;
                return Ok(Reloaded::NeedsRestart(keys));
            }
            crate::config::Change::Sources => {
                sources_of(&new, reload.forward, &reload.dictionaries)?
            }
        };
        let handlers = reload.handlers.clone();
        let checked = new.clone();
        let sources = reload
            .writer
            .lend(move |store| with_handlers(&checked, store, sources, handlers))
            .map_err(anyhow::Error::from)??;
        let (old, now) = (&serving.sources, &new.sources);
        let named = |list: &[SourceConfig], other: &[SourceConfig]| -> Vec<String> {
            list.iter()
                .filter(|s| !other.iter().any(|o| o.name == s.name))
                .map(|s| s.name.clone())
                .collect()
        };
        let changed = now
            .iter()
            .filter(|s| old.iter().any(|o| o.name == s.name && o != *s))
            .map(|s| s.name.clone())
            .collect();
        let done = Reloaded::Swapped {
            added: named(now, old),
            removed: named(old, now),
            changed,
        };
        reload.metrics.set_sources(&in_order(&new));
        reload.live.store(Arc::new(sources));
        *serving = new;
        reload
            .metrics
            .config_loaded(crate::time::unix_now(), sha256);
        Ok(done)
    }

    /// Records that the serving config came from a file of this hash (`serve`, at start).
    pub(crate) fn loaded_from(&self, sha256: Option<String>) {
        let (at, _) = self.0.metrics.config();
        self.0.metrics.config_loaded(at, sha256);
    }

    /// Counts a reload refused (for `/metrics`): by the caller, who read the file.
    pub(crate) fn refused(&self) {
        self.0.metrics.reload_refused();
    }
}

/// The names of `config`'s sources, in its order.
fn in_order(config: &Config) -> Vec<Arc<str>> {
    config
        .sources
        .iter()
        .map(|s| Arc::from(s.name.as_str()))
        .collect()
}

/// Each source of `config`, with its built-in handlers: built before the database is opened,
/// so that a bad source stops start-up before anything is created.
fn sources_of(
    config: &Config,
    forward: bool,
    dictionaries: &Arc<crate::payload::Dictionaries>,
) -> anyhow::Result<HashMap<Arc<str>, Source>> {
    config
        .sources
        .iter()
        .map(|c| {
            // `[forward]` with routes forwards the events they match, not every one.
            let all = forward && config.forward.as_ref().is_none_or(|f| f.on.is_none());
            let mut source =
                Source::from_config(c, all, config.http.max_body, dictionaries.clone())?;
            source.routes = crate::source::Routes::of(config, &c.name);
            for name in &c.handlers {
                let handler = builtin_handler(name, config, c)
                    .map_err(|e| anyhow::anyhow!("source `{}`: handlers: {e}", c.name))?;
                source.handlers.push(handler);
            }
            Ok((source.name.clone(), source))
        })
        .collect()
}

/// The registry of built-in handlers: the handler a source's `handlers` names, from the wing
/// that has it.
fn builtin_handler(
    name: &str,
    config: &Config,
    source: &SourceConfig,
) -> anyhow::Result<Arc<dyn Handler>> {
    stripe::handler(name, config, source).unwrap_or_else(|| Err(anyhow::anyhow!("unknown handler")))
}

/// The own tables of the built-in handler `name` (and the migrations that make them), if it
/// has any.
fn builtin_schema(name: &str) -> Option<&'static Schema> {
    stripe::schema(name)
}

/// The schema of every built-in handler that has one: what `migrate-to` asks for.
#[cfg(feature = "postgres")]
pub(crate) fn builtin_schemas() -> Vec<&'static Schema> {
    stripe::schemas().to_vec()
}

/// The schemas of the built-in handlers `config`'s sources name, each once, in config order.
fn schemas_in_use(config: &Config) -> Vec<&'static Schema> {
    let mut schemas: Vec<&'static Schema> = Vec::new();
    for name in config.sources.iter().flat_map(|s| &s.handlers) {
        if let Some(schema) = builtin_schema(name) {
            if !schemas.iter().any(|s| s.handler == schema.handler) {
                schemas.push(schema);
            }
        }
    }
    schemas
}

/// `sources` with the rest of their handlers, in the order they run: the app's Rust handlers,
/// then its SQL effects (after the built-in handlers' tables and the app's migrations, each
/// statement checked against `store`).
fn with_handlers(
    config: &Config,
    store: &mut dyn Store,
    mut sources: HashMap<Arc<str>, Source>,
    handlers: Vec<(String, Arc<dyn Handler>)>,
) -> anyhow::Result<HashMap<Arc<str>, Arc<Source>>> {
    // The built-in handlers' own tables first (only those a source names: a database whose
    // sources never name stripe-billing gets none of its tables, and one that names it later
    // gets them at that start); the app's migrations and effects may use them.
    for schema in schemas_in_use(config) {
        store.migrate_handler(schema)?;
    }
    if let Some(folder) = &config.schema.migrations {
        store.migrate_app(folder)?;
    }
    for (name, handler) in handlers {
        if let Some(source) = sources.get_mut(name.as_str()) {
            source.handlers.push(handler);
        }
    }
    for (name, effects) in compile_effects(store, &config.effects)? {
        if let Some(source) = sources.get_mut(name.as_str()) {
            source.handlers.push(Arc::new(SqlEffects(effects)));
        }
    }
    Ok(sources
        .into_iter()
        .map(|(name, source)| (name, Arc::new(source)))
        .collect())
}

/// The `[[effect]]` entries, grouped by source in config order, each statement checked against
/// the (migrated) database: it must compile and name only the known parameters.
fn compile_effects(
    store: &mut dyn Store,
    effects: &[EffectConfig],
) -> anyhow::Result<Vec<(String, Vec<SqlEffect>)>> {
    let mut by_source: Vec<(String, Vec<SqlEffect>)> = Vec::new();
    for (i, effect) in effects.iter().enumerate() {
        let index = i + 1;
        let mut statements = Vec::new();
        for (j, sql) in split_statements(&effect.sql).iter().enumerate() {
            let at = format!(
                "effect {index} (source `{}`), statement {}",
                effect.source,
                j + 1
            );
            // Quoted as the app wrote it: the database saw `$1` where it says `:body`.
            let refused = |why: &str| {
                let written: Vec<String> = sql
                    .trim()
                    .lines()
                    .map(|line| format!("    {line}"))
                    .collect();
                anyhow::anyhow!("{at}: {why}\n  the statement:\n{}", written.join("\n"))
            };
            let bound = bind_parameters(sql).map_err(|e| refused(&e))?;
            let returns_rows = store
                .check_statement(&bound.sql, bound.parameters.len())
                .map_err(|e| refused(&e))?;
            if returns_rows {
                return Err(refused(
                    "it returns rows (a SELECT, or RETURNING); an effect's statements change \
                     data and return nothing",
                ));
            }
            statements.push(bound);
        }
        let compiled = SqlEffect {
            index,
            config: effect.clone(),
            statements,
        };
        match by_source.iter_mut().find(|(s, _)| *s == effect.source) {
            Some((_, list)) => list.push(compiled),
            None => by_source.push((effect.source.clone(), vec![compiled])),
        }
    }
    Ok(by_source)
}

/// A server running on its own runtime thread (for the demo and for embedding tests).
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl RunningServer {
    /// Binds `config.listen` (port 0 picks a free port) and starts serving.
    pub fn start(config: Config) -> Result<RunningServer, Error> {
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
                runtime
                    .block_on(hookledger.serve(listener, async {
                        let _ = stopped.await;
                    }))
                    .map_err(anyhow::Error::from)
            })?;
        Ok(RunningServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Shuts down gracefully and waits until everything acknowledged is committed.
    pub fn stop(mut self) -> Result<(), Error> {
        self.shutdown().map_err(Error::from)
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

/// Each delivery kind's target as the console shows it: a URL as `scheme://host[:port]` with
/// its path and query shown as `/…` and `?…` (credentials, a Slack or Discord webhook's path
/// and a query can each hold a secret), or a command's program without its arguments (which
/// can hold a token).
fn shown_targets(config: &Config) -> Vec<(String, String)> {
    let url = crate::delivery::shown_url;
    let mut targets = Vec::new();
    if let Some(forward) = &config.forward {
        targets.push((crate::outbox::FORWARD.to_string(), url(&forward.url)));
    }
    for d in &config.deliveries {
        let shown = match (&d.command, d.url.as_str(), &config.forward) {
            (Some(argv), _, _) => match argv.as_slice() {
                [program] => program.clone(),
                [program, ..] => format!("{program} …"),
                [] => String::new(),
            },
            (None, "", Some(forward)) => url(&forward.url),
            (None, u, _) => url(u),
        };
        targets.push((d.kind.clone(), shown));
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Prepared;
    use crate::sql::StoreError;
    use crate::sql::Tx;

    struct Nothing;

    impl Handler for Nothing {
        fn name(&self) -> &str {
            "nothing"
        }

        fn handle(&self, _: &Tx<'_>, _: &crate::Event, _: Prepared) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[test]
    fn targets_are_shown_without_credentials_path_or_query_and_commands_without_arguments() {
        let mut deploy = crate::DeliveryConfig::new("deploy", "");
        deploy.command = Some(vec![
            "/usr/bin/notify".into(),
            "--token".into(),
            "tok_s3cret_argv".into(),
        ]);
        let mut bare = crate::DeliveryConfig::new("bare", "");
        bare.command = Some(vec!["/usr/local/bin/on-event".into()]);
        let config = Config {
            forward: Some(ForwardConfig::new(
                "https://user:p4ss@app.example/hooks?key=s3cret",
                Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            )),
            deliveries: vec![
                crate::DeliveryConfig::new("receipt", "http://mail.example:8025/send"),
                crate::DeliveryConfig::new(
                    "slack",
                    "https://hooks.slack.example/services/T000/B000/s3cretPathPart",
                ),
                crate::DeliveryConfig::new("root", "http://10.0.0.7:9000/"),
                crate::DeliveryConfig::new("same", ""),
                deploy,
                bare,
            ],
            ..Config::default()
        };
        let shown = shown_targets(&config);
        let text: Vec<(&str, &str)> = shown
            .iter()
            .map(|(k, t)| (k.as_str(), t.as_str()))
            .collect();
        assert_eq!(
            text,
            [
                ("forward", "https://app.example/…?…"),
                ("receipt", "http://mail.example:8025/…"),
                ("slack", "https://hooks.slack.example/…"),
                ("root", "http://10.0.0.7:9000"),
                ("same", "https://app.example/…?…"),
                ("deploy", "/usr/bin/notify …"),
                ("bare", "/usr/local/bin/on-event"),
            ]
        );
        let all = format!("{shown:?}");
        for secret in [
            "p4ss",
            "s3cret",
            "T000",
            "tok_s3cret_argv",
            "--token",
            "key=",
        ] {
            assert!(!all.contains(secret), "{secret} in {all}");
        }
    }

    #[test]
    fn shutdown_ends_even_while_an_app_still_holds_a_router() {
        let dir = tempfile::tempdir().unwrap();
        let hookledger = Hookledger::builder()
            .database(dir.path().join("h.db"))
            .source(SourceConfig::stripe(vec![crate::Secret::new(
                "whsec_a_secret_of_some_length",
            )]))
            .build()
            .unwrap();
        let kept = hookledger.router();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let stopped = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), hookledger.shutdown()).await
        });
        assert!(matches!(stopped, Ok(Ok(()))), "shutdown hung or failed");
        drop(kept);
    }

    #[test]
    fn a_handler_for_a_source_that_does_not_exist_is_refused_before_the_database_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("h.db");
        let err = Hookledger::builder()
            .database(&db)
            .source(SourceConfig::stripe(vec![crate::Secret::new(
                "whsec_a_secret_of_some_length",
            )]))
            .handler("gh", Nothing)
            .build()
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("handler `nothing`: there is no source `gh`"),
            "{err}"
        );
        assert!(!db.exists());
    }
}
