//! The command delivery kind: a `[[delivery]]` with `command` runs a local program (argv, no
//! shell) for each row of its kind, the payload on stdin and the row in `HOOKLEDGER_*`; exit 0
//! is done, another exit retried, a `give_up_exit` dead at once, past `timeout` its process
//! group is killed. Over real processes.

use std::path::Path;
use std::time::Duration;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(30);

/// Queues a `deploy` row for each event: the event's body, keyed by its id.
fn queue_deploy() -> &'static str {
    match store() {
        Store::Sqlite => {
            "INSERT INTO outbox (kind, source, key, event_type, payload)
VALUES ('deploy', :source, :event_id, :event_type, :body) ON CONFLICT DO NOTHING"
        }
        Store::Postgres => {
            "INSERT INTO outbox (kind, source, key, event_type, payload)
VALUES ('deploy', :source, :event_id, :event_type, convert_to(CAST(:body AS TEXT), 'UTF8'))
ON CONFLICT DO NOTHING"
        }
    }
}

/// Starts a server in `dir` whose `deploy` rows run `script` (written to `dir/script.sh`) as
/// `["/bin/sh", "script.sh"]` in `dir`, with `extra` keys on the delivery.
fn start(dir: &Path, script: &str, extra: &str) -> Server {
    std::fs::write(dir.join("script.sh"), script).unwrap();
    let config = format!(
        r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[delivery]]
kind = "deploy"
command = ["/bin/sh", "script.sh"]
workdir = "{}"
{extra}

[[effect]]
source = "stripe"
on = "*"
sql = """{}
"""
"#,
        dir.display(),
        queue_deploy()
    );
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    Server::start_in(dir, &["--config", path.to_str().unwrap()])
}

fn status(db: &Db, key: &str) -> (String, i64, Option<String>) {
    db.opt(
        "SELECT status, attempts, last_error FROM outbox WHERE kind = 'deploy' AND key = $1",
        &[&key],
    )
    .expect("the deploy row")
}

fn output(db: &Db, key: &str) -> Option<String> {
    db.opt::<Option<String>>(
        "SELECT output FROM outbox WHERE kind = 'deploy' AND key = $1",
        &[&key],
    )
    .flatten()
}

fn wait_status(db: &Db, key: &str, want: &str) -> (String, i64, Option<String>) {
    wait_for(WAIT, || {
        let row = status(db, key);
        (row.0 == want).then_some(row)
    })
    .unwrap_or_else(|| panic!("{key} not {want}: {:?}", status(db, key)))
}

#[test]
fn a_command_gets_the_payload_and_env_is_retried_on_exit_1_and_keeps_its_output() {
    let dir = test_dir();
    let script = r#"
/bin/cat > "payload-$HOOKLEDGER_ATTEMPT"
{
  echo "SOURCE=$HOOKLEDGER_SOURCE"
  echo "EVENT_ID=$HOOKLEDGER_EVENT_ID"
  echo "EVENT_TYPE=$HOOKLEDGER_EVENT_TYPE"
  echo "KIND=$HOOKLEDGER_KIND"
  echo "KEY=$HOOKLEDGER_KEY"
  echo "ATTEMPT=$HOOKLEDGER_ATTEMPT"
  echo "HOME=${HOME-unset}"
  echo "MANIFEST=${CARGO_MANIFEST_DIR-unset}"
} > env.txt
echo "attempt $HOOKLEDGER_ATTEMPT to stdout"
echo "attempt $HOOKLEDGER_ATTEMPT to stderr" >&2
[ "$HOOKLEDGER_ATTEMPT" -ge 3 ] || exit 1
"#;
    let server = start(
        dir.path(),
        script,
        r#"schedule = ["1s", "1s", "1s"]
env = ["HOME"]"#,
    );
    let body = paid("evt_cmd");
    assert_outcome(&server.send(&body), "evt_cmd", "processed");
    let db = server.db();
    let (_, attempts, error) = wait_status(&db, "evt_cmd", "done");
    assert_eq!(attempts, 3, "exit 1 twice, then 0");
    assert_eq!(error, None);
    for attempt in 1..=3 {
        let got = std::fs::read(dir.path().join(format!("payload-{attempt}"))).unwrap();
        assert_eq!(got, body, "the payload on stdin, attempt {attempt}");
    }
    let env = std::fs::read_to_string(dir.path().join("env.txt")).unwrap();
    let home = std::env::var("HOME").unwrap_or_default();
    assert_eq!(
        env,
        format!(
            "SOURCE=stripe\nEVENT_ID=evt_cmd\nEVENT_TYPE=invoice.paid\nKIND=deploy\n\
             KEY=evt_cmd\nATTEMPT=3\nHOME={home}\nMANIFEST=unset\n"
        ),
        "the row's HOOKLEDGER_*, the named variables, nothing else"
    );
    let out = output(&db, "evt_cmd").expect("the output is on the row");
    assert!(out.contains("attempt 3 to stdout"), "{out}");
    assert!(out.contains("attempt 3 to stderr"), "{out}");
    let id: i64 = db
        .opt("SELECT id FROM outbox WHERE key = $1", &[&"evt_cmd"])
        .unwrap();
    let (code, shown, err) = cli(&["outbox", "show", &id.to_string(), "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        shown.contains("deploy") && shown.contains("done"),
        "{shown}"
    );
    assert!(shown.contains("attempt 3 to stdout"), "{shown}");
    let (code, listed, _) = cli(&["outbox", "list", "--json", "--db", &server.db_arg()]);
    assert_eq!(code, 0);
    assert!(listed.contains("attempt 3 to stderr"), "{listed}");
    let (code, _, err) = cli(&["outbox", "show", "999999", "--db", &server.db_arg()]);
    assert_ne!(code, 0);
    assert!(err.contains("no outbox row 999999"), "{err}");
}

#[test]
fn an_exit_in_give_up_exit_is_dead_at_once() {
    let dir = test_dir();
    let server = start(
        dir.path(),
        "echo cannot deploy >&2\nexit 3\n",
        r#"schedule = ["1s", "1s", "1s"]
give_up_exit = [3, 4]"#,
    );
    assert_outcome(
        &server.send(&paid("evt_give_up")),
        "evt_give_up",
        "processed",
    );
    let db = server.db();
    let (_, attempts, error) = wait_status(&db, "evt_give_up", "dead");
    assert_eq!(attempts, 1, "not retried");
    assert!(error.unwrap().contains("exit 3"));
}

#[test]
fn a_command_past_its_timeout_is_killed_with_its_children_and_the_attempt_fails() {
    let dir = test_dir();
    let server = start(
        dir.path(),
        "/bin/sleep 60 &\necho $! > child.pid\n/bin/sleep 60\n",
        r#"schedule = ["1h"]
timeout = "1s""#,
    );
    assert_outcome(&server.send(&paid("evt_hang")), "evt_hang", "processed");
    let db = server.db();
    let (status, attempts, error) = wait_for(WAIT, || {
        let row = status(&db, "evt_hang");
        (row.1 == 1).then_some(row)
    })
    .expect("the attempt is recorded");
    assert_eq!((status.as_str(), attempts), ("pending", 1), "retried later");
    assert!(
        error.as_deref().unwrap().contains("timed out after 1s"),
        "{error:?}"
    );
    let child = std::fs::read_to_string(dir.path().join("child.pid")).unwrap();
    let stat = format!("/proc/{}/stat", child.trim());
    wait_for(Duration::from_secs(10), || {
        // Gone, or a zombie not reaped yet: killed either way.
        match std::fs::read_to_string(&stat) {
            Err(_) => Some(()),
            Ok(s) => s
                .rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('Z')
                .then_some(()),
        }
    })
    .expect("the command's child was killed with it");
}
