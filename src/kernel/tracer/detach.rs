//! Detaching links without holding up the thread that reads the ring
//! buffer: each detach waits for the kernel's RCU grace periods.

use libbpf_rs::Link;

/// One thread, started with the first link to detach, that drops the links
/// it is given: detaching waits for the kernel's RCU grace periods (tens of
/// ms), which the thread reading the ring buffer must not. One thread for
/// the run, not one per exited process: a thread per exit kept glibc's
/// per-thread heaps and stack caches growing under process churn (+9 MiB
/// over 30 processes in the churn test).
#[derive(Default)]
pub(super) struct Detacher {
    tx: Option<std::sync::mpsc::Sender<Vec<Link>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Detacher {
    pub(super) fn detach(&mut self, links: Vec<Link>) {
        if self.tx.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<Link>>();
            let spawned = std::thread::Builder::new().name("uvspan-detach".into()).spawn(move || rx.into_iter().for_each(drop));
            match spawned {
                Ok(t) => (self.tx, self.thread) = (Some(tx), Some(t)),
                // No thread to be had: detach here, the slow way.
                Err(_) => return drop(links),
            }
        }
        if let Some(Err(e)) = self.tx.as_ref().map(|tx| tx.send(links)) {
            drop(e.0);
        }
    }
}

impl Drop for Detacher {
    /// Whatever was handed over is detached before uvspan goes on exiting.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Detaches links side by side: each waits for the kernel's RCU grace
/// periods (~40 ms for a multi-uprobe link), not for each other.
pub(super) fn detach_all(links: Vec<Link>) {
    if links.len() <= 1 {
        return drop(links);
    }
    let threads: Vec<_> = links.into_iter().map(|l| std::thread::spawn(move || drop(l))).collect();
    for t in threads {
        let _ = t.join();
    }
}
