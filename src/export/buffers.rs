//! Byte buffers used again: the encoded runs of spans (filled on the tracer
//! thread, sent and emptied on the export thread). At tens of thousands of
//! spans per second these are up to ~300 KiB each, several times a second.

use std::sync::Mutex;

/// What is kept at most, in bytes of capacity: a few runs' worth (one of
/// the default 2,048 spans is ~300 KiB; a few are in flight at once).
const KEEP_BYTES: usize = 2 << 20;

#[derive(Debug, Default)]
pub struct Buffers {
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    bufs: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

impl Buffers {
    /// An empty buffer, one used before when there is one.
    pub fn take(&self) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let buf = free.bufs.pop().unwrap_or_default();
        free.bytes -= buf.capacity();
        buf
    }

    /// Gives `buf` back for another use (emptied; freed when keeping it
    /// would go over [`KEEP_BYTES`]).
    pub fn give(&self, mut buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if buf.capacity() == 0 || free.bytes + buf.capacity() > KEEP_BYTES {
            return;
        }
        buf.clear();
        free.bytes += buf.capacity();
        free.bufs.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_with_their_capacity_and_are_bounded_in_bytes() {
        let b = Buffers::default();
        assert_eq!(b.take().capacity(), 0, "none kept yet: a new one");
        let mut v = Vec::with_capacity(1000);
        v.extend_from_slice(b"spans");
        b.give(v);
        let again = b.take();
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(b.free.lock().unwrap().bytes, 0);
        // Large runs: two are kept, the third would go over the bound and
        // is freed.
        for _ in 0..3 {
            b.give(Vec::with_capacity(768 << 10));
        }
        let free = b.free.lock().unwrap();
        assert_eq!(free.bufs.len(), 2);
        assert_eq!(free.bytes, free.bufs.iter().map(Vec::capacity).sum::<usize>());
        assert!(free.bytes <= KEEP_BYTES);
    }
}
