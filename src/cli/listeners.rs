//! The listening sockets `serve` is handed rather than binds: systemd's socket activation
//! (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`), which is also how `serve` hands its own
//! sockets to the binary it re-executes on `SIGUSR2` ([`restart_in_place`]). A socket held
//! open across a restart queues the connections that arrive meanwhile, so none is refused.

use std::ffi::OsString;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;

use anyhow::{bail, Context};
use command_fds::{CommandFdExt, FdMapping};

/// The first passed descriptor (the protocol's `SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// The sockets passed to this process, by name.
#[derive(Debug, Default)]
pub(super) struct Passed {
    pub(super) webhook: Option<TcpListener>,
    pub(super) admin: Option<TcpListener>,
}

/// Reads the sockets passed in the environment, and removes its variables (a command run by a
/// `[[delivery]]` does not inherit them). None passed: `Passed::default()`. Names: `webhook`
/// and `admin`; a single socket without a name is the webhook listener. A `LISTEN_PID` of
/// another process means the sockets are not ours: a warning, and `serve` binds its own.
pub(super) fn passed() -> anyhow::Result<Passed> {
    let fds = std::env::var_os("LISTEN_FDS");
    let pid = std::env::var_os("LISTEN_PID");
    let names = std::env::var_os("LISTEN_FDNAMES");
    let passed = read(fds, pid, names, std::process::id());
    // listenfd removes LISTEN_FDS and LISTEN_PID when it takes the sockets; what it does not
    // take is removed here.
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDNAMES");
    passed
}

fn read(
    fds: Option<OsString>,
    pid: Option<OsString>,
    names: Option<OsString>,
    me: u32,
) -> anyhow::Result<Passed> {
    let Some(fds) = fds else {
        return Ok(Passed::default());
    };
    let text = |v: &OsString, key: &str| {
        v.to_str()
            .map(str::to_string)
            .with_context(|| format!("{key} is not text"))
    };
    let count: usize = text(&fds, "LISTEN_FDS")?.trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "LISTEN_FDS={:?} is not a count of sockets (systemd's socket activation sets it)",
            fds
        )
    })?;
    if let Some(pid) = &pid {
        let pid = text(pid, "LISTEN_PID")?;
        if pid.trim().parse::<u32>().ok() != Some(me) {
            log::warn!(
                "LISTEN_PID={pid} is not this process ({me}): the {count} socket(s) of \
                 LISTEN_FDS are not for it; binding its own"
            );
            return Ok(Passed::default());
        }
    }
    if count == 0 {
        return Ok(Passed::default());
    }
    let names = match &names {
        Some(names) => text(names, "LISTEN_FDNAMES")?
            .split(':')
            .map(str::to_string)
            .collect(),
        None => vec![String::new(); count],
    };
    if names.len() != count {
        bail!(
            "LISTEN_FDNAMES names {} socket(s) and LISTEN_FDS passes {count}: they must match",
            names.len()
        );
    }
    let roles = roles(&names)?;
    let mut listenfd = listenfd::ListenFd::from_env();
    let mut passed = Passed::default();
    for (index, role) in roles.into_iter().enumerate() {
        let fd = FIRST_FD + index as i32;
        let name = role.name();
        let listener = listenfd
            .take_tcp_listener(index)
            .with_context(|| {
                format!("fd {fd} ({name}) of LISTEN_FDS is not a listening TCP socket")
            })?
            .with_context(|| format!("fd {fd} ({name}) of LISTEN_FDS was not passed"))?;
        let listening = rustix::net::sockopt::socket_acceptconn(&listener)
            .with_context(|| format!("fd {fd} ({name}) of LISTEN_FDS"))?;
        if !listening {
            bail!(
                "fd {fd} ({name}) of LISTEN_FDS is a TCP socket that is not listening (the \
                 socket unit needs ListenStream=, not a connected socket)"
            );
        }
        match role {
            Role::Webhook => passed.webhook = Some(listener),
            Role::Admin => passed.admin = Some(listener),
        }
    }
    Ok(passed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Webhook,
    Admin,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Webhook => "webhook",
            Role::Admin => "admin",
        }
    }
}

/// What each passed socket is for, by its name.
fn roles(names: &[String]) -> anyhow::Result<Vec<Role>> {
    let one_unnamed = names.len() == 1 && matches!(names[0].as_str(), "" | "unknown");
    if one_unnamed {
        return Ok(vec![Role::Webhook]);
    }
    let mut roles = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let role = match name.as_str() {
            "webhook" => Role::Webhook,
            "admin" => Role::Admin,
            other => bail!(
                "fd {} of LISTEN_FDS is named {other:?} (LISTEN_FDNAMES): hookledger takes the \
                 names webhook and admin (FileDescriptorName= in the socket unit)",
                FIRST_FD + index as i32
            ),
        };
        if roles.contains(&role) {
            bail!(
                "LISTEN_FDNAMES names two sockets {}: pass one of each",
                role.name()
            );
        }
        roles.push(role);
    }
    if !roles.contains(&Role::Webhook) {
        bail!("LISTEN_FDS passes no socket named webhook (LISTEN_FDNAMES: {names:?})");
    }
    Ok(roles)
}

/// Runs this process's command line again in place (the same PID; the binary found by its
/// first argument, so a package upgraded meanwhile starts its new version), handing it the
/// listening sockets as systemd would. Returns only if the exec failed.
pub(super) fn restart_in_place(webhook: TcpListener, admin: Option<TcpListener>) -> anyhow::Error {
    let mut args = std::env::args_os();
    let Some(program) = args.next() else {
        return anyhow::anyhow!("cannot restart: this process has no argv[0]");
    };
    let mut names = vec!["webhook"];
    let mut mappings = vec![FdMapping {
        parent_fd: OwnedFd::from(webhook),
        child_fd: FIRST_FD,
    }];
    if let Some(admin) = admin {
        names.push("admin");
        mappings.push(FdMapping {
            parent_fd: OwnedFd::from(admin),
            child_fd: FIRST_FD + 1,
        });
    }
    let mut command = std::process::Command::new(&program);
    command
        .args(args)
        .env("LISTEN_FDS", names.len().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        // exec keeps the PID.
        .env("LISTEN_PID", std::process::id().to_string());
    if let Err(e) = command.fd_mappings(mappings) {
        return anyhow::anyhow!("cannot restart: the sockets' descriptors collide: {e:?}");
    }
    log::info!("restarting in place: {}", program.to_string_lossy());
    // The exec ends the log's thread: what it has not written yet is written now.
    super::log_buffer::flush();
    let e = command.exec();
    anyhow::Error::new(e).context(format!(
        "cannot restart: exec {}",
        program.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    fn err(fds: &str, pid: Option<&str>, names: Option<&str>) -> String {
        format!(
            "{:#}",
            read(os(fds), pid.and_then(os), names.and_then(os), 7).unwrap_err()
        )
    }

    #[test]
    fn nothing_passed_or_zero_sockets_or_another_process_binds_its_own() {
        for (fds, pid) in [(None, None), (os("0"), os("7")), (os("2"), os("8"))] {
            let passed = read(fds, pid, os("webhook:admin"), 7).unwrap();
            assert!(passed.webhook.is_none() && passed.admin.is_none());
        }
    }

    #[test]
    fn a_count_that_is_not_a_number_or_does_not_match_the_names_is_refused() {
        assert!(err("two", Some("7"), None).contains("LISTEN_FDS=\"two\" is not a count"));
        let e = err("2", Some("7"), Some("webhook"));
        assert!(
            e.contains("names 1 socket(s) and LISTEN_FDS passes 2"),
            "{e}"
        );
    }

    #[test]
    fn names_are_webhook_and_admin_and_one_unnamed_socket_is_the_webhook() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(roles(&names(&[""])).unwrap(), [Role::Webhook]);
        assert_eq!(roles(&names(&["unknown"])).unwrap(), [Role::Webhook]);
        assert_eq!(
            roles(&names(&["admin", "webhook"])).unwrap(),
            [Role::Admin, Role::Webhook]
        );
        let e = roles(&names(&["webhook", "metrics"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fd 4 of LISTEN_FDS is named \"metrics\""), "{e}");
        let e = roles(&names(&["webhook", "webhook"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("two sockets webhook"), "{e}");
        let e = roles(&names(&["admin"])).unwrap_err().to_string();
        assert!(e.contains("no socket named webhook"), "{e}");
    }
}
