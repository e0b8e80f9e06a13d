//! Logs, traces and metrics as a collector reads them: JSON log lines with their fields,
//! OpenTelemetry spans at an OTLP receiver run by the test (and the `traceparent` of a
//! delivery), and `/metrics` as `promtool` and an OpenMetrics parser read it.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const FORWARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A server forwarding to `app`, with `extra` arguments and environment.
fn forwarding(app: &FakeApp, extra: &[&str], env: &[(&str, &str)]) -> (Server, TestDir) {
    let dir = test_dir();
    let url = app.url();
    let mut args = vec!["--forward-to", url.as_str()];
    args.extend_from_slice(extra);
    let mut env = env.to_vec();
    env.push(("HOOKLEDGER_FORWARD_SECRET", FORWARD_SECRET));
    env.push(("RUST_LOG", "info"));
    let server = Server::start_with_env(dir.path(), &args, &env);
    (server, dir)
}

/// The log's lines as JSON objects (each line must be one).
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// `--log-format json` (here through `HOOKLEDGER_LOG_FORMAT`): a request's outcome, a refusal
/// and a delivery attempt are lines whose fields say what happened (source, event id,
/// outcome, status, reason; kind, row id, result), and start-up says the version; no secret,
/// no signature and no body is in any line.
#[test]
fn json_log_lines_carry_the_fields_of_requests_refusals_and_deliveries() {
    let app = FakeApp::start(&[]);
    let (server, _dir) = forwarding(&app, &[], &[("HOOKLEDGER_LOG_FORMAT", "json")]);
    let body = paid_invoice("evt_fields", "in_fields");
    assert_outcome(&server.send(&body), "evt_fields", "processed");
    let forged = server.post(
        "/webhooks/stripe",
        &paid("evt_forged"),
        &[("Stripe-Signature", &forged_signature())],
    );
    assert_error(&forged, 400, "invalid_signature");
    app.wait_delivered(1, Duration::from_secs(20));
    wait_outbox_status(&server.db(), "evt_fields", "done", Duration::from_secs(20));
    let log = wait_for(Duration::from_secs(10), || {
        let log = server.log();
        log.contains(r#""result":"delivered""#).then_some(log)
    })
    .unwrap_or_else(|| panic!("no delivery line in: {}", server.log()));
    let lines = json_lines(&log);
    let find = |what: &str, f: &dyn Fn(&Value) -> bool| {
        lines
            .iter()
            .find(|l| f(l))
            .unwrap_or_else(|| panic!("no {what} line in:\n{log}"))
            .clone()
    };
    let answered = find("request", &|l| {
        l["event_id"] == "evt_fields" && l["outcome"].is_string()
    });
    assert_eq!(answered["source"], "stripe", "{answered}");
    assert_eq!(answered["outcome"], "processed", "{answered}");
    assert_eq!(answered["status"], 200, "{answered}");
    assert_eq!(answered["event_type"], "invoice.paid", "{answered}");
    assert_eq!(answered["level"], "INFO", "{answered}");
    assert!(answered["duration_ms"].is_number(), "{answered}");
    let refused = find("refusal", &|l| l["reason"] == "invalid_signature");
    assert_eq!(refused["source"], "stripe", "{refused}");
    assert_eq!(refused["status"], 400, "{refused}");
    assert_eq!(refused["outcome"], "refused", "{refused}");
    assert_eq!(refused["level"], "WARN", "{refused}");
    let delivered = find("delivery", &|l| l["result"] == "delivered");
    let row_id = server
        .db()
        .strings("SELECT CAST(id AS TEXT) FROM outbox WHERE key = 'evt_fields'");
    assert_eq!(delivered["kind"], "forward", "{delivered}");
    assert_eq!(delivered["event_id"], "evt_fields", "{delivered}");
    assert_eq!(
        delivered["row_id"].to_string(),
        row_id[0],
        "{delivered} {row_id:?}"
    );
    assert_eq!(delivered["attempt"], 1, "{delivered}");
    let started = find("start-up", &|l| l["version"].is_string());
    assert_eq!(started["version"], env!("CARGO_PKG_VERSION"), "{started}");
    for l in &lines {
        for key in ["ts", "level", "target", "message"] {
            assert!(l[key].is_string(), "no {key} in {l}");
        }
    }
    let signature = &app.deliveries()[0].headers["webhook-signature"];
    for secret in [SECRET, FORWARD_SECRET, signature.as_str(), "jenny.rosen"] {
        assert!(!log.contains(secret), "`{secret}` is in the log");
    }
}

/// The text format (the default) writes the same fields as `key=value`, a value with a space
/// or a quote quoted, so that a value cannot make a field or a line of its own.
#[test]
fn text_log_lines_carry_the_fields_as_key_value() {
    let server = Server::start(&[]);
    assert_outcome(&server.send(&paid("evt_text")), "evt_text", "processed");
    let log = wait_for(Duration::from_secs(10), || {
        let log = server.log();
        log.contains("event_id=evt_text").then_some(log)
    })
    .unwrap_or_else(|| panic!("no request line in: {}", server.log()));
    let line = log
        .lines()
        .find(|l| l.contains("event_id=evt_text"))
        .unwrap();
    for field in [
        "source=stripe",
        "outcome=processed",
        "status=200",
        "event_type=invoice.paid",
    ] {
        assert!(line.contains(field), "no {field} in {line}");
    }
    assert!(line.contains(" INFO "), "{line}");
    // A source name from the URL, with a space and a quote, stays in its field.
    let reply = server.post("/webhooks/no%20such%22source", b"{}", &[]);
    assert_error(&reply, 404, "unknown_source");
    let log = wait_for(Duration::from_secs(10), || {
        let log = server.log();
        log.contains("reason=unknown_source").then_some(log)
    })
    .unwrap_or_else(|| panic!("no refusal line in: {}", server.log()));
    let line = log
        .lines()
        .find(|l| l.contains("reason=unknown_source"))
        .unwrap();
    assert!(
        line.contains(r#"source="no such\\\"source""#),
        "the source is not quoted: {line}"
    );
}

/// One request of the OTLP receiver: its body as JSON.
fn spans_received(collector: &FakeApp) -> Vec<Value> {
    let mut spans = Vec::new();
    for request in collector.deliveries() {
        let body: Value = serde_json::from_slice(&request.body)
            .unwrap_or_else(|e| panic!("OTLP body is not JSON ({e})"));
        assert_eq!(request.headers["content-type"], "application/json");
        for resource in body["resourceSpans"].as_array().expect("resourceSpans") {
            let service = &resource["resource"]["attributes"][0];
            assert_eq!(service["key"], "service.name");
            assert_eq!(service["value"]["stringValue"], "hookledger");
            for scope in resource["scopeSpans"].as_array().expect("scopeSpans") {
                spans.extend(scope["spans"].as_array().expect("spans").iter().cloned());
            }
        }
    }
    spans
}

/// A span's attributes as strings (OTLP JSON: `intValue` is a decimal string).
fn attributes(span: &Value) -> HashMap<String, String> {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let v = &a["value"];
            let value = v["stringValue"]
                .as_str()
                .or_else(|| v["intValue"].as_str())
                .unwrap_or_else(|| panic!("unexpected value {v}"));
            (a["key"].as_str().unwrap().to_string(), value.to_string())
        })
        .collect()
}

/// One attribute of a span, if it has it.
fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"]["stringValue"].as_str())
}

/// With `--otlp-endpoint`, a span per request arrives at an OTLP/HTTP receiver with its source,
/// event id, outcome and status; the delivery of the event carries a W3C `traceparent` in the
/// request's trace, and its own span is the request span's child; a `traceparent` the sender
/// sent is continued; a refusal's span says why.
#[test]
fn spans_reach_an_otlp_receiver_and_a_delivery_continues_the_request_trace() {
    let collector = FakeApp::start(&[]);
    let app = FakeApp::start(&[]);
    let endpoint = collector.url();
    let (server, _dir) = forwarding(&app, &["--otlp-endpoint", &endpoint], &[]);
    assert_outcome(
        &server.send(&paid_invoice("evt_traced", "in_traced")),
        "evt_traced",
        "processed",
    );
    let delivered = app.wait_delivered(1, Duration::from_secs(20));
    let forged = server.post(
        "/webhooks/stripe",
        &paid("evt_forged"),
        &[("Stripe-Signature", &forged_signature())],
    );
    assert_error(&forged, 400, "invalid_signature");
    // A sender (or a proxy) that traces: its trace goes on.
    let body = paid("evt_parented");
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let reply = server.post(
        "/webhooks/stripe",
        &body,
        &[
            ("Stripe-Signature", &signature(&body)),
            ("traceparent", parent),
        ],
    );
    assert_outcome(&reply, "evt_parented", "processed");
    app.wait_delivered(2, Duration::from_secs(20));

    let spans = wait_for(Duration::from_secs(20), || {
        let spans = spans_received(&collector);
        let names = |name: &str| spans.iter().filter(|s| s["name"] == name).count();
        (names("webhook") >= 3 && names("delivery") >= 2).then_some(spans)
    })
    .unwrap_or_else(|| panic!("spans missing: {:?}", spans_received(&collector)));
    let request = spans
        .iter()
        .find(|s| {
            s["name"] == "webhook" && attribute(s, "hookledger.event_id") == Some("evt_traced")
        })
        .expect("the request's span");
    let a = attributes(request);
    assert_eq!(a["hookledger.source"], "stripe");
    assert_eq!(a["hookledger.outcome"], "processed");
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(request["kind"], 2, "a server span");
    assert_eq!(request["parentSpanId"], "");
    let trace_id = request["traceId"].as_str().unwrap();
    assert_eq!(trace_id.len(), 32);
    let start: u128 = request["startTimeUnixNano"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let end: u128 = request["endTimeUnixNano"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(start > 0 && start <= end, "{request}");

    // The delivery: its header names the request's trace and the delivery span.
    let first = delivered
        .iter()
        .find(|d| d.headers["webhook-id"] == "evt_traced")
        .expect("the delivery of evt_traced");
    let traceparent = &first.headers["traceparent"];
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00", "{traceparent}");
    assert_eq!(
        parts[1], trace_id,
        "the delivery continues the request's trace"
    );
    assert_eq!(parts[3], "01", "{traceparent}");
    let delivery = spans
        .iter()
        .find(|s| s["name"] == "delivery" && s["spanId"] == parts[2])
        .unwrap_or_else(|| panic!("no delivery span {} in {spans:?}", parts[2]));
    assert_eq!(delivery["traceId"], trace_id);
    assert_eq!(delivery["parentSpanId"], request["spanId"]);
    assert_eq!(delivery["kind"], 3, "a client span");
    let d = attributes(delivery);
    assert_eq!(d["hookledger.outbox.kind"], "forward");
    assert_eq!(d["hookledger.outbox.result"], "delivered");
    assert_eq!(d["hookledger.event_id"], "evt_traced");
    let row_id = server.db().strings(
        "SELECT CAST(id AS TEXT) FROM outbox WHERE key = 'evt_traced' AND kind = 'forward'",
    );
    assert_eq!(d["hookledger.outbox.row_id"], row_id[0]);

    let refused = spans
        .iter()
        .find(|s| s["name"] == "webhook" && attribute(s, "hookledger.outcome") == Some("refused"))
        .expect("the refusal's span");
    let r = attributes(refused);
    assert_eq!(r["hookledger.reason"], "invalid_signature");
    assert_eq!(r["http.response.status_code"], "400");
    assert!(!r.contains_key("hookledger.event_id"), "{r:?}");

    let parented = spans
        .iter()
        .find(|s| {
            s["name"] == "webhook" && attribute(s, "hookledger.event_id") == Some("evt_parented")
        })
        .expect("the span of the request with a traceparent");
    assert_eq!(parented["traceId"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(parented["parentSpanId"], "b7ad6b7169203331");
    let second = app
        .deliveries()
        .into_iter()
        .find(|d| d.headers["webhook-id"] == "evt_parented")
        .expect("the delivery of evt_parented");
    assert!(
        second.headers["traceparent"].starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
        "{}",
        second.headers["traceparent"]
    );
    // Without an endpoint, no traceparent is sent: covered by a plain forward elsewhere;
    // here, nothing secret went to the collector.
    for request in collector.deliveries() {
        let body = String::from_utf8_lossy(&request.body);
        for secret in [SECRET, FORWARD_SECRET, "jenny.rosen"] {
            assert!(!body.contains(secret), "`{secret}` went to the collector");
        }
    }
}

/// A collector that is down costs the requests nothing: they are answered as usual, the
/// spans are dropped and counted, and deliveries still go out (with a `traceparent`).
#[test]
fn a_collector_that_is_down_drops_spans_and_delays_no_request() {
    let closed = free_addr();
    let app = FakeApp::start(&[]);
    let endpoint = format!("http://{closed}");
    let (server, _dir) = forwarding(&app, &["--otlp-endpoint", &endpoint], &[]);
    let started = std::time::Instant::now();
    for i in 0..50 {
        let id = format!("evt_down_{i}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(ledger_count(&server.db()), 50);
    let delivered = app.wait_delivered(50, Duration::from_secs(30));
    assert!(delivered
        .iter()
        .all(|d| d.headers.contains_key("traceparent")));
    let dropped = wait_for(Duration::from_secs(20), || {
        let (_, text) = server.admin_get("/metrics");
        let value: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("hookledger_trace_spans_dropped_total "))?
            .parse()
            .ok()?;
        (value >= 50.0).then_some(value)
    });
    assert!(dropped.is_some(), "the dropped spans are not counted");
}

/// Without `otlp_endpoint`, deliveries carry no `traceparent` (no trace to continue).
#[test]
fn without_an_endpoint_a_delivery_has_no_traceparent() {
    let app = FakeApp::start(&[]);
    let (server, _dir) = forwarding(&app, &[], &[]);
    assert_outcome(
        &server.send(&paid("evt_untraced")),
        "evt_untraced",
        "processed",
    );
    let delivered = app.wait_delivered(1, Duration::from_secs(20));
    assert!(!delivered[0].headers.contains_key("traceparent"));
}

/// An endpoint that is not an http(s) URL stops start-up, naming the flag, before the
/// database is created.
#[test]
fn a_bad_otlp_endpoint_stops_start_up_naming_it() {
    for bad in ["ftp://collector:4318", "collector:4318", "http://"] {
        let dir = test_dir();
        let db = db_arg_in(dir.path());
        let output = serve_command(&db)
            .args(["--otlp-endpoint", bad])
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--otlp-endpoint"), "{bad}: {stderr}");
        assert!(
            !dir.path().join("hookledger.db").exists(),
            "{bad}: the database was created"
        );
    }
}

/// A server with two sources' worth of activity and a forward lane: every family in use.
fn busy_server(app: &FakeApp) -> (Server, TestDir) {
    let (server, dir) = forwarding(app, &[], &[]);
    assert_outcome(&server.send(&paid("evt_m1")), "evt_m1", "processed");
    assert_outcome(&server.send(&paid("evt_m1")), "evt_m1", "duplicate");
    let forged = server.post(
        "/webhooks/stripe",
        &paid("evt_forged"),
        &[("Stripe-Signature", &forged_signature())],
    );
    assert_error(&forged, 400, "invalid_signature");
    assert_error(
        &server.post("/webhooks/nope", b"{}", &[]),
        404,
        "unknown_source",
    );
    app.wait_delivered(1, Duration::from_secs(20));
    wait_outbox_status(&server.db(), "evt_m1", "done", Duration::from_secs(20));
    (server, dir)
}

/// `/metrics` from the start: every family there, build info with the version, the request
/// duration by source, the forward lane's attempts and breaker at zero.
#[test]
fn metrics_from_the_start_have_every_family_and_the_known_series_at_zero() {
    let app = FakeApp::start(&[]);
    let (server, _dir) = forwarding(&app, &[], &[]);
    let (status, text) = server.admin_get("/metrics");
    assert_eq!(status, 200, "{text}");
    let build = format!(
        r#"hookledger_build_info{{version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    for line in [
        build.as_str(),
        r#"hookledger_request_duration_seconds_count{source="stripe"} 0"#,
        r#"hookledger_delivery_attempts_total{kind="forward",result="delivered"} 0"#,
        r#"hookledger_delivery_attempts_total{kind="forward",result="dead"} 0"#,
        r#"hookledger_delivery_breaker_open{kind="forward"} 0"#,
        "hookledger_trace_spans_dropped_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    // The writer's queue is there from the start; a background job (the heartbeat, the
    // refusals' flush) may be in it when the scrape comes.
    assert!(
        text.lines()
            .any(|l| l.starts_with("hookledger_writer_queue_depth ")),
        "no writer queue depth in\n{text}"
    );
    for family in [
        "hookledger_events_total",
        "hookledger_rejected_total",
        "hookledger_outbox_rows",
        "hookledger_batch_size",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# TYPE {family} "))),
            "no family {family} in\n{text}"
        );
    }
    assert_outcome(&server.send(&paid("evt_timed")), "evt_timed", "processed");
    app.wait_delivered(1, Duration::from_secs(20));
    let (_, text) = server.admin_get("/metrics");
    for line in [
        r#"hookledger_request_duration_seconds_count{source="stripe"} 1"#,
        r#"hookledger_delivery_attempts_total{kind="forward",result="delivered"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}

/// `promtool check metrics` (Prometheus's own linter, which most users run in CI) finds
/// nothing to say about `/metrics` as curl gets it.
#[test]
fn promtool_checks_metrics_clean() {
    if !prerequisite(
        installed("promtool"),
        "HOOKLEDGER_REQUIRE_PROMTOOL",
        "promtool (Debian package prometheus)",
    ) {
        return;
    }
    let app = FakeApp::start(&[]);
    let (server, _dir) = busy_server(&app);
    let (status, head, text) = server.admin_request("GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{text}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(text.contains("hookledger_events_total{"), "{text}");
    let output = fed(Command::new("promtool").args(["check", "metrics"]), &text);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool: {said}\n{text}");
    assert_eq!(said.trim(), "", "promtool has something to say:\n{said}");
}

/// An OpenMetrics parser (the Python `prometheus_client`'s, strict about the format) reads
/// `/metrics` as a scraper that asks for OpenMetrics gets it, and the Prometheus text parser
/// reads it as curl gets it: the same families and values.
#[test]
fn openmetrics_and_prometheus_parsers_read_metrics() {
    if !prerequisite(
        python_has("prometheus_client.openmetrics.parser"),
        "HOOKLEDGER_REQUIRE_PYTHON_PROMETHEUS",
        "the Python prometheus_client package (python3 -m pip install prometheus-client)",
    ) {
        return;
    }
    let app = FakeApp::start(&[]);
    let (server, _dir) = busy_server(&app);
    let accept = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5";
    let (status, head, openmetrics) =
        server.admin_request("GET", "/metrics", &[("Accept", accept)], b"");
    assert_eq!(status, 200, "{openmetrics}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    let (_, text) = server.admin_get("/metrics");
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
from prometheus_client.parser import text_string_to_metric_families as prom
parse = om if sys.argv[1] == "openmetrics" else prom
out = {}
for family in parse(sys.stdin.read()):
    for s in family.samples:
        key = s.name + json.dumps(s.labels, sort_keys=True)
        out[key] = [family.name, family.type, s.value]
print(json.dumps(out))
"#;
    let parse = |format: &str, input: &str| -> serde_json::Map<String, Value> {
        let output = fed(Command::new("python3").args(["-c", script, format]), input);
        assert!(
            output.status.success(),
            "the {format} parser refused it: {}\n{input}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let om = parse("openmetrics", &openmetrics);
    let prom = parse("prometheus", &text);
    let key = |name: &str, labels: &str| format!("{name}{labels}");
    let events = key(
        "hookledger_events_total",
        r#"{"outcome": "processed", "source": "stripe", "type": "invoice.paid"}"#,
    );
    assert_eq!(om[&events][0], "hookledger_events", "{om:?}");
    assert_eq!(om[&events][1], "counter", "{om:?}");
    assert_eq!(om[&events][2].as_f64(), Some(1.0), "{om:?}");
    let build = key(
        "hookledger_build_info",
        &format!(r#"{{"version": "{}"}}"#, env!("CARGO_PKG_VERSION")),
    );
    assert_eq!(om[&build][1], "info", "{om:?}");
    let rejected = key(
        "hookledger_rejected_total",
        r#"{"reason": "invalid_signature", "source": "stripe"}"#,
    );
    assert_eq!(om[&rejected][2].as_f64(), Some(1.0), "{om:?}");
    // The same samples either way, and the same counts (the writer, the timings and the
    // outbox may move between the two scrapes).
    let values = |m: &serde_json::Map<String, Value>| -> HashMap<String, f64> {
        m.iter()
            .map(|(k, v)| (k.clone(), v[2].as_f64().unwrap()))
            .collect()
    };
    let (om_values, prom_values) = (values(&om), values(&prom));
    let mut om_keys: Vec<&String> = om_values.keys().collect();
    let mut prom_keys: Vec<&String> = prom_values.keys().collect();
    om_keys.sort();
    prom_keys.sort();
    assert_eq!(om_keys, prom_keys);
    for (k, v) in &om_values {
        let counted = [
            "hookledger_events_total",
            "hookledger_rejected_total",
            "hookledger_build",
        ];
        if counted.iter().any(|c| k.starts_with(c)) {
            assert_eq!(prom_values.get(k), Some(v), "{k}");
        }
    }
}

/// Runs `command` with `input` on its stdin; its exit status and what it printed.
fn fed(command: &mut Command, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
