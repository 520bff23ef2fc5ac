#!/usr/bin/env bash
# Installs what building and testing uvspan needs on a fresh Debian/Ubuntu
# machine (run as root): clang (compiles bpf/), libelf and zlib (libbpf),
# pkg-config, util-linux's setpriv and unshare (the privilege and no-tracefs
# tests), wrk (loads an app in tests/e2e.rs), bpftool (the tests read
# uvspan's kernel maps with it), and
# binutils' strip (the Node build matrix, tests/matrix.rs, strips a copy of node;
# clang pulls binutils in on Debian, but not every clang install does), and
# chromium (tests/run.rs renders the HTML report headless), podman and runc
# (tests/namespaces.rs: real containers), Debian's PostgreSQL, MariaDB and
# redis-server with their clients (tests/db.rs and tests/realcode.rs run
# private instances of each), and Bun from npm (tests/first_contact.rs).
# Idempotent: it installs only what is missing.
#   scripts/setup.sh           build + test machine (also checks node and BTF)
#   scripts/setup.sh --build   build only (the Dockerfile's build stage)
set -euo pipefail
build_only=0
[ "${1:-}" = "--build" ] && build_only=1

need=()
command -v clang >/dev/null || need+=(clang)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v setpriv >/dev/null || need+=(util-linux)
command -v strip >/dev/null || need+=(binutils)
if [ $build_only -eq 0 ]; then
  command -v unshare >/dev/null || need+=(util-linux)
  # tests/e2e.rs loads an app with wrk (--sample-time under a saturated load).
  command -v wrk >/dev/null || need+=(wrk)
  command -v bpftool >/dev/null || need+=(bpftool)
  # tests/run.rs loads uvspan run's HTML report in a real headless browser.
  command -v chromium >/dev/null || need+=(chromium)
  # tests/namespaces.rs runs uvspan's container beside an app's with a real
  # OCI runtime (runc: crun refuses hybrid cgroup hosts).
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  # tests/db.rs: private database and cache servers (tests/common/servers.rs).
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
  command -v psql >/dev/null || need+=(postgresql-client)
  [ -x /usr/sbin/mariadbd ] || command -v mariadbd >/dev/null || need+=(mariadb-server)
  command -v mariadb >/dev/null || need+=(mariadb-client)
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
fi
[ -e /usr/include/libelf.h ] || need+=(libelf-dev)
[ -e /usr/include/zlib.h ] || need+=(zlib1g-dev)
[ -e /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need[*]}; run this script as root (sudo $0)" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
if [ $build_only -eq 1 ]; then
  echo "setup: ok for building (clang $(clang -dumpversion))" >&2
  exit 0
fi
command -v node >/dev/null || { echo "setup: node not found: install Node.js (the demo and tests trace it)" >&2; exit 1; }
[ -e /sys/kernel/btf/vmlinux ] || { echo "setup: this kernel has no BTF (/sys/kernel/btf/vmlinux): uvspan needs it" >&2; exit 1; }
# tests/first_contact.rs: Bun from npm (its platform package ships the
# binary), pinned by tests/fixtures/bun/package-lock.json; its install
# script is not run (the binary is used where the package puts it).
bun_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures/bun"
if [ ! -x "$bun_dir/node_modules/@oven/bun-linux-x64/bin/bun" ] || ! cmp -s "$bun_dir/package-lock.json" "$bun_dir/node_modules/.uvspan-lock"; then
  command -v npm >/dev/null || { echo "setup: npm not found: install it (the tests install Bun with it)" >&2; exit 1; }
  echo "setup: npm ci in tests/fixtures/bun (Bun, for the test of a runtime that is not Node.js)" >&2
  (cd "$bun_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$bun_dir/package-lock.json" "$bun_dir/node_modules/.uvspan-lock"
fi
echo "setup: ok (clang $(clang -dumpversion), node $(node --version), kernel $(uname -r))" >&2
