//! Named samples of one slow iteration folded into its top stacks, and the
//! loop phase each sample fell in (from the libuv frames under the JS ones).
//! Pure: no process needed.

use std::collections::HashMap;

/// One named frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// JS function name ("(anonymous)"), native symbol, or "[unknown]".
    pub function: String,
    /// JS: "file:line:col" (or less when unknown); native: the module
    /// ("node", "libc.so.6+0x1234" when the symbol is unknown).
    pub location: Option<String>,
    pub js: bool,
}

impl Frame {
    pub fn js(function: &str, location: Option<String>) -> Frame {
        let function = if function.is_empty() { "(anonymous)" } else { function };
        Frame { function: function.to_string(), location, js: true }
    }

    pub fn native(function: &str, location: Option<String>) -> Frame {
        Frame { function: function.to_string(), location, js: false }
    }
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.location {
            Some(l) => write!(f, "{} ({l})", self.function),
            None => f.write_str(&self.function),
        }
    }
}

/// How many distinct stacks an iteration reports (the rest are counted).
pub const TOP_STACKS: usize = 10;

/// What the samples of one slow iteration say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocked {
    pub samples: u64,
    /// Time one sample stands for.
    pub period_ns: u64,
    /// Distinct stacks (innermost frame first), heaviest first, at most
    /// [`TOP_STACKS`], with their sample counts.
    pub stacks: Vec<(Vec<Frame>, u64)>,
    /// Samples in stacks beyond the top ones.
    pub other_samples: u64,
    /// Samples per loop phase (see [`phase_of`]), largest first.
    pub phases: Vec<(&'static str, u64)>,
    /// Why frames could not be named (said once per iteration), if so.
    pub notice: Option<String>,
}

impl Blocked {
    /// The heaviest stack of the culprit (else the heaviest stack), one
    /// frame per line, innermost first.
    pub fn heaviest(&self) -> Option<String> {
        let c = self.culprit();
        let of = self.stacks.iter().find(|(s, _)| c.is_some() && culprit_of(s) == c);
        of.or(self.stacks.first()).map(|(s, _)| render(s))
    }

    /// The innermost frame of the project's own code in the heaviest
    /// stack: the innermost JS frame outside Node's built-in modules
    /// (`node:fs`, whose readSync the user's code called), else the
    /// innermost JS frame, else the innermost JIT frame named by the perf
    /// map, else the innermost named frame of node's own native code. Never
    /// a shared library's frame (libc's `open64` on top of the user's
    /// `readFileSync`), an address or a marker: None when the stack has
    /// only those. The native frames above it stay in the stack.
    ///
    /// Over the top stacks, the culprit with the most samples: stacks whose
    /// walk stopped at once (`[truncated]` alone) or that stayed in a
    /// library name no one, and the samples of one function spread over
    /// several stacks (its calls into libc's open, read, fstat) add up.
    pub fn culprit(&self) -> Option<&Frame> {
        let mut best: Vec<(&Frame, u64)> = Vec::new();
        for (s, n) in &self.stacks {
            let Some(f) = culprit_of(s) else { continue };
            match best.iter_mut().find(|(g, _)| *g == f) {
                Some((_, m)) => *m += n,
                None => best.push((f, *n)),
            }
        }
        // the first (heaviest stack's) of equals
        best.iter()
            .fold(None, |acc: Option<(&Frame, u64)>, &(f, n)| match acc {
                Some((_, m)) if m >= n => acc,
                _ => Some((f, n)),
            })
            .map(|(f, _)| f)
    }
}

/// One stack's culprit (see [`Blocked::culprit`]).
fn culprit_of(s: &[Frame]) -> Option<&Frame> {
    let builtin = |f: &Frame| f.location.as_deref().is_some_and(|l| l.starts_with("node:"));
    s.iter()
        .find(|f| f.js && !builtin(f))
        .or_else(|| s.iter().find(|f| f.js))
        .or_else(|| s.iter().find(|f| f.location.as_deref().is_some_and(|l| l.ends_with(".map"))))
        .or_else(|| s.iter().find(|f| is_own_native(f)))
}

/// The marker that ends a stack whose walk left the process's code (or
/// the copy of its stack): the frames above it are not known.
pub const TRUNCATED: &str = "[truncated]";

/// A named frame of node's own native code (its executable or libnode),
/// not a library's (`libc.so.6`, `[vdso]`), nor an address or a marker.
fn is_own_native(f: &Frame) -> bool {
    let named = !f.function.starts_with('[');
    let module = f.location.as_deref().unwrap_or("");
    // "node", "libnode.so.109"; "node+0x1234" is an address.
    let own = module == "node" || module.starts_with("libnode") && !module.contains('+');
    !f.js && named && own
}

/// A stack as `code.stacktrace` text: one frame per line, innermost first.
pub fn render(stack: &[Frame]) -> String {
    stack.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

/// libuv's phase functions, by the phase name used in attributes; and
/// Node's exported functions that run all due timers and immediates (named
/// in builds whose libuv internals are stripped).
const PHASE_FUNCTIONS: &[(&str, &str)] = &[
    ("node::Environment::RunTimers", "timers"),
    ("node::Environment::CheckImmediate", "check"),
    ("uv__run_timers", "timers"),
    ("uv__run_pending", "pending"),
    ("uv__run_idle", "idle"),
    ("uv__run_prepare", "prepare"),
    ("uv__io_poll", "poll"),
    ("uv__run_check", "check"),
    ("uv__run_closing_handles", "close"),
];

/// The loop phase a sample fell in: the innermost libuv phase function on
/// its stack. `other` when only `uv_run` is there (the pending and
/// closing-handles phases are inlined into it in Node's builds, and a
/// stripped libuv names no phase function); `unknown` when the walk did
/// not reach `uv_run`.
pub fn phase_of(stack: &[Frame]) -> &'static str {
    for f in stack.iter().filter(|f| !f.js) {
        // C++ names come with their parameters: "node::Environment::RunTimers(uv_timer_s*)".
        let name = f.function.split_once('(').map_or(f.function.as_str(), |(n, _)| n);
        if let Some((_, p)) = PHASE_FUNCTIONS.iter().find(|(sym, _)| name == *sym) {
            return p;
        }
        if f.function == "uv_run" {
            return "other";
        }
    }
    "unknown"
}

/// Samples of one iteration being folded.
#[derive(Default, Debug)]
pub struct Folder {
    counts: HashMap<Vec<Frame>, u64>,
    phases: HashMap<&'static str, u64>,
    samples: u64,
    pub notice: Option<String>,
}

impl Folder {
    pub fn add(&mut self, stack: Vec<Frame>) {
        *self.phases.entry(phase_of(&stack)).or_default() += 1;
        *self.counts.entry(stack).or_default() += 1;
        self.samples += 1;
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn finish(self, period_ns: u64) -> Blocked {
        let mut stacks: Vec<(Vec<Frame>, u64)> = self.counts.into_iter().collect();
        stacks.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let other_samples = stacks.iter().skip(TOP_STACKS).map(|(_, n)| n).sum();
        stacks.truncate(TOP_STACKS);
        let mut phases: Vec<(&'static str, u64)> = self.phases.into_iter().collect();
        phases.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        Blocked { samples: self.samples, period_ns, stacks, other_samples, phases, notice: self.notice }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(n: &str) -> Frame {
        Frame::js(n, Some(format!("/app/blocker.js:{}:1", n.len())))
    }

    fn native(n: &str) -> Frame {
        Frame::native(n, Some("node".into()))
    }

    fn timers_stack(leaf: &str) -> Vec<Frame> {
        vec![js(leaf), js("handleRequest"), native("node::Environment::RunTimers"), native("uv__run_timers"), native("uv_run")]
    }

    #[test]
    fn samples_fold_into_top_stacks_heaviest_first() {
        let mut f = Folder::default();
        for _ in 0..3 {
            f.add(timers_stack("parseBigPayload"));
        }
        f.add(timers_stack("tokenize"));
        let b = f.finish(1_001_001);
        assert_eq!(b.samples, 4);
        assert_eq!(b.stacks.len(), 2);
        assert_eq!(b.stacks[0].1, 3);
        assert_eq!(b.stacks[0].0[0].function, "parseBigPayload");
        assert_eq!(b.culprit().map(|f| f.function.as_str()), Some("parseBigPayload"));
        assert_eq!(
            b.heaviest().unwrap(),
            "parseBigPayload (/app/blocker.js:15:1)\nhandleRequest (/app/blocker.js:13:1)\n\
             node::Environment::RunTimers (node)\nuv__run_timers (node)\nuv_run (node)"
        );
        assert_eq!(b.phases, vec![("timers", 4)]);
    }

    /// The culprit is the user's function: not the native frames on top
    /// (the vDSO's clock, a syscall wrapper), nor Node's own JS under it.
    #[test]
    fn the_culprit_is_the_innermost_user_js_frame() {
        let pick = |stack: Vec<Frame>| {
            let mut f = Folder::default();
            f.add(stack);
            f.finish(1).culprit().map(ToString::to_string)
        };
        let vdso = Frame::native("__vdso_gettimeofday", Some("[vdso]".into()));
        let read = Frame::js("readSync", Some("node:fs:750:3".into()));
        assert_eq!(
            pick(vec![vdso.clone(), js("busyLoop"), js("main"), native("uv_run")]).as_deref(),
            Some("busyLoop (/app/blocker.js:8:1)")
        );
        assert_eq!(
            pick(vec![native("read"), read.clone(), js("readConfig"), native("uv_run")]).as_deref(),
            Some("readConfig (/app/blocker.js:10:1)")
        );
        assert_eq!(pick(vec![native("read"), read]).as_deref(), Some("readSync (node:fs:750:3)"), "only Node's own JS: its innermost");
        assert_eq!(pick(vec![vdso.clone(), native("uv_run")]).as_deref(), Some("uv_run (node)"), "no JS at all: node's own code");
    }

    /// Never a library's leaf, an address or a marker: the stack
    /// (libc's open64 over the text of a path read as a return address)
    /// has no culprit; with its true frames, the user's function.
    #[test]
    fn the_culprit_is_never_a_library_leaf_or_an_address() {
        let pick = |stack: Vec<Frame>| {
            let mut f = Folder::default();
            f.add(stack);
            f.finish(1).culprit().map(ToString::to_string)
        };
        let open64 = Frame::native("open64", Some("libc.so.6".into()));
        let garbage = Frame::native("[unknown]", Some("0x6f6d5f65646f6e2e".into()));
        let truncated = Frame::native(TRUNCATED, None);
        assert_eq!(pick(vec![open64.clone(), garbage.clone()]), None);
        assert_eq!(pick(vec![open64.clone(), truncated.clone()]), None);
        assert_eq!(pick(vec![Frame::native("[unknown]", Some("node+0x1234".into())), truncated.clone()]), None, "an address in node");
        assert_eq!(pick(vec![Frame::native("__vdso_clock_gettime", Some("[vdso]".into()))]), None);
        let read = Frame::js("readFileSync", Some("node:fs:441:22".into()));
        assert_eq!(
            pick(vec![open64.clone(), native("uv_fs_open"), read, js("readAllConfigs"), truncated]).as_deref(),
            Some("readAllConfigs (/app/blocker.js:14:1)")
        );
        let jit = Frame::native("JS:*hotLoop /srv/app.js:3:1", Some("perf-42.map".into()));
        assert_eq!(pick(vec![open64, jit, native("uv_run")]).as_deref(), Some("JS:*hotLoop /srv/app.js:3:1 (perf-42.map)"));
        assert_eq!(
            pick(vec![Frame::native("v8::internal::Heap::Scavenge", Some("libnode.so.109".into()))]).as_deref(),
            Some("v8::internal::Heap::Scavenge (libnode.so.109)")
        );
    }

    #[test]
    fn beyond_the_top_stacks_samples_are_counted() {
        let mut f = Folder::default();
        for i in 0..(TOP_STACKS + 5) {
            f.add(timers_stack(&format!("f{i}")));
        }
        f.add(timers_stack("f0"));
        let b = f.finish(1);
        assert_eq!(b.stacks.len(), TOP_STACKS);
        assert_eq!(b.stacks[0].0[0].function, "f0");
        assert_eq!(b.other_samples, 5);
        assert_eq!(b.stacks.iter().map(|s| s.1).sum::<u64>() + b.other_samples, b.samples);
    }

    #[test]
    fn the_innermost_phase_function_wins() {
        let poll = vec![js("onData"), native("uv__stream_io"), native("uv__io_poll"), native("uv_run")];
        assert_eq!(phase_of(&poll), "poll");
        let check = vec![js("onImmediate"), native("uv__run_check"), native("uv_run")];
        assert_eq!(phase_of(&check), "check");
        // A nested loop inside a timer callback: the inner phase counts.
        let nested = vec![native("uv__io_poll"), native("uv_run"), js("spin"), native("uv__run_timers"), native("uv_run")];
        assert_eq!(phase_of(&nested), "poll");
        let stripped = vec![js("onTimer"), native("node::Environment::RunTimers(uv_timer_s*)"), native("uv_run")];
        assert_eq!(phase_of(&stripped), "timers");
        let inlined = vec![js("onClose"), native("node::HandleWrap::OnClose"), native("uv_run")];
        assert_eq!(phase_of(&inlined), "other");
        assert_eq!(phase_of(&[js("x"), Frame::native("[unknown]", Some("0x1234".into()))]), "unknown");
        // A JS function that happens to be called like a libuv symbol is not a phase.
        assert_eq!(phase_of(&[Frame::js("uv__run_timers", None)]), "unknown");
    }
}
