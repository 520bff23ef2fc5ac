//! The traced app's database connections as the kernel sends them (wire
//! records: every buffer the app wrote on a connection whose first write
//! looked like a database protocol, every read of it, numbered per
//! connection) made into operations ([`DbRecord`]): one [`Conn`] per
//! connection, each operation under the cause of the write that sent its
//! command, timed from that write to the read that took its response's last
//! byte. Pure.
//!
//! Whose operation: a pool hands a connection to the next queued query
//! inside the callback that took the last one's response, so the write that
//! sends a command runs under the request that finished before, not the one
//! that asked. The request that answers its client in the callback that
//! took an operation's response is the one that waited for it: an operation
//! is held until its response's callback has written a response (or its
//! thread has gone on to another callback, or [`HOLD_NS`] passed) and is then
//! the writer's if the writer answered there, else that answering request's.
//! One written in a hand-off (in the callback where its writer's request
//! answered) that no one answers for is no request's: its writer is done.
//!
//! A connection is followed from its first record. One that began before
//! tracing (its first record not numbered 0) is followed only where its
//! bytes are unmistakable ([`guess`] on its server's default port). A lost
//! record (a gap in the numbers: the ring buffer was full, or a write had
//! more buffers than the kernel reads) ends its parsing, counted: an
//! operation is never paired with another's response.

use std::collections::VecDeque;
use std::net::SocketAddr;

use rustc_hash::FxHashMap;

use super::{guess, Conn, Dir, Op, Options, Stop, System};
use crate::events::decode::{HttpRecord, HttpWhat};

/// The most connections followed at once (past it the longest idle goes,
/// its unanswered operations counted).
pub const CONNS_MAX: usize = 4096;
/// The most chunks remembered per connection for its operations' times and
/// causes (a deeper pipeline's oldest operations are counted, not made).
pub const CHUNKS_MAX: usize = 8192;
/// The longest an operation waits for its response's callback to say
/// whose it is (kernel ns of the records seen since).
pub const HOLD_NS: u64 = 200_000_000;
/// The most operations waiting so.
const HELD_MAX: usize = 4096;
/// The latest answers remembered.
const ANSWERS_MAX: usize = 256;
/// Bytes of a connection's first read kept while its protocol is not known
/// (MySQL's server speaks first).
const GREETING_MAX: usize = 1024;

/// One database operation, with what its connection and records said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbRecord {
    pub pid: u32,
    /// The thread that wrote its command.
    pub tid: u32,
    /// The cause of the write that sent its command (without the sampler's
    /// bit: see `dropped`).
    pub cause: u64,
    /// The kernel's sampler dropped that cause's trace: counted in the
    /// metrics only.
    pub dropped: bool,
    /// Kernel ns: the write that sent its command, the read that took the
    /// last of its response.
    pub start_ns: u64,
    pub end_ns: u64,
    pub system: System,
    pub mariadb: bool,
    /// The connection's peer.
    pub server: Option<(String, u16)>,
    pub op: Op,
}

impl DbRecord {
    /// What the span and metric builders take.
    pub fn call(&self) -> super::spans::Call<'_> {
        super::spans::Call {
            op: &self.op,
            system: self.system,
            mariadb: self.mariadb,
            server: self.server.clone(),
            times: (self.start_ns, self.end_ns),
        }
    }
}

/// What the wire stage counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Connections whose protocol was made out.
    pub connections: u64,
    /// Operations made.
    pub ops: u64,
    /// Connections whose bytes matched no protocol (never parsed).
    pub unknown: u64,
    /// Connections whose parsing ended: a lost record, bytes the parser
    /// could not follow, a cut inside a message it needed, too deep a
    /// pipeline, or a protocol switch (TLS, COPY, pub/sub).
    pub stopped: u64,
    /// Requests that never became an operation (unanswered when parsing
    /// ended or the connection was dropped, skipped by the server, or
    /// older than [`CHUNKS_MAX`] chunks).
    pub lost_ops: u64,
    /// Connections dropped to stay within [`CONNS_MAX`].
    pub evicted: u64,
    /// Operations whose command another request's callback wrote (a pool's
    /// hand-off): given to the request that answered in their response's
    /// callback.
    pub handed_off: u64,
    /// Operations whose response callback answered several requests that
    /// cannot be matched to them (pipelined commands of several requests),
    /// or whose command was handed off by a request that had answered
    /// already and whose own callback answered no one: exported as no
    /// request's.
    pub unattributed: u64,
}

/// A chunk's record facts: when, by whom, under which cause.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    ts_ns: u64,
    tid: u32,
    cause: u64,
    dropped: bool,
    /// A read's callback number (0: a write, or not known).
    read_callback: u32,
}

enum State {
    /// The protocol is not known yet: the server's first read, if it spoke
    /// first, kept.
    Guessing(Option<(Vec<u8>, usize, Chunk)>),
    Parsing(Box<Conn>),
    /// Not followed (counted where it ended).
    Off,
}

struct Link {
    next_seq: u16,
    peer: Option<SocketAddr>,
    state: State,
    /// Chunk `base` is `chunks[0]`.
    base: u64,
    chunks: VecDeque<Chunk>,
    last_ns: u64,
    /// Numbered from 0: the connection was seen from its start.
    from_start: bool,
    /// The next operation made here was written in a hand-off: in the
    /// response callback of one whose request had answered its client
    /// there, so its write's cause is that finished request's, not its own.
    handoff: bool,
}

/// An operation waiting to learn whose it is.
struct Waiting {
    rec: DbRecord,
    link: (u32, u64),
    /// Its response's last read: thread and callback (0: that callback
    /// is over).
    tid: u32,
    callback: u32,
    /// The next command on its connection was written in that callback
    /// (a transaction's next statement, or a pool's hand-off).
    continued: bool,
    /// The requests that answered their clients in that callback.
    answers: Vec<u64>,
    /// Its command was written in a hand-off (see [`Link::handoff`]): its
    /// writer is never its owner by default.
    handed: bool,
    /// Whose it is, once known.
    owner: Option<u64>,
}

/// Every followed connection of every traced process.
#[derive(Default)]
pub struct Wire {
    links: FxHashMap<(u32, u64), Link>,
    waiting: VecDeque<Waiting>,
    /// The newest record's time seen.
    now_ns: u64,
    /// The latest answers (responses written), by thread and callback: an
    /// operation's response may span reads, and its request may answer in
    /// the first (an error) before the last ends it.
    answers: VecDeque<((u32, u32, u32), u64)>,
    options: Options,
    pub stats: WireStats,
}

impl Wire {
    pub fn new(options: Options) -> Wire {
        Wire { options, ..Wire::default() }
    }

    /// One wire record: the operations whose owner is now known, in their
    /// responses' order.
    pub fn record(&mut self, r: &HttpRecord, out: &mut Vec<DbRecord>) {
        self.went_on(r);
        if r.what == HttpWhat::WireWrite {
            self.continues((r.pid, r.conn), r);
        }
        self.parse(r);
        self.release(false, out);
    }

    /// An HTTP write: a response written in an operation's response
    /// callback says whose it was.
    pub fn http_write(&mut self, r: &HttpRecord, out: &mut Vec<DbRecord>) {
        if self.links.is_empty() {
            return;
        }
        self.went_on(r);
        if r.callback != 0 && r.data.starts_with(b"HTTP/") && crate::tasks::cause::task_of(r.cause).is_none() {
            if self.answers.len() >= ANSWERS_MAX {
                self.answers.pop_front();
            }
            self.answers.push_back(((r.pid, r.tid, r.callback), r.cause));
            for w in self.waiting.iter_mut() {
                if w.owner.is_none()
                    && w.callback != 0
                    && (w.rec.pid, w.tid, w.callback) == (r.pid, r.tid, r.callback)
                    && !w.answers.contains(&r.cause)
                    && w.answers.len() < 8
                {
                    w.answers.push(r.cause);
                }
            }
        }
        self.release(false, out);
    }

    /// Every waiting operation, decided as it stands (uvspan stopping).
    pub fn flush(&mut self, out: &mut Vec<DbRecord>) {
        self.release(true, out);
    }

    /// The time now (kernel monotonic ns): operations that waited
    /// [`HOLD_NS`] out.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<DbRecord>) {
        self.now_ns = self.now_ns.max(now_ns);
        self.release(false, out);
    }

    /// Operation `i` is `owner`'s, and so are the operations before it on
    /// its connection that led to it (each written in the last one's
    /// response callback, none answered there).
    fn decide(&mut self, i: usize, owner: u64) {
        let link = self.waiting[i].link;
        self.waiting[i].owner = Some(owner);
        let mut handed = u64::from(self.waiting[i].rec.cause != owner);
        for j in (0..i).rev() {
            let w = &mut self.waiting[j];
            if w.link != link {
                continue;
            }
            if !w.continued || w.owner.is_some() {
                break;
            }
            w.owner = Some(owner);
            handed += u64::from(w.rec.cause != owner);
        }
        self.stats.handed_off += handed;
    }

    /// A record of a thread's later callback: its waiting operations'
    /// callbacks are over; one whose callback answered no one and wrote no
    /// next command is its writer's.
    fn went_on(&mut self, r: &HttpRecord) {
        self.now_ns = self.now_ns.max(r.ts_ns);
        if r.callback == 0 {
            return;
        }
        let over: Vec<usize> = (0..self.waiting.len())
            .filter(|&i| {
                let w = &self.waiting[i];
                w.callback != 0 && w.rec.pid == r.pid && w.tid == r.tid && w.callback != r.callback
            })
            .collect();
        let mut callbacks: Vec<u32> = over.iter().map(|&i| self.waiting[i].callback).collect();
        callbacks.dedup();
        for cb in callbacks {
            let group: Vec<usize> = over.iter().copied().filter(|&i| self.waiting[i].callback == cb).collect();
            self.callback_over(&group);
        }
    }

    /// The callback where operations `group` took their responses is over
    /// (all of one thread's callback): whose each one was. An operation is
    /// its writer's when the writer answered there, or the one request's
    /// that answered there when it is the only operation; several
    /// operations of one writer are one operation here (a pipeline); several
    /// operations and several answers that do not match their writers one
    /// to one cannot be told apart: they are no request's (counted), never
    /// a guess. One that no one answered for is its writer's, or, when the
    /// next command was written there, whoever that one's is.
    fn callback_over(&mut self, group: &[usize]) {
        let writers: Vec<u64> = group.iter().map(|&i| self.waiting[i].rec.cause).collect();
        let answers = group.first().map(|&i| self.waiting[i].answers.clone()).unwrap_or_default();
        let distinct = writers.iter().enumerate().all(|(k, w)| !writers[..k].contains(w));
        for (k, &i) in group.iter().enumerate() {
            self.waiting[i].callback = 0;
            if self.waiting[i].owner.is_some() {
                continue;
            }
            let writer = writers[k];
            let (continued, handed) = (self.waiting[i].continued, self.waiting[i].handed);
            let owner = if answers.is_empty() {
                if continued {
                    continue;
                }
                self.writers_or_none(handed, writer)
            } else if group.len() == 1 || writers.iter().all(|w| *w == writers[0]) {
                if answers.contains(&writer) {
                    if continued {
                        // Its request answered here: the next command is another's.
                        self.handoff_on(self.waiting[i].link);
                    }
                    writer
                } else if answers.len() == 1 {
                    answers[0]
                } else {
                    self.stats.unattributed += 1;
                    0
                }
            } else if distinct && writers.iter().all(|w| answers.contains(w)) {
                writer
            } else {
                self.stats.unattributed += 1;
                0
            };
            self.decide(i, owner);
        }
    }

    /// An operation no one answered for: its writer's, unless its command
    /// was written in a hand-off (its writer's request had answered
    /// already): then no request's, counted, never a guess.
    fn writers_or_none(&mut self, handed: bool, writer: u64) -> u64 {
        if handed {
            self.stats.unattributed += 1;
            0
        } else {
            writer
        }
    }

    /// The next operation made on `link` was written in a hand-off.
    fn handoff_on(&mut self, link: (u32, u64)) {
        if let Some(l) = self.links.get_mut(&link) {
            l.handoff = true;
        }
    }

    /// A command written on `link` in the callback of its last waiting
    /// operation's response: that one led to this one (and a hand-off's
    /// successor is one too: its write has the same wrong cause).
    fn continues(&mut self, link: (u32, u64), r: &HttpRecord) {
        if r.callback == 0 {
            return;
        }
        let mut handed = false;
        if let Some(w) = self.waiting.iter_mut().rev().find(|w| w.link == link) {
            if w.owner.is_none() && w.callback != 0 && (w.tid, w.callback) == (r.tid, r.callback) {
                w.continued = true;
                handed = w.handed;
            }
        }
        if handed {
            self.handoff_on(link);
        }
    }

    /// The decided operations out, in order (and those that waited too
    /// long: their writer's).
    fn release(&mut self, all: bool, out: &mut Vec<DbRecord>) {
        while let Some(w) = self.waiting.front() {
            let late = all || w.rec.end_ns + HOLD_NS < self.now_ns || self.waiting.len() > HELD_MAX;
            if late && w.owner.is_none() && w.callback != 0 {
                let key = (w.rec.pid, w.tid, w.callback);
                let group: Vec<usize> = (0..self.waiting.len())
                    .filter(|&i| {
                        let v = &self.waiting[i];
                        v.callback != 0 && (v.rec.pid, v.tid, v.callback) == key
                    })
                    .collect();
                self.callback_over(&group);
                continue;
            }
            let Some(w) = self.waiting.front() else { break };
            let owner = match w.owner {
                Some(o) => o,
                None if late => {
                    let (handed, writer) = (w.handed, w.rec.cause);
                    self.writers_or_none(handed, writer)
                }
                None => break,
            };
            let Some(mut w) = self.waiting.pop_front() else { break };
            w.rec.cause = owner;
            out.push(w.rec);
        }
    }

    fn parse(&mut self, r: &HttpRecord) {
        let dir = match r.what {
            HttpWhat::WireWrite => Dir::Request,
            HttpWhat::WireRead => Dir::Response,
            _ => return,
        };
        let seq = r.stream as u16;
        let key = (r.pid, r.conn);
        // A connection at a stream's address numbered from 0 again is a new one.
        if seq == 0 {
            if let Some(old) = self.links.remove(&key) {
                self.stats.lost_ops += pending_of(old);
            }
        }
        if !self.links.contains_key(&key) {
            if self.links.len() >= CONNS_MAX {
                self.evict_idle();
            }
            let link = Link {
                next_seq: seq,
                peer: r.peer,
                state: State::Guessing(None),
                base: 0,
                chunks: VecDeque::new(),
                last_ns: r.ts_ns,
                from_start: seq == 0,
                handoff: false,
            };
            self.links.insert(key, link);
        }
        let Some(link) = self.links.get_mut(&key) else { return };
        link.last_ns = r.ts_ns;
        if link.peer.is_none() {
            link.peer = r.peer;
        }
        if seq != link.next_seq {
            // A record was lost: nothing after it can be paired.
            if !matches!(link.state, State::Off) {
                self.stats.lost_ops += stop(link);
                self.stats.stopped += 1;
            }
        }
        link.next_seq = seq.wrapping_add(1);
        let read_callback = if dir == Dir::Response { r.callback } else { 0 };
        let chunk = Chunk { ts_ns: r.ts_ns, tid: r.tid, cause: r.cause, dropped: r.dropped, read_callback };
        let len = (r.len as usize).max(r.data.len());
        let port = link.peer.map_or(0, |p| p.port());
        match &mut link.state {
            State::Off => return,
            State::Guessing(first) => match dir {
                Dir::Response if first.is_none() && link.from_start => {
                    let keep = &r.data[..r.data.len().min(GREETING_MAX)];
                    *first = Some((keep.to_vec(), len, chunk));
                    return;
                }
                Dir::Response => {
                    // A reply to nothing seen, or a second one first: not followed.
                    link.state = State::Off;
                    self.stats.unknown += 1;
                    return;
                }
                Dir::Request => {
                    let greeting = first.take();
                    let response = greeting.as_ref().map_or(&[][..], |g| &g.0[..]);
                    let system = guess(&r.data, response, port).filter(|s| link.from_start || port == s.default_port());
                    let Some(system) = system else {
                        link.state = State::Off;
                        self.stats.unknown += 1;
                        return;
                    };
                    self.stats.connections += 1;
                    let mut conn = Box::new(Conn::new(system, self.options));
                    if let Some((bytes, len, c)) = greeting {
                        link.base = conn.feed(Dir::Response, &bytes, len);
                        link.chunks.push_back(c);
                    } else {
                        link.base = 0;
                    }
                    link.state = State::Parsing(conn);
                }
            },
            State::Parsing(_) => {}
        }
        let State::Parsing(conn) = &mut link.state else { return };
        let n = conn.feed(dir, &r.data, len);
        if link.chunks.is_empty() {
            link.base = n;
        }
        link.chunks.push_back(chunk);
        while link.chunks.len() > CHUNKS_MAX {
            link.chunks.pop_front();
            link.base += 1;
        }
        let (system, mariadb) = (conn.system(), conn.is_mariadb());
        let server = link.peer.map(|p| (p.ip().to_string(), p.port()));
        for op in conn.take_ops() {
            let at = |c: u64| c.checked_sub(link.base).and_then(|i| link.chunks.get(i as usize)).copied();
            let (Some(start), Some(end)) = (at(op.start_chunk), at(op.end_chunk)) else {
                self.stats.lost_ops += 1;
                continue;
            };
            self.stats.ops += 1;
            let (op_start, op_end) = (op.start_chunk + 1, op.end_chunk);
            let rec = DbRecord {
                pid: r.pid,
                tid: start.tid,
                cause: start.cause,
                dropped: start.dropped,
                start_ns: start.ts_ns,
                end_ns: end.ts_ns.max(start.ts_ns),
                system,
                mariadb,
                server: server.clone(),
                op,
            };
            // No callback number (not known): its writer's.
            let owner = (r.callback == 0).then_some(rec.cause);
            // Answers in the callbacks of its response's earlier reads.
            let mut answers = Vec::new();
            for c in op_start..op_end {
                let Some(ch) = at(c) else { continue };
                if ch.read_callback == 0 {
                    continue;
                }
                for (k, cause) in &self.answers {
                    if *k == (r.pid, ch.tid, ch.read_callback) && !answers.contains(cause) && answers.len() < 8 {
                        answers.push(*cause);
                    }
                }
            }
            let handed = std::mem::take(&mut link.handoff);
            let w = Waiting { rec, link: key, tid: r.tid, callback: r.callback, continued: false, answers, owner, handed };
            self.waiting.push_back(w);
        }
        if conn.stopped().is_some() {
            self.stats.stopped += 1;
            self.stats.lost_ops += conn.dropped();
            link.state = State::Off;
        }
    }

    /// A process exited: its connections go (their unanswered operations
    /// counted; the decided ones out).
    pub fn exited(&mut self, pid: u32, out: &mut Vec<DbRecord>) {
        self.release(true, out);
        let gone: Vec<(u32, u64)> = self.links.keys().filter(|k| k.0 == pid).copied().collect();
        for k in gone {
            if let Some(l) = self.links.remove(&k) {
                self.stats.lost_ops += pending_of(l);
            }
        }
    }

    /// Connections followed now.
    pub fn open(&self) -> usize {
        self.links.len()
    }

    fn evict_idle(&mut self) {
        if let Some(k) = self.links.iter().min_by_key(|(_, l)| l.last_ns).map(|(k, _)| *k) {
            if let Some(l) = self.links.remove(&k) {
                self.stats.lost_ops += pending_of(l);
                self.stats.evicted += 1;
            }
        }
    }
}

/// Requests of a connection's parser that never got their response.
fn pending_of(mut l: Link) -> u64 {
    stop(&mut l)
}

/// Ends a link's parsing; returns its operations that will not be made.
fn stop(l: &mut Link) -> u64 {
    match std::mem::replace(&mut l.state, State::Off) {
        State::Parsing(mut c) if c.stopped().is_none() => c.abandon(),
        _ => 0,
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Garbled => "bytes the parser could not follow",
            Stop::Gap => "a capture cut across a message",
            Stop::Overflow => "too deep a pipeline",
            Stop::Unfollowed => "a protocol switch (TLS, COPY, pub/sub)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::tests::recording;

    fn rec(what: HttpWhat, seq: u16, ts: u64, cause: u64, data: &[u8], port: u16) -> HttpRecord {
        HttpRecord {
            pid: 7,
            tid: 7,
            ts_ns: ts,
            cause,
            dropped: false,
            conn: 0xabc,
            stream: i32::from(seq),
            what,
            len: data.len() as u32,
            tls: false,
            peer: (seq == 0).then(|| SocketAddr::from(([127, 0, 0, 1], port))),
            local_port: None,
            data: data.to_vec(),
            callback: 0,
        }
    }

    /// A recording fed as wire records, the writes alternating between two
    /// causes (as requests sharing a pooled connection do).
    fn feed(name: &str, port: u16, causes: [u64; 2], lose: Option<u16>) -> (Vec<DbRecord>, WireStats) {
        let mut w = Wire::new(Options::default());
        let mut out = Vec::new();
        let mut writes = 0;
        for (i, (dir, bytes)) in recording(name).into_iter().enumerate() {
            let seq = i as u16;
            let what = match dir {
                Dir::Request => {
                    writes += 1;
                    HttpWhat::WireWrite
                }
                Dir::Response => HttpWhat::WireRead,
            };
            if lose == Some(seq) {
                continue;
            }
            w.record(&rec(what, seq, 1000 * (i as u64 + 1), causes[writes % 2], &bytes, port), &mut out);
        }
        (out, w.stats)
    }

    #[test]
    fn every_operation_is_its_writes_cause_and_spans_write_to_read() {
        let (ops, stats) = feed("pg_scram", 5432, [11, 22], None);
        assert!(ops.len() >= 5, "{ops:?}");
        assert_eq!(stats.connections, 1);
        assert_eq!(stats.lost_ops, 0);
        for o in &ops {
            assert!(o.cause == 11 || o.cause == 22);
            assert!(o.end_ns > o.start_ns, "{o:?}");
            assert_eq!(o.server, Some(("127.0.0.1".to_string(), 5432)));
            assert_eq!(o.system, System::Postgres);
        }
        let missing = ops.iter().find(|o| o.op.status.as_deref() == Some("42P01")).expect("the missing table's error");
        assert_eq!(missing.op.collection.as_deref(), Some("missing_table"));
    }

    #[test]
    fn mysql_is_made_out_from_its_servers_greeting() {
        let (ops, stats) = feed("mysql2", 3306, [1, 2], None);
        assert_eq!(stats.connections, 1, "{stats:?}");
        assert!(ops.iter().all(|o| o.mariadb && o.system == System::Mysql));
        assert!(ops.iter().any(|o| o.op.status.as_deref() == Some("1146")));
    }

    #[test]
    fn a_lost_record_ends_the_connections_parsing_counted() {
        let (all, _) = feed("ioredis", 6379, [1, 2], None);
        let (ops, stats) = feed("ioredis", 6379, [1, 2], Some(6));
        assert!(ops.len() < all.len());
        assert_eq!(stats.stopped, 1);
        // Nothing after the gap: every op made is one of the full run's first.
        assert_eq!(ops[..], all[..ops.len()]);
    }

    #[test]
    fn other_bytes_are_not_followed() {
        let mut w = Wire::new(Options::default());
        let mut out = Vec::new();
        w.record(&rec(HttpWhat::WireWrite, 0, 1, 1, b"*garbage that is not RESP", 9999), &mut out);
        w.record(&rec(HttpWhat::WireRead, 1, 2, 1, b"+OK\r\n", 9999), &mut out);
        assert!(out.is_empty());
        assert_eq!(w.stats.unknown, 1);
        // A connection met mid-stream off its default port: not guessed.
        let mut w = Wire::new(Options::default());
        w.record(&rec(HttpWhat::WireWrite, 5, 1, 1, b"GET k\r\n", 7000), &mut out);
        assert_eq!(w.stats.unknown, 1);
    }

    #[test]
    fn connections_are_bounded() {
        let mut w = Wire::new(Options::default());
        let mut out = Vec::new();
        for i in 0..(CONNS_MAX as u64 + 10) {
            let mut r = rec(HttpWhat::WireWrite, 0, i, 1, b"*1\r\n$4\r\nPING\r\n", 6379);
            r.conn = i;
            w.record(&r, &mut out);
        }
        assert_eq!(w.open(), CONNS_MAX);
        assert_eq!(w.stats.evicted, 10);
    }

    #[test]
    fn a_long_reply_cut_by_the_capture_is_skipped_and_the_connection_goes_on() {
        let mut c = Conn::new(System::Redis, Options::default());
        let info = b"*1\r\n$4\r\ninfo\r\n";
        c.feed(Dir::Request, info, info.len());
        let mut resp = b"$5000\r\n".to_vec();
        resp.extend(std::iter::repeat_n(b'a', 5000));
        resp.extend(b"\r\n");
        // As the kernel sends it: the first UVSPAN_HTTP_CAPTURE bytes, the read's length.
        c.feed(Dir::Response, &resp[..1024], resp.len());
        let get = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        c.feed(Dir::Request, get, get.len());
        c.feed(Dir::Response, b"$1\r\nv\r\n", 7);
        assert_eq!(c.stopped(), None);
        let ops: Vec<String> = c.take_ops().into_iter().map(|o| o.operation).collect();
        assert_eq!(ops, ["INFO", "GET"]);
    }

    /// One Redis connection's records in order, numbered, each with its
    /// callback, and the HTTP responses written between them.
    struct Script {
        w: Wire,
        out: Vec<DbRecord>,
        seq: u16,
        ts: u64,
    }

    impl Script {
        fn new() -> Script {
            Script { w: Wire::new(Options::default()), out: Vec::new(), seq: 0, ts: 0 }
        }

        fn wire(&mut self, what: HttpWhat, cause: u64, callback: u32, data: &[u8]) {
            let mut r = rec(what, self.seq, self.ts, cause, data, 6379);
            r.callback = callback;
            self.seq += 1;
            self.ts += 10;
            self.w.record(&r, &mut self.out);
        }

        fn get(&mut self, cause: u64, callback: u32, key: &str) {
            self.wire(HttpWhat::WireWrite, cause, callback, format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes());
        }

        fn reply(&mut self, cause: u64, callback: u32) {
            self.wire(HttpWhat::WireRead, cause, callback, b"$1\r\nv\r\n");
        }

        /// Request `cause` answers its client in `callback`.
        fn answer(&mut self, cause: u64, callback: u32) {
            let mut r = rec(HttpWhat::Write, 0, 0, cause, b"HTTP/1.1 200 OK\r\n\r\n", 80);
            (r.conn, r.callback, r.peer) = (1, callback, None);
            self.w.http_write(&r, &mut self.out);
        }

        /// (query, owner) of each operation out.
        fn got(&self) -> Vec<(String, u64)> {
            self.out.iter().map(|o| (o.op.query.clone().unwrap_or_default(), o.cause)).collect()
        }
    }

    #[test]
    fn a_pools_hand_off_goes_to_the_request_that_answers_in_its_response_callback() {
        let mut s = Script::new();
        // A writes its GET a; a's reply callback hands the connection to B's
        // GET b (written under A) and answers A; b's answers B.
        s.get(1, 1, "a");
        s.reply(1, 2);
        s.get(1, 2, "b");
        s.answer(1, 2);
        s.reply(1, 3);
        s.answer(2, 3);
        // C's two statements, the second written in the first's reply
        // callback, then C answers: both C's.
        s.get(3, 4, "c");
        s.reply(3, 5);
        s.get(3, 5, "d");
        s.reply(3, 6);
        s.answer(3, 6);
        // Written under C, answered by D two statements later: D's.
        s.get(3, 6, "e");
        s.reply(3, 7);
        s.get(3, 7, "f");
        s.reply(3, 8);
        s.answer(4, 8);
        // Answered by no one, the thread goes on: its writer's.
        s.get(5, 9, "g");
        s.reply(5, 10);
        s.answer(6, 11);
        s.w.flush(&mut s.out);
        let want: Vec<(String, u64)> = [("GET a", 1), ("GET b", 2), ("GET c", 3), ("GET d", 3), ("GET e", 4), ("GET f", 4), ("GET g", 5)]
            .iter()
            .map(|(q, c)| (q.to_string(), *c))
            .collect();
        assert_eq!(s.got(), want);
        assert_eq!(s.w.stats.handed_off, 3);
    }

    /// A hand-off (written in the reply callback where its writer's request
    /// answered) whose own reply callback answers no one, as a request
    /// answered after a timer or a later read would: no request's, counted,
    /// not the finished writer's; and the same when it waits its time out.
    #[test]
    fn a_hand_off_no_one_answers_for_is_no_requests() {
        for late in [false, true] {
            let mut s = Script::new();
            s.get(1, 1, "a");
            s.reply(1, 2);
            s.get(1, 2, "b");
            s.answer(1, 2);
            s.reply(1, 3);
            if late {
                s.w.tick(HOLD_NS + 1_000, &mut s.out);
            } else {
                // The thread goes on: b's callback is over, no one answered.
                s.get(9, 4, "z");
                s.w.flush(&mut s.out);
            }
            assert_eq!(&s.got()[..2], &[("GET a".to_string(), 1), ("GET b".to_string(), 0)], "late: {late}");
            assert_eq!(s.w.stats.unattributed, 1, "late: {late}");
        }
    }
}
