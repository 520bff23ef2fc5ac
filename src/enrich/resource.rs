//! Resource attributes of a traced process, read from /proc. The parsing
//! pieces are pure functions with their own tests.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

/// The pid of a process in a PID namespace below uvspan's, as uvspan (on a
/// node: the host) sees it; `process.pid` is the one the process sees.
pub const HOST_PID: &str = "uvspan.process.host_pid";

/// What uvspan knows about a traced process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// As uvspan sees it.
    pub pid: u32,
    /// As the process sees itself, when it lives in a PID namespace below
    /// uvspan's (the `process.pid` its own SDK reports).
    pub own_pid: Option<u32>,
    pub ppid: Option<u32>,
    pub exe: String,
    pub argv: Vec<String>,
    pub cgroup: Option<String>,
    /// Every path in /proc/PID/cgroup (v1 hierarchies and v2).
    pub cgroups: Vec<String>,
    /// The target's environment, for the Kubernetes downward API names.
    pub env: Vec<(String, String)>,
    /// The target's own OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
    pub env_service_name: Option<String>,
    pub env_resource_attributes: Vec<(String, String)>,
    pub node_version: Option<String>,
    /// /proc/PID/environ could not be read (no CAP_DAC_READ_SEARCH for
    /// another user's process): its OTEL_* and K8S_* settings are unknown.
    pub environ_denied: bool,
}

/// What /proc says about a process, read once through the procfs crate.
/// Missing pieces (a permission, a process exiting meanwhile) stay empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcFacts {
    pub exe: String,
    pub argv: Vec<String>,
    /// The environment (empty when unreadable).
    pub env: Vec<(String, String)>,
    /// /proc/PID/environ could not be read (no CAP_DAC_READ_SEARCH for
    /// another user's process).
    pub environ_denied: bool,
    /// Every cgroup path of the process, v2 first.
    pub cgroups: Vec<String>,
    pub ppid: Option<u32>,
}

impl ProcFacts {
    /// None when the process is gone (its cgroups cannot be read).
    pub fn read(pid: u32) -> Option<ProcFacts> {
        let p = procfs::process::Process::new(pid as i32).ok()?;
        let cgroups = cgroup_paths(&p.cgroups().ok()?);
        let environ = p.environ();
        let environ_denied = matches!(environ, Err(procfs::ProcError::PermissionDenied(_)));
        let env = environ
            .map(|m| m.into_iter().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())).collect())
            .unwrap_or_default();
        Some(ProcFacts {
            exe: p.exe().map(|e| e.to_string_lossy().trim_end_matches(" (deleted)").to_string()).unwrap_or_default(),
            argv: p.cmdline().unwrap_or_default(),
            env,
            environ_denied,
            cgroups,
            ppid: p.stat().ok().and_then(|s| u32::try_from(s.ppid).ok()),
        })
    }

    /// A variable of the environment.
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl ProcessInfo {
    /// Reads /proc/PID. Missing pieces (a process that just exited, a
    /// permission) are left empty rather than failing.
    pub fn read(pid: u32, node_version: Option<String>) -> ProcessInfo {
        let f = ProcFacts::read(pid).unwrap_or_default();
        let (own_pid, ppid) = crate::discover::pidns::own_ids(pid, f.ppid);
        ProcessInfo {
            pid,
            own_pid,
            ppid,
            exe: f.exe.clone(),
            argv: f.argv.clone(),
            cgroup: cgroup_path(&f.cgroups),
            env_service_name: f.var("OTEL_SERVICE_NAME").filter(|s| !s.is_empty()).map(str::to_string),
            env_resource_attributes: f.var("OTEL_RESOURCE_ATTRIBUTES").map(parse_resource_attributes).unwrap_or_default(),
            node_version,
            environ_denied: f.environ_denied,
            cgroups: f.cgroups,
            env: f.env,
        }
    }

    /// service.name: the flag, else the target's OTEL_SERVICE_NAME, else
    /// derived from its command line.
    pub fn service_name(&self, flag: Option<&str>) -> String {
        flag.map(str::to_string).or_else(|| self.env_service_name.clone()).unwrap_or_else(|| derive_service_name(&self.argv, &self.exe))
    }

    pub fn resource(&self, service_flag: Option<&str>, host: &str) -> Resource {
        let mut attrs: Vec<KeyValue> = self.env_resource_attributes.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect();
        attrs.push(KeyValue::new("service.name", self.service_name(service_flag)));
        attrs.push(KeyValue::new("process.pid", i64::from(self.own_pid.unwrap_or(self.pid))));
        if self.own_pid.is_some() {
            attrs.push(KeyValue::new(HOST_PID, i64::from(self.pid)));
        }
        if let Some(pp) = self.ppid {
            attrs.push(KeyValue::new("process.parent_pid", i64::from(pp)));
        }
        if !self.exe.is_empty() {
            attrs.push(KeyValue::new("process.executable.path", self.exe.clone()));
            let name = self.exe.rsplit('/').next().unwrap_or(&self.exe).to_string();
            attrs.push(KeyValue::new("process.executable.name", name));
        }
        if !self.argv.is_empty() {
            attrs.push(KeyValue::new("process.command_line", self.argv.join(" ")));
        }
        attrs.push(KeyValue::new("process.runtime.name", "nodejs"));
        if let Some(v) = &self.node_version {
            attrs.push(KeyValue::new("process.runtime.version", v.trim_start_matches('v').to_string()));
        }
        attrs.push(KeyValue::new("host.name", host.to_string()));
        if let Some(cg) = &self.cgroup {
            attrs.push(KeyValue::new("process.linux.cgroup", cg.clone()));
        }
        if let Some(id) = self.cgroups.iter().find_map(|p| container_id(p)) {
            attrs.push(KeyValue::new("container.id", id));
        }
        let own: Vec<(String, String)> = std::env::vars().collect();
        let own_cgroups = procfs::process::Process::myself().and_then(|p| p.cgroups()).map(|c| cgroup_paths(&c)).unwrap_or_default();
        let own_pod = own_cgroups.iter().find_map(|p| pod_uid(p));
        for (k, v) in k8s_attributes(&self.cgroups, &self.env, &own, own_pod.as_deref()) {
            attrs.push(KeyValue::new(k, v));
        }
        attrs.push(KeyValue::new("telemetry.sdk.name", "uvspan"));
        attrs.push(KeyValue::new("telemetry.sdk.language", "rust"));
        attrs.push(KeyValue::new("telemetry.sdk.version", env!("CARGO_PKG_VERSION")));
        Resource::builder_empty().with_attributes(attrs).build()
    }
}

/// This host's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Every cgroup path of /proc/PID/cgroup, v2 (hierarchy 0) first.
pub fn cgroup_paths(cgroups: &procfs::ProcessCGroups) -> Vec<String> {
    let mut v: Vec<(bool, String)> = cgroups.0.iter().map(|c| (c.hierarchy != 0, c.pathname.clone())).collect();
    v.sort_by_key(|(v1, _)| *v1);
    let mut out: Vec<String> = Vec::new();
    for (_, p) in v {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The process's cgroup: the v2 path, unless it is the root "/" while a v1
/// hierarchy says more (hybrid hosts), then the first such v1 path.
pub fn cgroup_path(paths: &[String]) -> Option<String> {
    paths.iter().find(|p| p.as_str() != "/").or(paths.first()).cloned()
}

/// Kubernetes attributes: `k8s.pod.uid` from the cgroup path
/// (`kubepods-…-pod<uid>.slice` or `/kubepods/…/pod<uid>/`), and
/// `k8s.pod.name`, `k8s.namespace.name`, `k8s.node.name` from downward-API
/// variables in the target's environment, else in uvspan's own: the pod
/// names only when the target is in uvspan's own pod (a sidecar), the node
/// name always (a DaemonSet shares the node).
pub fn k8s_attributes(
    cgroups: &[String],
    target_env: &[(String, String)],
    own_env: &[(String, String)],
    own_pod_uid: Option<&str>,
) -> Vec<(&'static str, String)> {
    let get = |env: &[(String, String)], keys: &[&str]| {
        keys.iter().find_map(|k| env.iter().find(|(ek, v)| ek == k && !v.is_empty()).map(|(_, v)| v.clone()))
    };
    let mut out = Vec::new();
    let uid = cgroups.iter().find_map(|p| pod_uid(p));
    let same_pod = uid.is_some() && uid.as_deref() == own_pod_uid;
    if let Some(uid) = uid {
        out.push(("k8s.pod.uid", uid));
    }
    let pod_keys: [(&'static str, &[&str]); 2] = [
        ("k8s.pod.name", &["K8S_POD_NAME", "POD_NAME"]),
        ("k8s.namespace.name", &["K8S_NAMESPACE_NAME", "K8S_POD_NAMESPACE", "POD_NAMESPACE"]),
    ];
    for (attr, keys) in pod_keys {
        // uvspan's own pod names only apply to a target in uvspan's own pod (a sidecar's neighbour).
        if let Some(v) = get(target_env, keys).or_else(|| if same_pod { get(own_env, keys) } else { None }) {
            out.push((attr, v));
        }
    }
    if let Some(v) = get(target_env, &["K8S_NODE_NAME", "NODE_NAME"]).or_else(|| get(own_env, &["K8S_NODE_NAME", "NODE_NAME"])) {
        out.push(("k8s.node.name", v));
    }
    out
}

/// The pod UID in a kubelet cgroup path (systemd driver writes it with '_').
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.split('/').find_map(|seg| {
        let seg = seg.strip_suffix(".slice").unwrap_or(seg);
        let idx = seg.rfind("pod")?;
        let uid = seg[idx + 3..].replace('_', "-");
        let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        ok.then_some(uid)
    })
}

/// A container id in a cgroup path: the last 64-hex-digit run in a path
/// segment (docker-<id>.scope, /docker/<id>, cri-containerd-<id>.scope,
/// crio-<id>.scope, libpod-<id>.scope, kubepods .../<id>).
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.split('/').rev().find_map(|seg| {
        let seg = seg.strip_suffix(".scope").unwrap_or(seg);
        let id = seg.rsplit(['-', ':']).next()?;
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
    })
}

/// OTEL_RESOURCE_ATTRIBUTES: "k1=v1,k2=v2", values percent-decoded.
pub fn parse_resource_attributes(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Node options whose value is the next argument.
const OPTS_WITH_VALUE: &[&str] = &[
    "-r",
    "--require",
    "--import",
    "--loader",
    "--experimental-loader",
    "-C",
    "--conditions",
    "--title",
    "--inspect-port",
    "--env-file",
    "--input-type",
    "--stack-size",
    "--max-old-space-size",
];

/// A service name from a command line: the script node runs ("app" for
/// `node --x app.js`, the folder for `.../shop/index.js`), else the
/// executable's name (also for `node -e CODE` / `-p`).
pub fn derive_service_name(argv: &[String], exe: &str) -> String {
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let exe_name = || {
        let b = base(argv.first().map_or(exe, |a| a.as_str()));
        if b.is_empty() {
            "node".to_string()
        } else {
            b
        }
    };
    let mut script = None;
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-e" | "--eval" | "-p" | "--print" => return exe_name(),
            "--" => {
                script = it.next();
                break;
            }
            o if OPTS_WITH_VALUE.contains(&o) => {
                it.next();
            }
            o if o.starts_with('-') => {}
            _ => {
                script = Some(a);
                break;
            }
        }
    }
    let Some(s) = script else { return exe_name() };
    let b = base(s);
    for ext in [".js", ".mjs", ".cjs", ".ts"] {
        if let Some(stem) = b.strip_suffix(ext) {
            if stem == "index" || stem == "main" || stem == "server" {
                // index.js says little; use its folder when there is one.
                let parent = s.rsplit('/').nth(1).filter(|p| !p.is_empty() && *p != ".");
                return parent.map_or(stem.to_string(), str::to_string);
            }
            return stem.to_string();
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc/PID/cgroup text, as procfs parses it.
    fn paths(text: &str) -> Vec<String> {
        use procfs::FromBufRead;
        cgroup_paths(&procfs::ProcessCGroups::from_buf_read(text.as_bytes()).expect("cgroup text"))
    }

    #[test]
    fn container_ids() {
        let id = "a".repeat(64);
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/docker/{id}"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope"),
            format!("/kubepods/besteffort/pod5678/{id}"),
            format!("/system.slice/crio-{id}.scope"),
        ] {
            assert_eq!(container_id(&path).as_deref(), Some(id.as_str()), "{path}");
        }
        assert_eq!(container_id("/user.slice/user-0.slice/session-3.scope"), None);
    }

    #[test]
    fn kubernetes() {
        let uid = "1f2e3d4c-5b6a-7988-a1b2-c3d4e5f6a7b8";
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope",
            uid.replace('-', "_"),
            "a".repeat(64)
        );
        let cgroupfs = format!("/kubepods/besteffort/pod{uid}/{}", "b".repeat(64));
        assert_eq!(pod_uid(&systemd).as_deref(), Some(uid));
        assert_eq!(pod_uid(&cgroupfs).as_deref(), Some(uid));
        assert_eq!(pod_uid("/user.slice"), None);
        let e = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let own = e(&[("K8S_NODE_NAME", "n1"), ("K8S_NAMESPACE_NAME", "shop")]);
        // A sidecar: the target is in uvspan's own pod, uvspan's pod names apply.
        let attrs = k8s_attributes(std::slice::from_ref(&systemd), &e(&[("K8S_POD_NAME", "web-1")]), &own, Some(uid));
        assert_eq!(
            attrs,
            vec![
                ("k8s.pod.uid", uid.to_string()),
                ("k8s.pod.name", "web-1".into()),
                ("k8s.namespace.name", "shop".into()),
                ("k8s.node.name", "n1".into())
            ]
        );
        // A DaemonSet: the target is in another pod; only the node name is shared.
        let attrs = k8s_attributes(&[systemd], &[], &own, Some("00000000-0000-0000-0000-000000000000"));
        assert_eq!(attrs, vec![("k8s.pod.uid", uid.to_string()), ("k8s.node.name", "n1".into())]);
        // Not in a pod at all.
        let attrs = k8s_attributes(&["/user.slice".into()], &[], &e(&[("K8S_POD_NAME", "uvspan-x"), ("K8S_NODE_NAME", "n1")]), None);
        assert_eq!(attrs, vec![("k8s.node.name", "n1".into())]);
    }

    #[test]
    fn cgroup_hybrid_host() {
        let text = "4:memory:/process_api/c57c\n1:cpu:/\n0::/\n";
        assert_eq!(cgroup_path(&paths(text)).as_deref(), Some("/process_api/c57c"));
        assert_eq!(paths(text), vec!["/".to_string(), "/process_api/c57c".into()]);
    }

    #[test]
    fn cgroup_v1_and_v2() {
        assert_eq!(cgroup_path(&paths("0::/user.slice/x.scope\n")).as_deref(), Some("/user.slice/x.scope"));
        assert_eq!(cgroup_path(&paths("12:pids:/docker/abc\n11:cpu:/docker/abc\n")).as_deref(), Some("/docker/abc"));
        assert_eq!(cgroup_path(&paths("")), None);
    }

    #[test]
    fn service_names() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(derive_service_name(&a(&["node", "--inspect", "srv/app.js"]), "/usr/bin/node"), "app");
        assert_eq!(derive_service_name(&a(&["node", "/opt/shop/index.js"]), ""), "shop");
        assert_eq!(derive_service_name(&a(&["node"]), "/usr/bin/node"), "node");
        assert_eq!(derive_service_name(&[], "/usr/bin/node"), "node");
        assert_eq!(derive_service_name(&a(&["node", "-e", "require('fs')"]), ""), "node");
        assert_eq!(derive_service_name(&a(&["/opt/n/bin/node", "-p", "1"]), ""), "node");
        assert_eq!(derive_service_name(&a(&["node", "-r", "dotenv/config", "api.js"]), ""), "api");
        assert_eq!(derive_service_name(&a(&["node", "--", "x.mjs"]), ""), "x");
    }

    #[test]
    fn resource_attribute_env() {
        assert_eq!(
            parse_resource_attributes("deployment.environment=prod, team=a%2Cb,bad,=x"),
            vec![("deployment.environment".into(), "prod".into()), ("team".into(), "a,b".into())]
        );
    }

    #[test]
    fn own_process_facts() {
        let f = ProcFacts::read(std::process::id()).expect("this process");
        assert!(!f.exe.is_empty() && !f.argv.is_empty() && !f.cgroups.is_empty());
        assert_eq!(f.ppid, Some(std::os::unix::process::parent_id()));
        assert!(f.var("PATH").is_some() || std::env::var_os("PATH").is_none());
    }
}
