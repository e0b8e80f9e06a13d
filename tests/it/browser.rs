//! The operator's console in a real browser: Debian's `chromium`, headless, driven over the DevTools
//! protocol as a person would use it (a click, typing). Skipped where there is no chromium,
//! except under CI (`HOOKLEDGER_REQUIRE_CHROMIUM`). The screenshots are written to
//! `target/tmp/screenshots/` for people to look at.

use std::path::PathBuf;
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

use crate::admin::{forwarding, start_with_token, TOKEN, WAIT};
use crate::console::{gitlab, start_console, start_console_in, wait_refusals, GITLAB_TOKEN};
use crate::util::*;

/// `HOOKLEDGER_CHROMIUM`, or the first of the usual names on `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HOOKLEDGER_CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name))
        })
        .find(|candidate| candidate.is_file())
}

fn screenshot(tab: &Tab, name: &str) -> PathBuf {
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    path
}

/// A headless Chromium, or `None` (the test then skips) where there is none and CI does not
/// require it.
fn open_browser() -> Option<Browser> {
    let found = chromium();
    if !prerequisite(
        found.is_some(),
        "HOOKLEDGER_REQUIRE_CHROMIUM",
        "no chromium here (apt-get install chromium, or set HOOKLEDGER_CHROMIUM)",
    ) {
        return None;
    }
    let browser = Browser::new(LaunchOptions {
        path: found,
        headless: true,
        // As root (CI) Chromium runs only without its sandbox.
        sandbox: false,
        window_size: Some((1280, 1100)),
        idle_browser_timeout: Duration::from_secs(120),
        ..LaunchOptions::default()
    })
    .expect("chromium starts");
    Some(browser)
}

/// A tab on `path` of `server`'s admin listener.
fn open(browser: &Browser, server: &Server, path: &str) -> std::sync::Arc<Tab> {
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(WAIT);
    let url = format!("http://{}{path}", server.admin.unwrap());
    tab.navigate_to(&url)
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    tab
}

/// The text of the first element `selector` matches.
fn text(tab: &Tab, selector: &str) -> String {
    tab.wait_for_element(selector)
        .unwrap_or_else(|e| panic!("no `{selector}`: {e}"))
        .get_inner_text()
        .unwrap()
}

/// Clicks the first element `selector` matches and types `what` into it.
fn type_into(tab: &Tab, selector: &str, what: &str) {
    tab.wait_for_element(selector).unwrap().click().unwrap();
    tab.type_str(what).unwrap();
}

/// The page loads in Chromium and shows an event we sent and the dead row its forward left;
/// typing the token and clicking "Retry dead rows" puts the row back, the page says so, and
/// the row is delivered.
#[test]
fn in_chromium_the_status_page_shows_an_event_and_a_dead_row_and_its_button_revives_it() {
    let Some(browser) = open_browser() else {
        return;
    };
    let app = FakeApp::start(&[410]);
    let server = start_with_token(&forwarding(&app));
    let id = "evt_seen_in_the_browser";
    assert_outcome(&server.send(&paid(id)), id, "processed");
    let db = server.db();
    wait_outbox_status(&db, id, "dead", WAIT);

    let tab = open(&browser, &server, "/status");
    let text = tab.find_element("body").unwrap().get_inner_text().unwrap();
    for needle in [
        "hookledger status",
        id,
        "invoice.paid",
        "processed",
        "HTTP 410 Gone",
        "Retry dead rows",
    ] {
        assert!(text.contains(needle), "no `{needle}` on the page:\n{text}");
    }
    let dead = tab.find_elements("tr.dead-row").unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].get_inner_text().unwrap().contains(id));
    let shot = screenshot(&tab, "status-page.png");
    eprintln!("screenshot: {}", shot.display());

    tab.find_element("input[name=token]")
        .unwrap()
        .click()
        .unwrap();
    tab.type_str(TOKEN).unwrap();
    tab.find_element("#retry-dead").unwrap().click().unwrap();
    let flash = tab.wait_for_element("#revived").unwrap();
    assert_eq!(
        flash.get_inner_text().unwrap(),
        "1 dead row put back to pending."
    );
    assert!(
        tab.get_url().ends_with("/status?revived=1"),
        "{}",
        tab.get_url()
    );
    app.wait_delivered(1, WAIT);
    wait_outbox_status(&db, id, "done", WAIT);
    screenshot(&tab, "status-page-revived.png");
}

/// A Stripe event signed with another secret than the source's: the status page alone says
/// which source refuses, why (the reason) and what to fix (the message); the other source
/// shows none.
#[test]
fn in_chromium_a_wrong_secret_for_one_source_is_diagnosed_from_the_status_page() {
    let Some(browser) = open_browser() else {
        return;
    };
    let app = FakeApp::start(&[]);
    let server = start_console(&app.url());
    assert_outcome(
        &gitlab(&server, "gl-ok", "Push Hook", GITLAB_TOKEN),
        "gl-ok",
        "processed",
    );
    let wrong = hookledger::Secret::new("whsec_not_the_configured_one");
    for i in 0..2 {
        let body = paid(&format!("evt_wrong_{i}"));
        let header = hookledger::internals::stripe::sign(&wrong, now(), &body);
        let reply = server.post("/webhooks/stripe", &body, &[("Stripe-Signature", &header)]);
        assert_error(&reply, 400, "invalid_signature");
    }
    wait_refusals(&server.db(), "stripe", 2);
    let tab = open(&browser, &server, "/status");
    let stripe = text(&tab, "#summary-stripe");
    assert!(
        stripe.contains("2 refused in 15 min (invalid_signature 2)"),
        "{stripe}"
    );
    let refusals = text(&tab, "#source-stripe table.refusals");
    assert!(refusals.contains("invalid_signature"), "{refusals}");
    assert!(
        refusals.contains("no signature matches: check the signing secret"),
        "{refusals}"
    );
    let gitlab = text(&tab, "#summary-gitlab");
    assert!(gitlab.contains("no refusals"), "{gitlab}");
    assert!(gitlab.contains("last event"), "{gitlab}");
    screenshot(&tab, "status-wrong-secret.png");
}

/// After a restart the status page still shows the last minutes' events (from the ledger)
/// and the refusals with their messages (kept in the database).
#[test]
fn in_chromium_after_a_restart_the_status_page_shows_recent_events_and_refusals() {
    let Some(browser) = open_browser() else {
        return;
    };
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let mut server = start_console_in(dir.path(), &app.url());
    for id in ["evt_before_restart_1", "evt_before_restart_2"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let missing = server.post("/webhooks/stripe", &paid("evt_unsigned"), &[]);
    assert_error(&missing, 400, "invalid_signature");
    wait_refusals(&server.db(), "stripe", 1);
    assert!(server.terminate().is_some());
    let server = start_console_in(dir.path(), &app.url());
    let tab = open(&browser, &server, "/status");
    let events = text(&tab, "#source-stripe table.ledger-events");
    for id in ["evt_before_restart_1", "evt_before_restart_2"] {
        assert!(events.contains(id), "no {id} in {events}");
    }
    let summary = text(&tab, "#summary-stripe");
    assert!(summary.contains("0.1 events/min"), "{summary}");
    assert!(summary.contains("1 refused"), "{summary}");
    let refusals = text(&tab, "#source-stripe table.refusals");
    assert!(
        refusals.contains("missing Stripe-Signature header"),
        "{refusals}"
    );
    screenshot(&tab, "status-after-restart.png");
}

/// An event found in the browser by typing the start of its id is replayed from its page
/// (typing the token, clicking): its forward row is queued again and delivered again.
#[test]
fn in_chromium_an_event_found_by_id_is_replayed_from_its_page_and_delivered() {
    let Some(browser) = open_browser() else {
        return;
    };
    let app = FakeApp::start(&[]);
    let server = start_console(&app.url());
    for id in ["evt_find_me_7", "evt_other_1", "evt_other_2"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    app.wait_delivered(3, WAIT);
    let db = server.db();
    wait_outbox_status(&db, "evt_find_me_7", "done", WAIT);
    let tab = open(&browser, &server, "/events");
    type_into(&tab, "input[name=id]", "evt_find");
    tab.find_element("#search").unwrap().click().unwrap();
    tab.wait_until_navigated().unwrap();
    let links = tab.wait_for_elements("a.event-link").unwrap();
    assert_eq!(links.len(), 1, "{}", tab.get_url());
    links[0].click().unwrap();
    assert_eq!(text(&tab, "#event-id"), "evt_find_me_7");
    assert!(text(&tab, "#payload").contains("\"id\": \"evt_find_me_7\""));
    type_into(&tab, "#replay-form input[name=token]", TOKEN);
    tab.find_element("#replay").unwrap().click().unwrap();
    let flash = text(&tab, "#replayed");
    assert!(flash.starts_with("Replayed"), "{flash}");
    let delivered = app.wait_delivered(4, WAIT);
    let again = delivered
        .iter()
        .filter(|d| String::from_utf8_lossy(&d.body).contains("evt_find_me_7"))
        .count();
    assert_eq!(again, 2, "the event delivered again");
    let (status, queued): (String, i64) = wait_for(WAIT, || {
        db.opt::<(String, i64)>(
            "SELECT status, queued FROM outbox WHERE key = $1",
            &[&"evt_find_me_7"],
        )
        .filter(|(status, _)| status == "done")
    })
    .expect("the replayed row done");
    assert_eq!((status.as_str(), queued), ("done", 1), "queued once more");
    assert_eq!(db.count("SELECT count(*) FROM outbox"), 3);
    screenshot(&tab, "event-replayed.png");
}

/// Of three dead rows, the one retried from the outbox page (its own button, the token typed)
/// is delivered; the other two stay dead.
#[test]
fn in_chromium_one_dead_row_is_retried_alone() {
    let Some(browser) = open_browser() else {
        return;
    };
    let app = FakeApp::start(&[410, 410, 410]);
    let server = start_console(&app.url());
    let ids = ["evt_dead_1", "evt_dead_2", "evt_dead_3"];
    for id in ids {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    for id in ids {
        wait_outbox_status(&db, id, "dead", WAIT);
    }
    let row: i64 = db
        .opt("SELECT id FROM outbox WHERE key = $1", &[&"evt_dead_2"])
        .unwrap();
    let tab = open(&browser, &server, "/outbox?status=dead");
    assert_eq!(tab.find_elements("tr.status-dead").unwrap().len(), 3);
    type_into(&tab, &format!("#row-{row} input[name=token]"), TOKEN);
    tab.find_element(&format!("#retry-{row}"))
        .unwrap()
        .click()
        .unwrap();
    assert_eq!(text(&tab, "#retried"), "Put back to pending.");
    wait_outbox_status(&db, "evt_dead_2", "done", WAIT);
    let delivered = app.wait_delivered(1, WAIT);
    assert!(String::from_utf8_lossy(&delivered[0].body).contains("evt_dead_2"));
    for other in ["evt_dead_1", "evt_dead_3"] {
        assert_eq!(outbox_row(&db, other).unwrap().0, "dead", "{other}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE status = 'dead'"),
        2
    );
    screenshot(&tab, "outbox-row-retried.png");
}

/// A target that answers 500 with a `<script>` in its body, until its row is dead.
fn scripted_target() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 65536];
                let _ = stream.read(&mut buf);
                let body =
                    "<script>window.pwned = 'by the target'; document.title = 'pwned'</script>";
                let _ = write!(
                    stream,
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    url
}

/// A `<script>` in an event type (from a request header) and in a target's error body does
/// not run on any page (no side effect) and shows as text.
#[test]
fn in_chromium_a_script_in_an_event_type_or_a_targets_answer_does_not_run() {
    let Some(browser) = open_browser() else {
        return;
    };
    let server = start_console(&scripted_target());
    let kind = "<script>window.pwned = 'by the type'; document.title = 'pwned'</script>";
    assert_outcome(
        &gitlab(&server, "gl-script", kind, GITLAB_TOKEN),
        "gl-script",
        "processed",
    );
    let db = server.db();
    wait_for(WAIT, || {
        db.opt::<String>("SELECT status FROM outbox WHERE key = $1", &[&"gl-script"])
            .filter(|s| s == "dead")
    })
    .expect("the row to the scripted target dead");
    for path in [
        "/status",
        "/events?source=gitlab",
        "/event?source=gitlab&id=gl-script",
        "/outbox?status=dead",
    ] {
        let tab = open(&browser, &server, path);
        let ran = tab
            .evaluate(
                "typeof window.pwned === 'undefined' ? 'no' : window.pwned",
                false,
            )
            .unwrap()
            .value
            .unwrap();
        assert_eq!(ran, "no", "a script ran on {path}");
        assert_ne!(tab.get_title().unwrap(), "pwned", "{path}");
        let body = text(&tab, "body");
        if !path.starts_with("/outbox") {
            assert!(
                body.contains(kind),
                "the type not shown as text on {path}:\n{body}"
            );
        }
        let (_, html) = server.admin_get(path);
        assert!(!html.contains("<script>"), "{path}: {html}");
        tab.close(true).unwrap();
    }
}
