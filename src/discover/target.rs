//! What to trace: running processes given by PID, or a command uvspan
//! starts itself, held before exec until its probes are attached.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc;

use anyhow::{anyhow, bail, Context, Result};

use crate::symbols::{self, Images};

/// A user-facing error with its own exit code (127: command not found).
#[derive(Debug)]
pub struct ExitCodeError {
    pub code: i32,
    pub msg: String,
}

impl std::fmt::Display for ExitCodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}
impl std::error::Error for ExitCodeError {}

/// Checks that `pid` is a live process and finds its libuv.
pub fn check_pid(pid: u32) -> Result<Images> {
    let proc = procfs::process::Process::new(pid as i32).ok().filter(|_| pid != 0);
    let Some(proc) = proc else {
        bail!("no process with PID {pid}: check the PID (ps -C node -o pid,args)");
    };
    if proc.stat().is_ok_and(|s| s.state == 'Z') {
        bail!("process {pid} has already exited (zombie)");
    }
    symbols::images(pid).map_err(|e| anyhow!("cannot trace process {pid}: {e:#}"))
}

/// Finds `prog` like execvp would: as given when it holds a '/', else on PATH.
pub fn resolve_program(prog: &str, path_var: Option<&str>) -> Option<PathBuf> {
    let is_exec = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    };
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return is_exec(&p).then_some(p);
    }
    path_var
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(prog))
        .find(|p| is_exec(p))
}

/// The interpreter of a `#!` script: (program, first argument).
pub fn shebang(head: &[u8]) -> Option<(String, Option<String>)> {
    let line = head.strip_prefix(b"#!")?;
    let end = line.iter().position(|&c| c == b'\n').unwrap_or(line.len());
    let text = String::from_utf8_lossy(&line[..end]).trim().to_string();
    let mut parts = text.split_whitespace();
    let prog = parts.next()?.to_string();
    Some((prog, parts.find(|a| !a.starts_with('-')).map(str::to_string)))
}

/// The Node.js binary a command runs, and what the command is when it is
/// not Node.js itself.
pub struct CommandNode {
    pub images: Images,
    /// The node executable the probes are for (a node process under the
    /// command runs this file).
    pub node_exe: PathBuf,
    /// Why the command's own program is not Node.js ("/usr/bin/python3 is
    /// not Node.js: no libuv in it"), when it is not: only the Node.js
    /// processes it starts are traced.
    pub not_node: Option<String>,
}

/// The Node.js binary a command will run: the command itself, the
/// interpreter of a node script, or else `node` on PATH (for wrappers such as
/// `npm` or `sh -c "node …"`, whose node children are followed).
pub fn node_binary_for(argv0: &str) -> Result<CommandNode> {
    let path_var = std::env::var("PATH").ok();
    let prog = resolve_program(argv0, path_var.as_deref())
        .ok_or_else(|| ExitCodeError { code: 127, msg: format!("command not found: {argv0} (not an executable file, and not on PATH)") })?;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(&prog).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    let head = &head[..n];
    // The program that runs first: the command, or its script's interpreter.
    let first = if head.starts_with(b"\x7fELF") {
        Some(prog.clone())
    } else if let Some((interp, arg)) = shebang(head) {
        if interp.ends_with("/env") {
            arg.and_then(|a| resolve_program(&a, path_var.as_deref()))
        } else {
            Some(PathBuf::from(interp))
        }
    } else {
        None
    };
    let script = |what: String| if first.as_ref() == Some(&prog) { what } else { format!("{} is a script; {what}", prog.display()) };
    let not_node = match first.as_ref().map(|f| (f, symbols::locate_file(f))) {
        Some((f, Ok(libuv))) => {
            return Ok(CommandNode { images: Images::new(libuv, symbols::system_libc()), node_exe: f.clone(), not_node: None })
        }
        Some((_, Err(e))) if format!("{e}").contains(", not Node.js (") => script(format!("{e}")),
        Some((f, Err(_))) => script(format!("{} is not Node.js (no libuv in it)", f.display())),
        None => format!("{} is not Node.js (not an ELF executable, and not a script with a #! line)", prog.display()),
    };
    if let Some(node) = resolve_program("node", path_var.as_deref()) {
        if let Ok(libuv) = symbols::locate_file(&node) {
            return Ok(CommandNode { images: Images::new(libuv, symbols::system_libc()), node_exe: node, not_node: Some(not_node) });
        }
    }
    bail!("{not_node}: uvspan cannot trace it, and no node with libuv is on PATH for the Node.js processes it may start")
}

/// A command started by uvspan, stopped before exec until [`Spawned::release`].
pub struct Spawned {
    pub pid: u32,
    go: OwnedFd,
    pub status: mpsc::Receiver<std::io::Result<ExitStatus>>,
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array we own; on success we take
    // ownership of both exactly once.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both fds were just created by pipe2 and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks the command; the child reports its PID and waits for the go signal
/// before exec, so probes are live before any of its code runs.
/// `on_exit` runs (on another thread) once the command has exited.
pub fn spawn_held(argv: &[String], on_exit: impl FnOnce() + Send + 'static) -> Result<Spawned> {
    let (pid_r, pid_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let (pid_w_fd, go_r_fd) = (pid_w.as_raw_fd(), go_r.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (getpid, write, read) on fds it inherited.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid();
            let b = pid.to_ne_bytes();
            libc::write(pid_w_fd, b.as_ptr().cast(), b.len());
            let mut go = [0u8; 1];
            if libc::read(go_r_fd, go.as_mut_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::other("uvspan went away before the command could start"));
            }
            Ok(())
        });
    }
    let (status_tx, status_rx) = mpsc::channel();
    let name = argv[0].clone();
    std::thread::Builder::new()
        .name("uvspan-child".into())
        .spawn(move || {
            // spawn() returns once the child has exec'd, i.e. after release().
            let r = cmd.spawn().and_then(|mut c| c.wait());
            let _ = status_tx.send(r);
            drop((pid_w, go_r));
            on_exit();
        })
        .with_context(|| format!("cannot start {name}"))?;
    let mut b = [0u8; 4];
    let mut f = std::fs::File::from(pid_r);
    if f.read_exact(&mut b).is_err() {
        let err = status_rx.recv().ok().and_then(|r| r.err());
        bail!("cannot start {name}: {}", err.map_or("fork failed".into(), |e| e.to_string()));
    }
    Ok(Spawned { pid: i32::from_ne_bytes(b) as u32, go: go_w, status: status_rx })
}

impl Spawned {
    /// Lets the held child exec.
    pub fn release(&self) -> Result<()> {
        let mut f = std::fs::File::from(self.go.try_clone()?);
        std::io::Write::write_all(&mut f, &[1]).context("cannot release the command")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebangs() {
        assert_eq!(shebang(b"#!/usr/bin/env node\nx"), Some(("/usr/bin/env".into(), Some("node".into()))));
        assert_eq!(shebang(b"#!/usr/bin/env -S node --x\n"), Some(("/usr/bin/env".into(), Some("node".into()))));
        assert_eq!(shebang(b"#!/opt/node/bin/node"), Some(("/opt/node/bin/node".into(), None)));
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    #[test]
    fn resolves_on_path() {
        assert_eq!(resolve_program("sh", Some("/nonexistent:/bin")), Some(PathBuf::from("/bin/sh")));
        assert_eq!(resolve_program("definitely-not-a-command-xyz", Some("/bin")), None);
        assert_eq!(resolve_program("/bin/sh", None), Some(PathBuf::from("/bin/sh")));
    }
}
