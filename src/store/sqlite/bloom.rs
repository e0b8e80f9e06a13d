//! A Bloom filter over the ledger's keys: "certainly not claimed" without reading the disk.
//!
//! Sized for [`BITS_PER_KEY`] bits a key and [`HASHES`] probes: a false positive rate of
//! about 1e-4 (0.6185^20 ≈ 6.7e-5 at the capacity it was sized for). A false positive costs
//! the claim one index seek a block; a false negative would cost exactly-once, and there is none:
//! every key added sets all of its bits, and nothing clears a bit.

/// Bits a key: with [`HASHES`] probes, about one false positive in 10,000 lookups at capacity.
pub(crate) const BITS_PER_KEY: u64 = 20;

/// Probes a key: `BITS_PER_KEY · ln 2`, rounded, the number that makes false positives rarest.
pub(crate) const HASHES: u64 = 14;

/// How keys become bits ([`key_hash`], then [`bits`]): saved with a filter, so that a filter
/// saved by a release that hashed otherwise is never read as this one's. Change it with
/// either function.
pub(crate) const FORMAT: i64 = 1;

/// The 64-bit hash of a claim's key (FNV-1a over both strings, a separator between them,
/// then SplitMix64's finaliser to spread FNV's low bits): the same in every run.
pub(crate) fn key_hash(source: &str, event_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in source
        .as_bytes()
        .iter()
        .chain(&[0xff])
        .chain(event_id.as_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// SplitMix64's finaliser: every bit of the input reaches every bit of the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bits of `hash` in a filter of `words` words, as (word, mask): double hashing
/// (Kirsch–Mitzenmacher), `h1 + i·h2`.
fn bits(words: usize, hash: u64) -> impl Iterator<Item = (usize, u64)> {
    let m = words as u64 * 64;
    let h2 = mix(hash) | 1;
    (0..HASHES).map(move |i| {
        let bit = hash.wrapping_add(i.wrapping_mul(h2)) % m;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    })
}

pub(crate) struct Bloom {
    words: Vec<u64>,
    /// Keys added; past `capacity` the false positive rate climbs, and the owner rebuilds.
    keys: u64,
    capacity: u64,
}

impl Bloom {
    /// An empty filter for `capacity` keys.
    pub(crate) fn with_capacity(capacity: u64) -> Bloom {
        let capacity = capacity.max(1024);
        let words = (capacity * BITS_PER_KEY).div_ceil(64);
        Bloom {
            words: vec![0; words as usize],
            keys: 0,
            capacity,
        }
    }

    pub(crate) fn insert(&mut self, hash: u64) {
        for (word, mask) in bits(self.words.len(), hash) {
            self.words[word] |= mask;
        }
        self.keys += 1;
    }

    /// False: the key was certainly never added. True: it may have been.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        bits(self.words.len(), hash).all(|(word, mask)| self.words[word] & mask != 0)
    }

    /// Whether it holds more keys than it was sized for.
    pub(crate) fn is_full(&self) -> bool {
        self.keys > self.capacity
    }

    pub(crate) fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Keys added, and keys it was sized for: saved with its bits.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.keys, self.capacity)
    }

    /// Its bits, as saved: each word little-endian, in order.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A filter saved by [`Bloom::to_bytes`], with its counts; why not, when `bytes` is not
    /// the size a filter of `capacity` has here (cut short, or sized by other constants).
    pub(crate) fn from_saved(bytes: &[u8], keys: u64, capacity: u64) -> Result<Bloom, String> {
        let words = capacity
            .checked_mul(BITS_PER_KEY)
            .filter(|_| capacity >= 1024)
            .map(|bits| bits.div_ceil(64))
            .ok_or_else(|| format!("a capacity of {capacity} keys"))?;
        if bytes.len() as u64 != words * 8 {
            return Err(format!(
                "{} byte(s) of bits for a capacity of {capacity} keys ({} expected)",
                bytes.len(),
                words * 8
            ));
        }
        let words = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        Ok(Bloom {
            words,
            keys,
            capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_added_is_found() {
        let mut bloom = Bloom::with_capacity(100_000);
        for i in 0..100_000 {
            bloom.insert(key_hash("github", &format!("{i:08x}-delivery")));
        }
        for i in 0..100_000 {
            assert!(bloom.may_contain(key_hash("github", &format!("{i:08x}-delivery"))));
        }
        assert!(!bloom.is_full());
        bloom.insert(key_hash("github", "one more"));
        assert!(bloom.is_full());
    }

    #[test]
    fn false_positives_stay_near_one_in_ten_thousand_at_capacity() {
        let n = 200_000;
        let mut bloom = Bloom::with_capacity(n);
        for i in 0..n {
            bloom.insert(key_hash("svix", &format!("msg_{i}")));
        }
        let tries = 1_000_000;
        let false_positives = (0..tries)
            .filter(|i| bloom.may_contain(key_hash("svix", &format!("other_{i}"))))
            .count();
        // Expected ~67 (6.7e-5); the bound leaves room for chance, not for a broken filter
        // (one hash too few, or bits landing in one word, gives hundreds or thousands).
        assert!(false_positives <= 150, "{false_positives} in {tries}");
        assert_eq!(bloom.bytes() as u64, n * BITS_PER_KEY / 8);
    }

    #[test]
    fn a_saved_filter_reads_back_whole_and_a_cut_one_does_not() {
        let mut bloom = Bloom::with_capacity(5_000);
        for i in 0..5_000 {
            bloom.insert(key_hash("s", &format!("e{i}")));
        }
        let bytes = bloom.to_bytes();
        let (keys, capacity) = bloom.counts();
        let back = Bloom::from_saved(&bytes, keys, capacity).unwrap();
        assert_eq!(back.words, bloom.words);
        assert_eq!(back.counts(), (5_000, 5_000));
        assert!(Bloom::from_saved(&bytes[..bytes.len() - 8], keys, capacity).is_err());
        assert!(Bloom::from_saved(&bytes, keys, capacity + 64).is_err());
        assert!(Bloom::from_saved(&[], 0, 0).is_err());
        assert!(Bloom::from_saved(&bytes, keys, u64::MAX).is_err());
    }

    #[test]
    fn the_source_is_part_of_the_key() {
        assert_ne!(key_hash("a", "bc"), key_hash("ab", "c"));
        assert_ne!(key_hash("stripe", "evt_1"), key_hash("github", "evt_1"));
        assert_eq!(key_hash("stripe", "evt_1"), key_hash("stripe", "evt_1"));
    }
}
