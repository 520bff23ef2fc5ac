/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Unsampled HTTP/1 requests followed in the kernel (khttp): a request the
 * sampler drops at its head sends no record; its method and version are
 * read from its head, its status and length from its response's head, and
 * its writes are counted until the response is whole. Then its duration
 * goes to op_hist (HIST_HTTP: http.server.request.duration) and the
 * request is done. What the kernel cannot follow exactly as user space
 * does (src/requests/tracker.rs) is handed to user space before any of its
 * response is taken: a request line longer than the capture, a response
 * without Content-Length or chunked, an outgoing call, a request pipelined
 * behind it. Handing over sends the request's head record as it would have
 * been sent (its start, its connection, its method and version), and from
 * then on its records are sent as before.
 */
#ifndef UVSPAN_HTTP_FOLLOW_H
#define UVSPAN_HTTP_FOLLOW_H

/* The method of a request line (its first 8 bytes), enum http_method; -1
 * when the word does not end where a method does. */
static __always_inline int method_of(const char *h)
{
	__u32 w = (__u8)h[0] | (__u8)h[1] << 8 | (__u8)h[2] << 16 | (__u32)(__u8)h[3] << 24;
	switch (w) {
	case 0x20544547: /* "GET " */
		return METHOD_GET;
	case 0x54534f50: /* "POST" */
		return h[4] == ' ' ? METHOD_POST : -1;
	case 0x20545550: /* "PUT " */
		return METHOD_PUT;
	case 0x44414548: /* "HEAD" */
		return h[4] == ' ' ? METHOD_HEAD : -1;
	case 0x454c4544: /* "DELE" */
		return h[4] == 'T' && h[5] == 'E' && h[6] == ' ' ? METHOD_DELETE : -1;
	case 0x43544150: /* "PATC" */
		return h[4] == 'H' && h[5] == ' ' ? METHOD_PATCH : -1;
	case 0x4954504f: /* "OPTI" */
		return h[4] == 'O' && h[5] == 'N' && h[6] == 'S' && h[7] == ' ' ? METHOD_OPTIONS : -1;
	case 0x4e4e4f43: /* "CONN" */
		return h[4] == 'E' && h[5] == 'C' && h[6] == 'T' && h[7] == ' ' ? METHOD_CONNECT : -1;
	case 0x43415254: /* "TRAC" */
		return h[4] == 'E' && h[5] == ' ' ? METHOD_TRACE : -1;
	}
	return -1;
}

/* The request in the scratch record (its process, its start; n bytes
 * captured, its request line ending at first_lf: scan_head) followed from
 * now: 1 when it is (its method, and its version at the request line's
 * end, read as user space reads them); 0: send it as before. A global
 * function: verified once. */
__attribute__((noinline)) int http_follow(__u64 cause, __u64 stream, __u32 n, __u32 first_lf)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s || !stream || n > UVSPAN_HTTP_CAPTURE)
		return 0;
	__u32 pid = s->http.hdr.pid;
	__u64 start_ns = s->http.ts_ns;
	const char *d = s->http.data;
	int m = method_of(d);
	if (m < 0)
		return 0;
	/* "... HTTP/1.x\r\n" */
	__u32 p = first_lf;
	if (p < 16 || p > UVSPAN_HTTP_CAPTURE)
		return 0;
	char v[10] = {};
	for (int k = 0; k < 10; k++)
		v[k] = d[(p - 11 + k) & CAP_MASK];
	if (v[0] != ' ' || v[1] != 'H' || v[2] != 'T' || v[3] != 'T' || v[4] != 'P' || v[5] != '/' || v[6] != '1' ||
	    v[7] != '.' || (v[8] != '0' && v[8] != '1') || v[9] != '\r')
		return 0;
	struct http_req r = {
		.start_ns = start_ns,
		.last_ns = start_ns,
		.stream = stream,
		.method = m,
		.ver = v[8] - '0',
	};
	struct conn_key k = { .pid = pid, .ptr = cause };
	return !bpf_map_update_elem(&http_reqs, &k, &r, BPF_NOEXIST);
}

/* A status code's three digits at d (an HTTP/1 status line's, an HTTP/2
 * :status value): the status, -1 if they are not digits. */
static __always_inline int status_digits(const char *d)
{
	int status = 0;
	for (int k = 0; k < 3; k++) {
		if (d[k] < '0' || d[k] > '9')
			return -1;
		status = status * 10 + (d[k] - '0');
	}
	return status;
}

/* An HTTP server request's attributes as op_hist_count's `what`: its
 * version (HTTP/1's minor, or 2), method and whether over TLS. */
static __always_inline __u32 http_hist_what(__u8 ver, __u8 method, __u8 tls)
{
	return (__u32)ver << 24 | HIST_HTTP << 16 | (__u32)method << 8 | (tls & 1);
}

/* The response head in the scratch record (n bytes captured): its status,
 * with *expect its whole length (head and Content-Length); 0 when the
 * kernel cannot tell its end as user space does. A global function. */
__attribute__((noinline)) int http_response(__u32 n, __u64 *expect)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s || !expect || n < 16 || n > UVSPAN_HTTP_CAPTURE)
		return 0;
	const char *d = s->http.data;
	/* "HTTP/1.x ddd " */
	if (d[5] != '1' || d[6] != '.' || d[7] < '0' || d[7] > '9' || d[8] != ' ')
		return 0;
	int status = status_digits(d + 9);
	if ((d[12] != ' ' && d[12] != '\r') || status < 100)
		return 0;
	struct head_scan sc = { .n = n, .whole = 1 };
	scan_head(&sc);
	if (sc.bad || !sc.end || !sc.cl_at)
		return 0;
	__u32 p = sc.cl_at; /* its blanks skipped (head_line) */
	__u64 len = 0;
	for (int k = 0; k < 20; k++) {
		if (p + k >= n)
			return 0;
		char c = d[(p + k) & CAP_MASK];
		if (c == '\r') {
			if (!k)
				return 0;
			*expect = sc.end + len;
			return status;
		}
		if (c < '0' || c > '9' || k == 19)
			return 0;
		len = len * 10 + (c - '0');
	}
	return 0;
}

/* Tail exceptions: a request kept although its trace was not sampled
 * (the rule of src/requests/tracker.rs, Tail::keeps). */
static __always_inline int tail_keeps(const struct http_req *r)
{
	return (ktail_errors && r->status >= 500) || r->last_ns - r->start_ns > ktail_slow_ns;
}

/* A record the kernel makes for a followed request (k): the scratch HTTP
 * record, its header, time, cause, connection and kind set, the rest
 * zero but its data; NULL without scratch. */
static __always_inline struct http_event *followed_record(struct conn_key *k, __u64 ts_ns, __u64 conn, __u32 what)
{
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	struct http_event *e = &s->http;
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HTTP_CAPTURE);
	e->hdr.kind = EV_HTTP;
	e->hdr.pid = k->pid;
	e->hdr.tid = (__u32)current_ids();
	e->ts_ns = ts_ns;
	e->cause = k->ptr;
	e->conn = conn;
	e->what = what;
	return e;
}

/* Tail exceptions: a followed request whose records were sent held is
 * over for the kernel: they go on (`release`: kept, or handed over) or
 * are dropped. */
static __noinline void http_tail_verdict(struct conn_key *k, __u32 release)
{
	struct http_event *e = followed_record(k, bpf_ktime_get_ns(), 0, HTTP_TAIL);
	if (!e)
		return;
	e->len = release;
	emit(e, sizeof(*e) - UVSPAN_HTTP_CAPTURE);
}

/* A kept request's response as user space needs it: its status line, at
 * its last write, without a length (user space ends it once quiet, at
 * that write). */
static __noinline void http_status_record(struct conn_key *k, struct http_req *r)
{
	struct http_event *e = followed_record(k, r->last_ns, r->conn, HTTP_WRITE);
	if (!e)
		return;
	e->tls = r->tls;
	const char line[24] = "HTTP/1.1 000 \r\n\r\n";
	for (int i = 0; i < 24; i++)
		e->data[i] = line[i];
	__u32 st = r->status;
	e->data[9] = '0' + (st / 100) % 10;
	e->data[10] = '0' + (st / 10) % 10;
	e->data[11] = '0' + st % 10;
	e->captured = 17;
	e->len = 17;
	emit(e, sizeof(*e) - UVSPAN_HTTP_CAPTURE + 24);
}

/* A followed request is over: its duration counted (or, kept by the tail
 * exceptions, its held records go on: user space counts it as it would
 * have).
 * Over TLS, its later writes (the last record's ciphertext) are not sent
 * (unless a request is pipelined behind it: they are that one's); in the
 * clear there are none (one that comes is sent, and user space passes it
 * by). */
static __always_inline void http_end(struct conn_key *k, struct http_req *r)
{
	int keep = ktail && tail_keeps(r);
	if (ktail && r->held)
		http_tail_verdict(k, keep);
	if (keep && r->status)
		http_status_record(k, r);
	if (!keep)
		op_hist_count(k->pid, http_hist_what(r->ver, r->method, r->tls), r->status, r->last_ns - r->start_ns);
	if (r->tls && !r->pipelined) {
		__u8 one = 1;
		bpf_map_update_elem(&http_done, k, &one, BPF_ANY);
	}
	bpf_map_delete_elem(&http_reqs, k);
}

/* The request line user space would have seen, of a method and version:
 * "METHOD / HTTP/1.x\r\n\r\n" (user space needs no more of an unsampled
 * request: not its path, not its headers). */
static __always_inline __u32 request_line(char *d, __u8 method, __u8 ver)
{
	static const char names[9][8] = { "GET", "POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE" };
	static const __u8 lens[9] = { 3, 4, 3, 4, 6, 5, 7, 7, 5 };
	if (method > METHOD_TRACE)
		return 0;
	__u32 n = lens[method];
	for (int k = 0; k < 8; k++)
		d[k] = names[method][k];
	const char tail[18] = " / HTTP/1.0\r\n\r\n";
	for (int k = 0; k < 16; k++)
		d[(n + k) & 31] = tail[k];
	d[(n + 10) & 31] = '0' + (ver & 1);
	return n + 16;
}

/* A followed request becomes user space's: its head record, as it would
 * have been sent at its start, goes first. */
static __noinline void http_hand_over(struct conn_key *k, struct http_req *r)
{
	/* tail exceptions: its head (and work) sent held go on instead */
	struct http_event *e = 0;
	if (ktail && r->held)
		http_tail_verdict(k, 1);
	else
		e = followed_record(k, r->start_ns, r->stream, HTTP_REQUEST);
	if (e) {
		e->captured = request_line(e->data, r->method, r->ver);
		e->len = e->captured;
		peer_of(e, r->stream);
		emit(e, sizeof(*e) - UVSPAN_HTTP_CAPTURE + 32);
	}
	bpf_map_delete_elem(&http_reqs, k);
}

/* A request begins on `stream` (`pipelined`: behind the one before it, in
 * the same read), whose cause was `prev` until now. A followed request
 * before it there is over, as user space ends it (at its last write); one
 * a request is pipelined behind is handed over, or (its response under
 * way) ends without taking what is written for the next one. */
static __always_inline void http_next_on(__u32 pid, __u64 stream, __u64 prev, int pipelined)
{
	struct conn_key k = { .pid = pid, .ptr = prev };
	struct http_req *r = bpf_map_lookup_elem(&http_reqs, &k);
	if (!r || r->stream != stream)
		return;
	if (!pipelined)
		http_end(&k, r);
	else if (!r->conn)
		http_hand_over(&k, r);
	else
		r->pipelined = 1;
}

/* A write under an unsampled request's cause: 1 when the kernel took it
 * (no record), 0 to send it as before. `head` is its first 8 bytes, `call`
 * whether it is an outgoing request. */
static __always_inline int http_follow_write(__u64 cause, __u64 conn, __u64 data, __u64 avail, __u64 total,
					     const char *head, int call, __u8 tls)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = cause };
	struct http_req *r = bpf_map_lookup_elem(&http_reqs, &k);
	if (!r)
		return bpf_map_lookup_elem(&http_done, &k) != NULL;
	r->last_ns = bpf_ktime_get_ns();
	if (!r->conn) {
		if (call) {
			http_hand_over(&k, r);
			return 0;
		}
		/* user space passes by a write before the response's head */
		if (!is_response(head))
			return 1;
		struct scratch *s = get_scratch();
		if (!s)
			return 0;
		__u32 n = 0;
		if (avail <= HTTP_SHORT_HEAD) {
			if (!bpf_probe_read_user(s->http.data, HTTP_SHORT_HEAD, (void *)data))
				n = avail;
		} else if (!bpf_probe_read_user(s->http.data, UVSPAN_HTTP_CAPTURE, (void *)data)) {
			n = avail < UVSPAN_HTTP_CAPTURE ? avail : UVSPAN_HTTP_CAPTURE;
		}
		__u64 expect = 0;
		int status = http_response(n, &expect);
		if (!status) {
			http_hand_over(&k, r);
			return 0;
		}
		r->status = status;
		r->conn = conn;
		r->tls = tls;
		r->expect = expect;
	}
	/* a call after the response's head: user space passes it by too */
	if (r->conn == conn && !call) {
		r->written += total > 0xFFFFFFFF ? 0xFFFFFFFF : total;
		if (r->written >= r->expect)
			http_end(&k, r);
	}
	return 1;
}

#endif /* UVSPAN_HTTP_FOLLOW_H */
