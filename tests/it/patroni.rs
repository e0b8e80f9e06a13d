//! Failover with Patroni: two PostgreSQL nodes managed by Debian's `patroni` on Debian's
//! `etcd` (its DCS), `synchronous_mode: true`, started by the test in a temp directory; two
//! hookledger instances on a multi-host URL with `target_session_attrs=read-write` under load;
//! the leader's Patroni and PostgreSQL killed (kill -9), and Patroni promotes the synchronous
//! standby by itself. Skipped without the programs, unless `HOOKLEDGER_REQUIRE_PATRONI` is set
//! (as `.ci/run` does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::postgres::{assert_nothing_acknowledged_lost, send_until, Answers};
use crate::util::*;

/// PostgreSQL 15's programs, as Patroni runs them.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Whether Patroni can run here: etcd, patroni, PostgreSQL's programs, and setpriv and
/// runuser with a `postgres` user, since PostgreSQL refuses to run as root.
fn patroni_here() -> bool {
    if !cfg!(feature = "postgres") {
        eprintln!("skipped: this build has no PostgreSQL store (--no-default-features)");
        return false;
    }
    let runs = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    prerequisite(
        runs("etcd", "--version")
            && runs("patroni", "--version")
            && Path::new(PG_BIN).join("initdb").exists()
            && runs("runuser", "--help")
            && runs("setpriv", "--help"),
        "HOOKLEDGER_REQUIRE_PATRONI",
        "etcd, patroni and PostgreSQL 15 (apt-get install etcd-server patroni postgresql-15) are \
         needed for the Patroni failover test",
    )
}

/// The processes of the test's cluster, killed when dropped.
struct Processes {
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Processes {
    fn spawn(&mut self, name: &str, program: &str, args: &[&str], as_postgres: bool) -> usize {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        // setpriv executes the program in its own process (runuser would stay its parent),
        // so that a kill of the child is a kill of the program.
        let mut cmd = if as_postgres {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                program,
            ]);
            cmd
        } else {
            Command::new(program)
        };
        let child = cmd
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        self.children.push(child);
        self.children.len() - 1
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        // Patroni first (it would restart its PostgreSQL), then every PostgreSQL left.
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for node in ["node1", "node2"] {
            let data = self.dir.path().join(node);
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(Path::new(PG_BIN).join("pg_ctl"))
                .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The status of `GET path` on Patroni's REST API at `port`, 0 when it does not answer.
fn rest_status(port: u16, path: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One node's Patroni config: its REST API on `rest`, its PostgreSQL on `pg`, data in `data`.
fn node_config(name: &str, etcd: u16, rest: u16, pg: u16, data: &Path, dir: &Path) -> String {
    format!(
        r#"scope: hookledger-test
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd:
  host: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        synchronous_commit: "on"
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {PG_BIN}
  pgpass: {dir}/pgpass-{name}
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
"#,
        data = data.display(),
        dir = dir.display()
    )
}

#[test]
fn patroni_promotes_the_synchronous_standby_and_nothing_acknowledged_is_lost() {
    if skipped_on_postgres("it runs a cluster of its own: once, in the SQLite run") {
        return;
    }
    if !patroni_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let chowned = Command::new("chown")
        .arg("postgres:")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(chowned.success());
    let mut processes = Processes {
        children: Vec::new(),
        dir,
    };
    let root: PathBuf = processes.dir.path().to_path_buf();
    let (etcd_client, etcd_peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    let etcd_data = root.join("etcd");
    processes.spawn(
        "etcd",
        "etcd",
        &[
            "--name",
            "e1",
            "--data-dir",
            etcd_data.to_str().unwrap(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("e1={peer_url}"),
            "--enable-v2=true",
        ],
        false,
    );
    wait_for(Duration::from_secs(20), || {
        (rest_status(etcd_client, "/version") == 200).then_some(())
    })
    .expect("etcd answers");
    let nodes: Vec<(String, u16, u16)> = ["node1", "node2"]
        .iter()
        .map(|name| (name.to_string(), free_port(), free_port()))
        .collect();
    let mut patroni = Vec::new();
    for (name, rest, pg) in &nodes {
        let config = root.join(format!("{name}.yml"));
        let data = root.join(name);
        std::fs::write(
            &config,
            node_config(name, etcd_client, *rest, *pg, &data, &root),
        )
        .unwrap();
        let chowned = Command::new("chown")
            .arg("postgres:")
            .arg(&config)
            .status()
            .unwrap();
        assert!(chowned.success());
        patroni.push(processes.spawn(name, "patroni", &[config.to_str().unwrap()], true));
        // The first node bootstraps the cluster; the second one copies it.
        if name == "node1" {
            wait_for(Duration::from_secs(60), || {
                (rest_status(*rest, "/primary") == 200).then_some(())
            })
            .unwrap_or_else(|| panic!("node1 leads: {}", processes.log("node1")));
        }
    }
    let (leader_rest, standby_rest) = (nodes[0].1, nodes[1].1);
    wait_for(Duration::from_secs(60), || {
        (rest_status(standby_rest, "/sync") == 200).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "node2 is the synchronous standby: {}",
            processes.log("node2")
        )
    });

    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        nodes[0].2, nodes[1].2
    );
    let a = Server::start_on(&url, &[]);
    let b = Server::start_on(&url, &[]);
    let stop = AtomicBool::new(false);
    let (on_a, on_b) = (Answers::default(), Answers::default());
    let (killed_at, promoted_at, back) = std::thread::scope(|s| {
        send_until(s, a.url(), "evt_pa", 2, &stop, &on_a);
        send_until(s, b.url(), "evt_pb", 2, &stop, &on_b);
        let under_way = wait_for(Duration::from_secs(15), || {
            (on_a.acked_count() >= 100 && on_b.acked_count() >= 100).then_some(())
        });
        // The leader's Patroni, then its PostgreSQL: nothing restarts it.
        let postmaster = std::fs::read_to_string(root.join("node1/postmaster.pid")).unwrap();
        let postmaster = postmaster.lines().next().unwrap().trim().to_string();
        processes.children[patroni[0]].kill().unwrap();
        let killed = Command::new("kill")
            .args(["-9", &postmaster])
            .status()
            .unwrap();
        assert!(killed.success());
        let killed_at = Instant::now();
        let promoted = wait_for(Duration::from_secs(60), || {
            (rest_status(standby_rest, "/primary") == 200).then(Instant::now)
        });
        let back = promoted.and_then(|promoted_at| {
            wait_for(Duration::from_secs(15), || {
                (on_a.acked_after(promoted_at) > 0 && on_b.acked_after(promoted_at) > 0)
                    .then(|| promoted_at.elapsed())
            })
        });
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        under_way.expect("events were acknowledged on both instances before the kill");
        (killed_at, promoted, back)
    });
    let logs = format!(
        "A's log:\n{}\nB's log:\n{}\nnode2's log:\n{}",
        a.log(),
        b.log(),
        processes.log("node2")
    );
    let promoted_at = promoted_at.unwrap_or_else(|| panic!("Patroni did not promote\n{logs}"));
    let back = back.unwrap_or_else(|| panic!("an instance does not write again\n{logs}"));
    assert!(
        back <= Duration::from_secs(10),
        "{back:?} after the promotion\n{logs}"
    );
    assert_ne!(
        rest_status(leader_rest, "/primary"),
        200,
        "the old leader is gone"
    );
    let db = Db::open(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        nodes[1].2
    ));
    let (acked, claims) = assert_nothing_acknowledged_lost(&db, [&on_a, &on_b], &logs);
    eprintln!(
        "patroni: acknowledged {}, ledger {claims}; promoted {:?} after the kill, both \
         instances answering 200 again {back:?} after the promotion",
        acked.len(),
        promoted_at - killed_at
    );
}
