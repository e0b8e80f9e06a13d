//! What every command shares: its exit, and where a flag's value came from.

/// Whether a flag's `value` came from the environment variable `var`: clap fills the flag from
/// it too, and the same value there means it came from there.
pub(crate) fn from_environment(value: &Option<String>, var: &str) -> bool {
    value.is_some() && std::env::var(var).ok() == *value
}

/// The secret a flag names as `env:NAME`, `file:PATH` or `credential:NAME` (systemd's); the
/// secret itself is refused, as a command line is visible to every user of the machine.
pub(crate) fn secret_flag(flag: &str, value: &str) -> anyhow::Result<crate::config::Secret> {
    if !["env:", "file:", "credential:"]
        .iter()
        .any(|prefix| value.starts_with(prefix))
    {
        anyhow::bail!(
            "{flag} takes env:NAME, file:PATH or credential:NAME, not the secret itself (a \
             command line is visible to every user of the machine)"
        );
    }
    let reference = crate::config::Secret::new(value);
    Ok(crate::config::one_secret(
        flag,
        &reference,
        std::path::Path::new(""),
    )?)
}

/// A config error about `key`, whose value the flag `flag` gave, as the CLI shows it:
/// `--retention-days (retention.claim_days): …`.
pub(crate) fn flag_error(flag: &str, key: &str, message: &str) -> anyhow::Error {
    anyhow::anyhow!("{flag} ({key}): {message}")
}

/// What `main` turns into an exit code.
pub enum Exit {
    Ok,
    /// The command ran but its result is a failure (e.g. `send` got a non-2xx answer).
    Failed,
}
