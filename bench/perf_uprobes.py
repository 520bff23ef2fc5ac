#!/usr/bin/env python3
"""Plain uprobes, no BPF: a counting perf event on the kernel's uprobe PMU
(perf_event_open; no tracefs) at each point uvspan's plan for a process
uses, for that process only. The kernel traps at each point as it does
under uvspan; nothing else runs at a hit but the event's count.

    uvspan probes --pid PID --json | perf_uprobes.py PID

Prints "attached N" once the events are on, then waits for SIGINT or
SIGTERM and prints "hits TOTAL" (what the counters saw) before it exits.
"""
import ctypes
import json
import os
import signal
import struct
import sys


class Attr(ctypes.Structure):
    """struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1)."""
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # uprobe_path
        ("config2", ctypes.c_uint64),  # probe_offset
    ]


SYS_PERF_EVENT_OPEN = 298  # x86-64


def main():
    pid = int(sys.argv[1])
    plan = json.load(sys.stdin)
    with open("/sys/bus/event_source/devices/uprobe/type") as f:
        pmu = int(f.read())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fds, paths = [], []
    for p in plan["probes"]:
        if p.get("status") != "usable" or p.get("offset") is None:
            continue
        path = ctypes.create_string_buffer(p["path"].encode())
        paths.append(path)  # alive while the event is opened
        a = Attr(type=pmu, size=ctypes.sizeof(Attr), config1=ctypes.addressof(path), config2=p["offset"])
        fd = libc.syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(a), pid, -1, -1, 0)
        if fd < 0:
            err = ctypes.get_errno()
            sys.exit(f"perf_uprobes: perf_event_open {p['symbol']} at {p['offset']:#x}: {os.strerror(err)}")
        fds.append(fd)
    if not fds:
        sys.exit("perf_uprobes: the plan has no usable probe point")
    print(f"attached {len(fds)}", flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    total = sum(struct.unpack("Q", os.read(fd, 8))[0] for fd in fds)
    print(f"hits {total}", flush=True)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    main()
