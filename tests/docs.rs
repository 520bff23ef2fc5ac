//! The documentation holds together: every relative link in the repository's Markdown resolves
//! (the file exists, and an anchor names a heading or an `id` of its target), the README stays
//! short, the option tables' cells stay readable, and the benchmark page's prose names no commits
//! (the run history is in `bench/results/runs/` and git). Pure: no root, no kernel.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const README_MAX_LINES: usize = 300;
const CELL_MAX_CHARS: usize = 300;

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces to `-`,
/// everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `id="…"` and `name="…"` values in a piece of inline HTML.
fn html_ids(html: &str, out: &mut HashSet<String>) {
    for key in ["id=\"", "name=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(key) {
            rest = &rest[at + key.len()..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
}

struct Doc {
    anchors: HashSet<String>,
    /// (destination, line) of every link and image.
    links: Vec<(String, usize)>,
    /// (raw length, line) of every table cell.
    cells: Vec<(usize, usize)>,
    /// Prose text (not code, not link destinations), with its line.
    prose: Vec<(String, usize)>,
    headings: Vec<(HeadingLevel, String)>,
}

fn parse(text: &str) -> Doc {
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut doc = Doc { anchors: HashSet::new(), links: vec![], cells: vec![], prose: vec![], headings: vec![] };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut heading: Option<(HeadingLevel, String)> = None;
    let mut in_code_block = false;
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { level, id, .. }) => {
                if let Some(id) = id {
                    doc.anchors.insert(id.to_string());
                }
                heading = Some((level, String::new()));
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((level, h)) = heading.take() {
                    let base = slug(&h);
                    let n = seen.entry(base.clone()).or_insert(0);
                    doc.anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
                    *n += 1;
                    doc.headings.push((level, h));
                }
            }
            Event::Text(t) => {
                if let Some((_, h)) = heading.as_mut() {
                    h.push_str(&t);
                }
                if !in_code_block {
                    doc.prose.push((t.to_string(), line_of(range.start)));
                }
            }
            Event::Code(t) => {
                if let Some((_, h)) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::CodeBlock(_)) => in_code_block = true,
            Event::End(TagEnd::CodeBlock) => in_code_block = false,
            Event::Html(h) | Event::InlineHtml(h) => html_ids(&h, &mut doc.anchors),
            Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. }) => {
                doc.links.push((dest_url.to_string(), line_of(range.start)));
            }
            Event::Start(Tag::TableCell) => {
                let raw = text[range.clone()].trim().trim_matches('|').trim();
                doc.cells.push((raw.chars().count(), line_of(range.start)));
            }
            _ => {}
        }
    }
    doc
}

/// Every Markdown file of the repository (not the build's, not installed packages').
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git") {
                    walk(&p, out);
                }
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(Path::new(ROOT), &mut out);
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(ROOT).unwrap_or(p).display().to_string()
}

#[test]
fn every_relative_link_resolves() {
    let files = markdown_files();
    assert!(files.len() >= 10, "found only {} Markdown files", files.len());
    let mut docs: HashMap<PathBuf, Doc> = HashMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        docs.insert(f.canonicalize().unwrap(), parse(&text));
    }
    let mut broken = vec![];
    let mut checked = 0;
    for f in &files {
        let doc = &docs[&f.canonicalize().unwrap()];
        for (dest, line) in &doc.links {
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = dest.split_once('#').unwrap_or((dest.as_str(), ""));
            let target = if path.is_empty() { f.clone() } else { f.parent().unwrap().join(path) };
            let Ok(target) = target.canonicalize() else {
                broken.push(format!("{}:{line}: {dest}: no such file", rel(f)));
                continue;
            };
            if anchor.is_empty() || target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            match docs.get(&target) {
                Some(t) if t.anchors.contains(anchor) => {}
                Some(_) => broken.push(format!("{}:{line}: {dest}: no heading or id `{anchor}` there", rel(f))),
                None => broken.push(format!("{}:{line}: {dest}: not a Markdown file of the repository", rel(f))),
            }
        }
    }
    assert!(checked > 100, "only {checked} relative links found");
    assert!(broken.is_empty(), "{} broken link(s):\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn readme_is_short_and_keeps_its_commands() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= README_MAX_LINES, "README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/");
    for cmd in ["./scripts/demo.sh", "./scripts/test.sh"] {
        assert!(text.lines().any(|l| l.starts_with(cmd)), "README.md's quick start lost `{cmd}`");
    }
    let doc = parse(&text);
    let h1 = doc.headings.iter().filter(|(l, _)| *l == HeadingLevel::H1).count();
    assert_eq!(h1, 1, "README.md has {h1} top-level headings");
}

#[test]
fn option_table_cells_stay_readable() {
    for f in ["README.md", "docs/usage.md"] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(f)).unwrap();
        let doc = parse(&text);
        assert!(!doc.cells.is_empty(), "{f} has no table");
        let long: Vec<_> = doc
            .cells
            .iter()
            .filter(|(n, _)| *n > CELL_MAX_CHARS)
            .map(|(n, line)| format!("{f}:{line}: a cell of {n} characters"))
            .collect();
        assert!(long.is_empty(), "cells over {CELL_MAX_CHARS} characters (move the detail below the table):\n{}", long.join("\n"));
    }
}

/// A word that looks like an abbreviated commit: 7 to 40 hex digits, with a letter and a digit.
fn looks_like_commit(word: &str) -> bool {
    (7..=40).contains(&word.len())
        && word.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(|c| c.is_ascii_alphabetic())
}

#[test]
fn benchmark_prose_names_no_commit() {
    let f = "docs/benchmark.md";
    let text = std::fs::read_to_string(Path::new(ROOT).join(f)).unwrap();
    let doc = parse(&text);
    assert!(doc.prose.len() > 50, "{f}: too little prose parsed");
    let hits: Vec<_> = doc
        .prose
        .iter()
        .flat_map(|(t, line)| {
            t.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| looks_like_commit(w)).map(move |w| format!("{f}:{line}: {w}"))
        })
        .collect();
    assert!(
        hits.is_empty(),
        "commit hashes in the benchmark's prose (history belongs to bench/results/runs/ and git):\n{}",
        hits.join("\n")
    );
}

#[test]
fn slugs_and_commit_words() {
    assert_eq!(slug("Requests: `GET` (SERVER), with their work under them"), "requests-get-server-with-their-work-under-them");
    assert_eq!(slug("The app's own OTLP through uvspan (`--otlp-listen`)"), "the-apps-own-otlp-through-uvspan---otlp-listen");
    assert_eq!(slug("Per `fs.statSync`"), "per-fsstatsync");
    assert!(looks_like_commit("9ac4f28") && looks_like_commit("3951051a"));
    assert!(!looks_like_commit("1004120") && !looks_like_commit("deadbeef") && !looks_like_commit("fs"));
    let d = parse("# A\n## A\n<a id=\"x\"></a>text [l](b.md#c)\n\n| a | b |\n|---|---|\n| 1 | 22 |\n");
    assert!(d.anchors.contains("a") && d.anchors.contains("a-1") && d.anchors.contains("x"));
    assert_eq!(d.links, vec![("b.md#c".to_string(), 3)]);
    assert_eq!(d.cells.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 1, 1, 2]);
}
