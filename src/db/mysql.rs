//! MySQL's and MariaDB's client/server protocol of one connection.
//!
//! Requests: COM_QUERY (text), COM_STMT_PREPARE (an operation of its own,
//! `PREPARE`, that names the statement's SQL by the id the server gives it)
//! and COM_STMT_EXECUTE (one operation, with its statement's SQL). Responses:
//! OK (affected rows), ERR (error number and message), result sets (rows
//! counted; further result sets followed while the server says more exist).
//! Packets are checked against their sequence numbers: a packet out of
//! sequence ends the parsing ([`Stop::Garbled`]). The greeting and the
//! authentication exchange are skipped (the database the client names is
//! kept); a connection already open when parsing began is followed from its
//! next command. A compressed or TLS-switched socket is not followed (TLS
//! plaintext fed by the caller is).

use std::collections::VecDeque;

use super::sql;
use super::{Dir, Frame, Framer, Op, Options, Out, Stop, NAMES_MAX, PENDING_MAX};

/// Bytes kept of a server packet's body (an error's message is cut there).
const SERVER_KEEP: usize = 512;
const CLIENT_CONNECT_WITH_DB: u32 = 0x8;
const CLIENT_COMPRESS: u32 = 0x20;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_SSL: u32 = 0x800;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_PLUGIN_AUTH_LENENC: u32 = 0x20_0000;
const CLIENT_DEPRECATE_EOF: u32 = 0x100_0000;
const SERVER_MORE_RESULTS_EXISTS: u16 = 0x8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing seen yet.
    Start,
    /// The greeting was seen: the client's handshake response next.
    Greeted,
    /// Authentication until the server's OK.
    Auth,
    Command,
}

#[derive(Debug)]
enum Kind {
    Query,
    Prepare,
    Execute,
    /// COM_INIT_DB: the namespace when it succeeds.
    InitDb(String),
    /// Another command with one response packet (ping, reset, …).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resp {
    /// The response's first packet next.
    First,
    /// Column definitions of a result set still to come.
    Columns(u64),
    /// An EOF after the column definitions (if the protocol has it).
    ColumnsEof,
    Rows,
    /// A prepare's parameter definitions, then its columns'.
    PrepParams(u64, u64),
    PrepParamsEof(u64),
    PrepColumns(u64),
    PrepColumnsEof,
}

#[derive(Debug)]
struct Pending {
    kind: Kind,
    op: Op,
    resp: Resp,
    /// The next server packet's sequence number.
    seq: u8,
    /// The prepared statement's text (a prepare's, for its id).
    text: String,
    truncated: bool,
    /// A prepare's parameter and column blocks were empty.
    empty: (bool, bool),
}

pub struct Parser {
    options: Options,
    client: Framer,
    server: Framer,
    phase: Phase,
    server_caps: Option<u32>,
    client_caps: Option<u32>,
    /// Whether result sets end their column definitions and rows with an
    /// OK rather than EOF packets (learned from the handshake or a result).
    deprecate_eof: Option<bool>,
    mariadb: bool,
    database: Option<String>,
    statements: VecDeque<(u32, String, bool)>,
    pending: VecDeque<Pending>,
    /// The last packet of each direction was 0xffffff long: the next one
    /// continues its payload.
    client_more: bool,
    server_more: bool,
    /// The last server packet's sequence number (a trailing EOF after a
    /// finished response continues it).
    last_seq: Option<u8>,
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]]))
}
fn le32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// A length-encoded integer at `*at` (moved past it).
fn lenenc(b: &[u8], at: &mut usize) -> Option<u64> {
    let first = *b.get(*at)?;
    let (n, v) = match first {
        0..=0xfa => (1, u64::from(first)),
        0xfc => (3, u64::from(le16(b, *at + 1)?)),
        0xfd => {
            let s = b.get(*at + 1..*at + 4)?;
            (4, u64::from(s[0]) | u64::from(s[1]) << 8 | u64::from(s[2]) << 16)
        }
        0xfe => {
            let s = b.get(*at + 1..*at + 9)?;
            (9, u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
        }
        _ => return None,
    };
    *at += n;
    Some(v)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Parser {
    pub fn new(options: Options) -> Parser {
        Parser {
            options,
            client: Framer::default(),
            server: Framer::default(),
            phase: Phase::Start,
            server_caps: None,
            client_caps: None,
            deprecate_eof: None,
            mariadb: false,
            database: None,
            statements: VecDeque::new(),
            pending: VecDeque::new(),
            client_more: false,
            server_more: false,
            last_seq: None,
        }
    }

    pub(crate) fn mariadb(&self) -> bool {
        self.mariadb
    }

    pub(crate) fn abandon(&mut self) -> u64 {
        let n = self.pending.len() as u64;
        self.pending.clear();
        n
    }

    pub(crate) fn feed(&mut self, dir: Dir, mut bytes: &[u8], skip: usize, out: &mut Out<'_>) -> Result<(), Stop> {
        if self.phase == Phase::Start && !bytes.is_empty() {
            // The server speaks first on a new connection.
            self.phase = if dir == Dir::Response { Phase::Greeted } else { Phase::Command };
        }
        let hdr = |_: &[u8]| 4;
        let frame = |keep: usize| {
            move |h: &[u8]| -> Result<Frame, Stop> {
                let len = usize::from(h[0]) | usize::from(h[1]) << 8 | usize::from(h[2]) << 16;
                Ok(Frame { body_len: len, keep })
            }
        };
        match dir {
            Dir::Request => {
                while let Some(m) = self.client.next(&mut bytes, out.chunk, hdr, frame(super::KEEP))? {
                    let (len, seq, body, cut, start) = (m.header_len(), m.header[3], m.body.to_vec(), m.cut, m.start_chunk);
                    self.client_packet(len, seq, &body, cut, start)?;
                }
                if let Some(m) = self.client.skip(skip, Stop::Gap)? {
                    let (len, seq, body, start) = (m.header_len(), m.header[3], m.body.to_vec(), m.start_chunk);
                    self.client_packet(len, seq, &body, true, start)?;
                }
            }
            Dir::Response => {
                while let Some(m) = self.server.next(&mut bytes, out.chunk, hdr, frame(SERVER_KEEP))? {
                    let (len, seq, body) = (m.header_len(), m.header[3], m.body.to_vec());
                    self.server_packet(len, seq, &body, out)?;
                }
                if let Some(m) = self.server.skip(skip, Stop::Gap)? {
                    let (len, seq, body) = (m.header_len(), m.header[3], m.body.to_vec());
                    self.server_packet(len, seq, &body, out)?;
                }
            }
        }
        Ok(())
    }

    fn client_packet(&mut self, len: usize, seq: u8, body: &[u8], cut: bool, start: u64) -> Result<(), Stop> {
        let continued = std::mem::replace(&mut self.client_more, len == 0xff_ffff);
        if continued {
            return Ok(());
        }
        match self.phase {
            // A command (sequence 0) when no greeting was seen: the
            // connection was open before parsing began.
            Phase::Start | Phase::Greeted if self.server_caps.is_none() && seq == 0 => self.phase = Phase::Command,
            Phase::Start | Phase::Greeted => return self.handshake_response(body),
            Phase::Auth => return Ok(()),
            Phase::Command => {}
        }
        if seq != 0 {
            // LOCAL INFILE data, or an authentication answer after
            // COM_CHANGE_USER: no operation.
            return Ok(());
        }
        let Some((&cmd, rest)) = body.split_first() else { return Err(Stop::Garbled) };
        let statement = |t: &[u8]| (text(t), cut);
        let (kind, st) = match cmd {
            0x03 => (Kind::Query, statement(rest)),
            0x16 => (Kind::Prepare, statement(rest)),
            0x17 => {
                let id = le32(rest, 0).ok_or(Stop::Garbled)?;
                let st = self.statements.iter().rev().find(|(i, _, _)| *i == id).map(|(_, t, c)| (t.clone(), *c)).unwrap_or_default();
                (Kind::Execute, st)
            }
            0x02 => (Kind::InitDb(text(rest)), (String::new(), false)),
            // Quit, close a statement, send long data: no response.
            0x01 => return Ok(()),
            0x19 => {
                if let Some(id) = le32(rest, 0) {
                    self.statements.retain(|(i, _, _)| *i != id);
                }
                return Ok(());
            }
            0x18 => return Ok(()),
            0x04..=0x0f | 0x10..=0x15 | 0x1a..=0x1f => (Kind::Other, (String::new(), false)),
            _ => return Err(Stop::Garbled),
        };
        if self.pending.len() >= PENDING_MAX {
            return Err(Stop::Overflow);
        }
        let (sql_text, truncated) = st;
        let op = match kind {
            Kind::Query | Kind::Prepare | Kind::Execute => Op {
                operation: if matches!(kind, Kind::Prepare) { "PREPARE".into() } else { sql::operation(&sql_text).unwrap_or_default() },
                collection: sql::collection(&sql_text),
                namespace: self.database.clone(),
                query: (!sql_text.is_empty()).then(|| if self.options.raw_query { sql_text.clone() } else { sql::sanitize(&sql_text) }),
                query_truncated: truncated,
                start_chunk: start,
                ..Op::default()
            },
            _ => Op { start_chunk: start, ..Op::default() },
        };
        self.pending.push_back(Pending { kind, op, resp: Resp::First, seq: 1, text: sql_text, truncated, empty: (false, false) });
        Ok(())
    }

    /// The client's handshake response: its capabilities and database.
    fn handshake_response(&mut self, b: &[u8]) -> Result<(), Stop> {
        let caps = le32(b, 0).ok_or(Stop::Garbled)?;
        if caps & CLIENT_PROTOCOL_41 == 0 {
            return Err(Stop::Unfollowed);
        }
        if caps & CLIENT_COMPRESS != 0 {
            return Err(Stop::Unfollowed);
        }
        self.client_caps = Some(caps);
        if let Some(s) = self.server_caps {
            self.deprecate_eof = Some(s & caps & CLIENT_DEPRECATE_EOF != 0);
        }
        if caps & CLIENT_SSL != 0 && b.len() == 32 {
            // An SSLRequest: the full response follows (as TLS plaintext).
            self.client_caps = None;
            return Ok(());
        }
        self.phase = Phase::Auth;
        // caps, max packet, charset, 23 reserved; user NUL; auth; database.
        let mut at = 32;
        let user_end = memchr::memchr(0, b.get(at..).unwrap_or_default()).ok_or(Stop::Garbled)?;
        at += user_end + 1;
        let auth_len = if caps & CLIENT_PLUGIN_AUTH_LENENC != 0 {
            lenenc(b, &mut at).unwrap_or(0) as usize
        } else if caps & CLIENT_SECURE_CONNECTION != 0 {
            let n = usize::from(*b.get(at).unwrap_or(&0));
            at += 1;
            n
        } else {
            memchr::memchr(0, b.get(at..).unwrap_or_default()).map_or(0, |n| n + 1)
        };
        at += auth_len;
        if caps & CLIENT_CONNECT_WITH_DB != 0 {
            if let Some(rest) = b.get(at..) {
                let n = memchr::memchr(0, rest).unwrap_or(rest.len());
                if n > 0 {
                    self.database = Some(text(&rest[..n]));
                }
            }
        }
        Ok(())
    }

    fn server_packet(&mut self, len: usize, seq: u8, body: &[u8], out: &mut Out<'_>) -> Result<(), Stop> {
        let continued = std::mem::replace(&mut self.server_more, len == 0xff_ffff);
        if continued {
            return Ok(());
        }
        let first = body.first().copied();
        match self.phase {
            Phase::Start | Phase::Greeted => {
                if seq == 0 && first == Some(10) {
                    self.greeting(body);
                }
                return Ok(());
            }
            Phase::Auth => {
                // OK: logged in; ERR: refused (the connection closes).
                if matches!(first, Some(0x00) | Some(0xff)) {
                    self.phase = Phase::Command;
                }
                return Ok(());
            }
            Phase::Command => {}
        }
        let last_seq = self.last_seq.replace(seq);
        let deprecate = self.deprecate_eof;
        let is_eof = first == Some(0xfe) && (len < 9 || deprecate == Some(true) && len < 0xff_ffff);
        let Some(p) = self.pending.front_mut() else {
            // Mid-stream, before the first command seen; or a trailing EOF.
            return Ok(());
        };
        if seq != p.seq {
            // The EOF closing a prepare's definitions, when the protocol
            // was thought to have none.
            if p.resp == Resp::First && is_eof && last_seq.is_some_and(|l| l.wrapping_add(1) == seq) {
                self.deprecate_eof = Some(false);
                return Ok(());
            }
            return Err(Stop::Garbled);
        }
        p.seq = seq.wrapping_add(1);
        let chunk = out.chunk;
        let mut done = false;
        match p.resp {
            Resp::First => match first {
                Some(0x00) if !matches!(p.kind, Kind::Prepare) || len < 12 => {
                    let (rows, status) = ok_packet(body);
                    if matches!(p.kind, Kind::Query | Kind::Execute) {
                        p.op.rows = Some(rows);
                    }
                    if let Kind::InitDb(db) = &p.kind {
                        self.database = Some(db.clone());
                    }
                    done = status & SERVER_MORE_RESULTS_EXISTS == 0;
                }
                Some(0x00) => {
                    // A prepare's OK: id, columns, parameters.
                    let id = le32(body, 1).ok_or(Stop::Garbled)?;
                    let cols = u64::from(le16(body, 5).ok_or(Stop::Garbled)?);
                    let params = u64::from(le16(body, 7).ok_or(Stop::Garbled)?);
                    if self.statements.len() >= NAMES_MAX {
                        self.statements.pop_front();
                    }
                    self.statements.push_back((id, std::mem::take(&mut p.text), p.truncated));
                    p.resp = Resp::PrepParams(params, cols);
                    p.empty = (params == 0, cols == 0);
                    done = prep_next(p, deprecate);
                }
                Some(0xff) => {
                    error(&mut p.op, body);
                    done = true;
                }
                Some(0xfb) => {} // LOCAL INFILE: the client sends the file, then OK.
                _ if matches!(p.kind, Kind::Other | Kind::InitDb(_)) => done = true,
                _ => {
                    let mut at = 0;
                    let n = lenenc(body, &mut at).ok_or(Stop::Garbled)?;
                    if n == 0 {
                        return Err(Stop::Garbled);
                    }
                    p.resp = Resp::Columns(n);
                    p.op.rows.get_or_insert(0);
                }
            },
            Resp::Columns(n) => {
                p.resp = if n > 1 {
                    Resp::Columns(n - 1)
                } else if deprecate == Some(true) {
                    Resp::Rows
                } else {
                    Resp::ColumnsEof
                };
            }
            Resp::ColumnsEof => {
                p.resp = Resp::Rows;
                if first == Some(0xfe) && len < 9 {
                    self.deprecate_eof = Some(false);
                } else {
                    self.deprecate_eof = Some(true);
                    // This packet is a row already.
                    done = row_or_end(p, first, is_eof, body);
                }
            }
            Resp::Rows => done = row_or_end(p, first, is_eof, body),
            Resp::PrepParams(n, cols) => {
                p.resp = Resp::PrepParams(n.saturating_sub(1), cols);
                done = prep_next(p, deprecate);
            }
            Resp::PrepParamsEof(cols) => {
                if first == Some(0xfe) && len < 9 {
                    self.deprecate_eof = Some(false);
                    p.resp = Resp::PrepColumns(cols);
                } else {
                    // A column definition already.
                    self.deprecate_eof = Some(true);
                    p.resp = Resp::PrepColumns(cols.saturating_sub(1));
                }
                done = prep_next(p, self.deprecate_eof);
            }
            Resp::PrepColumns(n) => {
                p.resp = Resp::PrepColumns(n.saturating_sub(1));
                done = prep_next(p, deprecate);
            }
            Resp::PrepColumnsEof => done = true,
        }
        if done {
            if let Some(mut p) = self.pending.pop_front() {
                if matches!(p.kind, Kind::Query | Kind::Prepare | Kind::Execute) {
                    p.op.end_chunk = chunk;
                    out.ops.push(p.op);
                }
            }
        }
        Ok(())
    }

    fn greeting(&mut self, b: &[u8]) {
        let mut at = 1;
        let Some(n) = memchr::memchr(0, &b[1..]) else { return };
        let version = &b[1..1 + n];
        self.mariadb = memchr::memmem::find(version, b"MariaDB").is_some();
        at += n + 1;
        // Connection id, 8 bytes of scramble, a filler: the capabilities.
        at += 4 + 8 + 1;
        let lower = le16(b, at).unwrap_or(0);
        let upper = le16(b, at + 3).unwrap_or(0);
        let caps = u32::from(lower) | u32::from(upper) << 16;
        self.server_caps = Some(caps);
    }
}

impl super::Msg<'_> {
    /// A MySQL packet's payload length (from its 3-byte header).
    fn header_len(&self) -> usize {
        usize::from(self.header[0]) | usize::from(self.header[1]) << 8 | usize::from(self.header[2]) << 16
    }
}

/// After a prepare's packet: whether its response is complete, moving past
/// finished definition blocks. A block of definitions ends with an EOF
/// packet unless it is empty or the protocol has none; when that is not
/// known, the last block is taken to have none (an EOF that then comes is
/// recognized by its sequence number).
fn prep_next(p: &mut Pending, deprecate: Option<bool>) -> bool {
    loop {
        match p.resp {
            Resp::PrepParams(0, cols) => {
                if p.empty.0 || deprecate == Some(true) || (deprecate.is_none() && cols == 0) {
                    p.resp = Resp::PrepColumns(cols);
                    continue;
                }
                p.resp = Resp::PrepParamsEof(cols);
                return false;
            }
            Resp::PrepColumns(0) => {
                if deprecate == Some(false) && !p.empty.1 {
                    p.resp = Resp::PrepColumnsEof;
                    return false;
                }
                return true;
            }
            _ => return false,
        }
    }
}

fn row_or_end(p: &mut Pending, first: Option<u8>, is_eof: bool, body: &[u8]) -> bool {
    if first == Some(0xff) {
        error(&mut p.op, body);
        return true;
    }
    if is_eof {
        // EOF: warnings, status; OK (0xfe): affected rows, insert id, status.
        let status = if body.len() < 9 { le16(body, 3).unwrap_or(0) } else { ok_packet(body).1 };
        if status & SERVER_MORE_RESULTS_EXISTS != 0 {
            p.resp = Resp::First;
            return false;
        }
        return true;
    }
    p.op.rows = Some(p.op.rows.unwrap_or(0) + 1);
    false
}

/// An OK packet's affected rows and status flags.
fn ok_packet(b: &[u8]) -> (u64, u16) {
    let mut at = 1;
    let rows = lenenc(b, &mut at).unwrap_or(0);
    let _insert_id = lenenc(b, &mut at);
    (rows, le16(b, at).unwrap_or(0))
}

/// An ERR packet into the op: its number and message (after `#` and the
/// SQLSTATE, when there).
fn error(op: &mut Op, b: &[u8]) {
    let code = le16(b, 1).unwrap_or(0);
    let msg = b.get(3..).unwrap_or_default();
    let msg = if msg.first() == Some(&b'#') { msg.get(6..).unwrap_or_default() } else { msg };
    op.status = Some(code.to_string());
    op.error = Some(text(msg));
}
