//! A private PostgreSQL cluster of a test's own (initdb and pg_ctl of the machine's PostgreSQL),
//! for the tests that restart, kill or promote their database server: the shared test server
//! is never restarted under the other tests.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::prerequisite;

/// A private PostgreSQL cluster in a temp directory, on a free port, stopped on drop: for the
/// test that restarts its server.
pub struct Cluster {
    bin: PathBuf,
    /// The temp directory: the data directory, the socket directory and the server's log.
    dir: tempfile::TempDir,
    /// initdb refuses to run as root: as root every command runs as the `postgres` user.
    as_postgres: bool,
    port: u16,
}

impl Cluster {
    /// Where initdb and pg_ctl are: `HOOKLEDGER_TEST_PG_BIN`, or PostgreSQL 15's on Debian.
    fn bin() -> PathBuf {
        std::env::var_os("HOOKLEDGER_TEST_PG_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
    }

    /// Creates and starts the cluster; `None` (the test is skipped) without the binaries, or
    /// as root without `runuser` and a `postgres` user.
    pub fn start() -> Option<Cluster> {
        if !cfg!(feature = "postgres") {
            eprintln!("skipped: this build has no PostgreSQL store (--no-default-features)");
            return None;
        }
        let bin = Cluster::bin();
        let found = bin.join("initdb").exists() && bin.join("pg_ctl").exists();
        let what = format!(
            "needs PostgreSQL's initdb and pg_ctl in {} (HOOKLEDGER_TEST_PG_BIN)",
            bin.display()
        );
        if !prerequisite(found, "HOOKLEDGER_REQUIRE_POSTGRES", &what) {
            return None;
        }
        use std::os::unix::fs::MetadataExt;
        let as_postgres = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if as_postgres {
            let runnable = Command::new("runuser")
                .args(["-u", "postgres", "--", "true"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            let what = "needs runuser and a postgres user to run initdb as root";
            if !prerequisite(runnable, "HOOKLEDGER_REQUIRE_POSTGRES", what) {
                return None;
            }
        }
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            let chowned = Command::new("chown")
                .arg("postgres:")
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(chowned.success(), "chown postgres {}", dir.path().display());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Cluster {
            bin,
            dir,
            as_postgres,
            port,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                // The cluster is thrown away: its creation need not be durable (the server's
                // own fsync stays on).
                "--no-sync",
            ],
        );
        cluster.pg_ctl("start");
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_str().unwrap().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        };
        // Somewhere the postgres user may enter.
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// Runs `program` to its end; a test failure with its output if it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let output = self.command(program).args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{program} {args:?}: {}\n{}\n{}\nserver log:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    /// `pg_ctl start` or `pg_ctl stop -m fast`, waiting (at most 30 s) until it is done. The
    /// server logs to a file, so no pipe of ours stays open in it.
    pub fn pg_ctl(&self, action: &str) {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let mut args = vec!["-D", &data, "-w", "-t", "30"];
        match action {
            "start" => args.extend(["-l", log.to_str().unwrap(), "-o", &options, "start"]),
            "stop" => args.extend(["-m", "fast", "stop"]),
            _ => unreachable!("{action}"),
        }
        self.run("pg_ctl", &args);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                &self.data(),
                "-m",
                "immediate",
                "-w",
                "-t",
                "30",
                "stop",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
