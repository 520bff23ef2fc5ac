//! `uvspan probes`: where libuv is and which probes uvspan can use there,
//! like `tplist` for this domain. Nothing is attached; the plan shown is the
//! one `uvspan` would attach.

use anyhow::Result;
use serde::Serialize;

use crate::probes::catalog::{Detail, Needed};
use crate::probes::io_uring;
use crate::probes::plan::{plan, Conditions, ProbeState, ProbeStatus};
use crate::symbols::{self, Images, Located};

#[derive(Serialize)]
struct ImageInfo<'a> {
    path: &'a str,
    build_id: Option<&'a str>,
    node_version: Option<&'a str>,
    libuv_version: Option<&'a str>,
    symbol_table: bool,
}

impl<'a> ImageInfo<'a> {
    fn of(l: &'a Located) -> Self {
        ImageInfo {
            path: &l.path,
            build_id: l.image.build_id.as_deref(),
            node_version: l.image.node_version.as_deref(),
            libuv_version: l.image.libuv_version.as_deref(),
            symbol_table: l.image.has_symtab,
        }
    }
}

#[derive(Serialize)]
struct Listing<'a> {
    pid: Option<u32>,
    node_version: Option<&'a str>,
    libuv: ImageInfo<'a>,
    libc: Option<ImageInfo<'a>>,
    /// V8's image when it is not libuv's (libnode.so).
    #[serde(skip_serializing_if = "Option::is_none")]
    v8: Option<ImageInfo<'a>>,
    probes: &'a [ProbeStatus],
}

/// The images for `uvspan probes --pid PID` or `uvspan probes PATH`.
pub fn images_for(pid: Option<u32>, path: Option<&std::path::Path>) -> Result<Images> {
    match (pid, path) {
        (Some(pid), _) => crate::discover::target::check_pid(pid),
        (None, Some(p)) => Ok(Images::new(symbols::locate_file(p)?, symbols::system_libc())),
        (None, None) => anyhow::bail!("give --pid PID or the path of a node binary or libuv.so"),
    }
}

pub fn render_json(pid: Option<u32>, images: &Images, probes: &[ProbeStatus]) -> String {
    let l = Listing {
        pid,
        node_version: images.node_version.as_deref(),
        libuv: ImageInfo::of(&images.libuv),
        libc: images.libc.as_ref().map(ImageInfo::of),
        v8: images.v8.as_ref().map(ImageInfo::of),
        probes,
    };
    serde_json::to_string_pretty(&l).unwrap_or_default()
}

fn state_word(r: &ProbeStatus) -> &'static str {
    match (&r.state, r.fallback_for.is_some()) {
        (ProbeState::Usable, false) => "attachable",
        (ProbeState::Usable, true) => "fallback",
        (ProbeState::NotNeeded, _) => "not needed",
        (ProbeState::Missing, _) => "missing",
        (ProbeState::Failed(_), _) => "failed",
        (ProbeState::Off(_), _) => "off",
    }
}

fn note(r: &ProbeStatus) -> String {
    if r.single_stepped {
        return "single-stepped by the kernel: slower hits".into();
    }
    match (&r.state, r.fallback_for) {
        (ProbeState::Usable, Some(primary)) => format!("in use for missing {primary}"),
        (ProbeState::NotNeeded, Some(primary)) => format!("only used without {primary}"),
        (ProbeState::NotNeeded, None) if r.only_for == Some(Needed::FsEnds) => {
            "sync calls end at their return, async ones where the loop takes them (no io_uring)".into()
        }
        (ProbeState::NotNeeded, None) if r.only_for == Some(Needed::JobDone) => {
            "finished jobs end in batches at uv__work_done (one hit per batch)".into()
        }
        (ProbeState::NotNeeded, None) if r.only_for == Some(Needed::Batches) => {
            "turned off (UVSPAN_BENCH_PER_JOB_DONE=1): one hit per finished job".into()
        }
        (ProbeState::NotNeeded, None) if r.only_for == Some(Needed::LoopWaits) => {
            "fentry programs see the loop's epoll waits (as uvspan last found on this boot, else assumed)".into()
        }
        (ProbeState::NotNeeded, None) => format!("only used with {}", r.requires.unwrap_or("?")),
        (ProbeState::Missing, _) => r.if_missing.to_string(),
        (ProbeState::Failed(e), _) => format!("{e}: {}", r.if_missing),
        (ProbeState::Off(k), _) => k.how_to_enable(),
        _ => String::new(),
    }
}

/// The human view: the images, then one row per probe.
pub fn render_table(pid: Option<u32>, images: &Images, probes: &[ProbeStatus]) -> String {
    let mut out = String::new();
    let l = &images.libuv;
    let version =
        [images.node_version.as_deref().map(|v| format!("node {v}")), l.image.libuv_version.as_deref().map(|v| format!("libuv {v}"))]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
    if let Some(pid) = pid {
        out.push_str(&format!("process: {pid}\n"));
    }
    out.push_str(&format!(
        "libuv:   {} ({}; build-id {}; symbol table: {})\n",
        l.path,
        if version.is_empty() { "version unknown".into() } else { version },
        l.image.build_id.as_deref().unwrap_or("none"),
        if l.image.has_symtab { "yes" } else { "no, stripped: exported API only" }
    ));
    match &images.libc {
        Some(c) => out.push_str(&format!("libc:    {}\n", c.path)),
        None => out.push_str("libc:    not found\n"),
    }
    if let Some(v) = &images.v8 {
        out.push_str(&format!("v8:      {}\n", v.path));
    }
    let attachable = probes.iter().filter(|r| r.state == ProbeState::Usable).count();
    let off = probes.iter().filter(|r| matches!(r.state, ProbeState::Off(_))).count();
    if off > 0 {
        out.push_str(&format!("probes:  {attachable} of {} usable, {off} off (--detail, --requests)\n\n", probes.len()));
    } else {
        out.push_str(&format!("probes:  {attachable} of {} usable\n\n", probes.len()));
    }
    out.push_str(&format!("{:<24} {:<6} {:<12} {:<11} {}\n", "SYMBOL", "IN", "OFFSET", "STATUS", "NOTE"));
    for r in probes {
        let image = match r.image {
            crate::probes::catalog::ImageKind::Libuv => "libuv",
            crate::probes::catalog::ImageKind::Libc => "libc",
            crate::probes::catalog::ImageKind::V8 => "v8",
        };
        let off = r.offset.map_or_else(|| "-".to_string(), |o| format!("{o:#x}"));
        out.push_str(format!("{:<24} {:<6} {:<12} {:<11} {}\n", r.symbol, image, off, state_word(r), note(r)).trim_end());
        out.push('\n');
    }
    out
}

/// Runs `uvspan probes`.
pub fn run(pid: Option<u32>, path: Option<&std::path::Path>, json: bool, detail: Detail) -> Result<()> {
    let images = images_for(pid, path)?;
    // A file alone: as for a process started with the default environment.
    let env = pid.map_or(io_uring::Env::Unset, io_uring::Env::of);
    let k = crate::kernel::features::known();
    let probes = plan(&images, detail, Conditions::of(k.session, !k.fentry && k.session, &images, &env));
    if json {
        println!("{}", render_json(pid, &images, &probes));
    } else {
        print!("{}", render_table(pid, &images, &probes));
    }
    Ok(())
}
