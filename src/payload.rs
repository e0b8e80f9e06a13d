//! Stored payloads: an event's verified body is kept compressed with zstd, after a source has
//! enough events with a dictionary trained on its own payloads (`hookledger_payload_dicts`).
//!
//! A ledger row says how its `payload` is stored: `payload_codec` NULL or 0, the body as it
//! came (every row written before compression, and bodies that do not shrink); 1, one zstd
//! frame, made with the dictionary `payload_dict` when that is not NULL. A dictionary is never
//! changed or deleted once stored, so every row can be read for as long as it is kept.
//!
//! Compression runs on the request's thread (the source's submission), never on the writer's;
//! decompression where a payload is read (listings, the console, the outbox worker). A blob
//! that does not decompress is an [`Unreadable`] error naming why, never a panic.
//!
//! Failure modes: a dictionary row missing for a payload that names it (a hand-edited
//! database) or a corrupt frame makes that one payload unreadable; the rest read as before.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use zstd::dict::{DecoderDictionary, EncoderDictionary};
use zstd::zstd_safe;

/// `payload_codec`: the body as it came (also NULL).
pub(crate) const RAW: i64 = 0;
/// `payload_codec`: one zstd frame (with the dictionary `payload_dict`, if any).
pub(crate) const ZSTD: i64 = 1;

/// zstd's level 1, its fastest standard one: compression runs on the request's thread, for
/// every event. Measured on 4–5 KB Stripe events with a source's dictionary: with the zstd CLI,
/// level 3 (zstd's default) gives 269 bytes an event, level 9 239, level 19 229 (the dictionary
/// is what counts); with `hookledger-bench storage` (20,000 events, forwarding on, the whole
/// file per event) level 3 takes 944 bytes and level 1 967, and with `hookledger-bench compare`
/// (4 rounds of 60,000) level 1 serves 1.07x the events a second level 3 did. Frames of any
/// level read back the same, so the level can change between releases.
pub(crate) const LEVEL: i32 = 1;

/// A body decompresses to at most this many bytes: more than any source's body limit allows,
/// so a frame claiming more is corrupt (and is not given that much memory).
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// A payload as stored: its bytes and how to read them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) bytes: Vec<u8>,
    /// [`RAW`] or [`ZSTD`].
    pub(crate) codec: i64,
    /// The dictionary's id (`hookledger_payload_dicts.id`), for a frame made with one.
    pub(crate) dict: Option<i64>,
}

/// A stored payload that cannot be read back: the ledger has it, but not as anything a body
/// can be made of.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored payload cannot be read: {0}")]
pub(crate) struct Unreadable(pub(crate) String);

/// A trained dictionary, ready to compress and decompress with.
pub(crate) struct Dictionary {
    /// zstd's own id of the dictionary (also in every frame made with it): a hash of its
    /// content, so the same id is the same dictionary in any database.
    pub(crate) id: i64,
    encoder: EncoderDictionary<'static>,
    decoder: DecoderDictionary<'static>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary").field("id", &self.id).finish()
    }
}

impl Dictionary {
    /// The dictionary stored as `bytes`; its id is the one zstd wrote in it.
    pub(crate) fn new(bytes: &[u8]) -> Result<Dictionary, Unreadable> {
        let id = zstd_safe::get_dict_id_from_dict(bytes)
            .ok_or_else(|| Unreadable("not a zstd dictionary".into()))?;
        Ok(Dictionary {
            id: i64::from(id.get()),
            encoder: EncoderDictionary::copy(bytes, LEVEL),
            decoder: DecoderDictionary::copy(bytes),
        })
    }
}

/// Trains a dictionary on `samples` (bodies of one source) of at most `size` bytes; its bytes
/// as stored.
pub(crate) fn train(samples: &[Vec<u8>], size: usize) -> std::io::Result<Vec<u8>> {
    zstd::dict::from_samples(samples, size)
}

thread_local! {
    /// One compression context per thread, reused: a context's tables are allocated once.
    static CCTX: RefCell<zstd_safe::CCtx<'static>> = RefCell::new(zstd_safe::CCtx::create());
    static DCTX: RefCell<zstd_safe::DCtx<'static>> = RefCell::new(zstd_safe::DCtx::create());
}

/// `body` as it is stored: a zstd frame (with `dict` when given), or the body itself when the
/// frame would not be smaller.
pub(crate) fn compress(body: &[u8], dict: Option<&Dictionary>) -> Stored {
    let mut out: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(body.len()));
    let done = CCTX.with_borrow_mut(|cctx| match dict {
        Some(d) => cctx.compress_using_cdict(&mut out, body, d.encoder.as_cdict()),
        None => cctx.compress(&mut out, body, LEVEL),
    });
    match done {
        Ok(_) if out.len() < body.len() => {
            out.shrink_to_fit();
            Stored {
                bytes: out,
                codec: ZSTD,
                dict: dict.map(|d| d.id),
            }
        }
        // Incompressible (or zstd refused, which it does not on a big enough buffer): kept
        // as it came.
        _ => Stored {
            bytes: body.to_vec(),
            codec: RAW,
            dict: None,
        },
    }
}

/// The body stored as `bytes` with `codec` (NULL: raw) and `dict`; `load` finds a dictionary
/// by id when it is not cached yet.
pub(crate) fn decompress(
    bytes: Vec<u8>,
    codec: Option<i64>,
    dict: Option<i64>,
    load: impl FnOnce(i64) -> Result<Option<Vec<u8>>, String>,
) -> Result<Vec<u8>, Unreadable> {
    match codec.unwrap_or(RAW) {
        RAW => Ok(bytes),
        ZSTD => {
            let dict = match dict {
                Some(id) => Some(decoder(id, load)?),
                None => None,
            };
            unzstd(&bytes, dict.as_deref())
        }
        other => Err(Unreadable(format!(
            "unknown payload_codec {other} (written by a newer hookledger?)"
        ))),
    }
}

fn unzstd(frame: &[u8], dict: Option<&Dictionary>) -> Result<Vec<u8>, Unreadable> {
    let size = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) if size <= MAX_BODY => size as usize,
        Ok(Some(size)) => {
            return Err(Unreadable(format!(
                "the zstd frame claims {size} bytes, more than any body"
            )))
        }
        Ok(None) => return Err(Unreadable("the zstd frame has no content size".into())),
        Err(_) => return Err(Unreadable("not a zstd frame".into())),
    };
    let mut out: Vec<u8> = Vec::with_capacity(size);
    let done = DCTX.with_borrow_mut(|dctx| match dict {
        Some(d) => dctx.decompress_using_ddict(&mut out, frame, d.decoder.as_ddict()),
        None => dctx.decompress(&mut out, frame),
    });
    match done {
        Ok(n) if n == size => Ok(out),
        Ok(n) => Err(Unreadable(format!(
            "the zstd frame gave {n} bytes where it claims {size}"
        ))),
        Err(code) => Err(Unreadable(format!(
            "zstd: {}",
            zstd_safe::get_error_name(code)
        ))),
    }
}

/// The size of the body a zstd frame holds, read from the frame's header (its first 18 bytes
/// are enough); `None` when `head` is not one.
pub(crate) fn content_size(head: &[u8]) -> Option<u64> {
    zstd_safe::get_frame_content_size(head).ok().flatten()
}

/// Dictionaries by id, for reading: shared by every database of the process, which is safe
/// because an id is a hash of the dictionary's content.
fn decoders() -> &'static RwLock<HashMap<i64, Arc<Dictionary>>> {
    static DECODERS: OnceLock<RwLock<HashMap<i64, Arc<Dictionary>>>> = OnceLock::new();
    DECODERS.get_or_init(Default::default)
}

fn decoder(
    id: i64,
    load: impl FnOnce(i64) -> Result<Option<Vec<u8>>, String>,
) -> Result<Arc<Dictionary>, Unreadable> {
    if let Some(d) = decoders().read().ok().and_then(|m| m.get(&id).cloned()) {
        return Ok(d);
    }
    let bytes = load(id)
        .map_err(|e| Unreadable(format!("cannot read its dictionary {id}: {e}")))?
        .ok_or_else(|| Unreadable(format!("its dictionary {id} is not in the database")))?;
    let d = Arc::new(Dictionary::new(&bytes)?);
    if d.id != id {
        return Err(Unreadable(format!(
            "the dictionary stored as {id} is zstd's dictionary {}",
            d.id
        )));
    }
    remember(&d);
    Ok(d)
}

/// Keeps `d` for reading (a dictionary trained or loaded here need not be read back).
fn remember(d: &Arc<Dictionary>) {
    if let Ok(mut m) = decoders().write() {
        m.entry(d.id).or_insert_with(|| d.clone());
    }
}

/// The dictionary each source compresses with, once it has one: one map per server, shared
/// by the sources (which compress) and the trainer (which fills it in).
#[derive(Debug, Default)]
pub(crate) struct Dictionaries {
    by_source: RwLock<HashMap<Arc<str>, Arc<Dictionary>>>,
    /// Payloads compressed without a dictionary since the start, all sources: the trainer
    /// looks again soon once enough of them came (plain zstd costs about five times the
    /// instructions of zstd with a dictionary on a 2 KB body, measured with callgrind).
    plain: AtomicU64,
}

impl Dictionaries {
    /// `body` of `source` as it is stored.
    pub(crate) fn compress(&self, source: &str, body: &[u8]) -> Stored {
        let dict = self.get(source);
        if dict.is_none() {
            self.plain.fetch_add(1, Ordering::Relaxed);
        }
        compress(body, dict.as_deref())
    }

    /// Payloads compressed without a dictionary since the start.
    pub(crate) fn plain(&self) -> u64 {
        self.plain.load(Ordering::Relaxed)
    }

    pub(crate) fn get(&self, source: &str) -> Option<Arc<Dictionary>> {
        self.by_source.read().ok()?.get(source).cloned()
    }

    /// From now on `source` compresses with `dict`.
    pub(crate) fn set(&self, source: Arc<str>, dict: Arc<Dictionary>) {
        remember(&dict);
        if let Ok(mut m) = self.by_source.write() {
            m.insert(source, dict);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(i: usize) -> Vec<u8> {
        format!(
            r#"{{"id":"evt_{i:024}","object":"event","type":"invoice.paid","data":{{"object":{{"id":"in_{i:020}","amount_paid":{},"currency":"usd","customer":"cus_{:014}","lines":[{{"description":"1 x Pro (at $20.00 / month)","period":{{"end":{},"start":{}}}}}]}}}}}}"#,
            i * 7 % 5000,
            i * 13,
            1_780_000_000 + i,
            1_777_000_000 + i
        )
        .into_bytes()
    }

    #[test]
    fn a_body_comes_back_byte_for_byte_with_and_without_a_dictionary() {
        let samples: Vec<Vec<u8>> = (0..300).map(body).collect();
        let dict = Arc::new(Dictionary::new(&train(&samples, 4096).unwrap()).unwrap());
        let b = body(1000);
        let plain = compress(&b, None);
        assert_eq!((plain.codec, plain.dict), (ZSTD, None));
        let with = compress(&b, Some(&dict));
        assert_eq!((with.codec, with.dict), (ZSTD, Some(dict.id)));
        assert!(with.bytes.len() < plain.bytes.len() && plain.bytes.len() < b.len());
        let no_load = |_| -> Result<Option<Vec<u8>>, String> { panic!("cached") };
        remember(&dict);
        assert_eq!(
            decompress(plain.bytes, Some(ZSTD), None, no_load).unwrap(),
            b
        );
        assert_eq!(
            decompress(with.bytes, Some(ZSTD), with.dict, no_load).unwrap(),
            b
        );
        assert_eq!(decompress(b.clone(), None, None, no_load).unwrap(), b);
    }

    #[test]
    fn an_incompressible_body_is_kept_as_it_came() {
        let b: Vec<u8> = (0..64u8).collect();
        assert_eq!(
            compress(&b, None),
            Stored {
                bytes: b,
                codec: RAW,
                dict: None
            }
        );
    }

    #[test]
    fn a_corrupt_or_unknown_blob_is_an_error_not_a_panic() {
        let none = |_| Ok(None);
        let err = |bytes: Vec<u8>, codec, dict| decompress(bytes, Some(codec), dict, none);
        assert!(err(b"not zstd".to_vec(), ZSTD, None)
            .unwrap_err()
            .0
            .contains("not a zstd frame"));
        let mut frame = compress(&body(1), None).bytes;
        let last = frame.len() - 3;
        frame[last] ^= 0xff;
        frame.truncate(frame.len() - 1);
        assert!(err(frame, ZSTD, None).unwrap_err().0.starts_with("zstd"));
        assert!(err(b"x".to_vec(), 7, None)
            .unwrap_err()
            .0
            .contains("unknown payload_codec 7"));
        let frame = compress(&body(1), None).bytes;
        assert!(err(frame, ZSTD, Some(12345))
            .unwrap_err()
            .0
            .contains("dictionary 12345 is not in the database"));
    }
}
