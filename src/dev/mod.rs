pub(crate) mod client;

/// 16 hex digits from the operating system's random source (a fresh name or id).
pub(crate) fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(std::io::Error::from)?;
    Ok(hex::encode(bytes))
}
