//! Golden tests, no root needed: raw ring-buffer records recorded from a real
//! run (UVSPAN_RECORD=tests/golden/NAME.rec uvspan -- node tests/golden/fs_dns_loop.js;
//! stripped.rec with a stripped copy of node instead of node) are decoded and
//! turned into spans; the result must match NAME.golden.
//! Regenerate after an intended change with UPDATE_GOLDEN=1 cargo test --test golden.

use std::fmt::Write;
use std::path::Path;

use opentelemetry::trace::Status;
use uvspan::events::clock::Clock;
use uvspan::events::decode::{decode, read_recording};
use uvspan::events::spans::{build, SequentialIds, SpanContextSource};
use uvspan::export::console;

fn render(rec_file: &Path) -> String {
    let bytes = std::fs::read(rec_file).unwrap();
    let ids = SequentialIds::default();
    // Offset 0: times stay kernel-monotonic, so the output is the same on every run.
    let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler: Default::default() };
    let mut out = String::new();
    for raw in read_recording(&bytes) {
        let rec = decode(raw).expect("recorded records decode");
        let spans = build(rec.clone(), &src);
        if spans.is_empty() {
            writeln!(out, "# {rec:?}").unwrap();
            continue;
        }
        out.push_str(&console::render("node[1]", &spans));
        for s in &spans {
            for e in s.events.iter() {
                let t = e.time_ns;
                writeln!(out, "    event {} @{t}ns of {}", e.name, s.name).unwrap();
            }
            if let Status::Error { description } = &s.status {
                writeln!(out, "    status error {description:?} of {}", s.name).unwrap();
            }
            if s.parent_span_id != opentelemetry::trace::SpanId::INVALID {
                writeln!(out, "    parent {} of {} ({})", s.parent_span_id, s.name, s.span_context.span_id()).unwrap();
            }
        }
    }
    out
}

#[test]
fn recorded_runs_match_golden() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rec") {
            continue;
        }
        let golden = path.with_extension("golden");
        let got = render(&path);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &got).unwrap();
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|_| panic!("{} missing: run UPDATE_GOLDEN=1 cargo test --test golden", golden.display()));
        assert_eq!(got, want, "spans from {} differ from {}", path.display(), golden.display());
        checked += 1;
    }
    assert!(checked > 0, "no recordings in {}", dir.display());
}
