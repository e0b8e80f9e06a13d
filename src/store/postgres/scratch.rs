//! For unit tests that need PostgreSQL: a fresh database on the test server
//! (`HOOKLEDGER_TEST_POSTGRES`), dropped with the guard; `None` (skipped, with a message)
//! without a server, a failure under `HOOKLEDGER_REQUIRE_POSTGRES`.

const ADMIN: &str = "postgres://hookledger:hookledger@127.0.0.1:5432/postgres";

/// A fresh database on the test server, dropped with the guard.
pub(crate) struct Scratch {
    admin: postgres::Client,
    name: String,
    pub(crate) url: String,
}

impl Scratch {
    pub(crate) fn new() -> Option<Scratch> {
        let admin_url = std::env::var("HOOKLEDGER_TEST_POSTGRES").unwrap_or_else(|_| ADMIN.into());
        let mut admin = match postgres::Client::connect(&admin_url, postgres::NoTls) {
            Ok(admin) => admin,
            Err(e) => {
                assert!(
                    std::env::var_os("HOOKLEDGER_REQUIRE_POSTGRES").is_none(),
                    "HOOKLEDGER_REQUIRE_POSTGRES is set and no server answers: {e}"
                );
                eprintln!("skipped: no PostgreSQL server at the test URL ({e})");
                return None;
            }
        };
        let name = format!("hl_u_{:016x}", fastrand::u64(..));
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = match admin_url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => unreachable!("a URL with a database"),
        };
        Some(Scratch { admin, name, url })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}
