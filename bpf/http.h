/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Request context (--requests): where HTTP requests start (a request line
 * at a server parser: a new cause), the responses to outgoing calls, what
 * is written on a cause's behalf, and which cause a stream's callbacks
 * belong to.
 */
#ifndef UVSPAN_HTTP_H
#define UVSPAN_HTTP_H

#include <bpf/bpf_endian.h>
#include "ops.h"

/* The first bytes of an HTTP/1.x request line or status line. */
static __always_inline int is_response(const char *h)
{
	return h[0] == 'H' && h[1] == 'T' && h[2] == 'T' && h[3] == 'P' && h[4] == '/';
}

static __always_inline int is_request(const char *h)
{
	__u32 w = (__u8)h[0] | (__u8)h[1] << 8 | (__u8)h[2] << 16 | (__u32)(__u8)h[3] << 24;
	switch (w) {
	case 0x20544547: /* "GET " */
	case 0x54534f50: /* "POST" */
	case 0x20545550: /* "PUT " */
	case 0x44414548: /* "HEAD" */
	case 0x454c4544: /* "DELE" */
	case 0x43544150: /* "PATC" */
	case 0x4954504f: /* "OPTI" */
	case 0x4e4e4f43: /* "CONN" */
	case 0x43415254: /* "TRAC" */
		return 1;
	}
	return 0;
}

/* The peer and local address of the socket behind a stream's fd. */
static __always_inline void peer_of(struct http_event *e, __u64 stream)
{
	int fd = -1;
	bpf_probe_read_user(&fd, sizeof(fd), (void *)(stream + STREAM_FD_OFF));
	if (fd < 0)
		return;
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	if (!f)
		return;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	if (!sock || BPF_CORE_READ(sock, file) != f)
		return; /* not a socket */
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk)
		return;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family == FAMILY_INET) {
		__u32 a = BPF_CORE_READ(sk, __sk_common.skc_daddr);
		__builtin_memcpy(e->peer_addr, &a, 4);
	} else if (family == FAMILY_INET6) {
		BPF_CORE_READ_INTO(&e->peer_addr, sk, __sk_common.skc_v6_daddr);
	} else {
		return;
	}
	e->family = family;
	e->peer_port = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	e->local_port = BPF_CORE_READ(sk, __sk_common.skc_num);
}

#define HTTP_SHORT_HEAD 256

/* One HTTP record: `total` bytes in the call; with `capture`, the first
 * UVSPAN_HTTP_CAPTURE bytes at `data` (of which `avail` are the call's). */
static __always_inline void emit_http(__u32 what, __u64 cause, __u64 conn, __u64 data, __u64 avail, __u64 total,
				      int capture, __u8 tls)
{
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct http_event *e = &s->http;
	__u64 id = current_ids();
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HTTP_CAPTURE);
	e->hdr.kind = EV_HTTP;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->ts_ns = bpf_ktime_get_ns();
	e->cause = cause;
	e->conn = conn;
	e->what = what;
	e->len = total > 0xFFFFFFFF ? 0xFFFFFFFF : total;
	e->tls = tls;
	/* Fixed-size reads (a short head: 256 bytes) keep the verifier's
	 * bounds simple; `captured` says how much of it is the call's. A read
	 * that fails (the bytes end at a mapping's end) keeps nothing. */
	__u32 n = 0;
	if (capture && avail <= HTTP_SHORT_HEAD) {
		if (!bpf_probe_read_user(e->data, HTTP_SHORT_HEAD, (void *)data))
			n = avail;
	} else if (capture && !bpf_probe_read_user(e->data, UVSPAN_HTTP_CAPTURE, (void *)data)) {
		n = avail < UVSPAN_HTTP_CAPTURE ? avail : UVSPAN_HTTP_CAPTURE;
	}
	e->captured = n;
	if (what == HTTP_REQUEST)
		peer_of(e, conn);
	/* Sent with what was captured only (8-byte aligned). */
	__u64 size = sizeof(*e) - UVSPAN_HTTP_CAPTURE + (((__u64)n + 7) & ~7ULL);
	if (size > sizeof(*e))
		size = sizeof(*e);
	emit(e, size);
}

/* llhttp_execute(parser, data, len): HTTP bytes reach a parser. A request
 * line starts a new cause (the request; on keep-alive connections one per
 * request), its bytes sent up for the method, path and trace context; a
 * status line is the response to an outgoing call; anything else continues
 * the parser's request. The 'request' handler runs inside this call. */
static __always_inline int http_parse(struct pt_regs *ctx)
{
	__u64 parser = PT_REGS_PARM1(ctx), data = PT_REGS_PARM2(ctx), len = PT_REGS_PARM3(ctx);
	/* The probe point is past llhttp_execute's `add %rsi,%rdx` (the first
	 * instruction the kernel can emulate is the jmp after it): the third
	 * register then holds data + len. A length is never a user address. */
	if (len >= data && data > 0xFFFFFFFF)
		len -= data;
	char head[8] = {};
	if (len < 5 || bpf_probe_read_user(head, sizeof(head), (void *)data))
		return 0;
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = parser };
	if (is_response(head)) {
		/* the stream's writer's cause, restored by uv__stream_io */
		__u64 cause = fresh_cause(t->ctx.cause);
		if (is_task(cause))
			return 0;
		emit_http(HTTP_RESPONSE, cause, t->ctx.stream, data, len, len, 1, 0);
		return 0;
	}
	if (is_request(head)) {
		__u64 cause = new_cause(CAUSE_REQUEST);
		bpf_map_update_elem(&parser_cause, &key, &cause, BPF_ANY);
		t->ctx.cause = cause;
		emit_http(HTTP_REQUEST, cause, t->ctx.stream, data, len, len, 1, 0);
		return 0;
	}
	__u64 *c = bpf_map_lookup_elem(&parser_cause, &key);
	if (c)
		t->ctx.cause = *c;
	return 0;
}

/* llhttp__on_message_begin(parser, p, endp): llhttp starts a message at
 * p. A server parser's first message of a request was started by
 * http_parse (its cause in parser_cause); a second one begun under that
 * same cause is a request pipelined behind it in the same bytes: a new
 * cause from here, made current before its handler runs (inside the same
 * llhttp_execute), its head sent up (its peer is its connection's first
 * request's). Client parsers (responses) have no parser_cause: one lookup,
 * nothing else. Not inlined: a stack frame of its own (inlined, dispatch's
 * would pass 512 bytes). */
static __noinline int http_message(struct pt_regs *ctx)
{
	__u64 parser = PT_REGS_PARM1(ctx), p = PT_REGS_PARM2(ctx), endp = PT_REGS_PARM3(ctx);
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = parser };
	__u64 *c = bpf_map_lookup_elem(&parser_cause, &key);
	if (!c)
		return 0;
	__u64 cause = *c;
	__u64 *begun = bpf_map_lookup_elem(&parser_begun, &key);
	if (!begun || *begun != cause) {
		/* the request's own first message */
		bpf_map_update_elem(&parser_begun, &key, &cause, BPF_ANY);
		return 0;
	}
	char head[8] = {};
	if (endp < p + 5 || endp - p > 0xFFFFFFFF || bpf_probe_read_user(head, sizeof(head), (void *)p) || !is_request(head))
		return 0;
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	cause = new_cause(CAUSE_REQUEST);
	bpf_map_update_elem(&parser_cause, &key, &cause, BPF_ANY);
	bpf_map_update_elem(&parser_begun, &key, &cause, BPF_ANY);
	t->ctx.cause = cause;
	emit_http(HTTP_PIPELINED, cause, t->ctx.stream, p, endp - p, endp - p, 1, 0);
	return 0;
}

/* uv__stream_io(loop, w, events): a stream's callback is about to run; it
 * belongs to the cause of the stream's last write, or is a task of its own
 * (an I/O callback no request caused: a request line parsed in it makes the
 * request its cause instead). */
static __always_inline int stream_io(struct pt_regs *ctx)
{
	__u64 stream = PT_REGS_PARM2(ctx) - STREAM_IO_OFF;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = stream };
	__u64 *c = bpf_map_lookup_elem(&stream_cause, &key);
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	t->ctx.stream = stream;
	t->ctx.cause = c ? *c : new_cause(CAUSE_IO);
	return 0;
}

/* uv_try_write(stream, bufs, nbufs) / uv_write2(req, stream, bufs, nbufs,
 * ...): the cookie is the stream's argument index. Written while a cause is
 * current: the stream's replies belong to it, and the bytes (the response's
 * status line, an outgoing request with its traceparent) are sent up. */
static __always_inline int stream_write(struct pt_regs *ctx, __u64 cookie)
{
	struct args args;
	read_args(ctx, &args, 0);
	__u32 i = cookie & 3;
	__u64 stream = args.v[i];
	__u64 bufs = args.v[(i + 1) & 7];
	__u32 nbufs = args.v[(i + 2) & 7];
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = stream };
	__u64 cause = current_cause();
	if (!cause) {
		bpf_map_delete_elem(&stream_cause, &key);
		return 0;
	}
	bpf_map_update_elem(&stream_cause, &key, &cause, BPF_ANY);
	if (is_task(cause))
		return 0;
	/* struct uv_buf_t { char *base; size_t len; } */
	__u64 total = 0, first = 0, first_len = 0;
	for (int b = 0; b < UVSPAN_WRITE_BUFS; b++) {
		if (b >= nbufs)
			break;
		__u64 buf[2] = {};
		bpf_probe_read_user(buf, sizeof(buf), (void *)(bufs + b * 16));
		if (b == 0) {
			first = buf[0];
			first_len = buf[1];
		}
		total += buf[1];
	}
	char head[8] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)first);
	/* Only a head (status line, request line) is worth its bytes. */
	emit_http(HTTP_WRITE, cause, stream, first, first_len, total, is_response(head) || is_request(head), 0);
	return 0;
}

/* uv_tcp_connect(req, handle, addr, cb): an outgoing connection made under
 * a cause; its connect callback (where Node writes the request) and its
 * replies belong to it. */
static __always_inline int stream_connect(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause)
		return 0;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM2(ctx) };
	bpf_map_update_elem(&stream_cause, &key, &cause, BPF_ANY);
	return 0;
}

/* SSL_write(ssl, buf, num): the plaintext of a TLS write (the stream then
 * only sees ciphertext). */
static __always_inline int tls_write(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause || is_task(cause))
		return 0;
	__u64 buf = PT_REGS_PARM2(ctx);
	__u64 len = (int)PT_REGS_PARM3(ctx);
	char head[8] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)buf);
	emit_http(HTTP_WRITE, cause, PT_REGS_PARM1(ctx), buf, len, len, is_response(head) || is_request(head), 1);
	return 0;
}

/* node's timers and immediates run (Environment::RunTimers,
 * CheckImmediate): all due JS timers in one scope, so none of them can be
 * told apart per request. The batch is a task (the cookie: its enum
 * cause_kind); user space sees it only if it does traced work. */
static __always_inline int task_start(struct pt_regs *ctx, __u64 cookie)
{
	if (!requests)
		return 0;
	struct thread_state *t = thread_state_of(1);
	if (t) {
		t->ctx.cause = new_cause(cookie & CAUSE_KIND_MASK);
		t->ctx.stream = 0;
	}
	return 0;
}

#endif /* UVSPAN_HTTP_H */
