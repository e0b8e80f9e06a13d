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
    /// `-c` settings of its server beyond the port, the socket and the address.
    settings: Vec<String>,
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
        Cluster::start_with(&[])
    }

    /// [`Cluster::start`] with these `-c` settings (`name=value`).
    pub fn start_with(settings: &[&str]) -> Option<Cluster> {
        let cluster = Cluster::empty(settings)?;
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

    /// A streaming standby of `primary` (a base backup of it, `standby.signal`), named
    /// `name` (its `application_name`, which `synchronous_standby_names` lists), started.
    pub fn standby_of(primary: &Cluster, name: &str) -> Cluster {
        let standby = Cluster::empty(&[]).expect("the primary's binaries and user");
        let data = standby.data();
        let port = primary.port.to_string();
        standby.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &data,
                "-X",
                "stream",
                "-R",
                "--no-sync",
            ],
        );
        let conninfo = format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={name}'\n"
        );
        let auto = std::path::Path::new(&data).join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap();
        text.push_str(&conninfo);
        std::fs::write(&auto, text).unwrap();
        standby.pg_ctl("start");
        standby
    }

    /// The server's process, from `postmaster.pid`.
    pub fn pid(&self) -> i32 {
        let pid =
            std::fs::read_to_string(std::path::Path::new(&self.data()).join("postmaster.pid"))
                .unwrap();
        pid.lines().next().unwrap().trim().parse().unwrap()
    }

    /// SIGKILL to the server (its children die with it: they watch the postmaster).
    pub fn kill_9(&self) {
        let status = Command::new("kill")
            .args(["-9", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -9 the postmaster");
    }

    /// `pg_ctl promote`, waiting until the standby takes writes.
    pub fn promote(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "-t", "30", "promote"]);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A cluster not yet made: its temp directory (owned by `postgres` when run as root) and a
    /// free port; `None` as [`Cluster::start`].
    fn empty(settings: &[&str]) -> Option<Cluster> {
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
        Some(Cluster {
            bin,
            dir,
            as_postgres,
            port,
            settings: settings.iter().map(|s| s.to_string()).collect(),
        })
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
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
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
