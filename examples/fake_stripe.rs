//! A fake Stripe API (test only): the few read endpoints `hookledger reconcile` uses, with
//! Stripe's auth, pagination and error shapes, and switches to make it fail or stall.
//!
//! ```sh
//! cargo run --example fake_stripe -- --events tests/fixtures/stripe/events --recent
//! export STRIPE_API_KEY=sk_test_fake_0123456789
//! curl -H "Authorization: Bearer $STRIPE_API_KEY" \
//!     'http://127.0.0.1:12111/v1/events?limit=2&created%5Bgte%5D=1724636056'
//! hookledger reconcile --source stripe --since 30d \
//!     --api-base http://127.0.0.1:12111 --api-key env:STRIPE_API_KEY
//! ```
//!
//! Serves `GET /v1/events` (`limit`, `created[gt|gte|lt|lte]`, `starting_after`, `type`;
//! newest first), `GET /v1/events/{id}` and `GET /v1/subscriptions/{id}`. Every `/v1` call
//! needs `Authorization: Bearer <key>`; anything else answers Stripe's error JSON. Events
//! and subscriptions are served exactly as their JSON text came in (a client may keep the
//! raw bytes, as `hookledger reconcile` does); the text of a [`serde_json::Value`] given to
//! [`FakeStripe::add_event`] is its `to_string()`.
//!
//! Control routes, without auth, to drive it from a shell (tests call [`FakeStripe`]'s
//! methods instead). They are for testing only: anyone who can reach the port can change
//! what the fake answers.
//!
//! - `POST /_fake/events`: the body is one event or an array of events, each with `id`
//!   and `created`; an event whose `id` is already stored replaces it.
//! - `POST /_fake/subscriptions`: the body is a subscription object, stored by its `id`.
//! - `POST /_fake/fail?status=429&count=2`: the next `count` (default 1) API calls answer
//!   `status`, to watch a client back off.
//! - `POST /_fake/repeat`: from now on `GET /v1/events` ignores `starting_after` and answers
//!   its first page with `has_more: true`, as a broken API might: a client must not loop.
//!
//! ```sh
//! curl -X POST --data-binary @tests/fixtures/stripe/events/invoice.paid.json \
//!     http://127.0.0.1:12111/_fake/events
//! curl -X POST 'http://127.0.0.1:12111/_fake/fail?status=429&count=2'
//! ```
//!
//! Integration tests include this file as a module and call [`FakeStripe::start`], so it
//! avoids crate-level attributes and `main` is dead code there.

use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Stripe's page size when `limit` is absent.
const DEFAULT_LIMIT: usize = 10;
/// Stripe's largest accepted `limit`.
const MAX_LIMIT: usize = 100;
/// Large enough for every fixture event posted as one array, small enough that a stray
/// upload cannot exhaust a test machine's memory.
const MAX_CONTROL_BODY_BYTES: usize = 16 << 20;

/// A fake Stripe API server on its own thread and runtime, so that blocking tests and
/// `#[tokio::test]`s can both use it. Dropping it leaves the thread serving until the
/// process exits.
#[allow(unreachable_pub)] // reachable when a test crate includes this file
pub struct FakeStripe {
    /// Where it listens: the API base is [`FakeStripe::url`].
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    /// Never joined: dropping the handle detaches the server, so drop never blocks.
    _server: std::thread::JoinHandle<()>,
}

/// One API call as the fake saw it, for tests to assert what a client asked for.
#[allow(unreachable_pub)] // reachable when a test crate includes this file
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: String,
    pub path_and_query: String,
    /// The status answered; for a call still waiting out its delay (or whose client gave
    /// up), the status it was going to get.
    pub status: u16,
    /// The JSON text answered (or going to be).
    pub body: String,
}

#[allow(unreachable_pub)] // reachable when a test crate includes this file
impl FakeStripe {
    /// Binds 127.0.0.1:0 and serves on a thread of its own (its own tokio current-thread
    /// runtime); `key` is the only accepted secret key.
    ///
    /// # Panics
    /// If the port cannot be bound or the runtime cannot start: a broken test machine.
    pub fn start(key: &str) -> FakeStripe {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake Stripe: binding 127.0.0.1:0");
        FakeStripe::start_on(listener, key)
    }

    /// Serves on an already bound listener.
    ///
    /// # Panics
    /// If the listener cannot be handed to tokio or the runtime cannot start.
    pub fn start_on(listener: TcpListener, key: &str) -> FakeStripe {
        FakeStripe::try_start_on(listener, key).expect("fake Stripe: starting the server")
    }

    /// `http://127.0.0.1:PORT`, the API base a client is given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stores an event for listing and retrieval; one with the `id` of a stored event
    /// replaces it in place.
    ///
    /// # Panics
    /// If the event has no string `id` or no integer `created`: listing cannot order it.
    pub fn add_event(&self, event: serde_json::Value) {
        match StoredEvent::parse(&event.to_string()) {
            Ok(event) => self.shared.lock().add_event(event),
            Err(problem) => panic!("fake Stripe: add_event: {problem}"),
        }
    }

    /// Stores a subscription, answered by `GET /v1/subscriptions/{id}`.
    ///
    /// # Panics
    /// If the object has no string `id`.
    pub fn set_subscription(&self, object: serde_json::Value) {
        let id = match object_id(&object) {
            Ok(id) => id.to_owned(),
            Err(problem) => panic!("fake Stripe: set_subscription: {problem}"),
        };
        self.shared
            .lock()
            .subscriptions
            .insert(id, object.to_string());
    }

    /// The next `count` API calls (to /v1/...) answer `status` (429 or 500 typically) with a
    /// Stripe-shaped error body. Calls queue behind failures already pending.
    ///
    /// # Panics
    /// If `status` is not an error status (400..=599).
    pub fn fail_next(&self, status: u16, count: usize) {
        let status =
            failure_status(status).unwrap_or_else(|problem| panic!("fake Stripe: {problem}"));
        self.shared.lock().fail_next(status, count);
    }

    /// From now on `GET /v1/events` answers its first page again whatever the cursor, with
    /// `has_more: true`: an API that never ends its list.
    pub fn repeat_page(&self) {
        self.shared.lock().repeat_page = true;
    }

    /// The `n`-th API call from now on (1 = the next one) waits `delay` before it is answered.
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn delay_call(&self, n: usize, delay: Duration) {
        assert!(
            n >= 1,
            "fake Stripe: delay_call counts from 1 (the next call)"
        );
        let mut store = self.shared.lock();
        let at = store.seen + n as u64;
        store.delays.insert(at, delay);
    }

    /// Every API call so far (method, path with query, status answered), in order; control
    /// routes are not recorded.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Like `start_on`, but hands failures to `main`, which reports them instead of panicking.
    fn try_start_on(listener: TcpListener, key: &str) -> std::io::Result<FakeStripe> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Registering the socket needs the runtime entered; doing it here rather than on
        // the server thread makes a failure the caller's error, not a silent dead server.
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            key: key.to_owned(),
            store: Mutex::default(),
        });
        let router = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&shared));
        let server = std::thread::Builder::new()
            .name("fake-stripe".to_owned())
            .spawn(move || {
                if let Err(e) = runtime.block_on(async { axum::serve(listener, router).await }) {
                    eprintln!("fake Stripe: server stopped: {e}");
                }
            })?;
        Ok(FakeStripe {
            addr,
            shared,
            _server: server,
        })
    }
}

/// What the handle and the server thread share.
struct Shared {
    /// The only secret key `/v1` calls may present.
    key: String,
    store: Mutex<Store>,
}

impl Shared {
    /// The store, even after a panic left the lock poisoned: nothing panics while holding
    /// it, so a poisoned store is still whole, and one failed test assertion should not turn
    /// every later answer into a second panic.
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Everything the fake answers from, and the record of what it was asked.
#[derive(Default)]
struct Store {
    /// In the order added, which breaks ties between equal `created` (later added, listed first).
    events: Vec<StoredEvent>,
    /// Each subscription's JSON text, by `id`.
    subscriptions: HashMap<String, String>,
    /// Statuses that the next API calls answer instead, the next call's at the front.
    failures: VecDeque<StatusCode>,
    /// Delays by the call's sequence number (the first API call is 1).
    delays: HashMap<u64, Duration>,
    /// API calls received so far: the sequence number of the latest.
    seen: u64,
    /// `GET /v1/events` answers its first page, saying there is more ([`FakeStripe::repeat_page`]).
    repeat_page: bool,
    calls: Vec<Call>,
}

impl Store {
    fn add_event(&mut self, event: StoredEvent) {
        match self.events.iter_mut().find(|stored| stored.id == event.id) {
            Some(stored) => *stored = event,
            None => self.events.push(event),
        }
    }

    fn fail_next(&mut self, status: StatusCode, count: usize) {
        self.failures.extend(std::iter::repeat_n(status, count));
    }

    fn event(&self, id: &str) -> Option<&StoredEvent> {
        self.events.iter().find(|event| event.id == id)
    }

    /// The events in Stripe's list order: newest `created` first, and among equal
    /// `created` the one added later first.
    fn events_newest_first(&self) -> Vec<&StoredEvent> {
        let mut order: Vec<(usize, &StoredEvent)> = self.events.iter().enumerate().collect();
        order.sort_by_key(|&(added, event)| Reverse((event.created, added)));
        order.into_iter().map(|(_, event)| event).collect()
    }
}

/// An event as added: its JSON text, served byte for byte (a client may keep the raw
/// bytes, as `hookledger reconcile` does), and the fields listing filters on.
struct StoredEvent {
    id: String,
    created: i64,
    kind: Option<String>,
    json: String,
}

impl StoredEvent {
    /// Refuses JSON without a string `id` or an integer `created`: listing cannot order it.
    fn parse(json: &str) -> Result<StoredEvent, String> {
        let event: Value = serde_json::from_str(json).map_err(|e| format!("invalid JSON: {e}"))?;
        let id = object_id(&event)?.to_owned();
        let created = event
            .get("created")
            .and_then(Value::as_i64)
            .ok_or("an event needs an integer \"created\"")?;
        Ok(StoredEvent {
            id,
            created,
            kind: event.get("type").and_then(Value::as_str).map(str::to_owned),
            json: json.trim().to_owned(),
        })
    }
}

fn object_id(object: &Value) -> Result<&str, String> {
    match object.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => Ok(id),
        _ => Err("the object needs a string \"id\"".to_owned()),
    }
}

/// Only error statuses: a "failure" answering 200 would test nothing.
fn failure_status(status: u16) -> Result<StatusCode, String> {
    match StatusCode::from_u16(status) {
        Ok(code) if code.is_client_error() || code.is_server_error() => Ok(code),
        _ => Err(format!(
            "the failure status must be 400..=599, not {status}"
        )),
    }
}

/// The one handler: control routes, or an API call answered after its delay.
async fn answer(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    if request.uri().path().starts_with("/_fake/") {
        return control(&shared, request).await;
    }
    let (status, body, delay) =
        api_call(&shared, request.method(), request.uri(), request.headers());
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    json_response(status, body)
}

/// Every answer is JSON text, so that stored events go out exactly as they came in.
fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Decides and records an API call's answer in one critical section, so `calls()` lists
/// calls in the order they arrived even when some are delayed.
fn api_call(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> (StatusCode, String, Option<Duration>) {
    let mut store = shared.lock();
    store.seen += 1;
    let seq = store.seen;
    let delay = store.delays.remove(&seq);
    // An overloaded API fails before it looks at the key, and Stripe checks the key before
    // the URL.
    let answered = match store.failures.pop_front() {
        Some(status) => Err(StripeError::injected(status)),
        None if !authorized(headers, &shared.key) => Err(StripeError::bad_key()),
        None => route(&store, method, uri),
    };
    let (status, body) = match answered {
        Ok(body) => (StatusCode::OK, body),
        Err(error) => (error.status, error.body()),
    };
    store.calls.push(Call {
        method: method.to_string(),
        path_and_query: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), ToString::to_string),
        status: status.as_u16(),
        body: body.clone(),
    });
    (status, body, delay)
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        == Some(key)
}

/// The API's endpoints, answering JSON text; anything else is Stripe's "unrecognized
/// request URL". Ids in the path are matched as sent (Stripe's ids need no escaping).
fn route(store: &Store, method: &Method, uri: &Uri) -> Result<String, StripeError> {
    let segments: Vec<&str> = match uri.path().strip_prefix("/v1/") {
        Some(rest) => rest.split('/').collect(),
        None => Vec::new(),
    };
    match (method, segments.as_slice()) {
        (&Method::GET, ["events"]) => list_events(store, uri.query()),
        (&Method::GET, ["events", id]) if !id.is_empty() => store
            .event(id)
            .map(|event| event.json.clone())
            .ok_or_else(|| StripeError::no_such("event", id)),
        (&Method::GET, ["subscriptions", id]) if !id.is_empty() => store
            .subscriptions
            .get(*id)
            .cloned()
            .ok_or_else(|| StripeError::no_such("subscription", id)),
        _ => Err(StripeError::unrecognized(method, uri)),
    }
}

/// `GET /v1/events`: one page, newest first, after the `starting_after` cursor.
fn list_events(store: &Store, query: Option<&str>) -> Result<String, StripeError> {
    let params = ListParams::parse(query.unwrap_or(""))?;
    let ordered = store.events_newest_first();
    // The cursor is a position in the unfiltered order, so it need not match the filters.
    let start = match &params.starting_after {
        _ if store.repeat_page => 0,
        None => 0,
        Some(cursor) => match ordered.iter().position(|event| event.id == *cursor) {
            Some(at) => at + 1,
            None => return Err(StripeError::no_such("event", cursor).with_param("starting_after")),
        },
    };
    let mut matching = ordered[start..]
        .iter()
        .filter(|event| params.matches(event));
    let data: Vec<&str> = matching
        .by_ref()
        .take(params.limit)
        .map(|event| event.json.as_str())
        .collect();
    let has_more = matching.next().is_some() || store.repeat_page;
    // Built as text so that each event is served exactly as it was added.
    Ok(format!(
        r#"{{"object":"list","url":"/v1/events","has_more":{has_more},"data":[{}]}}"#,
        data.join(",")
    ))
}

/// `GET /v1/events` query parameters.
struct ListParams {
    limit: usize,
    created_gt: Option<i64>,
    created_gte: Option<i64>,
    created_lt: Option<i64>,
    created_lte: Option<i64>,
    starting_after: Option<String>,
    kind: Option<String>,
}

impl ListParams {
    /// Like Stripe, refuses a parameter it does not know rather than ignore it: a client
    /// sending `ending_before` or a misspelt filter would otherwise pass on wrong data.
    fn parse(query: &str) -> Result<ListParams, StripeError> {
        let mut params = ListParams {
            limit: DEFAULT_LIMIT,
            created_gt: None,
            created_gte: None,
            created_lt: None,
            created_lte: None,
            starting_after: None,
            kind: None,
        };
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match name.as_ref() {
                "limit" => params.limit = parse_limit(&value)?,
                "created[gt]" => params.created_gt = Some(parse_timestamp(&name, &value)?),
                "created[gte]" => params.created_gte = Some(parse_timestamp(&name, &value)?),
                "created[lt]" => params.created_lt = Some(parse_timestamp(&name, &value)?),
                "created[lte]" => params.created_lte = Some(parse_timestamp(&name, &value)?),
                "starting_after" => params.starting_after = Some(value.into_owned()),
                "type" => params.kind = Some(value.into_owned()),
                _ => return Err(StripeError::unknown_parameter(&name)),
            }
        }
        Ok(params)
    }

    fn matches(&self, event: &StoredEvent) -> bool {
        let created = event.created;
        self.created_gt.is_none_or(|bound| created > bound)
            && self.created_gte.is_none_or(|bound| created >= bound)
            && self.created_lt.is_none_or(|bound| created < bound)
            && self.created_lte.is_none_or(|bound| created <= bound)
            && self
                .kind
                .as_ref()
                .is_none_or(|kind| event.kind.as_ref() == Some(kind))
    }
}

fn parse_limit(value: &str) -> Result<usize, StripeError> {
    match value.parse::<usize>() {
        Ok(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
        _ => Err(StripeError::invalid(
            "limit",
            format!("Invalid limit: must be an integer between 1 and {MAX_LIMIT}, got '{value}'"),
        )),
    }
}

fn parse_timestamp(name: &str, value: &str) -> Result<i64, StripeError> {
    value
        .parse()
        .map_err(|_| StripeError::invalid(name, format!("Invalid integer: {value}")))
}

/// A Stripe error answer: the HTTP status and the fields of the `error` object.
struct StripeError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<String>,
    message: String,
}

impl StripeError {
    fn invalid(param: &str, message: String) -> StripeError {
        StripeError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            param: Some(param.to_owned()),
            message,
        }
    }

    fn unknown_parameter(name: &str) -> StripeError {
        StripeError::invalid(name, format!("Received unknown parameter: {name}"))
    }

    /// 404 for a retrieval; `with_param` turns it into Stripe's 400 for a bad cursor.
    fn no_such(resource: &str, id: &str) -> StripeError {
        StripeError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: Some("resource_missing"),
            param: None,
            message: format!("No such {resource}: '{id}'"),
        }
    }

    fn with_param(self, param: &str) -> StripeError {
        StripeError {
            status: StatusCode::BAD_REQUEST,
            param: Some(param.to_owned()),
            ..self
        }
    }

    /// Never echoes the key presented: it may be a real one sent to the wrong place.
    fn bad_key() -> StripeError {
        StripeError {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            code: None,
            param: None,
            message: "Invalid API Key provided: sk_****".to_owned(),
        }
    }

    fn unrecognized(method: &Method, uri: &Uri) -> StripeError {
        StripeError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: None,
            param: None,
            message: format!("Unrecognized request URL ({method}: {}).", uri.path()),
        }
    }

    /// The bodies Stripe sends when rate limiting and on its own errors.
    fn injected(status: StatusCode) -> StripeError {
        if status == StatusCode::TOO_MANY_REQUESTS {
            StripeError {
                status,
                kind: "invalid_request_error",
                code: Some("rate_limit"),
                param: None,
                message: "Too many requests hit the API too quickly.".to_owned(),
            }
        } else {
            StripeError {
                status,
                kind: "api_error",
                code: None,
                param: None,
                message: "An unknown error occurred".to_owned(),
            }
        }
    }

    fn body(&self) -> String {
        let mut error = json!({"type": self.kind, "message": self.message});
        if let Some(code) = self.code {
            error["code"] = json!(code);
        }
        if let Some(param) = &self.param {
            error["param"] = json!(param);
        }
        json!({ "error": error }).to_string()
    }
}

/// The control routes (module doc); errors use the API's error shape.
async fn control(shared: &Shared, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let done = match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/_fake/events") => match read_text(body).await {
            Ok(text) => add_events(shared, &text),
            Err(error) => Err(error),
        },
        (&Method::POST, "/_fake/subscriptions") => match read_text(body).await {
            Ok(text) => set_subscription(shared, &text),
            Err(error) => Err(error),
        },
        (&Method::POST, "/_fake/fail") => fail_from_query(shared, parts.uri.query().unwrap_or("")),
        (&Method::POST, "/_fake/repeat") => {
            shared.lock().repeat_page = true;
            Ok(json!({ "repeat_page": true }))
        }
        _ => Err(StripeError::unrecognized(&parts.method, &parts.uri)),
    };
    match done {
        Ok(reply) => json_response(StatusCode::OK, reply.to_string()),
        Err(error) => json_response(error.status, error.body()),
    }
}

async fn read_text(body: Body) -> Result<String, StripeError> {
    let bytes = axum::body::to_bytes(body, MAX_CONTROL_BODY_BYTES)
        .await
        .map_err(|e| StripeError::invalid("body", format!("Could not read the body: {e}")))?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| StripeError::invalid("body", "The body is not UTF-8".to_owned()))
}

/// Adds all the events in `text` (one event or an array) or, if one is not an event, none.
fn add_events(shared: &Shared, text: &str) -> Result<Value, StripeError> {
    let invalid = |problem: String| StripeError::invalid("body", problem);
    // Split an array without re-serialising its elements, so each keeps its exact text.
    let items: Vec<Box<RawValue>> = if text.trim_start().starts_with('[') {
        serde_json::from_str(text).map_err(|e| invalid(format!("invalid JSON: {e}")))?
    } else {
        vec![serde_json::from_str(text).map_err(|e| invalid(format!("invalid JSON: {e}")))?]
    };
    let events = items
        .iter()
        .enumerate()
        .map(|(at, item)| {
            StoredEvent::parse(item.get()).map_err(|p| invalid(format!("event {at}: {p}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let added = events.len();
    let mut store = shared.lock();
    for event in events {
        store.add_event(event);
    }
    Ok(json!({ "added": added }))
}

fn set_subscription(shared: &Shared, text: &str) -> Result<Value, StripeError> {
    let invalid = |problem: String| StripeError::invalid("body", problem);
    let object: Value =
        serde_json::from_str(text).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
    let id = object_id(&object).map_err(invalid)?.to_owned();
    shared
        .lock()
        .subscriptions
        .insert(id.clone(), text.trim().to_owned());
    Ok(json!({ "id": id }))
}

fn fail_from_query(shared: &Shared, query: &str) -> Result<Value, StripeError> {
    let mut status = None;
    let mut count = 1;
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let bad = || StripeError::invalid(&name, format!("Invalid {name}: {value}"));
        match name.as_ref() {
            "status" => status = Some(value.parse::<u16>().map_err(|_| bad())?),
            "count" => count = value.parse::<usize>().map_err(|_| bad())?,
            _ => return Err(StripeError::unknown_parameter(&name)),
        }
    }
    let status =
        status.ok_or_else(|| StripeError::invalid("status", "Missing status".to_owned()))?;
    let status =
        failure_status(status).map_err(|problem| StripeError::invalid("status", problem))?;
    shared.lock().fail_next(status, count);
    Ok(json!({ "status": status.as_u16(), "count": count }))
}

/// Command line of the example binary.
#[derive(clap::Parser)]
#[command(about = "A fake Stripe API (test only), for trying `hookledger reconcile`")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:12111")]
    listen: SocketAddr,
    /// The only secret key accepted (`Authorization: Bearer <key>`).
    #[arg(
        long,
        env = "FAKE_STRIPE_KEY",
        default_value = "sk_test_fake_0123456789",
        hide_env_values = true
    )]
    key: String,
    /// Load every `*.json` file in DIR as an event (e.g. tests/fixtures/stripe/events).
    #[arg(long, value_name = "DIR")]
    events: Option<PathBuf>,
    /// Move the loaded events' `created` into the last hours, a minute apart in their order
    /// (the fixtures are from 2024: older than any reconcile looks back).
    #[arg(long, requires = "events")]
    recent: bool,
}

/// Only turns `run`'s result into an exit code: 2 and a message for a start-up failure.
fn main() -> ExitCode {
    match run(<Args as clap::Parser>::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake_stripe: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("binding {}", args.listen))?;
    let fake = FakeStripe::try_start_on(listener, &args.key).context("starting the server")?;
    if let Some(dir) = &args.events {
        load_events(&fake, dir, args.recent)?;
    }
    // The full key: it is a test key, and the user needs it for their client.
    println!("fake Stripe API on {} (key {})", fake.url(), args.key);
    std::io::stdout().flush()?;
    wait_for_ctrl_c()
}

/// Adds every `*.json` file in `dir` as an event, in file-name order (which orders events
/// with equal `created`); files that are not events are skipped with a message. With
/// `recent`, the events are dated a minute apart, ending now, in the order of their `created`.
fn load_events(fake: &FakeStripe, dir: &Path, recent: bool) -> anyhow::Result<()> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.extension().is_some_and(|ext| ext == "json") {
            paths.push(path);
        }
    }
    paths.sort();
    let mut events = Vec::new();
    for path in paths {
        match read_event(&path) {
            Ok(event) => events.push(event),
            Err(problem) => eprintln!("fake_stripe: skipping {}: {problem}", path.display()),
        }
    }
    if recent {
        events = redated(events)?;
    }
    for event in events {
        fake.shared.lock().add_event(event);
    }
    Ok(())
}

/// `events` dated a minute apart up to now, in the order of their `created` (re-serialised).
fn redated(mut events: Vec<StoredEvent>) -> anyhow::Result<Vec<StoredEvent>> {
    events.sort_by_key(|e| e.created);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let count = events.len() as i64;
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| {
            let mut value: Value = serde_json::from_str(&event.json)?;
            value["created"] = json!(now - (count - i as i64) * 60);
            StoredEvent::parse(&value.to_string()).map_err(anyhow::Error::msg)
        })
        .collect()
}

fn read_event(path: &Path) -> Result<StoredEvent, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    StoredEvent::parse(&text)
}

fn wait_for_ctrl_c() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tokio::signal::ctrl_c())?;
    Ok(())
}
