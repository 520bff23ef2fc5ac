//! PostgreSQL's frontend/backend protocol (3.0) of one connection.
//!
//! Requests: a simple query (`Q`) is one operation, answered by its
//! CommandComplete(s) or ErrorResponse and ended by ReadyForQuery. The
//! extended protocol's Parse (`P`) names a statement's SQL (the unnamed one,
//! or a prepared statement reused by name), Bind (`B`) makes a portal of it,
//! and each Execute (`E`) is one operation, ended by its CommandComplete,
//! EmptyQueryResponse, PortalSuspended or ErrorResponse; after an error the
//! server skips the batch's later Executes up to Sync (counted as dropped,
//! not made operations). The startup and authentication exchange (SCRAM,
//! MD5, trust) and SSLRequest are skipped; a connection already open when
//! parsing began is followed from its first message. COPY and replication
//! end the parsing ([`Stop::Unfollowed`]).

use std::collections::VecDeque;

use super::sql;
use super::{Dir, Frame, Framer, Op, Options, Out, Stop, NAMES_MAX, PENDING_MAX};

/// Largest message length believed (the server's own limit is 1 GiB).
const MAX_LEN: u32 = 1 << 30;
/// The message types a client sends after its startup packet.
const CLIENT_TYPES: &[u8] = b"QPBEDSCHXFpdcf";

/// What the client sent that awaits the server.
#[derive(Debug)]
enum Pending {
    /// A simple query: ended by ReadyForQuery.
    Query(Op),
    /// An Execute: ended by its completion or an error.
    Execute(Op),
    /// A Sync: ended by ReadyForQuery (Executes before it that got no
    /// completion were skipped by the server).
    Sync,
}

pub struct Parser {
    options: Options,
    client: Framer,
    server: Framer,
    /// The client's first message is its startup packet (no type byte).
    client_startup: bool,
    /// The server answers an SSLRequest/GSSENCRequest with one byte.
    server_one_byte: u32,
    /// Between startup and the first ReadyForQuery.
    login: bool,
    database: Option<String>,
    /// Prepared statements by name ("" is the unnamed one): their SQL.
    statements: VecDeque<(String, Statement)>,
    /// Portals by name: their statement's SQL.
    portals: VecDeque<(String, Statement)>,
    pending: VecDeque<Pending>,
    /// The chunk the next operation's first message (Parse, Bind…) began in.
    next_start: Option<u64>,
    seen_any: bool,
}

#[derive(Clone, Debug, Default)]
struct Statement {
    text: String,
    truncated: bool,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// A NUL-terminated string at `*at` (moved past it); `None` if the body
/// ends first.
fn cstr<'a>(b: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = b.get(*at..)?;
    let n = memchr::memchr(0, rest)?;
    *at += n + 1;
    Some(&rest[..n])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn remember(map: &mut VecDeque<(String, Statement)>, name: String, st: Statement) {
    if let Some(i) = map.iter().position(|(n, _)| *n == name) {
        map.remove(i);
    }
    if map.len() >= NAMES_MAX {
        map.pop_front();
    }
    map.push_back((name, st));
}

fn lookup<'a>(map: &'a VecDeque<(String, Statement)>, name: &str) -> Option<&'a Statement> {
    map.iter().rev().find(|(n, _)| n == name).map(|(_, s)| s)
}

impl Parser {
    pub fn new(options: Options) -> Parser {
        Parser {
            options,
            client: Framer::default(),
            server: Framer::default(),
            client_startup: true,
            server_one_byte: 0,
            login: false,
            database: None,
            statements: VecDeque::new(),
            portals: VecDeque::new(),
            pending: VecDeque::new(),
            next_start: None,
            seen_any: false,
        }
    }

    pub(crate) fn abandon(&mut self) -> u64 {
        let n = self.pending.iter().filter(|p| !matches!(p, Pending::Sync)).count();
        self.pending.clear();
        n as u64
    }

    pub(crate) fn feed(&mut self, dir: Dir, mut bytes: &[u8], skip: usize, out: &mut Out<'_>) -> Result<(), Stop> {
        match dir {
            Dir::Request => {
                if !self.seen_any && !bytes.is_empty() {
                    self.seen_any = true;
                    // Mid-stream: a typed message (its type is a letter; a
                    // startup packet's length starts with a zero byte).
                    self.client_startup = bytes[0] == 0;
                }
                loop {
                    let startup = self.client_startup;
                    let hdr = |_: &[u8]| if startup { 4 } else { 5 };
                    let frame = |h: &[u8]| -> Result<Frame, Stop> {
                        let len = if startup { be32(h, 0) } else { be32(h, 1) }.unwrap_or(0);
                        let min = if startup { 8 } else { 4 };
                        if !(min..=MAX_LEN).contains(&len) || !startup && !CLIENT_TYPES.contains(&h[0]) {
                            return Err(Stop::Garbled);
                        }
                        let keep = if startup || b"QPBEC".contains(&h[0]) { super::KEEP } else { 0 };
                        Ok(Frame { body_len: len as usize - 4, keep })
                    };
                    let Some(m) = self.client.next(&mut bytes, out.chunk, hdr, frame)? else { break };
                    let (t, body, cut, start) = (if startup { 0 } else { m.header[0] }, m.body.to_vec(), m.cut, m.start_chunk);
                    self.client_msg(t, &body, cut, start, out)?;
                }
                if let Some(m) = self.client.skip(skip, Stop::Gap)? {
                    let (t, body, start) = (if m.header.len() == 5 { m.header[0] } else { 0 }, m.body.to_vec(), m.start_chunk);
                    self.client_msg(t, &body, true, start, out)?;
                }
            }
            Dir::Response => {
                while self.server_one_byte > 0 && !bytes.is_empty() && !self.server.mid_message() {
                    self.server_one_byte -= 1;
                    match bytes[0] {
                        // TLS follows on the socket: its plaintext is the
                        // caller's to feed (SSL_read/SSL_write), the startup
                        // packet next.
                        b'S' | b'G' | b'N' => self.client_startup = true,
                        _ => return Err(Stop::Garbled),
                    }
                    bytes = &bytes[1..];
                }
                loop {
                    let hdr = |_: &[u8]| 5;
                    let frame = |h: &[u8]| -> Result<Frame, Stop> {
                        let len = be32(h, 1).unwrap_or(0);
                        if !(4..=MAX_LEN).contains(&len) || !h[0].is_ascii_alphanumeric() {
                            return Err(Stop::Garbled);
                        }
                        let keep = if b"CEZ".contains(&h[0]) { super::KEEP } else { 0 };
                        Ok(Frame { body_len: len as usize - 4, keep })
                    };
                    let Some(m) = self.server.next(&mut bytes, out.chunk, hdr, frame)? else { break };
                    let (t, body) = (m.header[0], m.body.to_vec());
                    self.server_msg(t, &body, out)?;
                }
                if let Some(m) = self.server.skip(skip, Stop::Gap)? {
                    let (t, body) = (m.header[0], m.body.to_vec());
                    self.server_msg(t, &body, out)?;
                }
            }
        }
        Ok(())
    }

    fn push(&mut self, p: Pending) -> Result<(), Stop> {
        if self.pending.len() >= PENDING_MAX {
            return Err(Stop::Overflow);
        }
        self.pending.push_back(p);
        Ok(())
    }

    fn op(&mut self, st: &Statement, start: u64) -> Op {
        let start = self.next_start.take().unwrap_or(start);
        let query = if self.options.raw_query { st.text.clone() } else { sql::sanitize(&st.text) };
        Op {
            operation: sql::operation(&st.text).unwrap_or_default(),
            collection: sql::collection(&st.text),
            namespace: self.database.clone(),
            query: (!st.text.is_empty()).then_some(query),
            query_truncated: st.truncated,
            start_chunk: start,
            ..Op::default()
        }
    }

    fn client_msg(&mut self, t: u8, body: &[u8], cut: bool, start: u64, _out: &mut Out<'_>) -> Result<(), Stop> {
        if t == 0 {
            // Startup, SSLRequest, GSSENCRequest or CancelRequest.
            let code = be32(body, 0).ok_or(Stop::Garbled)?;
            match code {
                0x0003_0000 => {
                    self.client_startup = false;
                    self.login = true;
                    let mut at = 4;
                    let mut user = None;
                    while let Some(k) = cstr(body, &mut at).filter(|k| !k.is_empty()) {
                        let v = cstr(body, &mut at).unwrap_or_default();
                        match k {
                            b"database" => self.database = Some(text(v)),
                            b"user" => user = Some(text(v)),
                            _ => {}
                        }
                    }
                    // The server's default database is the user's name.
                    if self.database.is_none() {
                        self.database = user;
                    }
                }
                80_877_103 | 80_877_104 => self.server_one_byte += 1,
                80_877_102 => {}
                // Replication and other protocol versions: not followed.
                _ => return Err(Stop::Unfollowed),
            }
            return Ok(());
        }
        match t {
            b'Q' => {
                let mut at = 0;
                let sql = cstr(body, &mut at);
                let st = Statement { text: text(sql.unwrap_or(body)), truncated: cut || sql.is_none() };
                let op = self.op(&st, start);
                self.push(Pending::Query(op))?;
            }
            b'P' => {
                let mut at = 0;
                let name = cstr(body, &mut at).map(text).unwrap_or_default();
                let sql = cstr(body, &mut at);
                let st = Statement { text: text(sql.unwrap_or(&body[at.min(body.len())..])), truncated: cut && sql.is_none() };
                remember(&mut self.statements, name, st);
                self.next_start.get_or_insert(start);
            }
            b'B' => {
                let mut at = 0;
                let portal = cstr(body, &mut at).map(text).unwrap_or_default();
                let stmt = cstr(body, &mut at).map(text).unwrap_or_default();
                let st = lookup(&self.statements, &stmt).cloned().unwrap_or_default();
                remember(&mut self.portals, portal, st);
                self.next_start.get_or_insert(start);
            }
            b'E' => {
                let mut at = 0;
                let portal = cstr(body, &mut at).map(text).unwrap_or_default();
                let st = lookup(&self.portals, &portal).cloned().unwrap_or_default();
                let op = self.op(&st, start);
                self.push(Pending::Execute(op))?;
            }
            b'S' => self.push(Pending::Sync)?,
            b'C' => {
                // Close a statement ('S') or a portal ('P').
                let mut at = 1;
                let name = cstr(body, &mut at).map(text).unwrap_or_default();
                let map = if body.first() == Some(&b'S') { &mut self.statements } else { &mut self.portals };
                if let Some(i) = map.iter().position(|(n, _)| *n == name) {
                    map.remove(i);
                }
            }
            b'D' => {
                self.next_start.get_or_insert(start);
            }
            // Flush, Terminate, password/SASL answers, function calls.
            b'H' | b'X' | b'p' | b'F' => {}
            // COPY data from the client: not followed.
            b'd' | b'c' | b'f' => return Err(Stop::Unfollowed),
            _ => return Err(Stop::Garbled),
        }
        Ok(())
    }

    fn server_msg(&mut self, t: u8, body: &[u8], out: &mut Out<'_>) -> Result<(), Stop> {
        let chunk = out.chunk;
        match t {
            b'C' | b'I' | b's' => {
                let tag = (t == b'C').then(|| {
                    let mut at = 0;
                    text(cstr(body, &mut at).unwrap_or(body))
                });
                match self.pending.front_mut() {
                    Some(Pending::Query(op)) => {
                        if let Some(tag) = &tag {
                            apply_tag(op, tag);
                        }
                    }
                    Some(Pending::Execute(op)) => {
                        if let Some(tag) = &tag {
                            apply_tag(op, tag);
                        }
                        op.end_chunk = chunk;
                        if let Some(Pending::Execute(op)) = self.pending.pop_front() {
                            out.ops.push(op);
                        }
                    }
                    // Nothing asked: parsing began mid-response.
                    None => {}
                    // A completion where a Sync's ReadyForQuery belongs.
                    Some(Pending::Sync) => return Err(Stop::Garbled),
                }
            }
            b'E' => {
                let (code, msg) = error_fields(body);
                match self.pending.front_mut() {
                    Some(Pending::Query(op)) => {
                        op.status = Some(code);
                        op.error = Some(msg);
                    }
                    Some(Pending::Execute(op)) => {
                        op.status = Some(code);
                        op.error = Some(msg);
                        op.end_chunk = chunk;
                        if let Some(Pending::Execute(op)) = self.pending.pop_front() {
                            out.ops.push(op);
                        }
                        // The server skips to the next Sync.
                        while let Some(Pending::Execute(_)) = self.pending.front() {
                            self.pending.pop_front();
                            out.dropped += 1;
                        }
                    }
                    // An error before any request (a failed login, a
                    // shutdown): no operation.
                    _ => {}
                }
            }
            b'Z' => {
                self.login = false;
                match self.pending.pop_front() {
                    Some(Pending::Query(mut op)) => {
                        op.end_chunk = chunk;
                        out.ops.push(op);
                    }
                    Some(Pending::Sync) | None => {}
                    Some(Pending::Execute(_)) => {
                        // Executes the server skipped, up to their Sync.
                        out.dropped += 1;
                        while let Some(p) = self.pending.pop_front() {
                            if matches!(p, Pending::Sync) {
                                break;
                            }
                            out.dropped += 1;
                        }
                    }
                }
            }
            // COPY: not followed.
            b'G' | b'H' | b'W' => return Err(Stop::Unfollowed),
            // Authentication, parameters, key data, row descriptions and
            // rows, parse/bind/close completion, notices, notifications,
            // no data, function results, negotiation.
            b'R' | b'S' | b'K' | b'T' | b'D' | b'1' | b'2' | b'3' | b'N' | b'A' | b'n' | b't' | b'V' | b'v' | b'c' | b'd' => {
                if t == b'D' {
                    if let Some(Pending::Query(op) | Pending::Execute(op)) = self.pending.front_mut() {
                        op.rows = Some(op.rows.unwrap_or(0) + 1);
                    }
                }
            }
            _ => return Err(Stop::Garbled),
        }
        Ok(())
    }
}

/// A CommandComplete tag (`SELECT 3`, `INSERT 0 2`, `CREATE TABLE`): the
/// operation it names and its row count.
fn apply_tag(op: &mut Op, tag: &str) {
    let mut parts: Vec<&str> = tag.split(' ').collect();
    let rows = parts.last().and_then(|n| n.parse::<u64>().ok());
    if rows.is_some() {
        parts.pop();
        // INSERT's oid.
        if parts.first() == Some(&"INSERT") && parts.len() == 2 {
            parts.pop();
        }
        op.rows = rows;
    }
    let name = parts.join(" ");
    if !name.is_empty() {
        op.operation = name;
    }
}

/// An ErrorResponse's SQLSTATE (`C`) and message (`M`).
fn error_fields(body: &[u8]) -> (String, String) {
    let (mut code, mut msg) = (String::new(), String::new());
    let mut at = 0;
    while let Some(&f) = body.get(at) {
        if f == 0 {
            break;
        }
        at += 1;
        let Some(v) = cstr(body, &mut at) else {
            // Cut by the capture: what is there.
            let v = &body[at.min(body.len())..];
            match f {
                b'C' => code = text(v),
                b'M' => msg = text(v),
                _ => {}
            }
            break;
        };
        match f {
            b'C' => code = text(v),
            b'M' => msg = text(v),
            _ => {}
        }
    }
    if code.is_empty() {
        code = "XX000".into();
    }
    (code, msg)
}
