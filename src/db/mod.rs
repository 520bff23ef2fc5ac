//! Database and cache operations from the wire protocol of one client
//! connection: what the app wrote on its socket (requests) and what it read
//! (responses), in order, become [`Op`]s — PostgreSQL ([`postgres`]),
//! MySQL/MariaDB ([`mysql`]), Redis ([`redis`]) and MongoDB ([`mongo`]) —
//! and [`spans`] makes them CLIENT spans. Pure: the bytes come from the
//! traced app and from its peers, so every parser takes any bytes in any
//! chunking with bounded memory, never panics, and ends a connection it
//! cannot follow with a [`Stop`] rather than guess an operation.
//!
//! Feeding a connection: one [`Conn`] per client socket, created when its
//! protocol is known ([`guess`] from its first bytes and port); every
//! socket operation's bytes, in the order the app made them, go to
//! [`Conn::feed`] with the direction and the length the operation really
//! moved (more than the bytes given when the capture was cut: the parser
//! skips the rest inside a message, and ends with [`Stop::Gap`] if the cut
//! crossed a message it needed). Each feed is one chunk, numbered from 0
//! per connection; an [`Op`] names the chunk its request started in and the
//! chunk its response ended in, for the caller's timestamps.
//!
//! Bounds: per direction, a message's header and at most [`KEEP`] bytes of
//! its body (a longer query text is cut there and marked
//! [`Op::query_truncated`]; the message itself is followed to its end), at
//! most [`PENDING_MAX`] requests awaiting their response and [`NAMES_MAX`]
//! prepared statements and portals per connection.

pub mod live;
pub mod mongo;
pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod spans;
pub mod sql;

#[cfg(test)]
mod tests;

/// The most bytes of one message's body kept (a query's text, an error's
/// fields, a command's arguments); the rest is skipped, never buffered.
pub const KEEP: usize = 4096;
/// The most requests of one connection awaiting their responses (a longer
/// pipeline ends the connection's parsing with [`Stop::Overflow`]).
pub const PENDING_MAX: usize = 4096;
/// The most prepared statements (and portals) remembered per connection;
/// past it the oldest is forgotten (its later executions have no text).
pub const NAMES_MAX: usize = 1024;
/// The most bytes of a message's body kept from its end (a MongoDB reply's
/// `ok`, after its documents).
pub const TAIL: usize = 64;

/// The database system a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    Postgres,
    /// MySQL or MariaDB (the server's greeting says which, when seen).
    Mysql,
    Redis,
    Mongo,
}

impl System {
    /// The port the system listens on by default.
    pub fn default_port(self) -> u16 {
        match self {
            System::Postgres => 5432,
            System::Mysql => 3306,
            System::Redis => 6379,
            System::Mongo => 27017,
        }
    }
}

/// Which way the bytes went, seen from the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// The app wrote them (client → server).
    Request,
    /// The app read them (server → client).
    Response,
}

/// How the parsers treat query text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Keep query text as the app sent it (literals included); else
    /// literals become `?`. Bound parameters are never in it either way.
    pub raw_query: bool,
}

/// One database operation: a request and its response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Op {
    /// `SELECT`, `INSERT`, `GET`, `find`, … (the server's word where it
    /// says one: PostgreSQL's command tag).
    pub operation: String,
    /// The table or collection, when the operation names exactly one.
    pub collection: Option<String>,
    /// The database (PostgreSQL's, MySQL's, MongoDB's `$db`; Redis's index
    /// after `SELECT`), when the connection showed it.
    pub namespace: Option<String>,
    /// The query or command text, sanitized unless [`Options::raw_query`].
    pub query: Option<String>,
    /// The query text was longer than [`KEEP`] (or than the capture).
    pub query_truncated: bool,
    /// The server's error code: SQLSTATE, MySQL's error number, Redis's
    /// error prefix (`ERR`, `WRONGTYPE`), MongoDB's code. `None`: success.
    pub status: Option<String>,
    /// The server's error message.
    pub error: Option<String>,
    /// Rows returned or affected, when the response says.
    pub rows: Option<u64>,
    /// The chunk (feed) its request started in.
    pub start_chunk: u64,
    /// The chunk its response ended in.
    pub end_chunk: u64,
}

impl Op {
    pub fn is_error(&self) -> bool {
        self.status.is_some()
    }
}

/// Why a connection's parsing ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The bytes are not the protocol (or not where the parser was).
    Garbled,
    /// A capture cut crossed a message boundary: the rest cannot be framed.
    Gap,
    /// More than [`PENDING_MAX`] requests awaited their responses.
    Overflow,
    /// The connection changed protocol (TLS on the socket, Redis pub/sub,
    /// a PostgreSQL COPY): not followed further.
    Unfollowed,
}

/// A protocol's parser of one connection.
enum Parser {
    Postgres(postgres::Parser),
    Mysql(mysql::Parser),
    Redis(redis::Parser),
    Mongo(mongo::Parser),
}

/// One client connection's parser: feed it every socket operation's bytes
/// in order, take its finished operations.
pub struct Conn {
    system: System,
    parser: Parser,
    chunk: u64,
    stop: Option<Stop>,
    ops: Vec<Op>,
    /// Requests that had no response when the parsing stopped, or that the
    /// server skipped (an extended-protocol batch after an error).
    dropped: u64,
}

impl Conn {
    pub fn new(system: System, options: Options) -> Conn {
        let parser = match system {
            System::Postgres => Parser::Postgres(postgres::Parser::new(options)),
            System::Mysql => Parser::Mysql(mysql::Parser::new(options)),
            System::Redis => Parser::Redis(redis::Parser::new(options)),
            System::Mongo => Parser::Mongo(mongo::Parser::new(options)),
        };
        Conn { system, parser, chunk: 0, stop: None, ops: Vec::new(), dropped: 0 }
    }

    pub fn system(&self) -> System {
        self.system
    }

    /// One socket operation's bytes: `bytes` as captured, `len` the bytes
    /// the operation moved (`len > bytes.len()`: the capture was cut, the
    /// rest is skipped). Returns the chunk's number (the next feed's is one
    /// more), which finished [`Op`]s refer to.
    pub fn feed(&mut self, dir: Dir, bytes: &[u8], len: usize) -> u64 {
        let chunk = self.chunk;
        self.chunk += 1;
        if self.stop.is_some() {
            return chunk;
        }
        let bytes = &bytes[..bytes.len().min(len)];
        let skip = len - bytes.len();
        let mut out = Out { chunk, ops: &mut self.ops, dropped: 0 };
        let r = match &mut self.parser {
            Parser::Postgres(p) => p.feed(dir, bytes, skip, &mut out),
            Parser::Mysql(p) => p.feed(dir, bytes, skip, &mut out),
            Parser::Redis(p) => p.feed(dir, bytes, skip, &mut out),
            Parser::Mongo(p) => p.feed(dir, bytes, skip, &mut out),
        };
        self.dropped += out.dropped;
        if let Err(stop) = r {
            self.stop = Some(stop);
            self.dropped += self.abandon();
        }
        chunk
    }

    /// Forgets the requests awaiting their responses (the connection is
    /// no longer followed); returns how many there were.
    pub fn abandon(&mut self) -> u64 {
        match &mut self.parser {
            Parser::Postgres(p) => p.abandon(),
            Parser::Mysql(p) => p.abandon(),
            Parser::Redis(p) => p.abandon(),
            Parser::Mongo(p) => p.abandon(),
        }
    }

    /// The operations finished since the last call, in the order their
    /// responses ended.
    pub fn take_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.ops)
    }

    /// Why parsing ended, if it did (the connection's later bytes are then
    /// counted, not parsed).
    pub fn stopped(&self) -> Option<Stop> {
        self.stop
    }

    /// Requests that never became an [`Op`]: unanswered when parsing
    /// stopped, or skipped by the server.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The MySQL server's greeting said MariaDB.
    pub fn is_mariadb(&self) -> bool {
        matches!(&self.parser, Parser::Mysql(p) if p.mariadb())
    }
}

/// Where a parser puts what it finished during one feed.
pub(crate) struct Out<'a> {
    pub chunk: u64,
    pub ops: &'a mut Vec<Op>,
    pub dropped: u64,
}

/// What a framed stream made of one message.
pub(crate) struct Msg<'a> {
    pub header: &'a [u8],
    /// The first [`KEEP`] bytes of its body (fewer where the parser asked
    /// for fewer).
    pub body: &'a [u8],
    /// The body was longer than what is kept (or cut by the capture).
    pub cut: bool,
    /// The last [`TAIL`] bytes of a cut body (empty if not cut, or if the
    /// capture skipped its end).
    pub tail: &'a [u8],
    /// The chunk the message started in.
    pub start_chunk: u64,
}

/// A message's framing, from its header: the body's length and how much of
/// it to keep.
pub(crate) struct Frame {
    pub body_len: usize,
    pub keep: usize,
}

/// Splits one direction of a length-prefixed protocol into messages with
/// bounded memory: a header (its size from its first byte, as the caller
/// says), then a body of which at most `keep` bytes (and a [`TAIL`]) are
/// kept. Call [`Framer::next`] until it returns `None`, then
/// [`Framer::skip`] for bytes the capture did not get.
#[derive(Default)]
pub(crate) struct Framer {
    header: Vec<u8>,
    body: Vec<u8>,
    tail: Vec<u8>,
    /// Body bytes still to come (meaningful once the header is complete).
    left: usize,
    keep: usize,
    in_body: bool,
    cut: bool,
    /// The tail lost bytes to the capture.
    tail_lost: bool,
    /// The last call returned a message: clear it first.
    returned: bool,
    start_chunk: u64,
}

impl Framer {
    /// Whether a message is partly received (between messages: false).
    pub fn mid_message(&self) -> bool {
        !self.returned && (self.in_body || !self.header.is_empty())
    }

    fn reset_returned(&mut self) {
        if self.returned {
            self.returned = false;
            self.header.clear();
            self.in_body = false;
        }
    }

    /// The next complete message in `bytes` (consumed as read), or `None`
    /// when they end first. `hdr_len` says a header's size from its first
    /// bytes (at least one), `frame` reads a complete header.
    pub fn next<E>(
        &mut self,
        bytes: &mut &[u8],
        chunk: u64,
        hdr_len: impl Fn(&[u8]) -> usize,
        frame: impl Fn(&[u8]) -> Result<Frame, E>,
    ) -> Result<Option<Msg<'_>>, E> {
        self.reset_returned();
        loop {
            if !self.in_body {
                if bytes.is_empty() {
                    return Ok(None);
                }
                if self.header.is_empty() {
                    self.start_chunk = chunk;
                }
                let need = hdr_len(if self.header.is_empty() { bytes } else { &self.header }).max(1);
                let take = need.saturating_sub(self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                *bytes = &bytes[take..];
                if self.header.len() < need {
                    continue;
                }
                let f = frame(&self.header)?;
                self.left = f.body_len;
                self.keep = f.keep.min(KEEP);
                self.in_body = true;
                self.cut = false;
                self.tail_lost = false;
                self.body.clear();
                self.tail.clear();
            }
            let take = self.left.min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.body_bytes(now);
            self.left -= take;
            *bytes = rest;
            if self.left > 0 {
                return Ok(None);
            }
            return Ok(Some(self.finish()));
        }
    }

    /// `n` bytes the capture did not get, after [`Framer::next`] returned
    /// `None`: inside a body they are skipped (the message is returned if
    /// they end it); anywhere else they are `gap`.
    pub fn skip<E>(&mut self, n: usize, gap: E) -> Result<Option<Msg<'_>>, E> {
        self.reset_returned();
        if n == 0 {
            return Ok(None);
        }
        if !self.in_body || n > self.left {
            return Err(gap);
        }
        self.left -= n;
        self.cut = true;
        self.tail_lost = true;
        self.tail.clear();
        Ok(if self.left == 0 { Some(self.finish()) } else { None })
    }

    fn body_bytes(&mut self, b: &[u8]) {
        let room = self.keep.saturating_sub(self.body.len()).min(b.len());
        self.body.extend_from_slice(&b[..room]);
        let over = &b[room..];
        if !over.is_empty() {
            self.cut = true;
            if over.len() >= TAIL {
                self.tail.clear();
                self.tail.extend_from_slice(&over[over.len() - TAIL..]);
            } else {
                self.tail.extend_from_slice(over);
                let extra = self.tail.len().saturating_sub(TAIL);
                self.tail.drain(..extra);
            }
            self.tail_lost = false;
        }
    }

    fn finish(&mut self) -> Msg<'_> {
        self.returned = true;
        let tail: &[u8] = if self.tail_lost { &[] } else { &self.tail };
        Msg { header: &self.header, body: &self.body, cut: self.cut, tail, start_chunk: self.start_chunk }
    }
}

/// The protocol of a client connection from the first bytes the app wrote
/// (`request`, may be empty), the first it read (`response`, may be empty:
/// MySQL's server speaks first) and the server's port. Bytes that are
/// unmistakably a protocol's start decide; a mid-stream message (a
/// connection opened before tracing began) decides only on its system's
/// default port.
pub fn guess(request: &[u8], response: &[u8], port: u16) -> Option<System> {
    let be32 = |b: &[u8], at: usize| b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
    let le32 = |b: &[u8], at: usize| b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    // PostgreSQL: a startup message (protocol 3.0), SSLRequest,
    // GSSENCRequest or CancelRequest.
    if let (Some(len), Some(code)) = (be32(request, 0), be32(request, 4)) {
        let startup = code == 0x0003_0000 && (9..=10_000).contains(&len);
        let special = len == 8 && matches!(code, 80_877_103 | 80_877_104) || len == 16 && code == 80_877_102;
        if startup || special {
            return Some(System::Postgres);
        }
    }
    // MySQL: the server's greeting (protocol 10), sequence 0.
    if response.len() >= 5 && response[3] == 0 && response[4] == 10 {
        let len = usize::from(response[0]) | usize::from(response[1]) << 8 | usize::from(response[2]) << 16;
        if (20..=1024).contains(&len) {
            return Some(System::Mysql);
        }
    }
    // Redis: a command array of bulk strings.
    if request.len() >= 4 && request[0] == b'*' && request[1].is_ascii_digit() {
        if let Some(nl) = memchr::memchr(b'\n', &request[..request.len().min(16)]) {
            if request[1..nl].strip_suffix(b"\r").is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
                && request.get(nl + 1).is_none_or(|b| *b == b'$')
            {
                return Some(System::Redis);
            }
        }
    }
    // MongoDB: a message header with OP_MSG / OP_QUERY / OP_COMPRESSED.
    if let (Some(len), Some(op)) = (le32(request, 0), le32(request, 12)) {
        if matches!(op, 2013 | 2004 | 2012) && (21..=48_000_000).contains(&len) && le32(request, 8) == Some(0) {
            return Some(System::Mongo);
        }
    }
    // Mid-stream, on the default port only.
    let on = |s: System| (port == s.default_port()).then_some(s);
    if let (Some(&t), Some(len)) = (request.first(), be32(request, 1)) {
        if b"QPBEDSHCXFdcf".contains(&t) && (4..=1 << 30).contains(&len) {
            if let Some(s) = on(System::Postgres) {
                return Some(s);
            }
        }
    }
    if request.len() >= 5 && request[3] == 0 && matches!(request[4], 0x01..=0x03 | 0x0e | 0x16..=0x1a | 0x1f) {
        if let Some(s) = on(System::Mysql) {
            return Some(s);
        }
    }
    if request.first().is_some_and(u8::is_ascii_alphabetic) && memchr::memchr(b'\n', request).is_some() {
        return on(System::Redis);
    }
    None
}
