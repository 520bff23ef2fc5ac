//! Database and cache servers of a test's own: Debian's PostgreSQL, MariaDB
//! and redis-server (installed by `scripts/setup.sh`), each a private
//! instance in a temp dir on a free loopback port, run as `nobody` (the
//! servers refuse root or should not have it). Dropping the handle stops the
//! server and removes its files.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::runner::{on_path, setpriv, TempDir};

/// How long a server may take to start (PostgreSQL's initdb and MariaDB's
/// install-db included) before the test fails.
pub const SERVER_START: Duration = Duration::from_secs(60);

/// The user and password of the test servers (PostgreSQL with password
/// authentication, MariaDB).
pub const DB_USER: &str = "uvspan";
pub const DB_PASSWORD: &str = "uvspan-secret";
/// The database the test servers create for [`DB_USER`].
pub const DB_NAME: &str = "uvspan";

/// The unprivileged user the servers run as.
const SERVER_UID: u32 = 65534;
const SERVER_GID: u32 = 65534;

/// PostgreSQL's binaries (Debian keeps them out of PATH).
const PG_BIN: &str = "/usr/lib/postgresql";

/// PostgreSQL's authentication of TCP clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgAuth {
    /// SCRAM-SHA-256 with [`DB_USER`]/[`DB_PASSWORD`].
    Scram,
    /// No password asked.
    Trust,
}

/// A running server of the test's own; Drop stops it.
pub struct DbServer {
    /// `postgresql`, `mariadb` or `redis`.
    pub kind: &'static str,
    pub port: u16,
    child: Child,
    log: PathBuf,
    // Last: removed after the server stopped.
    dir: TempDir,
}

impl DbServer {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's own log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A PostgreSQL connection URL for [`DB_USER`] on [`DB_NAME`].
    pub fn pg_url(&self) -> String {
        format!("postgresql://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{}/{DB_NAME}", self.port)
    }
}

impl Drop for DbServer {
    fn drop(&mut self) {
        // SIGTERM: each server shuts down cleanly on it (PostgreSQL's smart
        // shutdown waits for clients: SIGINT is its fast one).
        let sig = if self.kind == "postgresql" { libc::SIGINT } else { libc::SIGTERM };
        // SAFETY: kill(2) on the process group we created for this child.
        unsafe { libc::kill(-(self.child.id() as i32), sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above; it did not stop in time.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 for a free port");
    l.local_addr().expect("local addr").port()
}

fn require(bin: &str, what: &str) -> String {
    let found = if bin.starts_with('/') { Path::new(bin).is_file() } else { on_path(bin) };
    assert!(found, "{bin} not found: this test runs a private {what}; install it with scripts/setup.sh (as root)");
    bin.to_string()
}

/// PostgreSQL's newest installed major version's bin directory.
fn pg_bin() -> PathBuf {
    let mut versions: Vec<u32> =
        std::fs::read_dir(PG_BIN).map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()).unwrap_or_default();
    versions.sort_unstable();
    let v = versions.last().unwrap_or_else(|| {
        panic!("no PostgreSQL under {PG_BIN}: this test runs a private PostgreSQL; install it with scripts/setup.sh (as root)")
    });
    Path::new(PG_BIN).join(v.to_string()).join("bin")
}

/// A directory the server's user owns, in the test's temp dir.
fn owned_dir(dir: &TempDir, name: &str) -> PathBuf {
    // The temp dir itself: the server's user must get through it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    let p = dir.path().join(name);
    std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
    std::os::unix::fs::chown(&p, Some(SERVER_UID), Some(SERVER_GID)).unwrap_or_else(|e| panic!("cannot chown {}: {e}", p.display()));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).expect("chmod server dir");
    p
}

/// `bin args…` as the servers' unprivileged user.
fn as_server_user(bin: &str, args: &[&str]) -> Command {
    let mut c = Command::new(setpriv());
    c.args(["--reuid", &SERVER_UID.to_string(), "--regid", &SERVER_GID.to_string(), "--clear-groups", "--"]);
    c.arg(bin).args(args);
    c.env("HOME", "/tmp").env_remove("PGPASSWORD");
    c
}

/// Runs a set-up step to completion; fails the test with its output if it
/// fails.
fn step(mut c: Command, what: &str) {
    let out = c.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `c` (stdout and stderr into `log`) in its own process group.
fn spawn(mut c: Command, log: &Path, what: &str) -> Child {
    let f = std::fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
    let f2 = f.try_clone().expect("clone log file");
    c.stdin(Stdio::null()).stdout(f).stderr(f2).process_group(0);
    c.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
}

/// Waits until `ready` holds (the server answers) before [`SERVER_START`];
/// fails in one line with the server's last log line if it exits or the
/// deadline passes.
fn wait_ready(server: &mut DbServer, mut ready: impl FnMut(&DbServer) -> bool) {
    let deadline = Instant::now() + SERVER_START;
    loop {
        if TcpStream::connect_timeout(&server.addr(), Duration::from_millis(200)).is_ok() && ready(server) {
            return;
        }
        let last = |s: &DbServer| s.log().lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(empty log)").to_string();
        if let Ok(Some(st)) = server.child.try_wait() {
            panic!(
                "{} on port {} exited ({st}) before answering: {} (log {})",
                server.kind,
                server.port,
                last(server),
                server.log.display()
            );
        }
        if Instant::now() > deadline {
            panic!("{} on port {} did not answer within {SERVER_START:?}: {}", server.kind, server.port, last(server));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A private PostgreSQL with [`DB_USER`] (superuser, password
/// [`DB_PASSWORD`]) and its database [`DB_NAME`], TCP clients authenticated
/// by `auth`.
pub fn postgres(auth: PgAuth) -> DbServer {
    let bin = pg_bin();
    let (initdb, postgres) = (bin.join("initdb"), bin.join("postgres"));
    let (initdb, postgres) = (require(&initdb.to_string_lossy(), "PostgreSQL"), require(&postgres.to_string_lossy(), "PostgreSQL"));
    let dir = TempDir::new("postgres");
    let data = owned_dir(&dir, "data");
    let sock = owned_dir(&dir, "sock");
    let pwfile = data.join("pw");
    std::fs::write(&pwfile, DB_PASSWORD).expect("write pwfile");
    std::os::unix::fs::chown(&pwfile, Some(SERVER_UID), Some(SERVER_GID)).expect("chown pwfile");
    let method = match auth {
        PgAuth::Scram => "scram-sha-256",
        PgAuth::Trust => "trust",
    };
    let pgdata = data.join("pg");
    let (pgdata_s, pwfile_s) = (pgdata.to_string_lossy().into_owned(), format!("--pwfile={}", pwfile.display()));
    let auth_arg = format!("--auth={method}");
    step(
        as_server_user(&initdb, &["-D", &pgdata_s, "-U", DB_USER, &pwfile_s, &auth_arg, "--no-sync", "--encoding=UTF8", "--locale=C"]),
        "PostgreSQL's initdb",
    );
    let port = free_port();
    let log = dir.path().join("server.log");
    let port_s = port.to_string();
    let sock_s = sock.to_string_lossy().into_owned();
    let c = as_server_user(
        &postgres,
        &[
            "-D",
            &pgdata_s,
            "-p",
            &port_s,
            "-k",
            &sock_s,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "password_encryption=scram-sha-256",
        ],
    );
    let child = spawn(c, &log, "postgres");
    let mut server = DbServer { kind: "postgresql", port, child, log, dir };
    wait_ready(&mut server, |s| {
        let mut c = Command::new(require("psql", "PostgreSQL client"));
        c.args(["-X", "-q", "-w", "-d", &format!("postgresql://{DB_USER}@127.0.0.1:{}/postgres", s.port), "-c", "SELECT 1"]);
        c.env("PGPASSWORD", DB_PASSWORD).env("PGCONNECT_TIMEOUT", "2");
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|st| st.success())
    });
    let out = psql(&server, "postgres", &format!("CREATE DATABASE {DB_NAME}"));
    assert!(out.is_ok(), "cannot create PostgreSQL database {DB_NAME}: {}", out.unwrap_err());
    server
}

/// Runs `sql` through `psql` as [`DB_USER`] on `db` of `server`; its
/// unaligned, tuples-only output, or psql's error.
pub fn psql(server: &DbServer, db: &str, sql: &str) -> Result<String, String> {
    let mut c = Command::new(require("psql", "PostgreSQL client"));
    c.args(["-X", "-q", "-w", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    c.args(["-d", &format!("postgresql://{DB_USER}@127.0.0.1:{}/{db}", server.port), "-c", sql]);
    c.env("PGPASSWORD", DB_PASSWORD);
    output(c, "psql")
}

fn output(mut c: Command, what: &str) -> Result<String, String> {
    let out = c.stdin(Stdio::null()).output().map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    } else {
        Err(format!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim_end()))
    }
}

/// A private MariaDB with [`DB_USER`]/[`DB_PASSWORD`] (all privileges, from
/// any host) and its database [`DB_NAME`].
pub fn mariadb() -> DbServer {
    let install = require("mariadb-install-db", "MariaDB");
    let mariadbd =
        if Path::new("/usr/sbin/mariadbd").is_file() { "/usr/sbin/mariadbd".to_string() } else { require("mariadbd", "MariaDB") };
    let dir = TempDir::new("mariadb");
    let data = owned_dir(&dir, "data");
    let run = owned_dir(&dir, "run");
    let datadir = data.join("db").to_string_lossy().into_owned();
    // Its own temporary directory: two installs at once in the shared /tmp
    // can trip over each other's temporary tables.
    let tmpdir = format!("--tmpdir={}", run.display());
    step(
        as_server_user(
            &install,
            &["--no-defaults", &format!("--datadir={datadir}"), &tmpdir, "--auth-root-authentication-method=socket", "--skip-test-db"],
        ),
        "mariadb-install-db",
    );
    let init = run.join("init.sql");
    let mut sql = format!("CREATE DATABASE IF NOT EXISTS {DB_NAME};\n");
    for host in ["%", "localhost", "127.0.0.1"] {
        sql.push_str(&format!(
            "CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{DB_PASSWORD}';\nGRANT ALL ON *.* TO '{DB_USER}'@'{host}';\n"
        ));
    }
    std::fs::write(&init, sql).expect("write init.sql");
    std::os::unix::fs::chown(&init, Some(SERVER_UID), Some(SERVER_GID)).expect("chown init.sql");
    let port = free_port();
    let log = dir.path().join("server.log");
    let args = [
        "--no-defaults".to_string(),
        format!("--datadir={datadir}"),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".to_string(),
        format!("--socket={}", run.join("sock").display()),
        format!("--pid-file={}", run.join("pid").display()),
        format!("--tmpdir={}", run.display()),
        format!("--init-file={}", init.display()),
        "--skip-name-resolve".to_string(),
        "--skip-log-bin".to_string(),
        "--innodb-buffer-pool-size=32M".to_string(),
        "--innodb-log-file-size=8M".to_string(),
        "--innodb-flush-log-at-trx-commit=0".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = spawn(as_server_user(&mariadbd, &args), &log, "mariadbd");
    let mut server = DbServer { kind: "mariadb", port, child, log, dir };
    wait_ready(&mut server, |s| mariadb_sql(s, "SELECT 1").is_ok());
    server
}

/// Runs `sql` through the `mariadb` client as [`DB_USER`] on [`DB_NAME`];
/// its tab-separated output without column names, or the client's error.
pub fn mariadb_sql(server: &DbServer, sql: &str) -> Result<String, String> {
    let mut c = Command::new(require("mariadb", "MariaDB client"));
    c.args(["--no-defaults", "-h", "127.0.0.1", "-P", &server.port.to_string(), "-u", DB_USER, "-N", "-B"]);
    c.arg(format!("-p{DB_PASSWORD}")).args(["--connect-timeout=2", DB_NAME, "-e", sql]);
    output(c, "mariadb")
}

/// A private redis-server (no persistence, no password).
pub fn redis() -> DbServer {
    let bin = require("redis-server", "redis-server");
    let dir = TempDir::new("redis");
    let data = owned_dir(&dir, "data");
    let port = free_port();
    let log = dir.path().join("server.log");
    let (port_s, data_s) = (port.to_string(), data.to_string_lossy().into_owned());
    let c = as_server_user(
        &bin,
        &["--port", &port_s, "--bind", "127.0.0.1", "--dir", &data_s, "--save", "", "--appendonly", "no", "--daemonize", "no"],
    );
    let child = spawn(c, &log, "redis-server");
    let mut server = DbServer { kind: "redis", port, child, log, dir };
    wait_ready(&mut server, |s| redis_cli(s, &["PING"]).is_ok_and(|o| o == "PONG"));
    server
}

/// Runs one command through `redis-cli`; its output or the client's error.
pub fn redis_cli(server: &DbServer, args: &[&str]) -> Result<String, String> {
    let mut c = Command::new(require("redis-cli", "redis-server's client (redis-tools)"));
    c.args(["-h", "127.0.0.1", "-p", &server.port.to_string()]).args(args);
    output(c, "redis-cli")
}
