//! Redis's RESP2 and RESP3 of one connection.
//!
//! One operation per command: a pipeline's commands are matched to their
//! replies in order (each its own operation, its end the chunk its reply
//! ended in), and so are a transaction's: `MULTI`, each queued command
//! (ended by its `QUEUED`), and `EXEC`, whose operation carries the first
//! error among the results it returns (or `EXECABORT`). An error reply (`-`
//! or RESP3's blob error) is the operation's status: its first word (`ERR`,
//! `WRONGTYPE`) and its message. RESP3's out-of-band pushes and attributes
//! are skipped. Pub/sub and `MONITOR` end the parsing
//! ([`Stop::Unfollowed`]): their replies are not answers to commands.
//!
//! Query text: the command name, its key (the first argument of commands
//! that take one; the subcommand of container commands such as `CLIENT`),
//! and `?` for every other argument; with [`Options::raw_query`] the
//! arguments as sent (up to [`KEEP`] bytes).

use std::collections::VecDeque;

use super::{Dir, Op, Options, Out, Stop, KEEP, PENDING_MAX};

/// Bytes kept of a line (a simple string, an error, a length).
const LINE_MAX: usize = 512;
/// Bytes kept of each argument (the command, its key); with raw query text,
/// [`KEEP`] for the whole command.
const ARG_KEEP: usize = 256;
/// Deepest nesting followed.
const DEPTH_MAX: usize = 64;
/// Longest bulk string believed (Redis's proto-max-bulk-len default).
const BULK_MAX: i64 = 512 << 20;

/// Commands whose first argument is not a key: it is shown as `?` (a
/// container command's first argument, its subcommand, is shown).
const NO_KEY: &[&str] = &[
    "AUTH",
    "HELLO",
    "ECHO",
    "PING",
    "SELECT",
    "SWAPDB",
    "INFO",
    "MULTI",
    "EXEC",
    "DISCARD",
    "QUIT",
    "EVAL",
    "EVALSHA",
    "EVAL_RO",
    "EVALSHA_RO",
    "FCALL",
    "FCALL_RO",
    "MIGRATE",
    "WAIT",
    "DBSIZE",
    "FLUSHDB",
    "FLUSHALL",
    "SCAN",
    "KEYS",
    "PUBLISH",
    "SPUBLISH",
];
/// Commands after which replies are no longer answers.
const UNFOLLOWED: &[&str] = &["SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "MONITOR", "SYNC", "PSYNC"];

/// One RESP item the reader finished.
#[derive(Debug, Default)]
struct Item {
    /// Nesting depth (0: a top-level value).
    depth: usize,
    /// The type byte (`+`, `$`, `*`, …; `i` for an inline command).
    kind: u8,
    /// Its text as kept (a simple value's, a bulk's first bytes).
    text: Vec<u8>,
    /// An aggregate's element count (-1: null).
    count: i64,
    /// The top-level value ended with this item.
    top_done: bool,
    /// The chunk the top-level value started in.
    start_chunk: u64,
}

#[derive(Clone, Copy, Debug)]
struct Level {
    left: u64,
    /// An attribute (its elements do not count in its parent).
    attr: bool,
}

/// Reads one direction's RESP items with bounded memory.
#[derive(Default)]
struct Reader {
    line: Vec<u8>,
    line_over: bool,
    /// In a bulk: payload bytes left, then its CRLF.
    bulk: Option<(u8, usize)>,
    crlf_left: u8,
    bulk_text: Vec<u8>,
    bulk_keep: usize,
    stack: Vec<Level>,
    start_chunk: u64,
    in_value: bool,
    /// The client side accepts inline commands.
    inline: bool,
}

fn int(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.len() > 19 || s.is_empty() {
        return None;
    }
    s.parse().ok()
}

impl Reader {
    /// The next item in `bytes` (consumed as read), keeping at most `keep`
    /// bytes of a bulk string; `None` when they end first.
    fn next(&mut self, bytes: &mut &[u8], chunk: u64, keep: usize) -> Result<Option<Item>, Stop> {
        loop {
            if bytes.is_empty() {
                return Ok(None);
            }
            if !self.in_value {
                self.in_value = true;
                self.start_chunk = chunk;
            }
            if let Some((kind, left)) = self.bulk {
                let take = left.min(bytes.len());
                let room = self.bulk_keep.saturating_sub(self.bulk_text.len()).min(take);
                self.bulk_text.extend_from_slice(&bytes[..room]);
                *bytes = &bytes[take..];
                if left > take {
                    self.bulk = Some((kind, left - take));
                    continue;
                }
                self.bulk = None;
                self.crlf_left = 2;
                self.line.clear();
                self.line.push(kind);
            }
            if self.crlf_left > 0 {
                let want: &[u8] = if self.crlf_left == 2 { b"\r\n" } else { b"\n" };
                let n = usize::from(self.crlf_left).min(bytes.len());
                if bytes[..n] != want[..n] {
                    return Err(Stop::Garbled);
                }
                *bytes = &bytes[n..];
                self.crlf_left -= n as u8;
                if self.crlf_left > 0 {
                    continue;
                }
                let kind = self.line.first().copied().unwrap_or(b'$');
                self.line.clear();
                let text = std::mem::take(&mut self.bulk_text);
                return Ok(Some(self.complete(kind, text, 0)));
            }
            // A line, up to its '\n'; its first byte says what it is.
            if self.line.is_empty() && !self.line_start_ok(bytes[0]) {
                return Err(Stop::Garbled);
            }
            let nl = memchr::memchr(b'\n', bytes);
            let part = &bytes[..nl.map_or(bytes.len(), |n| n + 1)];
            *bytes = &bytes[part.len()..];
            let room = LINE_MAX.saturating_sub(self.line.len()).min(part.len());
            self.line.extend_from_slice(&part[..room]);
            self.line_over |= room < part.len();
            if nl.is_none() {
                continue;
            }
            let over = std::mem::take(&mut self.line_over);
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let Some(&kind) = line.first() else {
                // An empty line: an inline command's keep-alive.
                if self.inline && self.stack.is_empty() {
                    self.in_value = false;
                    continue;
                }
                return Err(Stop::Garbled);
            };
            let body = &line[1..];
            match kind {
                b'+' | b'-' | b':' | b',' | b'(' | b'#' | b'_' => {
                    let text = body.to_vec();
                    return Ok(Some(self.complete(kind, text, 0)));
                }
                b'$' | b'!' | b'=' => {
                    if over {
                        return Err(Stop::Garbled);
                    }
                    let n = int(body).ok_or(Stop::Garbled)?;
                    if n == -1 && kind == b'$' {
                        return Ok(Some(self.complete(b'_', Vec::new(), -1)));
                    }
                    if !(0..=BULK_MAX).contains(&n) {
                        return Err(Stop::Garbled);
                    }
                    self.bulk_keep = keep;
                    self.bulk_text.clear();
                    self.bulk = Some((kind, n as usize));
                    if n == 0 {
                        self.bulk = None;
                        self.crlf_left = 2;
                        self.line.clear();
                        self.line.push(kind);
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    if over {
                        return Err(Stop::Garbled);
                    }
                    let n = int(body).ok_or(Stop::Garbled)?;
                    if n < -1 || n > i64::from(u32::MAX) {
                        return Err(Stop::Garbled);
                    }
                    let elems = if matches!(kind, b'%' | b'|') { n.max(0) as u64 * 2 } else { n.max(0) as u64 };
                    if elems == 0 {
                        return Ok(Some(self.complete(kind, Vec::new(), n)));
                    }
                    if self.stack.len() >= DEPTH_MAX {
                        return Err(Stop::Garbled);
                    }
                    let item = Item { depth: self.stack.len(), kind, count: n, start_chunk: self.start_chunk, ..Item::default() };
                    self.stack.push(Level { left: elems, attr: kind == b'|' });
                    return Ok(Some(item));
                }
                _ if self.inline && self.stack.is_empty() && kind.is_ascii_graphic() => {
                    return Ok(Some(self.complete(b'i', line, 0)));
                }
                _ => return Err(Stop::Garbled),
            }
        }
    }

    /// Whether `b` may start a line here: a RESP type byte, or (a client's
    /// top level) an inline command's first letter or an empty line.
    fn line_start_ok(&self, b: u8) -> bool {
        b"+-:,(#_$!=*~>%|".contains(&b) || self.inline && self.stack.is_empty() && (b.is_ascii_graphic() || b == b'\r' || b == b'\n')
    }

    /// A scalar item (or an empty aggregate) ended: the levels it closes.
    fn complete(&mut self, kind: u8, text: Vec<u8>, count: i64) -> Item {
        let depth = self.stack.len();
        let mut attr_done = kind == b'|';
        while let Some(top) = self.stack.last_mut() {
            if !attr_done {
                top.left -= 1;
            }
            if top.left > 0 {
                break;
            }
            attr_done = top.attr;
            self.stack.pop();
        }
        // An attribute ending at the top: the value it annotates follows.
        let top_done = self.stack.is_empty() && !attr_done;
        if top_done {
            self.in_value = false;
        }
        Item { depth, kind, text, count, top_done, start_chunk: self.start_chunk }
    }
}

/// A command awaiting its reply.
#[derive(Debug)]
struct Command {
    op: Op,
    /// Its name, upper case.
    name: String,
    /// Its first argument (for `SELECT`).
    arg: Option<String>,
}

pub struct Parser {
    options: Options,
    client: Reader,
    server: Reader,
    /// The command being read: its arguments so far (first bytes of each),
    /// its argument count, the bytes kept.
    args: Vec<Vec<u8>>,
    nargs: u64,
    raw_len: usize,
    pending: VecDeque<Command>,
    namespace: Option<String>,
    /// The reply being read: its first error (a top-level error, or the
    /// first inside an `EXEC`'s results).
    reply_error: Option<String>,
    /// The reply being read is an attribute's or a push's (not an answer).
    reply_push: bool,
    reply_null: bool,
}

impl Parser {
    pub fn new(options: Options) -> Parser {
        Parser {
            options,
            client: Reader { inline: true, ..Reader::default() },
            server: Reader::default(),
            args: Vec::new(),
            nargs: 0,
            raw_len: 0,
            pending: VecDeque::new(),
            namespace: None,
            reply_error: None,
            reply_push: false,
            reply_null: false,
        }
    }

    pub(crate) fn abandon(&mut self) -> u64 {
        let n = self.pending.len() as u64;
        self.pending.clear();
        n
    }

    pub(crate) fn feed(&mut self, dir: Dir, mut bytes: &[u8], skip: usize, out: &mut Out<'_>) -> Result<(), Stop> {
        match dir {
            Dir::Request => {
                let raw = self.options.raw_query;
                loop {
                    let kept = self.args.len();
                    let raw_len = self.raw_len;
                    let keep = if raw {
                        KEEP.saturating_sub(raw_len)
                    } else if kept < 3 {
                        ARG_KEEP
                    } else {
                        0
                    };
                    let Some(item) = self.client.next(&mut bytes, out.chunk, keep)? else { break };
                    self.client_item(item)?;
                }
            }
            Dir::Response => {
                while let Some(item) = self.server.next(&mut bytes, out.chunk, 128)? {
                    self.server_item(item, out)?;
                }
            }
        }
        if skip > 0 {
            // Inside a bulk the rest of it can be skipped.
            let r = if dir == Dir::Request { &mut self.client } else { &mut self.server };
            match r.bulk {
                Some((kind, left)) if skip <= left => {
                    r.bulk = Some((kind, left - skip));
                    if dir == Dir::Request {
                        self.client.bulk_keep = 0;
                    }
                }
                // The cut took its CRLF too: the bulk ends there.
                Some((kind, left)) if skip - left <= 2 => {
                    r.bulk = Some((kind, 0));
                    if dir == Dir::Request {
                        self.client.bulk_keep = 0;
                    }
                    let crlf = skip - left;
                    return self.feed(dir, &b"\r\n"[..crlf], 0, out);
                }
                _ => return Err(Stop::Gap),
            }
        }
        Ok(())
    }

    fn client_item(&mut self, item: Item) -> Result<(), Stop> {
        match item.kind {
            b'*' if item.depth == 0 => {
                self.args.clear();
                self.nargs = item.count.max(0) as u64;
                self.raw_len = 0;
            }
            b'$' if item.depth == 1 => {
                self.raw_len += item.text.len();
                if self.args.len() < 3 || self.options.raw_query {
                    self.args.push(item.text);
                } else {
                    self.args.push(Vec::new());
                }
            }
            b'i' => {
                self.args = item.text.split(|c| c.is_ascii_whitespace()).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
                self.nargs = self.args.len() as u64;
            }
            // A command is an array of bulk strings.
            _ => return Err(Stop::Garbled),
        }
        if item.top_done {
            self.command(item.start_chunk)?;
        }
        Ok(())
    }

    fn command(&mut self, start: u64) -> Result<(), Stop> {
        let args = std::mem::take(&mut self.args);
        let Some(name) = args.first() else { return Ok(()) };
        let name = String::from_utf8_lossy(name).to_ascii_uppercase();
        if UNFOLLOWED.contains(&name.as_str()) {
            return Err(Stop::Unfollowed);
        }
        if self.pending.len() >= PENDING_MAX {
            return Err(Stop::Overflow);
        }
        let arg = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).into_owned());
        let mut query = name.clone();
        let n = self.nargs.max(args.len() as u64);
        let truncated;
        if self.options.raw_query {
            let mut len = 0;
            for a in &args[1..] {
                query.push(' ');
                query.push_str(&String::from_utf8_lossy(a));
                len += a.len();
            }
            truncated = len >= KEEP || args.len() as u64 != n;
        } else {
            truncated = false;
            for i in 1..n {
                // The key, or a container's subcommand.
                let shown = i == 1 && !NO_KEY.contains(&name.as_str());
                query.push(' ');
                match arg(i as usize).filter(|_| shown) {
                    Some(a) => query.push_str(&a),
                    None => query.push('?'),
                }
            }
        }
        let op = Op {
            operation: name.clone(),
            namespace: self.namespace.clone(),
            query: Some(query),
            query_truncated: truncated,
            start_chunk: start,
            ..Op::default()
        };
        self.pending.push_back(Command { op, arg: arg(1), name });
        Ok(())
    }

    fn server_item(&mut self, item: Item, out: &mut Out<'_>) -> Result<(), Stop> {
        if item.depth == 0 && item.kind == b'>' {
            self.reply_push = true;
        }
        if !self.reply_push {
            match item.kind {
                b'-' | b'!' if self.reply_error.is_none() => self.reply_error = Some(String::from_utf8_lossy(&item.text).into_owned()),
                b'_' | b'*' if item.depth == 0 && item.count == -1 => self.reply_null = true,
                b'_' if item.depth == 0 => self.reply_null = true,
                _ => {}
            }
        }
        if !item.top_done {
            return Ok(());
        }
        if std::mem::take(&mut self.reply_push) {
            // A push ended: not a reply.
            return Ok(());
        }
        let error = self.reply_error.take();
        let null = std::mem::take(&mut self.reply_null);
        let Some(mut cmd) = self.pending.pop_front() else {
            // A reply to a command sent before parsing began.
            return Ok(());
        };
        if let Some(e) = error {
            let code = e.split(' ').next().unwrap_or("ERR").to_string();
            cmd.op.status = Some(if code.is_empty() { "ERR".into() } else { code });
            cmd.op.error = Some(e);
        } else if cmd.name == "EXEC" && null {
            // A WATCHed key changed: the transaction did not run.
            cmd.op.status = Some("EXECABORT".into());
            cmd.op.error = Some("transaction aborted (a watched key changed)".into());
        } else if cmd.name == "SELECT" {
            self.namespace = cmd.arg.clone();
        }
        cmd.op.end_chunk = out.chunk;
        out.ops.push(cmd.op);
        Ok(())
    }
}
