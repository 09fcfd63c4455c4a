//! The out-of-sync bitmap towards one peer, in memory: one bit per `bm_block` bytes of
//! data, set by writes the peer did not get and cleared by resync.
//!
//! Bits are atomics so the data path sets them without a lock. Which 4 KiB pages of the
//! bitmap changed since they were last written out is kept beside them, so a write-out
//! touches only those pages (meta.rs writes them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Bits of one on-disk bitmap page (4096 bytes).
pub const BITS_PER_PAGE: u64 = 4096 * 8;
const WORDS_PER_PAGE: usize = 4096 / 8;

#[derive(Debug)]
pub struct Bitmap {
    words: Vec<AtomicU64>,
    bits: u64,
    /// Bytes of data per bit.
    block: u64,
    /// Pages changed since their last write-out.
    dirty_pages: Mutex<Vec<bool>>,
}

impl Bitmap {
    /// `bits` bits of `block` bytes each, all clear.
    pub fn new(bits: u64, block: u64) -> Bitmap {
        let n = usize::try_from(bits.div_ceil(64)).expect("bitmap fits in memory");
        let pages = n.div_ceil(WORDS_PER_PAGE);
        Bitmap {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
            bits,
            block,
            dirty_pages: Mutex::new(vec![false; pages]),
        }
    }

    /// A bitmap loaded from its words (as read from disk); bits past `bits` are ignored.
    pub fn from_words(bits: u64, block: u64, words: &[u64]) -> Bitmap {
        let b = Bitmap::new(bits, block);
        for (i, w) in words.iter().enumerate().take(b.words.len()) {
            b.words[i].store(*w, Ordering::Relaxed);
        }
        b.trim_tail();
        b
    }

    fn trim_tail(&self) {
        let rem = self.bits % 64;
        if rem != 0 {
            if let Some(last) = self.words.last() {
                last.fetch_and((1u64 << rem) - 1, Ordering::Relaxed);
            }
        }
    }

    pub fn bits(&self) -> u64 {
        self.bits
    }

    pub fn block(&self) -> u64 {
        self.block
    }

    /// The bits covering data bytes `[offset, offset + len)`: every bit the range touches.
    pub fn covering(&self, offset: u64, len: u64) -> (u64, u64) {
        let first = offset / self.block;
        let end = (offset + len).div_ceil(self.block).min(self.bits);
        (first, end)
    }

    /// The bits wholly inside `[offset, offset + len)`: only these may be cleared by a
    /// write of that range.
    pub fn inside(&self, offset: u64, len: u64) -> (u64, u64) {
        let first = offset.div_ceil(self.block);
        let end = ((offset + len) / self.block).min(self.bits);
        (first, end.max(first))
    }

    fn mark_page(&self, word: usize) {
        let mut d = self.dirty_pages.lock().unwrap_or_else(|p| p.into_inner());
        d[word / WORDS_PER_PAGE] = true;
    }

    /// Sets bits `[first, end)`.
    pub fn set(&self, first: u64, end: u64) {
        self.change(first, end, true);
    }

    /// Clears bits `[first, end)`.
    pub fn clear(&self, first: u64, end: u64) {
        self.change(first, end, false);
    }

    /// Sets every bit.
    pub fn set_all(&self) {
        self.set(0, self.bits);
    }

    /// Sets the bits of data bytes `[offset, offset + len)`.
    pub fn set_bytes(&self, offset: u64, len: u64) {
        let (a, b) = self.covering(offset, len);
        self.set(a, b);
    }

    fn change(&self, first: u64, end: u64, on: bool) {
        let end = end.min(self.bits);
        let mut bit = first;
        while bit < end {
            let w = usize::try_from(bit / 64).expect("in range");
            let lo = bit % 64;
            let hi = (end - (bit - lo)).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            let old = if on {
                self.words[w].fetch_or(mask, Ordering::AcqRel)
            } else {
                self.words[w].fetch_and(!mask, Ordering::AcqRel)
            };
            let changed = if on { !old & mask } else { old & mask };
            if changed != 0 {
                self.mark_page(w);
            }
            bit = bit - lo + 64;
        }
    }

    pub fn get(&self, bit: u64) -> bool {
        if bit >= self.bits {
            return false;
        }
        let w = usize::try_from(bit / 64).expect("in range");
        self.words[w].load(Ordering::Acquire) & (1 << (bit % 64)) != 0
    }

    /// Bits set.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// Bytes of data marked out of sync (the last bit may cover less than a block).
    pub fn count_bytes(&self, data_size: u64) -> u64 {
        let n = self.count();
        let full = n * self.block;
        if self.bits > 0 && self.get(self.bits - 1) {
            full - (self.bits * self.block - data_size)
        } else {
            full
        }
    }

    /// The first run of set bits at or after `from`, at most `max` bits long.
    pub fn next_run(&self, from: u64, max: u64) -> Option<(u64, u64)> {
        let mut bit = from;
        // Find the first set bit, a word at a time.
        loop {
            if bit >= self.bits {
                return None;
            }
            let w = usize::try_from(bit / 64).expect("in range");
            let word = self.words[w].load(Ordering::Acquire) & (u64::MAX << (bit % 64));
            if word == 0 {
                bit = (bit / 64 + 1) * 64;
                continue;
            }
            bit = bit - bit % 64 + u64::from(word.trailing_zeros());
            break;
        }
        if bit >= self.bits {
            return None;
        }
        let start = bit;
        while bit < self.bits && bit - start < max && self.get(bit) {
            bit += 1;
        }
        Some((start, bit))
    }

    /// ORs `words` into the bitmap (a peer's bits joined to ours).
    pub fn merge_words(&self, first_word: usize, words: &[u64]) {
        for (i, w) in words.iter().enumerate() {
            if let Some(slot) = self.words.get(first_word + i) {
                if *w != 0 && slot.fetch_or(*w, Ordering::AcqRel) & *w != *w {
                    self.mark_page(first_word + i);
                }
            }
        }
        self.trim_tail();
    }

    /// A copy of the words `[first, first + n)`.
    pub fn words(&self, first: usize, n: usize) -> Vec<u64> {
        self.words
            .iter()
            .skip(first)
            .take(n)
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }

    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Takes the list of pages changed since the last call (page index, its words); the
    /// caller writes them out, and calls [`Bitmap::redirty`] if that fails.
    pub fn take_dirty_pages(&self) -> Vec<(usize, Vec<u64>)> {
        let pages: Vec<usize> = {
            let mut d = self.dirty_pages.lock().unwrap_or_else(|p| p.into_inner());
            let list = d
                .iter()
                .enumerate()
                .filter(|(_, on)| **on)
                .map(|(i, _)| i)
                .collect();
            d.iter_mut().for_each(|x| *x = false);
            list
        };
        pages
            .into_iter()
            .map(|p| (p, self.words(p * WORDS_PER_PAGE, WORDS_PER_PAGE)))
            .collect()
    }

    /// Marks pages dirty again (their write-out failed).
    pub fn redirty(&self, pages: &[usize]) {
        let mut d = self.dirty_pages.lock().unwrap_or_else(|p| p.into_inner());
        for &p in pages {
            if let Some(x) = d.get_mut(p) {
                *x = true;
            }
        }
    }

    /// Marks every page dirty (the whole bitmap is written at the next write-out).
    pub fn redirty_all(&self) {
        let mut d = self.dirty_pages.lock().unwrap_or_else(|p| p.into_inner());
        d.iter_mut().for_each(|x| *x = true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_count_and_runs() {
        let b = Bitmap::new(200, 4096);
        b.set(3, 70);
        assert_eq!(b.count(), 67);
        assert_eq!(b.next_run(0, 1000), Some((3, 70)));
        assert_eq!(b.next_run(0, 10), Some((3, 13)));
        b.clear(10, 20);
        assert_eq!(b.count(), 57);
        assert_eq!(b.next_run(4, 1000), Some((4, 10)));
        assert_eq!(b.next_run(10, 1000), Some((20, 70)));
        assert_eq!(b.next_run(70, 1000), None);
        b.set(199, 300);
        assert_eq!(b.count(), 58);
        assert_eq!(b.next_run(71, 1000), Some((199, 200)));
    }

    #[test]
    fn byte_ranges_round_outward_to_set_and_inward_to_clear() {
        let b = Bitmap::new(10, 4096);
        assert_eq!(b.covering(4095, 2), (0, 2));
        assert_eq!(b.inside(4095, 2), (1, 1));
        assert_eq!(b.inside(4096, 8192), (1, 3));
        // The last bit of a data size that is not a whole block counts its real bytes.
        b.set(9, 10);
        assert_eq!(b.count_bytes(9 * 4096 + 512), 512);
    }

    #[test]
    fn dirty_pages_follow_changes() {
        let b = Bitmap::new(BITS_PER_PAGE * 3, 4096);
        assert!(b.take_dirty_pages().is_empty());
        b.set(BITS_PER_PAGE + 5, BITS_PER_PAGE + 6);
        let pages = b.take_dirty_pages();
        assert_eq!(pages.len(), 1);
        assert_eq!(pages[0].0, 1);
        assert_eq!(pages[0].1[0], 1 << 5);
        // Setting a bit that is already set changes nothing.
        b.set(BITS_PER_PAGE + 5, BITS_PER_PAGE + 6);
        assert!(b.take_dirty_pages().is_empty());
        b.merge_words(0, &[1, 0, 2]);
        assert_eq!(b.count(), 3);
        assert_eq!(b.take_dirty_pages().len(), 1);
    }
}
