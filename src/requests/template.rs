//! A low-cardinality name for a request's path without the app's help: `url.template`, made by
//! replacing the path segments that identify one resource (numbers, UUIDs, hashes, long random
//! tokens) with placeholders: `/items/8812/photos` → `/items/{id}/photos`. Pure, on bytes the
//! traced process controls: bounded, never panics.
//!
//! The app's own SDK knows the route it matched (`http.route`); where uvspan's spans are joined
//! to the app's SERVER span (`--otlp-listen`), that span, with its route, is the one exported.

use std::borrow::Cow;

/// Segments kept; past these the template ends in `/…` (a path that long is its own
/// cardinality problem).
const MAX_SEGMENTS: usize = 16;
/// A segment longer than this is a placeholder whatever it holds.
const MAX_SEGMENT: usize = 64;

/// The placeholder of a segment that names one resource, or `None` for a segment to keep.
fn placeholder(seg: &str) -> Option<&'static str> {
    let b = seg.as_bytes();
    if b.is_empty() {
        return None;
    }
    if b.len() > MAX_SEGMENT {
        return Some("{token}");
    }
    if b.iter().all(u8::is_ascii_digit) {
        return Some("{id}");
    }
    if is_uuid(b) {
        return Some("{uuid}");
    }
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    // A hex digest or object id: 12+ hex digits, some of them numbers (so `deadbeefcafe`, a word,
    // stays, and `5f8ff25a1c3e` goes).
    if b.len() >= 12 && digits > 0 && b.iter().all(u8::is_ascii_hexdigit) {
        return Some("{hash}");
    }
    // A number with a separator or a unit-like prefix: `2024-01-31`, `12.5`, `v-1234567`.
    if digits * 2 > b.len() && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':')) {
        return Some("{id}");
    }
    // A random token (base64url, base62): long, letters and digits mixed, no word separators.
    let upper = b.iter().filter(|c| c.is_ascii_uppercase()).count();
    let lower = b.iter().filter(|c| c.is_ascii_lowercase()).count();
    if b.len() >= 16
        && digits >= 2
        && (upper > 0 || lower > 0)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
        && !looks_like_words(seg)
    {
        return Some("{token}");
    }
    None
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(b: &[u8]) -> bool {
    b.len() == 36 && b.iter().enumerate().all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() })
}

/// Words joined by `-` or `_` (a slug such as `release-notes-2024`): every part but numbers is
/// letters only.
fn looks_like_words(seg: &str) -> bool {
    let parts: Vec<&str> = seg.split(['-', '_']).collect();
    parts.len() > 1 && parts.iter().all(|p| p.bytes().all(|c| c.is_ascii_lowercase()) || p.bytes().all(|c| c.is_ascii_digit()))
}

/// `url.template` of a request (`None` for a gRPC call: its name is its method).
pub fn of_head(head: &super::head::Head) -> Option<String> {
    head.grpc().is_none().then(|| url_template(&head.path).into_owned())
}

/// `url.template` of a request's path (no query: `url.path` as uvspan keeps it).
pub fn url_template(path: &str) -> Cow<'_, str> {
    if path.is_empty() {
        return Cow::Borrowed("/");
    }
    let segs: Vec<&str> = path.split('/').collect();
    let changed = segs.len() > MAX_SEGMENTS + 1 || segs.iter().any(|s| placeholder(s).is_some());
    if !changed {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len().min(256));
    for (i, s) in segs.iter().enumerate() {
        if i > MAX_SEGMENTS {
            out.push_str("/…");
            break;
        }
        if i > 0 {
            out.push('/');
        }
        out.push_str(placeholder(s).unwrap_or(s));
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The golden table: paths as apps serve them → their templates.
    const GOLDEN: &[(&str, &str)] = &[
        ("/", "/"),
        ("", "/"),
        ("*", "*"),
        ("/health", "/health"),
        ("/items/42", "/items/{id}"),
        ("/items/42/", "/items/{id}/"),
        ("/api/v1/users/1234/orders/98765", "/api/v1/users/{id}/orders/{id}"),
        ("/api/v2/items", "/api/v2/items"),
        ("/users/3f2504e0-4f89-11d3-9a0c-0305e82c3301", "/users/{uuid}"),
        ("/users/3F2504E0-4F89-11D3-9A0C-0305E82C3301/avatar", "/users/{uuid}/avatar"),
        ("/blobs/sha256/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "/blobs/sha256/{hash}"),
        ("/commits/5f8ff25a1c3e", "/commits/{hash}"),
        ("/objects/507f1f77bcf86cd799439011", "/objects/{hash}"),
        ("/cafe/deadbeefcafe", "/cafe/deadbeefcafe"),
        ("/reports/2024-01-31", "/reports/{id}"),
        ("/price/12.50", "/price/{id}"),
        ("/s/aZ3kQ9xT2mLp7VbN", "/s/{token}"),
        ("/reset/eyJhbGciOiJIUzI1NiJ9x8Kp2", "/reset/{token}"),
        ("/blog/release-notes-2024", "/blog/release-notes-2024"),
        ("/static/app.3f9a.js", "/static/app.3f9a.js"),
        ("/static/main.css", "/static/main.css"),
        ("/v1", "/v1"),
        ("/docs/getting_started", "/docs/getting_started"),
        ("/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r", "/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/…"),
    ];

    #[test]
    fn golden_paths_to_templates() {
        let mut wrong = vec![];
        for (path, want) in GOLDEN {
            let got = url_template(path);
            if got != *want {
                wrong.push(format!("{path:?}: {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_path_without_ids_is_borrowed_as_it_is() {
        assert!(matches!(url_template("/api/v2/items"), Cow::Borrowed("/api/v2/items")));
    }

    proptest! {
        #[test]
        fn any_path_gives_a_bounded_template(path in "\\PC{0,600}") {
            let t = url_template(&path);
            prop_assert!(t.len() <= path.len().max(1) + 8 * (MAX_SEGMENTS + 1));
            prop_assert!(t.split('/').count() <= MAX_SEGMENTS + 2);
            // Templating is idempotent: a template's segments are kept or are placeholders.
            prop_assert_eq!(url_template(&t).into_owned(), t.into_owned());
        }

        #[test]
        fn numeric_segments_always_become_ids(prefix in "[a-z]{1,10}", n in 0u64..u64::MAX) {
            let path = format!("/{prefix}/{n}");
            prop_assert_eq!(url_template(&path).into_owned(), format!("/{prefix}/{{id}}"));
        }
    }
}
