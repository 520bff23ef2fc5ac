//! Byte buffers used again: the encoded runs of spans (filled on the tracer
//! thread, sent and emptied on the export thread) and the export requests.
//! At tens of thousands of spans per second these are 100–300 KiB each,
//! several times a second: allocating and freeing them (on two threads)
//! showed in profiles as glibc consolidating its free lists.

use std::sync::Mutex;

/// Buffers kept at most (what is in flight at once is a few).
const KEEP: usize = 16;
/// A buffer grown past this is freed, not kept.
const KEEP_CAPACITY: usize = 4 << 20;

#[derive(Debug, Default)]
pub struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl Buffers {
    /// An empty buffer, one used before when there is one.
    pub fn take(&self) -> Vec<u8> {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default()
    }

    /// Gives `buf` back for another use (emptied; freed when enough are kept
    /// or it grew too large).
    pub fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > KEEP_CAPACITY {
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < KEEP {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_with_their_capacity_and_are_bounded() {
        let b = Buffers::default();
        assert_eq!(b.take().capacity(), 0, "none kept yet: a new one");
        let mut v = Vec::with_capacity(1000);
        v.extend_from_slice(b"spans");
        b.give(v);
        let again = b.take();
        assert!(again.is_empty() && again.capacity() >= 1000);
        for _ in 0..KEEP + 5 {
            b.give(Vec::with_capacity(10));
        }
        assert_eq!(b.free.lock().unwrap().len(), KEEP);
        b.give(Vec::with_capacity(KEEP_CAPACITY + 1));
        assert!(b.free.lock().unwrap().iter().all(|v| v.capacity() <= KEEP_CAPACITY), "too large: freed");
    }
}
