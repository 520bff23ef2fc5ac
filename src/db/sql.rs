//! SQL text as the spans show it: literals replaced by `?` (strings, numbers,
//! dollar-quoted and hex literals; comments dropped), and the operation and
//! single table a statement names. Pure and bounded: the output is never
//! longer than the input, any bytes give a result.

/// `sql` with its literals replaced by `?` and its comments removed;
/// identifiers, keywords, placeholders (`$1`, `?`, `:name`) and casts kept.
/// An unterminated literal or comment (a text cut by the capture) is
/// replaced to the end.
pub fn sanitize(sql: &str) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    // Whether the last byte written continues an identifier (a digit after
    // it is part of the name: `t1`, `$1`).
    let mut in_word = false;
    // The last thing replaced was a comment (a space stands for it).
    let mut after_comment = false;
    while i < b.len() {
        let c = b[i];
        let was_comment = std::mem::take(&mut after_comment);
        match c {
            b'\'' => {
                i = skip_quoted(b, i + 1, b'\'');
                out.push('?');
                in_word = false;
            }
            b'"' | b'`' => {
                // A quoted identifier: kept.
                let end = skip_quoted(b, i + 1, c);
                out.push_str(&sql[i..end]);
                i = end;
                in_word = false;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
            }
            b'#' if !in_word => {
                // MySQL's line comment.
                i = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = memchr::memmem::find(&b[i + 2..], b"*/").map_or(b.len(), |n| i + 2 + n + 2);
                if !out.ends_with(' ') && !out.is_empty() {
                    out.push(' ');
                }
                after_comment = true;
            }
            b'$' if !in_word => {
                // $1 (a placeholder) or $tag$…$tag$ (a literal).
                let tag_end = b[i + 1..].iter().position(|c| !(c.is_ascii_alphanumeric() || *c == b'_')).map(|n| i + 1 + n);
                match tag_end {
                    Some(e) if b[e] == b'$' && !b[i + 1..e].first().is_some_and(u8::is_ascii_digit) => {
                        let tag = &b[i..=e];
                        i = memchr::memmem::find(&b[e + 1..], tag).map_or(b.len(), |n| e + 1 + n + tag.len());
                        out.push('?');
                        in_word = false;
                    }
                    _ => {
                        let e = tag_end.unwrap_or(b.len());
                        out.push_str(&sql[i..e]);
                        i = e;
                        in_word = true;
                    }
                }
            }
            b'0'..=b'9' if !in_word => {
                // A number: digits, a point, an exponent, hex (0x…).
                let mut j = i + 1;
                while j < b.len()
                    && (b[j].is_ascii_alphanumeric() || b[j] == b'.' || ((b[j] == b'+' || b[j] == b'-') && matches!(b[j - 1], b'e' | b'E')))
                {
                    j += 1;
                }
                out.push('?');
                i = j;
                in_word = false;
            }
            b'.' if !in_word && b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'.') {
                    j += 1;
                }
                out.push('?');
                i = j;
            }
            b'x' | b'X' | b'b' | b'B' | b'e' | b'E' | b'n' | b'N' if !in_word && b.get(i + 1) == Some(&b'\'') => {
                // X'0A', B'01', E'…', N'…'
                i = skip_quoted(b, i + 2, b'\'');
                out.push('?');
                in_word = false;
            }
            b' ' | b'\t' | b'\r' | b'\n' if out.ends_with(' ') && was_comment => {
                i += 1;
                after_comment = true;
            }
            _ => {
                // Whole UTF-8 characters (the index is on a boundary here).
                let len = utf8_len(c);
                let end = (i + len).min(b.len());
                out.push_str(sql.get(i..end).unwrap_or(""));
                in_word = c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
                i = end;
            }
        }
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// The index after the closing `q` of a literal starting at `i` (a doubled
/// `q` and a backslash escape are inside it), or the end.
fn skip_quoted(b: &[u8], mut i: usize, q: u8) -> usize {
    while i < b.len() {
        if b[i] == b'\\' && q == b'\'' {
            i += 2;
            continue;
        }
        if b[i] == q {
            if b.get(i + 1) == Some(&q) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    b.len()
}

/// The words of a statement's start, outside comments and literals: what
/// [`operation`] and [`collection`] read.
fn words(sql: &str, max: usize) -> Vec<&str> {
    let b = sql.as_bytes();
    let mut w = Vec::new();
    let mut i = 0;
    while i < b.len() && w.len() < max {
        let c = b[i];
        if c == b'-' && b.get(i + 1) == Some(&b'-') {
            i = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i = memchr::memmem::find(&b[i + 2..], b"*/").map_or(b.len(), |n| i + 2 + n + 2);
        } else if c == b'\'' {
            i = skip_quoted(b, i + 1, b'\'');
            w.push("?");
        } else if c == b'"' || c == b'`' {
            let e = skip_quoted(b, i + 1, c);
            w.push(&sql[i..e]);
            i = e;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' {
            let e = b[i..].iter().position(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.'))).map_or(b.len(), |n| i + n);
            w.push(&sql[i..e]);
            i = e;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c < 0x80 {
            w.push(&sql[i..=i]);
            i += 1;
        } else {
            // Not ASCII: a character (not a word) of any length.
            let e = (i + utf8_len(c)).min(b.len());
            i = if sql.is_char_boundary(e) { e } else { b.len() };
        }
    }
    w
}

/// The statement's operation: its first keyword, upper case (`SELECT`,
/// `INSERT`, `WITH`), or `None` for no keyword.
pub fn operation(sql: &str) -> Option<String> {
    let w = words(sql, 1);
    let first = w.first()?;
    first.bytes().all(|c| c.is_ascii_alphabetic()).then(|| first.to_ascii_uppercase())
}

/// The one table a simple statement names: `SELECT … FROM t` (no join, no
/// second table), `INSERT INTO t`, `UPDATE t`, `DELETE FROM t`; `None` when
/// it names none or several, or it is not one of those.
pub fn collection(sql: &str) -> Option<String> {
    let w = words(sql, 256);
    let is = |s: &str, k: &str| s.eq_ignore_ascii_case(k);
    let op = w.first()?;
    let at = if is(op, "SELECT") || is(op, "DELETE") {
        w.iter().position(|s| is(s, "FROM"))? + 1
    } else if is(op, "INSERT") || is(op, "REPLACE") {
        w.iter().position(|s| is(s, "INTO"))? + 1
    } else if is(op, "UPDATE") {
        1
    } else {
        return None;
    };
    let name = *w.get(at)?;
    if name == "(" || name == "?" || name.starts_with('$') {
        return None;
    }
    // A second table: a comma after it (or after its alias), or a join.
    let rest = &w[at + 1..];
    let second = rest.iter().take(3).any(|s| *s == ",") || rest.iter().any(|s| is(s, "JOIN"));
    (!second).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_become_placeholders_and_placeholders_stay() {
        let cases = [
            ("SELECT 1 AS one, 'it''s' AS s", "SELECT ? AS one, ? AS s"),
            ("SELECT $1::int + $2::int AS sum", "SELECT $1::int + $2::int AS sum"),
            ("SELECT * FROM t1 WHERE id = 7 AND x > -3.5e+2", "SELECT * FROM t1 WHERE id = ? AND x > -?"),
            ("SELECT $$a 'b'$$, $tag$x$tag$ FROM t", "SELECT ?, ? FROM t"),
            ("SELECT x'0A', E'a\\'b' -- secret\nFROM \"T 1\"", "SELECT ?, ? \nFROM \"T 1\""),
            ("SELECT ? + ? AS sum", "SELECT ? + ? AS sum"),
            ("SELECT /* pw */ 'unterminated", "SELECT ?"),
            ("INSERT INTO items VALUES (1, 'a'), (2, 'b')", "INSERT INTO items VALUES (?, ?), (?, ?)"),
            ("SELECT 'é', été FROM ünï", "SELECT ?, été FROM ünï"),
            ("SELECT .5, 0x1F", "SELECT ?, ?"),
        ];
        for (sql, want) in cases {
            assert_eq!(sanitize(sql), want, "{sql}");
        }
    }

    #[test]
    fn operation_and_single_table() {
        assert_eq!(operation("  select * from t").as_deref(), Some("SELECT"));
        assert_eq!(operation("/* c */ WITH x AS (SELECT 1) SELECT * FROM x").as_deref(), Some("WITH"));
        assert_eq!(operation("(SELECT 1)"), None);
        assert_eq!(collection("SELECT * FROM missing_table WHERE id = 7").as_deref(), Some("missing_table"));
        assert_eq!(collection("INSERT INTO items VALUES (1)").as_deref(), Some("items"));
        assert_eq!(collection("UPDATE public.items SET a = 1").as_deref(), Some("public.items"));
        assert_eq!(collection("DELETE FROM \"Items\" WHERE a = 1").as_deref(), Some("\"Items\""));
        assert_eq!(collection("SELECT * FROM a, b"), None);
        assert_eq!(collection("SELECT * FROM a x, b"), None);
        assert_eq!(collection("SELECT * FROM a JOIN b ON a.id = b.id"), None);
        assert_eq!(collection("SELECT 1"), None);
        assert_eq!(collection("SELECT * FROM (SELECT 1) s"), None);
        assert_eq!(collection("CREATE TABLE t (a int)"), None);
    }
}
