//! The command delivery kind: a `[[delivery]]` with `command` runs a local program (argv, no
//! shell) for each row of its kind, the payload on stdin and the row in `HOOKLEDGER_*`; exit 0
//! is done, another exit retried, a `give_up_exit` dead at once, past `timeout` its process
//! group is killed. Over real processes.

use std::path::Path;
use std::time::Duration;

use hookledger::internals::Reply;

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
    let out = output(&db, "evt_give_up").expect("a failed run's output is kept too");
    assert_eq!(out, "cannot deploy\n");
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200);
    assert!(
        page.contains("<pre class=output>cannot deploy\n</pre>"),
        "{page}"
    );
}

#[test]
fn a_command_past_its_timeout_is_killed_with_its_children_and_the_attempt_fails() {
    let dir = test_dir();
    let server = start(
        dir.path(),
        "/bin/sleep 60 &\necho $! > child.pid\necho building\n/bin/sleep 60\n",
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
    assert_eq!(
        output(&db, "evt_hang").as_deref(),
        Some("building\n"),
        "a timed-out run's output is kept"
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

const GITHUB_SECRET: &str = "a-github-webhook-secret-for-coalescing";

/// POSTs `body` to the `gh` source as GitHub's delivery `id` of a push.
fn push(server: &Server, id: &str, body: &[u8]) -> Reply {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(GITHUB_SECRET.as_bytes()).unwrap();
    mac.update(body);
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    server.post(
        "/webhooks/gh",
        body,
        &[
            ("X-Hub-Signature-256", &signature),
            ("X-GitHub-Delivery", id),
            ("X-GitHub-Event", "push"),
        ],
    )
}

/// Deploy only the newest push: with `coalesce = true` and one run at a time, the pushes that
/// arrive while a deploy runs are superseded by the newest (kept, and shown as superseded),
/// duplicates queue nothing, and the command runs twice: the first push, then the newest. The
/// rows queued by an effect's SQL.
#[test]
fn coalesce_runs_the_first_push_then_only_the_newest_never_two_at_once() {
    let body = match store() {
        Store::Sqlite => ":body",
        Store::Postgres => "convert_to(CAST(:body AS TEXT), 'UTF8')",
    };
    let effect = format!(
        r#"
[[effect]]
source = "gh"
on = "push"
sql = """
INSERT INTO outbox (kind, source, key, event_type, payload)
VALUES ('deploy', :source, :event_id, :event_type, {body}) ON CONFLICT DO NOTHING
"""
"#
    );
    first_push_then_the_newest(&effect, false);
}

/// The same with a route and no SQL (`on = [...]`, the deploy example's): pushes to main
/// coalesce by their ref, and a push to another branch queues nothing.
#[test]
fn a_route_deploys_the_first_push_to_main_then_the_newest_and_no_other_branch() {
    let route = r#"on = [{ source = "gh", types = ["push"], key = "/ref", when = { "/ref" = "refs/heads/main" } }]"#;
    first_push_then_the_newest(route, true);
}

/// Four pushes to main, the first resent twice, with `queue` queuing the deploys (lines of
/// the delivery's table, or tables after it); with `routed`, a push to another branch too.
fn first_push_then_the_newest(queue: &str, routed: bool) {
    let dir = test_dir();
    // The first run waits for `release`; every run logs its start and end.
    std::fs::write(
        dir.path().join("deploy.sh"),
        "echo \"start $HOOKLEDGER_KEY\" >> runs.log\n\
         while [ ! -e release ]; do /bin/sleep 0.05; done\n\
         echo \"end $HOOKLEDGER_KEY\" >> runs.log\n",
    )
    .unwrap();
    let config = format!(
        r#"
[[source]]
name = "gh"
scheme = "github"
secrets = ["env:HOOKLEDGER_TEST_GH"]

[[delivery]]
kind = "deploy"
command = ["/bin/sh", "deploy.sh"]
workdir = "{}"
coalesce = true
{queue}
"#,
        dir.path().display()
    );
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[("HOOKLEDGER_TEST_GH", GITHUB_SECRET)],
    );
    let fixture = std::fs::read(fixtures_dir().join("github/push.json")).unwrap();
    let after = b"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c";
    // Push `n`: the fixture with its own commit id.
    let pushed = |n: u8| -> Vec<u8> {
        let at = fixture
            .windows(after.len())
            .position(|w| w == after)
            .unwrap();
        let mut body = fixture.clone();
        body[at..at + 8].copy_from_slice(format!("{n:08}").as_bytes());
        body
    };
    let runs = || std::fs::read_to_string(dir.path().join("runs.log")).unwrap_or_default();
    assert_outcome(&push(&server, "d-1", &pushed(1)), "d-1", "processed");
    wait_for(WAIT, || runs().contains("start d-1").then_some(())).expect("the first run starts");
    for _ in 0..2 {
        assert_outcome(&push(&server, "d-1", &pushed(1)), "d-1", "duplicate");
    }
    for n in 2..=4 {
        let id = format!("d-{n}");
        assert_outcome(&push(&server, &id, &pushed(n)), &id, "processed");
    }
    if routed {
        let dev = String::from_utf8(pushed(5))
            .unwrap()
            .replace("refs/heads/main", "refs/heads/dev");
        assert_outcome(
            &push(&server, "d-dev", dev.as_bytes()),
            "d-dev",
            "processed",
        );
    }
    let db = server.db();
    let statuses =
        || db.strings("SELECT key || ' ' || status FROM outbox WHERE kind = 'deploy' ORDER BY id");
    wait_for(WAIT, || {
        (statuses()
            == [
                "d-1 pending",
                "d-2 superseded",
                "d-3 superseded",
                "d-4 pending",
            ])
        .then_some(())
    })
    .unwrap_or_else(|| panic!("superseded while the first runs: {:?}", statuses()));
    let (status, metrics) = server.admin_get("/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("hookledger_outbox_rows{kind=\"deploy\",status=\"superseded\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hookledger_delivery_in_flight{kind=\"deploy\"} 1"),
        "{metrics}"
    );
    std::fs::write(dir.path().join("release"), "").unwrap();
    wait_status(&db, "d-4", "done");
    wait_status(&db, "d-1", "done");
    assert_eq!(
        runs(),
        "start d-1\nend d-1\nstart d-4\nend d-4\n",
        "the first push, then the newest, one at a time"
    );
    assert_eq!(
        statuses(),
        ["d-1 done", "d-2 superseded", "d-3 superseded", "d-4 done"]
    );
    let (code, listed, err) = cli(&[
        "outbox",
        "list",
        "--status",
        "superseded",
        "--db",
        &server.db_arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(listed.contains("d-2") && listed.contains("d-3"), "{listed}");
    assert!(!listed.contains("d-4"), "{listed}");
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200);
    assert!(page.contains("<th>superseded</th>"), "{page}");
}

/// Runs `git args` in `dir`; its stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {:?}", out);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `examples/deploy/`: its config, with `/srv/app` a scratch checkout, deploys a push to main
/// with its `deploy.sh` (the checkout moves to the pushed commit).
#[test]
fn the_deploy_example_checks_out_the_pushed_commit() {
    if !prerequisite(
        installed("git") && installed("python3"),
        "HOOKLEDGER_REQUIRE_GIT",
        "git and python3",
    ) {
        return;
    }
    let dir = test_dir();
    let origin = dir.path().join("origin");
    std::fs::create_dir(&origin).unwrap();
    git(&origin, &["init", "--quiet", "--initial-branch=main"]);
    git(
        &origin,
        &["commit", "--quiet", "--allow-empty", "-m", "one"],
    );
    let app = dir.path().join("app");
    git(
        dir.path(),
        &["clone", "--quiet", origin.to_str().unwrap(), "app"],
    );
    git(
        &origin,
        &["commit", "--quiet", "--allow-empty", "-m", "two"],
    );
    let pushed = git(&origin, &["rev-parse", "HEAD"]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(repo.join("examples/deploy/hookledger.toml"))
        .unwrap()
        .replace(
            "/srv/app/examples/deploy/deploy.sh",
            repo.join("examples/deploy/deploy.sh").to_str().unwrap(),
        )
        .replace("/srv/app", app.to_str().unwrap());
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)],
    );
    let body = String::from_utf8(std::fs::read(fixtures_dir().join("github/push.json")).unwrap())
        .unwrap()
        .replace("0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c", &pushed);
    assert_outcome(
        &push(&server, "d-example", body.as_bytes()),
        "d-example",
        "processed",
    );
    let db = server.db();
    let (_, attempts, error) = wait_status(&db, "d-example", "done");
    assert_eq!((attempts, error), (1, None));
    assert_eq!(git(&app, &["rev-parse", "HEAD"]), pushed, "checked out");
    let out = output(&db, "d-example").unwrap();
    assert!(out.contains(&format!("deployed {pushed}")), "{out}");
    // Its route, not SQL, queued the row: the push's body, its ref as the coalescing key.
    let (payload, coalesce_key, event_type): (Vec<u8>, String, String) = db.one(
        "SELECT payload, coalesce_key, event_type FROM outbox WHERE key = 'd-example'",
        &[],
    );
    assert_eq!(payload, body.as_bytes());
    assert_eq!(
        (coalesce_key.as_str(), event_type.as_str()),
        ("refs/heads/main", "push")
    );
    // A resend is a duplicate and a push to another branch is processed: neither queues a row.
    assert_outcome(
        &push(&server, "d-example", body.as_bytes()),
        "d-example",
        "duplicate",
    );
    let other = body.replace("refs/heads/main", "refs/heads/dev");
    assert_outcome(
        &push(&server, "d-dev", other.as_bytes()),
        "d-dev",
        "processed",
    );
    assert_eq!(db.count("SELECT count(*) FROM outbox"), 1);
}

/// SIGTERM while a command runs: the server waits for that run (its result is recorded) and
/// leaves the next row due, not started, for the restart.
#[test]
fn sigterm_waits_for_the_running_command_and_leaves_the_rest_due() {
    let dir = test_dir();
    let script = "echo \"start $HOOKLEDGER_KEY\" >> runs.log\n/bin/sleep 2\n\
                  echo \"end $HOOKLEDGER_KEY\" >> runs.log\n";
    let mut server = start(dir.path(), script, "");
    let runs = || std::fs::read_to_string(dir.path().join("runs.log")).unwrap_or_default();
    assert_outcome(&server.send(&paid("evt_run")), "evt_run", "processed");
    wait_for(WAIT, || runs().contains("start evt_run").then_some(())).expect("a run starts");
    assert_outcome(&server.send(&paid("evt_next")), "evt_next", "processed");
    assert_eq!(server.terminate(), Some(0), "{}", server.log());
    assert_eq!(
        runs(),
        "start evt_run\nend evt_run\n",
        "waited for; next not started"
    );
    let db = server.db();
    assert_eq!(status(&db, "evt_run"), ("done".into(), 1, None));
    assert_eq!(status(&db, "evt_next"), ("pending".into(), 0, None));
}

/// kill -9 of hookledger during a run: the run's result was never recorded, so the row is
/// still pending and the command runs again after the restart (at least once), once the run
/// the killed server left has ended.
#[test]
fn a_kill_9_during_a_run_reruns_it_after_the_restart() {
    if skipped_through_pooler("the killed server's rows wait for their lease") {
        return;
    }
    let dir = test_dir();
    let script = "echo \"run $HOOKLEDGER_ATTEMPT\" >> runs.log\n\
                  [ -e restarted ] || /bin/sleep 3\n";
    let mut server = start(dir.path(), script, "");
    let runs = || std::fs::read_to_string(dir.path().join("runs.log")).unwrap_or_default();
    assert_outcome(&server.send(&paid("evt_kill")), "evt_kill", "processed");
    wait_for(WAIT, || (runs() == "run 1\n").then_some(())).expect("a run starts");
    server.kill();
    assert_eq!(
        status(&server.db(), "evt_kill"),
        ("pending".into(), 0, None)
    );
    std::fs::write(dir.path().join("restarted"), "").unwrap();
    let restarted = start(dir.path(), script, "");
    let db = restarted.db();
    assert_eq!(
        wait_status(&db, "evt_kill", "done"),
        ("done".into(), 1, None)
    );
    assert_eq!(
        runs(),
        "run 1\nrun 1\n",
        "run again, as its first recorded attempt"
    );
}

/// A deploy that removed its own script does not take every source down at the next start:
/// the server starts (warning, naming the kind and the program), events are processed, the
/// kind's attempts fail with an error naming the missing program, and once the program is
/// there again the row is delivered on its schedule.
#[test]
fn a_removed_program_starts_the_server_and_fails_its_attempts_naming_it() {
    let dir = test_dir();
    let program = dir.path().join("deploy.sh");
    let config = format!(
        r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[delivery]]
kind = "deploy"
command = ["{}"]
schedule = ["1s", "1s", "1s", "1s", "1s", "1s"]

[[effect]]
source = "stripe"
on = "*"
sql = """{}
"""
"#,
        program.display(),
        queue_deploy()
    );
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_in(dir.path(), &["--config", path.to_str().unwrap()]);
    let log = server.log();
    assert!(
        log.contains("delivery `deploy`") && log.contains(&format!("{}", program.display())),
        "a warning names the kind and the program: {log}"
    );
    assert_outcome(&server.send(&paid("evt_gone")), "evt_gone", "processed");
    let db = server.db();
    assert_eq!(ledger_count(&db), 1);
    let (state, attempts, error) = wait_for(WAIT, || {
        let row = status(&db, "evt_gone");
        (row.1 >= 1).then_some(row)
    })
    .expect("the deploy row was attempted");
    assert_eq!((state.as_str(), attempts), ("pending", 1));
    let error = error.expect("the row's error");
    assert!(
        error.contains(&format!("`{}` does not exist", program.display())),
        "{error}"
    );

    // Into the test's folder: the command runs in serve's working directory (the repo's, here).
    let mark = program.with_file_name("deployed.txt");
    std::fs::write(
        &program,
        format!("#!/bin/sh\necho deployed > '{}'\n", mark.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    wait_status(&db, "evt_gone", "done");
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), "deployed\n");
}

/// kill -9 of hookledger mid-run leaves the command running (its own process group): the
/// restarted server does not run the row again beside it. It waits for the old run to end
/// (logged), then runs the row again; the marks the command writes never overlap.
#[test]
fn after_a_kill_9_mid_run_the_restart_waits_for_the_old_run_before_running_again() {
    if skipped_through_pooler("the killed server's rows wait for their lease") {
        return;
    }
    let dir = test_dir();
    let script = "echo \"start $(/bin/date +%s%N)\" >> marks\n\
                  /bin/sleep 3\n\
                  echo \"end $(/bin/date +%s%N)\" >> marks\n";
    let marks = || -> Vec<(String, u128)> {
        std::fs::read_to_string(dir.path().join("marks"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (what, at) = l.split_once(' ').unwrap();
                (what.to_string(), at.parse().unwrap())
            })
            .collect()
    };
    let mut server = start(dir.path(), script, "");
    assert_outcome(&server.send(&paid("evt_orphan")), "evt_orphan", "processed");
    wait_for(WAIT, || (marks().len() == 1).then_some(())).expect("a run starts");
    server.kill();
    let restarted = start(dir.path(), script, "");
    let db = restarted.db();
    assert_eq!(
        wait_status(&db, "evt_orphan", "done"),
        ("done".into(), 1, None)
    );
    let marks = marks();
    let order: Vec<&str> = marks.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(
        order,
        ["start", "end", "start", "end"],
        "the old run ended before the new one started: {marks:?}"
    );
    assert!(marks[2].1 >= marks[1].1, "{marks:?}");
    assert!(
        restarted.log().contains("started by an earlier server"),
        "the wait is logged: {}",
        restarted.log()
    );
}
