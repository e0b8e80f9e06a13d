//! The status page in a real browser: Debian's `chromium`, headless, driven over the DevTools
//! protocol as a person would use it (a click, typing). Skipped where there is no chromium,
//! except under CI (`HOOKLEDGER_REQUIRE_CHROMIUM`). The screenshots are written to
//! `target/tmp/screenshots/` for people to look at.

use std::path::PathBuf;
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

use crate::admin::{forwarding, start_with_token, TOKEN, WAIT};
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

/// The page loads in Chromium and shows an event we sent and the dead row its forward left;
/// typing the token and clicking "Retry dead rows" puts the row back, the page says so, and
/// the row is delivered.
#[test]
fn in_chromium_the_status_page_shows_an_event_and_a_dead_row_and_its_button_revives_it() {
    let found = chromium();
    if !prerequisite(
        found.is_some(),
        "HOOKLEDGER_REQUIRE_CHROMIUM",
        "no chromium here (apt-get install chromium, or set HOOKLEDGER_CHROMIUM)",
    ) {
        return;
    }
    let app = FakeApp::start(&[410]);
    let server = start_with_token(&forwarding(&app));
    let id = "evt_seen_in_the_browser";
    assert_outcome(&server.send(&paid(id)), id, "processed");
    let db = server.db();
    wait_outbox_status(&db, id, "dead", WAIT);

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
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(WAIT);
    let url = format!("http://{}/status", server.admin.unwrap());
    tab.navigate_to(&url)
        .unwrap()
        .wait_until_navigated()
        .unwrap();
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
