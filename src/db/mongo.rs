//! MongoDB's wire protocol (OP_MSG) of one connection.
//!
//! A request's body section is its command document: the first key is the
//! command (`find`, `insert`, `aggregate`, `hello`), its value the
//! collection when it is a string, `$db` the namespace. The reply with the
//! request's id in `responseTo` ends it: `ok` (0 is an error, with `code`
//! and `errmsg`), and the documents of `cursor.firstBatch`/`nextBatch` or
//! `n` as rows. A request with `moreToCome` gets no reply (its operation ends
//! where it was sent); replies to no request seen (an exhaust cursor's,
//! a connection open before parsing began) are skipped. OP_COMPRESSED and
//! the legacy opcodes end the parsing ([`Stop::Unfollowed`]).
//!
//! Only the first [`KEEP`] bytes of a message are read as BSON, and the last
//! [`TAIL`] for a long reply's `ok`: a command whose `$db` comes after a
//! large filter has no namespace; a long reply's rows are not counted.

use std::collections::VecDeque;

use super::{Dir, Frame, Framer, Op, Options, Out, Stop, KEEP, PENDING_MAX};

const OP_MSG: u32 = 2013;
const OP_COMPRESSED: u32 = 2012;
const OP_QUERY: u32 = 2004;
const OP_REPLY: u32 = 1;
/// Largest message believed (the server's maxMessageSizeBytes).
const MAX_LEN: u32 = 48_000_000;
const MORE_TO_COME: u32 = 1 << 1;

pub struct Parser {
    options: Options,
    client: Framer,
    server: Framer,
    /// Requests by id, awaiting their replies.
    pending: VecDeque<(u32, Op)>,
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// A BSON value as the parser needs it.
#[derive(Debug, PartialEq)]
enum Val<'a> {
    Str(&'a str),
    Num(f64),
    Bool(bool),
    Doc(&'a [u8]),
    Array(&'a [u8]),
    Other,
}

/// The elements of one BSON document (`doc` starts at its length); stops
/// at the first element that does not fit (a cut document yields its
/// complete elements).
fn elements(doc: &[u8]) -> impl Iterator<Item = (&[u8], Val<'_>)> {
    let end = le32(doc, 0).map_or(0, |l| (l as usize).min(doc.len()));
    let mut at = 4;
    std::iter::from_fn(move || {
        let t = *doc.get(at)?;
        if t == 0 || at >= end {
            return None;
        }
        let name_end = at + 1 + memchr::memchr(0, doc.get(at + 1..end)?)?;
        let name = &doc[at + 1..name_end];
        let v = name_end + 1;
        let sized = |extra: usize| le32(doc, v).map(|l| l as usize + extra);
        let (len, val) = match t {
            0x01 => (8, doc.get(v..v + 8).map_or(Val::Other, |b| Val::Num(f64::from_le_bytes(b.try_into().unwrap_or([0; 8]))))),
            0x02 | 0x0d | 0x0e => {
                let l = sized(4)?;
                let s = doc.get(v + 4..(v + l).saturating_sub(1)).and_then(|b| std::str::from_utf8(b).ok());
                (l, s.map_or(Val::Other, Val::Str))
            }
            0x03 | 0x04 => {
                let l = sized(0)?;
                let d = doc.get(v..v + l)?;
                (l, if t == 0x03 { Val::Doc(d) } else { Val::Array(d) })
            }
            0x05 => (sized(5)?, Val::Other),
            0x06 | 0x0a | 0xff | 0x7f => (0, Val::Other),
            0x07 => (12, Val::Other),
            0x08 => (1, Val::Bool(doc.get(v).is_some_and(|b| *b != 0))),
            0x09 | 0x11 => (8, Val::Other),
            0x12 => (8, doc.get(v..v + 8).map_or(Val::Other, |b| Val::Num(i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64))),
            0x10 => (4, le32(doc, v).map_or(Val::Other, |n| Val::Num(f64::from(n as i32)))),
            0x13 => (16, Val::Other),
            0x0b => {
                let a = memchr::memchr(0, doc.get(v..end)?)?;
                let b = memchr::memchr(0, doc.get(v + a + 1..end)?)?;
                (a + b + 2, Val::Other)
            }
            0x0c => (sized(4)? + 12, Val::Other),
            0x0f => (sized(0)?, Val::Other),
            _ => return None,
        };
        if v + len > end {
            return None;
        }
        at = v + len;
        Some((name, val))
    })
}

fn get<'a>(doc: &'a [u8], key: &[u8]) -> Option<Val<'a>> {
    elements(doc).find(|(k, _)| *k == key).map(|(_, v)| v)
}

fn count(array: &[u8]) -> u64 {
    elements(array).count() as u64
}

/// An OP_MSG body's flags and its body section's document (kind 0), which
/// may be cut.
fn body_doc(body: &[u8]) -> Option<(u32, &[u8])> {
    let flags = le32(body, 0)?;
    let mut at = 4;
    loop {
        match *body.get(at)? {
            0 => return Some((flags, body.get(at + 1..)?)),
            1 => {
                // A document sequence: its size, then on.
                let l = le32(body, at + 1)? as usize;
                at += 1 + l;
            }
            _ => return None,
        }
    }
}

impl Parser {
    pub fn new(options: Options) -> Parser {
        Parser { options, client: Framer::default(), server: Framer::default(), pending: VecDeque::new() }
    }

    pub(crate) fn abandon(&mut self) -> u64 {
        let n = self.pending.len() as u64;
        self.pending.clear();
        n
    }

    pub(crate) fn feed(&mut self, dir: Dir, mut bytes: &[u8], skip: usize, out: &mut Out<'_>) -> Result<(), Stop> {
        let hdr = |_: &[u8]| 16;
        let frame = |h: &[u8]| -> Result<Frame, Stop> {
            let len = le32(h, 0).unwrap_or(0);
            let op = le32(h, 12).unwrap_or(0);
            if !((21..=MAX_LEN).contains(&len) || op == OP_REPLY && (36..=MAX_LEN).contains(&len)) {
                return Err(Stop::Garbled);
            }
            match op {
                OP_MSG => Ok(Frame { body_len: len as usize - 16, keep: KEEP }),
                OP_COMPRESSED | OP_QUERY | OP_REPLY => Err(Stop::Unfollowed),
                _ => Err(Stop::Garbled),
            }
        };
        let framer = if dir == Dir::Request { &mut self.client } else { &mut self.server };
        let mut msgs = Vec::new();
        while let Some(m) = framer.next(&mut bytes, out.chunk, hdr, frame)? {
            msgs.push((m.header.to_vec(), m.body.to_vec(), m.cut, m.tail.to_vec(), m.start_chunk));
        }
        if let Some(m) = framer.skip(skip, Stop::Gap)? {
            msgs.push((m.header.to_vec(), m.body.to_vec(), true, Vec::new(), m.start_chunk));
        }
        for (h, body, cut, tail, start) in msgs {
            let id = le32(&h, 4).unwrap_or(0);
            let to = le32(&h, 8).unwrap_or(0);
            match dir {
                Dir::Request => self.request(id, &body, cut, start, out)?,
                Dir::Response => self.reply(to, &body, cut, &tail, out)?,
            }
        }
        Ok(())
    }

    fn request(&mut self, id: u32, body: &[u8], cut: bool, start: u64, out: &mut Out<'_>) -> Result<(), Stop> {
        let (flags, doc) = body_doc(body).ok_or(Stop::Garbled)?;
        let mut it = elements(doc);
        let Some((name, first)) = it.next() else { return Err(Stop::Garbled) };
        let operation = String::from_utf8_lossy(name).into_owned();
        let collection = match first {
            Val::Str(s) if !s.is_empty() => Some(s.to_string()),
            _ => None,
        };
        let namespace = match get(doc, b"$db") {
            Some(Val::Str(s)) => Some(s.to_string()),
            _ => None,
        };
        // The command as text only with raw queries: its values are the
        // app's data (sanitizing BSON is not attempted).
        let query = self.options.raw_query.then(|| format!("{{\"{operation}\": …}}"));
        let mut op = Op { operation, collection, namespace, query, query_truncated: cut, start_chunk: start, ..Op::default() };
        if flags & MORE_TO_COME != 0 {
            op.end_chunk = out.chunk;
            out.ops.push(op);
            return Ok(());
        }
        if self.pending.len() >= PENDING_MAX {
            return Err(Stop::Overflow);
        }
        self.pending.push_back((id, op));
        Ok(())
    }

    fn reply(&mut self, to: u32, body: &[u8], cut: bool, tail: &[u8], out: &mut Out<'_>) -> Result<(), Stop> {
        let Some(i) = self.pending.iter().position(|(id, _)| *id == to) else { return Ok(()) };
        let Some((_, mut op)) = self.pending.remove(i) else { return Ok(()) };
        let (_, doc) = body_doc(body).ok_or(Stop::Garbled)?;
        let mut ok = None;
        let (mut code, mut errmsg) = (None, None);
        for (k, v) in elements(doc) {
            match (k, v) {
                (b"ok", Val::Num(n)) => ok = Some(n != 0.0),
                (b"ok", Val::Bool(b)) => ok = Some(b),
                (b"code", Val::Num(n)) => code = Some(n as i64),
                (b"errmsg", Val::Str(s)) => errmsg = Some(s.to_string()),
                (b"n", Val::Num(n)) if n >= 0.0 => op.rows = Some(n as u64),
                (b"cursor", Val::Doc(c)) => {
                    for (k, v) in elements(c) {
                        if let (b"firstBatch" | b"nextBatch", Val::Array(a)) = (k, v) {
                            op.rows = Some(count(a));
                        }
                    }
                }
                _ => {}
            }
        }
        if ok.is_none() && cut {
            // A long reply: its `ok` is near its end.
            if let Some(at) = memchr::memmem::find(tail, b"\x01ok\x00") {
                if let Some(b) = tail.get(at + 4..at + 12) {
                    ok = Some(f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) != 0.0);
                }
            }
        }
        if ok == Some(false) {
            op.status = Some(code.map_or_else(|| "ERROR".to_string(), |c| c.to_string()));
            op.error = errmsg;
        }
        op.end_chunk = out.chunk;
        out.ops.push(op);
        Ok(())
    }
}
