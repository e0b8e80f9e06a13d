//! Redis Streams: each row added to the stream by one script that also sets a guard key named
//! by the row's [`message_id`] (its value the entry's id). The script runs atomically, so a row
//! attempted again (after a crash between the reply and the row's write) finds its guard and
//! adds nothing: each row is in the stream at most once. The guard expires when the row could no
//! longer be retried (its schedule, and a day).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{message_id, metadata};
use crate::config::RedisConfig;
use crate::delivery::shown_url;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};

/// KEYS: the guard, the stream. ARGV: the guard's lifetime in seconds, whether the entry may
/// create the stream (`1`), then the entry's fields and values. Replies `{1, id}` when it added
/// the entry, `{0, id}` when the guard says it is there already, `{-1, ''}` when the stream is
/// missing and may not be created.
const ADD_ONCE: &str = r"
local id = redis.call('GET', KEYS[1])
if id then return {0, id} end
if ARGV[2] ~= '1' and redis.call('EXISTS', KEYS[2]) == 0 then return {-1, ''} end
id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
return {1, id}
";

pub(crate) struct Redis {
    client: redis::Client,
    /// Connections not in use; an attempt takes one (or opens one) and puts it back after a
    /// reply. One that failed is dropped.
    idle: Mutex<Vec<redis::Connection>>,
    script: redis::Script,
    stream: String,
    create: bool,
    guard_for: Duration,
    timeout: Duration,
    shown: String,
}

impl Redis {
    /// Checks, when the server answers within `check`, that the stream exists (unless
    /// `create`) and is a stream.
    pub(crate) fn open(
        config: &RedisConfig,
        at: &str,
        timeout: Duration,
        check: Duration,
        guard_for: Duration,
    ) -> anyhow::Result<Redis> {
        let shown = shown_url(config.url.expose());
        let client = redis::Client::open(config.url.expose())
            .map_err(|e| anyhow::anyhow!("{at}.url: not a Redis URL ({})", said(&e)))?;
        let redis = Redis {
            client,
            idle: Mutex::new(Vec::new()),
            script: redis::Script::new(ADD_ONCE),
            stream: config.stream.clone(),
            create: config.create,
            guard_for,
            timeout,
            shown,
        };
        let kind = redis.connect(check).and_then(|mut connection| {
            let kind: String = redis::cmd("TYPE")
                .arg(&redis.stream)
                .query(&mut connection)?;
            redis.idle.lock().expect("not poisoned").push(connection);
            Ok(kind)
        });
        match kind.as_deref() {
            Ok("stream") => {}
            Ok("none") if config.create => {}
            Ok("none") => anyhow::bail!(
                "{at}.stream: there is no stream `{}` at {} (make it, e.g. `XGROUP CREATE {} \
                 workers $ MKSTREAM`, or set `create = true`)",
                redis.stream,
                redis.shown,
                redis.stream
            ),
            Ok(other) => anyhow::bail!(
                "{at}.stream: `{}` at {} is a {other}, not a stream",
                redis.stream,
                redis.shown
            ),
            Err(e) => log::warn!(
                "{at}: Redis at {} cannot be checked at start-up ({}); its rows are attempted, \
                 and retried, until it takes them",
                redis.shown,
                said(e)
            ),
        }
        Ok(redis)
    }

    fn connect(&self, within: Duration) -> redis::RedisResult<redis::Connection> {
        let connection = self.client.get_connection_with_timeout(within)?;
        connection.set_read_timeout(Some(self.timeout))?;
        connection.set_write_timeout(Some(self.timeout))?;
        Ok(connection)
    }

    fn add(
        &self,
        connection: &mut redis::Connection,
        row: &PendingRow,
        payload: &[u8],
    ) -> redis::RedisResult<(i64, String)> {
        let guard = format!("{{{}}}:hookledger:{}", self.stream, message_id(row));
        let mut invocation = self.script.key(guard);
        invocation
            .key(&self.stream)
            .arg(self.guard_for.as_secs().max(1))
            .arg(if self.create { "1" } else { "0" })
            .arg("body")
            .arg(payload);
        for (name, value) in metadata(row) {
            invocation.arg(name).arg(value);
        }
        invocation.invoke(connection)
    }
}

/// A Redis error as told: the server's code and words, or the client's category and cause;
/// never the URL.
fn said(e: &redis::RedisError) -> String {
    let what = e.code().unwrap_or_else(|| e.category());
    match e.detail() {
        Some(detail) => format!("{what}: {detail}"),
        None => what.to_string(),
    }
}

impl Target for Redis {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        let idle = self.idle.lock().expect("not poisoned").pop();
        let mut connection = match idle.map_or_else(|| self.connect(self.timeout), Ok) {
            Ok(connection) => connection,
            Err(e) => {
                return Err(Failure::Transport(format!(
                    "Redis at {}: {}",
                    self.shown,
                    said(&e)
                )))
            }
        };
        let added = self.add(&mut connection, row, payload);
        let (status, _) = added
            .map_err(|e| Failure::Transport(format!("Redis at {}: {}", self.shown, said(&e))))?;
        self.idle.lock().expect("not poisoned").push(connection);
        if status < 0 {
            return Err(Failure::Transport(format!(
                "Redis at {}: there is no stream `{}` (it was deleted, or never made)",
                self.shown, self.stream
            )));
        }
        Ok(None)
    }
}
