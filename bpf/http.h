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

#define TP_NAME_LEN 12 /* "traceparent:" */
#define TP_VALUE_LEN 55 /* "00-<32 hex>-<16 hex>-<2 hex>" */
#define CAP_MASK (UVSPAN_HTTP_CAPTURE - 1)

/* Whether a header line at `p` is traceparent's: its first 12 bytes as two
 * words (names are not case sensitive: letters compared with their case
 * bit set, which ':' has too). */
static __always_inline int tp_name_at(const char *d, __u32 p)
{
	if (p > UVSPAN_HTTP_CAPTURE - TP_NAME_LEN)
		return 0;
	__u64 a = 0;
	__u32 b = 0;
	__builtin_memcpy(&a, d + p, 8);
	__builtin_memcpy(&b, d + p + 8, 4);
	return (a | 0x2020202020202020ULL) == 0x7261706563617274ULL /* "tracepar" */ &&
	       (b | 0x20202020U) == 0x3a746e65U /* "ent:" */;
}

/* Whether the header line at p is named `name` (8 + up to 8 bytes, letters
 * compared with their case bit set, which '-' and ':' have too). */
static __always_inline int header_at(const char *d, __u32 p, __u64 a8, __u64 b8, __u64 bmask)
{
	if (p > UVSPAN_HTTP_CAPTURE - 16)
		return 0;
	__u64 a = 0, b = 0;
	__builtin_memcpy(&a, d + p, 8);
	__builtin_memcpy(&b, d + p + 8, 8);
	return (a | 0x2020202020202020ULL) == a8 && ((b | 0x2020202020202020ULL) & bmask) == b8;
}

/* The captured head (the scratch record's data; 0: no scratch), and in *w
 * its 8-byte word at `at`. */
static __always_inline const char *head_word_at(__u32 at, __u64 *w)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		return 0;
	*w = *(const __u64 *)(s->http.data + (at & (UVSPAN_HTTP_CAPTURE - 8)));
	return s->http.data;
}

/* Whether a word holds a '\n' (a line starts in it). */
static __always_inline int has_lf(__u64 w)
{
	__u64 x = w ^ 0x0a0a0a0a0a0a0a0aULL;
	return ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0;
}

/* One scan of a captured head (the scratch record's data, n bytes), a word
 * at a time, a line looked at only where a word holds a '\n'. A request's:
 * its request line's end and (want_tp: for the sampler) where its
 * traceparent's value starts. A response's (whole): its head's end and its
 * Content-Length line. */
struct head_scan {
	__u32 n;
	__u32 first_lf; /* the first '\n' + 1 (0: none) */
	__u32 end;      /* the head's length, its empty line included (0: not within n) */
	__u32 cl_at;    /* where the Content-Length value starts, blanks skipped (0: none) */
	__u32 lines;
	__u32 bad;      /* a head user space would read otherwise: hand it over */
	__u32 whole;    /* a response: its every line, up to its end */
	__u32 want_tp;  /* a request: look for its traceparent */
	__u32 tp;       /* where the traceparent's value starts (0: none) */
	__u32 _pad;
};

/* A request head's scan (http_request), per CPU: in a frame of its
 * own it would count against the 512 bytes of stack the dispatcher's call
 * chains share. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct head_scan);
} head_scan_buf SEC(".maps");

/* A request's header line at q (want_tp): 1 when the scan is over (its
 * traceparent found, or none can fit in what is left). */
static __always_inline int request_line_at(struct head_scan *sc, const char *d, __u32 q)
{
	if (!sc->want_tp || q + TP_NAME_LEN + TP_VALUE_LEN > sc->n)
		return 1;
	if (tp_name_at(d, q)) {
		sc->tp = q + TP_NAME_LEN;
		return 1;
	}
	return 0;
}

/* A response's header line at q: 1 when the scan is over (its head's end,
 * or a head the kernel does not follow). */
static __always_inline int response_line_at(struct head_scan *sc, const char *d, __u32 q)
{
	if (q + 2 > sc->n)
		return 1;
	if (d[q & CAP_MASK] == '\r' && d[(q + 1) & CAP_MASK] == '\n') {
		sc->end = q + 2;
		return 1;
	}
	/* httparse reads 64 headers at the most */
	if (++sc->lines > 64) {
		sc->bad = 1;
		return 1;
	}
	/* "content-length:" */
	if (header_at(d, q, 0x2d746e65746e6f63ULL, 0x003a6874676e656cULL, 0x00FFFFFFFFFFFFFFULL)) {
		if (sc->cl_at)
			sc->bad = 1;
		/* the value, after the blanks before it */
		__u32 v = q + 15;
		for (int k = 0; k < 4; k++) {
			/* the mask stays (clang drops it knowing q's bound; the
			 * verifier does not) */
			barrier_var(v);
			if (d[v & CAP_MASK] == ' ' || d[v & CAP_MASK] == '\t')
				v++;
		}
		sc->cl_at = v;
	}
	/* "transfer-encoding:" (chunked, or not: user space decides) */
	else if (header_at(d, q, 0x726566736e617274ULL, 0x6e69646f636e652dULL, ~0ULL)) {
		sc->bad = 1;
		return 1;
	}
	return 0;
}

/* The header line at q of the captured head: 1 when the scan is over. A
 * global function: the byte loop below reaches it up to 8 times a word,
 * and the verifier walks it once (inline, every path through a word's
 * lines multiplied: ~58,000 instructions processed). */
__attribute__((noinline)) int head_line(struct head_scan *sc, __u32 q)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!sc || !s)
		return 1;
	if (!sc->first_lf)
		sc->first_lf = q;
	const char *d = s->http.data;
	return sc->whole ? response_line_at(sc, d, q) : request_line_at(sc, d, q);
}

/* The captured head's 8-byte word at `at`: 1 when the scan is over. */
static __always_inline long head_word(__u32 at, struct head_scan *sc)
{
	if (at >= sc->n)
		return 1;
	__u64 w = 0;
	if (!head_word_at(at, &w))
		return 1;
	if (!has_lf(w))
		return 0;
	for (int b = 0; b < 8; b++) {
		if ((__u8)(w >> (b * 8)) != '\n')
			continue;
		__u32 q = at + b + 1; /* the next line */
		if (q > sc->n || head_line(sc, q))
			return 1;
	}
	return 0;
}

/* Words a bpf_loop step of the scan looks at: a step's call costs more
 * than a word without a line in it. */
#define HEAD_STEP_WORDS 4

/* bpf_loop callback: the captured head's step i (HEAD_STEP_WORDS words). */
static long head_step(__u32 i, struct head_scan *sc)
{
	for (int k = 0; k < HEAD_STEP_WORDS; k++)
		if (head_word((i * HEAD_STEP_WORDS + k) * 8, sc))
			return 1;
	return 0;
}

/* The scan of the head in the scratch record (sc->n bytes). A global
 * function: the verifier walks the loop once, not once per caller's path
 * to it (inside the request-head probe, ~200,000 instructions processed). */
__attribute__((noinline)) int scan_head(struct head_scan *sc)
{
	if (!sc)
		return 0;
	/* bpf_loop's context is on this function's stack */
	struct head_scan s = *sc;
	bpf_loop(UVSPAN_HTTP_CAPTURE / 8 / HEAD_STEP_WORDS, head_step, &s, 0);
	*sc = s;
	return 0;
}

static __always_inline int hex_digit(__u8 c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* A traceparent value at offset p of the scratch record's data (n bytes),
 * as src/requests/head.rs parses it: 1 with the trace id's 56 low bits and
 * (bit 56) its sampled flag in *out; 0 for a malformed one. A global
 * function: the verifier checks its straight-line parse once. */
__attribute__((noinline)) int tp_value(__u32 p, __u32 n, __u64 *out)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s || !out)
		return 0;
	const char *d = s->http.data;
	for (int k = 0; k < 4; k++)
		if (d[p & CAP_MASK] == ' ' || d[p & CAP_MASK] == '\t')
			p++;
	if (p + TP_VALUE_LEN > n)
		return 0;
	__u64 trace_or = 0, span_or = 0, low = 0;
	__u32 version = 0, flags = 0;
	/* A bounded loop, not unrolled: unrolled, its 55 steps' spills took
	 * 272 bytes of stack in every chain that calls it. */
#pragma clang loop unroll(disable)
	for (int k = 0; k < TP_VALUE_LEN; k++) {
		__u8 c = d[(p + k) & CAP_MASK];
		if (k == 2 || k == 35 || k == 52) {
			if (c != '-')
				return 0;
			continue;
		}
		int v = hex_digit(c);
		if (v < 0)
			return 0;
		if (k < 2)
			version = version << 4 | v;
		else if (k < 35)
			trace_or |= v;
		else if (k < 52)
			span_or |= v;
		else
			flags = flags << 4 | v;
		if (k >= 21 && k < 35)
			low = low << 4 | v;
	}
	if (version == 0xff || !trace_or || !span_or)
		return 0;
	/* Version 00 has exactly four fields. */
	if (version == 0 && p + TP_VALUE_LEN < n && d[(p + TP_VALUE_LEN) & CAP_MASK] == '-')
		return 0;
	*out = low | (__u64)(flags & 1) << 56;
	return 1;
}

/* --publish-trace-context: the trace id of a traceparent value tp_value
 * took (at offset p of the scratch record's data, blanks before it) into
 * v, big-endian. A global function: verified once. */
__attribute__((noinline)) int tp_trace_id(__u32 p, struct trace_ctx_v1 *v)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s || !v)
		return 0;
	const char *d = s->http.data;
	for (int k = 0; k < 4; k++)
		if (d[p & CAP_MASK] == ' ' || d[p & CAP_MASK] == '\t')
			p++;
	for (int k = 0; k < 16; k++) {
		int a = hex_digit(d[(p + 3 + 2 * k) & CAP_MASK]);
		int b = hex_digit(d[(p + 4 + 2 * k) & CAP_MASK]);
		if (a < 0 || b < 0)
			return 0;
		v->trace_id[k] = a << 4 | b;
	}
	return 1;
}

/* A request of a trace that is sampled and came with a valid traceparent
 * (at `tp` in the scratch record, n bytes): its caller's trace id and its
 * SERVER span's id (ctx_ids'), kept for ctx_publish. */
static __always_inline void ctx_parent_of(__u64 cause, __u32 tp, __u32 n)
{
	__u64 v56 = 0;
	if (!tp || (cause & CAUSE_DROP) || !tp_value(tp, n, &v56))
		return;
	struct trace_ctx_v1 v = {};
	ctx_ids(cause, &v);
	if (!tp_trace_id(tp, &v))
		return;
	struct conn_key k = { .pid = bpf_get_current_pid_tgid() >> 32, .ptr = cause };
	bpf_map_update_elem(&ctx_parent, &k, &v, BPF_ANY);
	if (!ctx_parents)
		ctx_parents = 1;
}

/* tp_value's answer: the sampled flag and the trace id's 56 low bits. */
static __always_inline int tp_parse(__u32 p, __u32 n, int *flag, __u64 *low56)
{
	__u64 v = 0;
	if (!tp_value(p, n, &v))
		return 0;
	*flag = (v >> 56) & 1;
	*low56 = v & ((1ULL << 56) - 1);
	return 1;
}

/* Whether the sampler reads an incoming traceparent: parent-based, or a
 * ratio (the incoming trace id's bits decide). */
static __always_inline int ksample_reads_parent(void)
{
	return ksample_parent || (ksample_threshold && ksample_threshold < (1ULL << 56));
}

/* A cause decided by its incoming traceparent: its caller's sampled flag
 * (parent-based), else its trace id's 56 low bits against the threshold. */
static __always_inline __u64 sample_incoming(__u64 cause, int flag, __u64 low56)
{
	cause &= ~(__u64)CAUSE_DROP;
	if (ksample_parent)
		return flag ? cause : cause | CAUSE_DROP;
	return low56 >= ksample_threshold ? cause : cause | CAUSE_DROP;
}

/* A request's cause, decided by the sampler (ksample_requests): by the
 * traceparent of its head (its value at `tp` in the scratch record, n bytes;
 * 0: none), or (none, or a malformed one) the cause's own random bits
 * (sample_root). A global function: verified once. */
__attribute__((noinline)) __u64 sample_request(__u64 cause, __u32 tp, __u32 n)
{
	int flag = 0;
	__u64 low56 = 0;
	if (tp && ksample_reads_parent() && tp_parse(tp, n, &flag, &low56))
		return sample_incoming(cause, flag, low56);
	return sample_root(cause);
}

/* The scratch HTTP record of a call: `total` bytes in it; with `capture`,
 * the first UVSPAN_HTTP_CAPTURE bytes at `data` (of which `avail` are the
 * call's). None: no scratch. */
static __always_inline struct http_event *fill_http(__u32 what, __u64 cause, __u64 conn, __u64 data, __u64 avail,
						   __u64 total, int capture, __u8 tls)
{
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
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
	return e;
}

/* The scratch HTTP record sent, with what was captured only (8-byte
 * aligned). */
static __always_inline __u64 http_record_size(const struct http_event *e)
{
	__u64 n = e->captured;
	if (n > UVSPAN_HTTP_CAPTURE)
		n = UVSPAN_HTTP_CAPTURE;
	return sizeof(*e) - UVSPAN_HTTP_CAPTURE + ((n + 7) & ~7ULL);
}

static __always_inline void send_http(struct http_event *e)
{
	emit(e, http_record_size(e));
}

/* emit_http's arguments (more than a BPF call takes). */
struct http_emit {
	__u64 cause;
	__u64 conn;
	__u64 data;
	__u64 avail;
	__u64 total;
	__u32 what;
	__u8 capture;
	__u8 tls;
	/* a wire record's number on its connection */
	__u16 seq;
	/* the thread's callback number (HTTP_WRITE, HTTP_WIRE_READ) */
	__u32 callback;
	__u32 _pad;
};

/* A global function: verified once (inline, the branches on a write's
 * first bytes in front of it had the verifier walk it ~200 times). */
__attribute__((noinline)) int emit_http_of(const struct http_emit *a)
{
	if (!a)
		return 0;
	struct http_event *e = fill_http(a->what, a->cause, a->conn, a->data, a->avail, a->total, a->capture, a->tls);
	if (e) {
		e->callback = a->callback;
		send_http(e);
	}
	return 0;
}

/* One HTTP record (fill_http), sent. */
static __always_inline void emit_http(__u32 what, __u64 cause, __u64 conn, __u64 data, __u64 avail, __u64 total,
				      int capture, __u8 tls)
{
	struct http_emit a = {
		.cause = cause, .conn = conn, .data = data, .avail = avail, .total = total,
		.what = what, .capture = capture != 0, .tls = tls,
	};
	emit_http_of(&a);
}

/* A stream's cause (stream_cause): written in place where its entry is
 * there, as it is for every request of a keep-alive connection after its
 * first (an LRU map's update takes its locks and lists: dearer than a
 * lookup, twice a request). A global function: verified once (a branch
 * in the dispatcher's paths multiplies what the verifier walks). */
__attribute__((noinline)) int stream_cause_set(__u32 pid, __u64 stream, __u64 cause)
{
	struct conn_key k = { .pid = pid, .ptr = stream };
	struct stream_owner *c = bpf_map_lookup_elem(&stream_cause, &k);
	if (c) {
		c->cause = cause;
	} else {
		struct stream_owner o = { .cause = cause, .pending = 1 };
		bpf_map_update_elem(&stream_cause, &k, &o, BPF_ANY);
	}
	return 0;
}

/* A client connection written under `cause`: its replies are the cause's,
 * but when another cause still waits for one there (a connection shared by
 * requests, its commands pipelined: a database's, a cache's): then no one's
 * (struct stream_owner's `mixed`). A global function: verified once. */
__attribute__((noinline)) int client_write(struct stream_owner *o, __u64 cause)
{
	if (!o)
		return 0;
	if (!o->pending)
		o->mixed = 0;
	else if (o->cause != cause)
		o->mixed = 1;
	o->cause = cause;
	o->pending = 1;
	return 0;
}

/* A server connection `o` writes its request's response: the request has
 * answered (`answered`), once per request. A global function: verified
 * once. */
__attribute__((noinline)) int server_answers(struct stream_owner *o, __u32 pid)
{
	if (!o || o->answer || !o->server)
		return 0;
	o->answer = 1;
	struct conn_key k = { .pid = pid, .ptr = o->server };
	__u8 one = 1;
	bpf_map_update_elem(&answered, &k, &one, BPF_ANY);
	return 0;
}

/* A client connection `o` reads a reply: one read after its writer's
 * request answered is no longer that request's. The writer's callback
 * most likely handed the connection on (a pool gives it to a waiting
 * request when the reply it waited for comes, or opens a new one for it
 * when an idle one closes), and the reply belongs to whoever the hand-off
 * served, which the kernel cannot tell: the read is a task of its own (no
 * parent is better than a wrong one; a call a request makes and does not
 * wait for before answering loses its reply's work the same way). A
 * global function: verified once. */
__attribute__((noinline)) int reply_orphaned(struct stream_owner *o, __u32 pid)
{
	if (!o || !o->pending || o->mixed || is_task(o->cause))
		return 0;
	struct conn_key k = { .pid = pid, .ptr = o->cause };
	if (!bpf_map_lookup_elem(&answered, &k))
		return 0;
	o->mixed = 2;
	return 1;
}

/* A request begins on server connection `stream`: its callbacks and its
 * writes are the request's from now on (see struct stream_owner). A global
 * function: verified once. */
__attribute__((noinline)) int stream_serves(__u32 pid, __u64 stream, __u64 cause)
{
	struct conn_key k = { .pid = pid, .ptr = stream };
	struct stream_owner o = { .cause = cause, .server = cause };
	bpf_map_update_elem(&stream_cause, &k, &o, BPF_ANY);
	return 0;
}

/* A server parser begins a message in the thread's stream callback number
 * `callbacks` (parser_begun, written in place as stream_cause_set): 1 when
 * its last one began in the same callback (this one is pipelined behind
 * it). A global function. */
__attribute__((noinline)) int parser_begins(__u32 pid, __u64 parser, __u64 callbacks)
{
	struct conn_key k = { .pid = pid, .ptr = parser };
	__u64 *begun = bpf_map_lookup_elem(&parser_begun, &k);
	if (!begun) {
		bpf_map_update_elem(&parser_begun, &k, &callbacks, BPF_ANY);
		return 0;
	}
	int pipelined = *begun == callbacks;
	*begun = callbacks;
	return pipelined;
}

#include "http_follow.h"

/* A request's first record, at its head (on `stream`): its cause decided
 * by the sampler; an unsampled one is followed in the kernel instead where
 * it can be (khttp). Returns its cause. */
static __always_inline __u64 http_request(__u32 what, __u64 cause, __u64 stream, __u64 p, __u64 len)
{
	struct http_event *e = fill_http(what, cause, stream, p, len, len, 1, 0);
	if (!e)
		return cause;
	/* One scan of the head: the sampler's traceparent, and the request
	 * line's end for a request the kernel follows. */
	__u32 zero = 0;
	struct head_scan *sc = bpf_map_lookup_elem(&head_scan_buf, &zero);
	if (!sc) {
		send_http(e);
		return cause;
	}
	__builtin_memset(sc, 0, sizeof(*sc));
	sc->n = e->captured;
	sc->want_tp = (ksample_requests && ksample_reads_parent()) || publish_ctx;
	if (sc->want_tp)
		scan_head(sc);
	if (ksample_requests)
		e->cause = cause = sample_request(cause, sc->tp, sc->n);
	if (publish_ctx)
		ctx_parent_of(cause, sc->tp, sc->n);
	int follow = khttp && what == HTTP_REQUEST && dropped(cause);
	if (follow && !sc->want_tp)
		scan_head(sc);
	if (follow && http_follow(cause, stream, sc->n, sc->first_lf)) {
		/* tail exceptions: its head is held, the first of its records */
		if (ktail) {
			peer_of(e, stream);
			tail_hold(e->hdr.pid, cause, http_record_size(e), 0);
		}
		return cause;
	}
	if (what == HTTP_REQUEST)
		peer_of(e, stream);
	send_http(e);
	return cause;
}

/* llhttp__on_message_begin(parser, p, endp): llhttp starts a message at
 * p, once per message, whatever the reads (every official build 18-26 has
 * it in .dynsym). A request line starts a new cause (on keep-alive
 * connections one per request), current before its
 * 'request' handler runs (inside this llhttp_execute), its head sent up;
 * a status line is the response to an outgoing call. The connection's next
 * reads (a body in later packets) belong to the request: it becomes the
 * stream's cause. A request begun in the same stream callback as the
 * parser's last one was pipelined behind it (its peer is its connection's
 * first request's). Not inlined: a stack frame of its own (inlined,
 * dispatch's would pass 512 bytes). */
static __noinline int http_message(struct pt_regs *ctx)
{
	__u64 parser = PT_REGS_PARM1(ctx), p = PT_REGS_PARM2(ctx), endp = PT_REGS_PARM3(ctx);
	char head[8] = {};
	if (endp < p + 5 || endp - p > 0xFFFFFFFF || bpf_probe_read_user(head, sizeof(head), (void *)p))
		return 0;
	__u64 len = endp - p;
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	if (is_response(head)) {
		/* the stream's writer's cause (a request's or a task's call),
		 * restored by uv__stream_io; not again where its read reported it */
		if (p == t->ctx.read_head)
			return 0;
		/* filled and sent here, not through emit_http_of: a frame
		 * fewer in the chains below the dispatcher (512 bytes in all) */
		struct http_event *e = fill_http(HTTP_RESPONSE, fresh_cause(thread_cause(t)), t->ctx.stream, p, len, len, 1, 0);
		if (e)
			send_http(e);
		return 0;
	}
	if (!is_request(head))
		return 0;
	__u32 pid = current_ids() >> 32;
	__u32 what = parser_begins(pid, parser, t->ctx.callbacks) ? HTTP_PIPELINED : HTTP_REQUEST;
	/* the stream's causes, looked up once: its last request's, then this one's */
	struct conn_key sk = { .pid = pid, .ptr = t->ctx.stream };
	struct stream_owner *stream_was = sk.ptr ? bpf_map_lookup_elem(&stream_cause, &sk) : 0;
	if (khttp && stream_was)
		http_next_on(pid, sk.ptr, stream_was->server ? stream_was->server : stream_was->cause, what == HTTP_PIPELINED);
	/* sent first: the sampler decides the request's cause there */
	__u64 cause = http_request(what, new_cause(CAUSE_REQUEST), sk.ptr, p, len);
	cause_put(t, cause);
	if (stream_was) {
		stream_was->cause = cause;
		stream_was->server = cause;
		stream_was->answer = 0;
	} else if (sk.ptr) {
		stream_serves(pid, sk.ptr, cause);
	}
	return 0;
}

/* A client connection's first write (its first 16 bytes, `len` in its
 * first buffer) looks like the start of a database protocol's message:
 * PostgreSQL's startup (or SSL, GSS, cancel request) or a typed message, a
 * MySQL packet (the handshake response, or a command), a Redis command
 * array, a MongoDB message header. User space decides which (db::guess);
 * this keeps every other connection's bytes off the ring buffer. */
static __always_inline int wire_guess(const unsigned char *h, __u64 len)
{
	__u32 be0 = (__u32)h[0] << 24 | (__u32)h[1] << 16 | (__u32)h[2] << 8 | h[3];
	__u32 be1 = (__u32)h[1] << 24 | (__u32)h[2] << 16 | (__u32)h[3] << 8 | h[4];
	__u32 code = (__u32)h[4] << 24 | (__u32)h[5] << 16 | (__u32)h[6] << 8 | h[7];
	if (be0 >= 8 && be0 <= len &&
	    (code == 0x00030000 || code == 80877103 || code == 80877104 || code == 80877102))
		return 1;
	if ((h[0] == 'Q' || h[0] == 'P' || h[0] == 'B' || h[0] == 'E' || h[0] == 'S' || h[0] == 'X' || h[0] == 'p') &&
	    be1 >= 4 && (__u64)be1 + 1 <= len)
		return 1;
	__u32 le3 = h[0] | (__u32)h[1] << 8 | (__u32)h[2] << 16;
	if (le3 && (__u64)le3 + 4 <= len && h[3] <= 1)
		return 1;
	if (h[0] == '*' && h[1] >= '0' && h[1] <= '9')
		return 1;
	__u32 le0 = h[0] | (__u32)h[1] << 8 | (__u32)h[2] << 16 | (__u32)h[3] << 24;
	__u32 op = h[12] | (__u32)h[13] << 8 | (__u32)h[14] << 16 | (__u32)h[15] << 24;
	return le0 >= 21 && le0 <= len && (op == 2013 || op == 2004 || op == 2012);
}

/* One wire record (HTTP_WIRE_WRITE, HTTP_WIRE_READ) of a database
 * connection: up to UVSPAN_HTTP_CAPTURE of its bytes, read at their exact
 * length (a short reply near its buffer's end is still read); the first of
 * a connection carries its peer. A global function: verified once. */
__attribute__((noinline)) int emit_wire(const struct http_emit *a)
{
	if (!a)
		return 0;
	struct http_event *e = fill_http(a->what, a->cause, a->conn, 0, 0, a->total, 0, 0);
	if (!e)
		return 0;
	__u32 n = a->avail > UVSPAN_HTTP_CAPTURE ? UVSPAN_HTTP_CAPTURE : a->avail;
	if (n > UVSPAN_HTTP_CAPTURE)
		n = UVSPAN_HTTP_CAPTURE;
	if (n && !bpf_probe_read_user(e->data, n, (void *)a->data))
		e->captured = n;
	e->stream_id = a->seq;
	e->callback = a->callback;
	if (a->seq == 0)
		peer_of(e, a->conn);
	send_http(e);
	return 0;
}

/* A client connection's write (its entry o; `head`: its first bytes):
 * its protocol decided at the first; a database's every buffer sent up
 * (its parser must see every byte in order, whoever writes them), a
 * record each. Returns 1 when sent (no HTTP record then). A write of more
 * buffers than UVSPAN_WRITE_BUFS loses the rest: the connection's
 * sequence skips one, and user space stops parsing it. */
static __always_inline int wire_write(struct stream_owner *o, __u64 cause, __u64 stream, __u64 bufs, __u32 nbufs,
				      __u64 *first, const char *head, int http, __u32 callback)
{
	if (o->wire == WIRE_UNDECIDED)
		o->wire = !http && wire_guess((const unsigned char *)head, first[1]) ? WIRE_DB : WIRE_OTHER;
	if (o->wire != WIRE_DB)
		return 0;
	struct http_emit a = { .cause = cause, .conn = stream, .what = HTTP_WIRE_WRITE, .callback = callback };
	for (int b = 0; b < UVSPAN_WRITE_BUFS; b++) {
		if (b >= nbufs)
			break;
		__u64 buf[2] = {};
		if (b == 0) {
			buf[0] = first[0];
			buf[1] = first[1];
		} else {
			bpf_probe_read_user(buf, sizeof(buf), (void *)(bufs + b * 16));
		}
		a.data = buf[0];
		a.avail = a.total = buf[1];
		a.seq = o->wire_seq++;
		emit_wire(&a);
	}
	if (nbufs > UVSPAN_WRITE_BUFS)
		o->wire_seq++;
	return 1;
}

/* A read of a database connection (the thread's stream): sent up, under
 * the thread's cause (its operations are their writes'). */
static __always_inline int wire_read(struct thread_state *t, __u64 base, __s64 nread)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = t->ctx.stream };
	struct stream_owner *o = bpf_map_lookup_elem(&stream_cause, &k);
	if (!o || o->server || o->wire == WIRE_OTHER)
		return 0;
	struct http_emit a = {
		.cause = fresh_cause(thread_cause(t)), .conn = k.ptr, .data = base, .avail = nread, .total = nread,
		.what = HTTP_WIRE_READ, .seq = o->wire_seq++, .callback = t->ctx.callbacks,
	};
	emit_wire(&a);
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
	struct stream_owner *c = bpf_map_lookup_elem(&stream_cause, &key);
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	t->ctx.stream = stream;
	t->ctx.callbacks++;
	t->ctx.read_head = 0;
	/* a database's reads; a connection's before its first write, where its
	 * server may speak first (MySQL's greeting) */
	t->ctx.wire = c && !c->server && !c->child &&
		      (c->wire == WIRE_DB || (c->wire == WIRE_UNDECIDED && c->pending));
	/* readable (POLLIN): its writers' replies come (see client_write) */
	if (c && !c->server && (PT_REGS_PARM3(ctx) & 1)) {
		if (reply_orphaned(c, key.pid))
			stat_inc(STAT_AFTER_ANSWER);
		else if (c->mixed == 1)
			stat_inc(STAT_MIXED_READS);
		c->pending = 0;
	}
	__u64 cause = c && !c->mixed ? c->cause : 0;
	cause_put(t, cause ? cause : new_task_cause(CAUSE_IO));
	return 0;
}

/* LibuvStreamWrap::OnUvRead(this, nread, buf): bytes a stream read, inside
 * its uv__stream_io (the thread's stream). A response head is the reply to
 * the call that waits there, whoever parses it: node's llhttp (which then
 * does not report it again) or a client's own (undici's, fetch's, in
 * WebAssembly). Its status line and head, as llhttp__on_message_begin sends
 * them. */
static __always_inline int stream_read(struct pt_regs *ctx)
{
	__s64 nread = (__s64)PT_REGS_PARM2(ctx);
	struct thread_state *t = requests && nread > 0 ? thread_state_of(0) : 0;
	if (!t || !t->ctx.stream)
		return 0;
	__u64 base = 0;
	if (bpf_probe_read_user(&base, sizeof(base), (void *)PT_REGS_PARM3(ctx)))
		return 0;
	if (t->ctx.wire)
		return wire_read(t, base, nread);
	char head[8] = {};
	if (nread < 12 || bpf_probe_read_user(head, sizeof(head), (void *)base) || !is_response(head))
		return 0;
	t->ctx.read_head = base;
	emit_http(HTTP_RESPONSE, fresh_cause(thread_cause(t)), t->ctx.stream, base, nread, nread, 1, 0);
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
	struct thread_state *t = requests ? thread_state_of(0) : 0;
	/* A server connection's write: its request's response, whatever
	 * callback writes it; else the writer's (its replies are its). */
	struct stream_owner *owner = requests ? bpf_map_lookup_elem(&stream_cause, &key) : 0;
	__u64 server = owner ? owner->server : 0;
	__u64 cause = server ? fresh_cause(server) : t ? fresh_cause(thread_cause(t)) : 0;
	if (!cause) {
		if (!server)
			bpf_map_delete_elem(&stream_cause, &key);
		return 0;
	}
	/* (a server connection's causes stay its request's) */
	if (server)
		server_answers(owner, key.pid);
	else if (owner)
		client_write(owner, cause);
	else if (!server)
		stream_cause_set(key.pid, stream, cause);
	/* struct uv_buf_t { char *base; size_t len; } */
	__u64 first[2] = {};
	if (nbufs)
		bpf_probe_read_user(first, sizeof(first), (void *)bufs);
	char head[16] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)first[0]);
	int call = is_request(head);
	/* A client connection's: a database's bytes go up as they are. */
	if (!server && requests) {
		if (!owner)
			owner = bpf_map_lookup_elem(&stream_cause, &key);
		if (owner && !owner->child && wire_write(owner, cause, stream, bufs, nbufs, first, head, call || is_response(head),
						       t ? t->ctx.callbacks : 0))
			return 0;
	}
	/* A task's writes: only its calls (their replies are its), and the
	 * ciphertext of its HTTPS call (its socket) right after its SSL_write. */
	if (is_task(cause) && !call) {
		if (!t || !t->ctx.tls_call)
			return 0;
		t->ctx.tls_call = 0;
	}
	__u64 total = first[1];
	for (int b = 1; b < UVSPAN_WRITE_BUFS; b++) {
		if (b >= nbufs)
			break;
		__u64 buf[2] = {};
		bpf_probe_read_user(buf, sizeof(buf), (void *)(bufs + b * 16));
		total += buf[1];
	}
	if (khttp && dropped(cause) && !is_task(cause) && http_follow_write(cause, stream, first[0], first[1], total, head, call, 0))
		return 0;
	/* Only a head (status line, request line) is worth its bytes. */
	struct http_emit a = {
		.cause = cause, .conn = stream, .data = first[0], .avail = first[1], .total = total,
		.what = HTTP_WRITE, .capture = is_response(head) || call, .callback = t ? t->ctx.callbacks : 0,
	};
	emit_http_of(&a);
	return 0;
}

/* uv_tcp_connect(req, handle, addr, cb): an outgoing connection made under
 * a cause; its connect callback (where Node writes the request) and its
 * replies belong to it. */
static __always_inline int stream_connect(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM2(ctx) };
	/* a new connection: nothing of the stream's memory's last one stays
	 * (a server connection's request, its writers) */
	if (!cause) {
		bpf_map_delete_elem(&stream_cause, &k);
		return 0;
	}
	struct stream_owner o = { .cause = cause, .pending = 1 };
	bpf_map_update_elem(&stream_cause, &k, &o, BPF_ANY);
	return 0;
}

/* SSL_write(ssl, buf, num): the plaintext of a TLS write (the stream then
 * only sees ciphertext). */
static __always_inline int tls_write(struct pt_regs *ctx)
{
	struct thread_state *t = requests ? thread_state_of(0) : 0;
	__u64 cause = t ? fresh_cause(thread_cause(t)) : 0;
	if (!cause)
		return 0;
	__u64 buf = PT_REGS_PARM2(ctx);
	__u64 len = (int)PT_REGS_PARM3(ctx);
	char head[8] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)buf);
	int call = is_request(head);
	/* A task's: only its calls (then their ciphertext, see stream_write). */
	if (is_task(cause)) {
		if (!call)
			return 0;
		t->ctx.tls_call = 1;
	}
	if (khttp && dropped(cause) && !is_task(cause) && http_follow_write(cause, PT_REGS_PARM1(ctx), buf, len, len, head, call, 1))
		return 0;
	emit_http(HTTP_WRITE, cause, PT_REGS_PARM1(ctx), buf, len, len, is_response(head) || call, 1);
	return 0;
}

/* HandleWrap::OnClose(handle): what uvspan kept of the handle goes (a
 * stream's causes). A child process's pipe's close callbacks (where node
 * emits the child's 'close', and execFile calls back) are the cause's that
 * spawned it; any other handle's are a task of their own. Returns that
 * cause, or 0. A global function: verified once. */
__attribute__((noinline)) __u64 handle_closes(__u64 handle)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = handle };
	struct stream_owner *o = bpf_map_lookup_elem(&stream_cause, &k);
	if (!o)
		return 0;
	__u64 cause = o->child ? fresh_cause(o->cause) : 0;
	bpf_map_delete_elem(&stream_cause, &k);
	return cause;
}

/* uv_spawn(loop, process, options): the child's exit callback
 * (ProcessWrap::OnExit) and its pipes' callbacks are the spawning cause's.
 * uv_process_options_t: exit_cb, file, args, env, cwd, flags, stdio_count
 * (at 44), stdio (at 48); uv_stdio_container_t: flags, then the stream (at
 * 8) when UV_CREATE_PIPE (1). */
static __always_inline int spawn(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	__u32 pid = current_ids() >> 32;
	struct conn_key k = { .pid = pid, .ptr = PT_REGS_PARM2(ctx) };
	bpf_map_update_elem(&work_cause, &k, &cause, BPF_ANY);
	__u64 opts = PT_REGS_PARM3(ctx);
	__u64 stdio = 0;
	int count = 0;
	if (!cause || bpf_probe_read_user(&count, sizeof(count), (void *)(opts + 44)) ||
	    bpf_probe_read_user(&stdio, sizeof(stdio), (void *)(opts + 48)))
		return 0;
	for (int i = 0; i < 3; i++) {
		__u64 c[2] = {};
		if (i >= count || bpf_probe_read_user(c, sizeof(c), (void *)(stdio + i * 16)))
			break;
		if (!(c[0] & 1) || !c[1])
			continue;
		struct conn_key pk = { .pid = pid, .ptr = c[1] };
		struct stream_owner o = { .cause = cause, .child = 1 };
		bpf_map_update_elem(&stream_cause, &pk, &o, BPF_ANY);
	}
	return 0;
}

/* ProcessWrap::OnExit(process, status, signal): the child's exit handlers
 * run under the cause that spawned it (a child spawned under none: a task
 * of its own). */
static __always_inline int process_exit(struct pt_regs *ctx)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM1(ctx) };
	__u64 *c = bpf_map_lookup_elem(&work_cause, &k);
	__u64 cause = c ? fresh_cause(*c) : 0;
	if (c)
		bpf_map_delete_elem(&work_cause, &k);
	set_cause(cause ? cause : new_task_cause(CAUSE_IO));
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
	__u64 cause = 0;
	if (cookie & CAUSE_CLOSE_FLAG)
		cause = handle_closes(PT_REGS_PARM1(ctx));
	struct thread_state *t = thread_state_of(1);
	if (t) {
		cause_put(t, cause ? cause : new_task_cause(cookie & CAUSE_KIND_MASK));
		t->ctx.stream = 0;
		t->ctx.callbacks++;
	}
	return 0;
}

#endif /* UVSPAN_HTTP_H */
