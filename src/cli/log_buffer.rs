//! The log's writer: lines are handed to a thread of their own (`hookledger-log`), which writes
//! what has come in one `write` to stderr, then pauses for [`PAUSE`]. Under load the request
//! path logs a line per event; written one by one, each was a system call on a request's
//! thread, with the two request threads taking turns on stderr's lock.
//!
//! Lines keep their order: every line goes through one buffer, and whoever writes it out
//! (the thread, or [`flush`]) holds the write lock from taking the buffer until it is written.
//!
//! # Failure modes
//! - A line reaches stderr at most [`PAUSE`] (plus the write) after it was logged: a `kill -9`
//!   loses the lines of that last moment. Exits that hookledger makes itself lose none: the
//!   binary's [`LogGuard`] flushes when `main` ends (and when it unwinds), and a restart in
//!   place flushes before its `exec`; from then on lines are written at once.
//! - A stderr that does not take lines (a full pipe) stops the thread; once [`MAX_PENDING`]
//!   bytes wait, a thread that logs waits too, as it did on the write itself before. Nothing is
//!   dropped.
//! - A write that fails is not retried (there is nowhere else to say it).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// How long the thread waits after a write before it takes the next lines.
const PAUSE: Duration = Duration::from_millis(2);

/// Bytes of lines that may wait; a thread that logs beyond waits for the writer.
const MAX_PENDING: usize = 1 << 20;

/// The lines not written yet, where they go, and how the thread and the loggers wait.
struct Buffer {
    pending: Mutex<Vec<u8>>,
    /// Lines came (for the thread).
    came: Condvar,
    /// The lines were taken (for a logger waiting for room).
    taken: Condvar,
    /// Where lines go (stderr), held from taking lines until they are written: keeps the
    /// order between the thread and [`flush`]. Always taken before `pending`.
    sink: Mutex<Box<dyn Write + Send>>,
    /// Set by [`flush`] for good: each line is written at once from then on.
    direct: AtomicBool,
}

impl Buffer {
    /// A buffer into `sink`, with its thread started.
    fn start(sink: Box<dyn Write + Send>) -> &'static Buffer {
        let buffer: &'static Buffer = Box::leak(Box::new(Buffer {
            pending: Mutex::new(Vec::new()),
            came: Condvar::new(),
            taken: Condvar::new(),
            sink: Mutex::new(sink),
            direct: AtomicBool::new(false),
        }));
        let started = std::thread::Builder::new()
            .name("hookledger-log".into())
            .spawn(move || run(buffer))
            .is_ok();
        // No thread (out of threads): every line at once.
        buffer.direct.store(!started, Ordering::SeqCst);
        buffer
    }
}

/// The process's buffer, into stderr.
fn buffer() -> &'static Buffer {
    static BUFFER: OnceLock<&'static Buffer> = OnceLock::new();
    BUFFER.get_or_init(|| Buffer::start(Box::new(std::io::stderr())))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The thread: waits for lines, writes what has come, pauses.
fn run(buffer: &'static Buffer) {
    let mut spare = Vec::new();
    loop {
        {
            let mut pending = lock(&buffer.pending);
            while pending.is_empty() {
                pending = buffer
                    .came
                    .wait(pending)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        write_out(buffer, &mut spare);
        std::thread::sleep(PAUSE);
    }
}

/// Takes the waiting lines (leaving `spare`'s room in their place) and writes them.
fn write_out(buffer: &Buffer, spare: &mut Vec<u8>) {
    let mut sink = lock(&buffer.sink);
    std::mem::swap(&mut *lock(&buffer.pending), spare);
    buffer.taken.notify_all();
    if !spare.is_empty() {
        let _ = sink.write_all(spare).and_then(|()| sink.flush());
        spare.clear();
    }
}

/// Writes the lines still waiting, and every later line at once: before the process ends or
/// replaces itself (`exec`).
pub(crate) fn flush() {
    flush_into(buffer());
}

fn flush_into(buffer: &Buffer) {
    let mut sink = lock(&buffer.sink);
    buffer.direct.store(true, Ordering::SeqCst);
    let waiting = std::mem::take(&mut *lock(&buffer.pending));
    buffer.taken.notify_all();
    let _ = sink.write_all(&waiting).and_then(|()| sink.flush());
}

/// Flushes the log when dropped: the binary holds it in `main` (see [`flush`]).
#[must_use = "the log is flushed when this is dropped: keep it until the process ends"]
pub struct LogGuard(());

impl LogGuard {
    pub(crate) fn new() -> LogGuard {
        LogGuard(())
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        flush();
    }
}

/// The log's writer (`tracing_subscriber`'s `MakeWriter`): one formatted line a write.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Buffered;

impl Write for Buffered {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        add(buffer(), line)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Adds `line` to the lines waiting, or writes it at once after a [`flush`].
fn add(buffer: &Buffer, line: &[u8]) -> std::io::Result<usize> {
    if buffer.direct.load(Ordering::SeqCst) {
        return lock(&buffer.sink).write(line);
    }
    let mut pending = lock(&buffer.pending);
    while pending.len() >= MAX_PENDING && !buffer.direct.load(Ordering::SeqCst) {
        pending = buffer
            .taken
            .wait(pending)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    let was_empty = pending.is_empty();
    pending.extend_from_slice(line);
    drop(pending);
    if was_empty {
        buffer.came.notify_one();
    }
    Ok(line.len())
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffered {
    type Writer = Buffered;

    fn make_writer(&'a self) -> Buffered {
        Buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A sink the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_from_several_threads_arrive_whole_and_in_each_threads_order_and_a_flush_loses_none() {
        let out = Shared::default();
        let buffer = Buffer::start(Box::new(out.clone()));
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for i in 0..5_000 {
                        add(buffer, format!("thread {t} line {i}\n").as_bytes()).unwrap();
                    }
                });
            }
        });
        flush_into(buffer);
        // After the flush a line is written at once.
        add(buffer, b"after\n").unwrap();
        let text = String::from_utf8(lock(&out.0).clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 20_001);
        assert_eq!(lines.last(), Some(&"after"));
        for t in 0..4 {
            let prefix = format!("thread {t} line ");
            let order: Vec<usize> = lines
                .iter()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|i| i.parse().unwrap())
                .collect();
            assert_eq!(order, (0..5_000).collect::<Vec<_>>(), "thread {t}");
        }
    }

    #[test]
    fn the_thread_writes_a_line_soon_without_a_flush() {
        let out = Shared::default();
        let buffer = Buffer::start(Box::new(out.clone()));
        add(buffer, b"one line\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lock(&out.0).is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*lock(&out.0), b"one line\n");
    }

    /// A sink that takes nothing until the gate opens.
    struct Gated(Arc<Mutex<()>>, Shared);

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _open = lock(&self.0);
            self.1.write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_sink_that_takes_nothing_holds_the_logger_back_past_the_bound_and_drops_nothing() {
        let gate = Arc::new(Mutex::new(()));
        let out = Shared::default();
        let closed = lock(&gate);
        let buffer = Buffer::start(Box::new(Gated(gate.clone(), out.clone())));
        let line = [b'x'; 1023];
        let logger = std::thread::spawn(move || {
            for _ in 0..3 * MAX_PENDING / 1024 {
                add(buffer, &[&line[..], b"\n"].concat()).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!logger.is_finished(), "the logger went past the bound");
        drop(closed);
        logger.join().unwrap();
        flush_into(buffer);
        assert_eq!(lock(&out.0).len(), 3 * MAX_PENDING);
    }
}
