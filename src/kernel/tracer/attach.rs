//! Attaching the catalog's probes: once per file and pid filter (a file
//! mapped by many processes, by whichever path, is attached once), libc's
//! epoll waits per process, what each attachment held (to attach it again
//! when a sampling window opens).

use anyhow::{anyhow, bail, Result};
use libbpf_rs::{Link, UprobeMultiOpts, UprobeOpts};

use super::detach::detach_all;
use super::{Tracer, Waits};
use crate::kernel::skel::types::{cookie_layout, probe_kind};
use crate::probes::catalog::ImageKind;
use crate::probes::io_uring;
use crate::probes::plan::{plan, Conditions, ProbeState, ProbeStatus};
use crate::symbols::{Images, Located};

/// (device, inode) of a file.
pub(super) type FileId = (u64, u64);

pub(super) fn file_id(p: &std::path::Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

pub(super) struct Attached {
    /// Empty while a sampling window is closed.
    pub(super) links: Vec<Link>,
    /// What was attached, to attach it again when a window opens.
    pub(super) spec: AttachSpec,
    /// The statuses of this image's probes when it was attached.
    pub(super) report: Vec<ProbeStatus>,
}

/// The probes attached to one file for one pid filter.
#[derive(Clone)]
pub(super) struct AttachSpec {
    pub(super) path: std::path::PathBuf,
    pub(super) pid: i32,
    /// (offset, cookie) of each probe that attached.
    pub(super) probes: Vec<(usize, u64)>,
}

/// What [`Tracer::attach`] did.
pub struct Attach {
    pub report: Vec<ProbeStatus>,
    /// Whether new probes went into the kernel (false: the files were
    /// already attached for this pid filter).
    pub new: bool,
}

impl Tracer {
    /// [`Waits::LibcUprobes`]: the planned libc epoll probes of process
    /// `pid`, attached for it alone (a link for every process mapping libc
    /// would trap every epoll wait on the host). A row that does not attach
    /// is marked failed; the process then falls back to the tracepoints.
    pub(super) fn attach_waits(&mut self, images: &Images, pid: u32, report: &mut [ProbeStatus]) {
        let Some(libc) = images.libc.as_ref() else { return };
        if self.wait_links.contains_key(&pid) {
            return;
        }
        let rows: Vec<&mut ProbeStatus> =
            report.iter_mut().filter(|r| r.kind == probe_kind::PROBE_EPOLL_WAIT && r.state == ProbeState::Usable).collect();
        if rows.is_empty() {
            return;
        }
        let (links, _) = self.attach_image(libc, pid as i32, rows);
        if !links.is_empty() {
            self.wait_links.insert(pid, links);
        }
    }

    /// Attaches the planned probes of process `pid`'s images: for that
    /// process alone, or with `per_file` for every process mapping the files
    /// (the kernel-side filter then decides). A file already attached for
    /// that filter is not attached again (its probes would fire twice); a
    /// probe this process needs that the file's existing attachment left out
    /// (uv_fs_req_cleanup, for a process with io_uring turned on) is
    /// attached for this process alone. Missing symbols are reported, not
    /// fatal; no probe attached at all is an error.
    pub fn attach(&mut self, images: &Images, pid: u32, per_file: bool) -> Result<Attach> {
        // libc's first mapping moves while the dynamic loader relocates it:
        // for a process found that early, the range named is gone; look again.
        let again;
        let images = if images.libc.as_ref().is_some_and(|l| file_id(&l.attach_path).is_none()) {
            again = Images { libc: crate::symbols::locate_libc(pid), ..images.clone() };
            &again
        } else {
            images
        };
        let env = io_uring::Env::of(pid);
        let mut report = plan(images, self.detail, Conditions::of(self.session, self.waits == Waits::LibcUprobes, images, &env));
        self.attach_waits(images, pid, &mut report);
        let filter = if per_file { -1 } else { pid as i32 };
        let (mut live, mut new) = (0, false);
        // V8's probes go with libuv's file when V8 is in it (a node executable).
        let file_of = |k: ImageKind| if k == ImageKind::V8 && images.v8.is_none() { ImageKind::Libuv } else { k };
        let files = [(ImageKind::Libuv, Some(&images.libuv)), (ImageKind::Libc, images.libc.as_ref()), (ImageKind::V8, images.v8.as_ref())];
        for (kind, loc) in files {
            let Some(loc) = loc else { continue };
            let Some(id) = file_id(&loc.attach_path) else {
                if kind == ImageKind::Libuv {
                    bail!("{} is gone", loc.path);
                }
                // libc only serves fallbacks and the epoll waits, libnode.so
                // V8's collections: the rest is traced.
                let here =
                    |r: &ProbeStatus| file_of(r.image) == kind && r.kind != probe_kind::PROBE_EPOLL_WAIT && r.state == ProbeState::Usable;
                for r in report.iter_mut().filter(|r| here(r)) {
                    r.state = ProbeState::Failed(format!("{} is gone", loc.path));
                }
                continue;
            };
            // Attach for `filter` what the plan wants; or, where the file is
            // attached already, only what this process needs beyond that
            // attachment (`only`), for this process.
            let (filter, only) = match self.uprobes.get(&(id, filter)) {
                None => (filter, None),
                Some(done) => {
                    live += done.spec.probes.len();
                    let mut extra = Vec::new();
                    for r in report.iter_mut().filter(|r| file_of(r.image) == kind) {
                        let Some(was) = done.report.iter().find(|w| w.symbol == r.symbol) else { continue };
                        if per_file && r.state == ProbeState::Usable && was.state == ProbeState::NotNeeded {
                            extra.push(r.symbol);
                        } else {
                            r.state = was.state.clone();
                        }
                    }
                    if extra.is_empty() {
                        continue;
                    }
                    if let Some(own) = self.uprobes.get(&(id, pid as i32)) {
                        live += own.spec.probes.len();
                        continue;
                    }
                    (pid as i32, Some(extra))
                }
            };
            let wanted = |r: &ProbeStatus| {
                file_of(r.image) == kind && r.kind != probe_kind::PROBE_EPOLL_WAIT && only.as_ref().is_none_or(|o| o.contains(&r.symbol))
            };
            let mine: Vec<&mut ProbeStatus> = report.iter_mut().filter(|r| wanted(r) && r.state == ProbeState::Usable).collect();
            if mine.is_empty() {
                continue;
            }
            let (mut links, probes) = self.attach_image(loc, filter, mine);
            live += probes.len();
            if !probes.is_empty() {
                new = true;
                let report = report.iter().filter(|r| wanted(r)).cloned().collect();
                if self.window_closed {
                    // Attached to check it can be; live from the next window.
                    detach_all(std::mem::take(&mut links));
                }
                let spec = AttachSpec { path: loc.attach_path.clone(), pid: filter, probes };
                self.uprobes.insert((id, filter), Attached { links, spec, report });
            }
        }
        if live == 0 {
            let why = report
                .iter()
                .find_map(|r| match &r.state {
                    ProbeState::Failed(e) => Some(e.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| "no libuv probe symbol found".into());
            return Err(anyhow!("no probe could be attached to {} ({why})", images.libuv.path));
        }
        Ok(Attach { report, new })
    }

    /// One multi-uprobe link for the image when the kernel has them, else one
    /// link per probe (so a failure is reported per probe). Returns the links
    /// and the (offset, cookie) of the probes they hold.
    fn attach_image(&self, loc: &Located, pid: i32, mut probes: Vec<&mut ProbeStatus>) -> (Vec<Link>, Vec<(usize, u64)>) {
        let wanted: Vec<(usize, u64)> = probes.iter().map(|r| (r.offset.unwrap_or(0) as usize, r.cookie)).collect();
        let (links, failed) = self.attach_probes(&loc.attach_path, pid, &wanted);
        for (i, e) in &failed {
            probes[*i].state = ProbeState::Failed(format!("attach failed: {e}"));
        }
        let live = wanted.into_iter().enumerate().filter(|(i, _)| !failed.iter().any(|(f, _)| f == i)).map(|(_, p)| p).collect();
        (links, live)
    }

    /// Attaches (offset, cookie) probes to a file; the indexes that failed
    /// with their error (multi-uprobe: all or none).
    pub(super) fn attach_probes(&self, path: &std::path::Path, pid: i32, probes: &[(usize, u64)]) -> (Vec<Link>, Vec<(usize, String)>) {
        // A link for one process: the kernel runs it there only, and the
        // BPF side can skip its traced-set lookup.
        let one = if pid > 0 { 1u64 << cookie_layout::COOKIE_ONE_PROCESS_SHIFT.0 } else { 0 };
        if self.multi {
            // With session uprobes, the fs submits (libc's epoll waits,
            // HTTP/2 frames, body pieces, closes and outgoing streams) get
            // their own link.
            let session = |&(_, cookie): &(usize, u64)| {
                let kind = cookie >> cookie_layout::COOKIE_KIND_SHIFT.0;
                self.session
                    && [
                        probe_kind::PROBE_FS_SUBMIT,
                        probe_kind::PROBE_EPOLL_WAIT,
                        probe_kind::PROBE_H2_FRAME,
                        probe_kind::PROBE_H2_DATA,
                        probe_kind::PROBE_H2_CLOSE,
                        probe_kind::PROBE_H2_SUBMIT,
                    ]
                    .iter()
                    .any(|k| kind == u64::from(k.0))
            };
            let mut links = Vec::new();
            for in_session in [false, true] {
                let part: Vec<&(usize, u64)> = probes.iter().filter(|p| session(p) == in_session).collect();
                if part.is_empty() {
                    continue;
                }
                let opts = UprobeMultiOpts {
                    offsets: part.iter().map(|p| p.0).collect(),
                    cookies: part.iter().map(|p| p.1 | one).collect(),
                    session: in_session,
                    ..Default::default()
                };
                let prog = if in_session { &self.skel.progs.uv_session } else { &self.dispatcher.progs.uv_multi };
                // Benchmark only: uvspan's program between bench_leave
                // (attached before it, so run after it) and bench_enter.
                let progs: Vec<&libbpf_rs::ProgramMut<'_>> = if super::times_hits(self.multi) {
                    vec![&self.skel.progs.bench_leave, prog, &self.skel.progs.bench_enter]
                } else {
                    vec![prog]
                };
                let attached = progs.into_iter().try_for_each(|p| {
                    let opts = UprobeMultiOpts { session: in_session && std::ptr::eq(p, prog), ..opts.clone() };
                    links.push(p.attach_uprobe_multi_with_opts(pid, path, "", opts)?);
                    Ok::<_, libbpf_rs::Error>(())
                });
                match attached {
                    Ok(()) => {}
                    Err(e) => {
                        // All or none, as with one link: a file that went
                        // away between the two (its process exited) must not
                        // stay attached in half.
                        detach_all(links);
                        return (Vec::new(), (0..probes.len()).map(|i| (i, e.to_string())).collect());
                    }
                }
            }
            return (links, Vec::new());
        }
        let (mut links, mut failed) = (Vec::new(), Vec::new());
        for (i, &(offset, cookie)) in probes.iter().enumerate() {
            let opts = UprobeOpts { cookie: cookie | one, retprobe: false, ..Default::default() };
            match self.dispatcher.progs.uv_single.attach_uprobe_with_opts(pid, path, offset, opts) {
                Ok(link) => links.push(link),
                Err(e) => failed.push((i, e.to_string())),
            }
        }
        (links, failed)
    }
}
