/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Request context for HTTP/2 servers (node:http2, over nghttp2, which
 * official builds link statically): each stream is a request of its own,
 * however many share a connection and a read. Its cause is made at its
 * first request header (Http2Session::OnHeaderCallback), current while node
 * runs the stream's JS handlers (Http2Session::OnFrameReceive for its
 * HEADERS frame, and the DATA frame that ends its body), its :status seen
 * at nghttp2_submit_response, its end at Http2Session::OnStreamClose.
 * Streams are keyed by (process, nghttp2 session, stream id): every one of
 * these functions has both. HTTP/1 requests never reach them.
 *
 * HTTP/2 clients: a stream node submits (nghttp2_submit_request, a session
 * uprobe: the stream id is its return value) under a cause keeps that
 * cause (its caller's), its request headers sent up (HTTP2_CLIENT); its
 * response's frames make it current again (the response handlers' work is
 * the caller's), its :status and grpc-status come through OnHeaderCallback
 * (response and trailer categories), its end at the frame that ends the
 * response (or at OnStreamClose: a reset). An unsampled caller's, or a
 * task's, streams keep their cause but send nothing.
 */
#ifndef UVSPAN_H2_H
#define UVSPAN_H2_H

#include "http.h"

struct h2_frame_hd {
	__u64 length;
	__s32 stream_id;
	__u8 type;
	__u8 flags;
	__u8 reserved;
	__u8 _pad;
};

static __always_inline int same(const char *a, const char *lit, int n)
{
#pragma unroll
	for (int i = 0; i < 12; i++) {
		if (i >= n)
			break;
		if (a[i] != lit[i])
			return 0;
	}
	return 1;
}

/* The request headers sent up: the pseudo-headers, the trace context, the
 * user agent and the content type (gRPC); the others are not kept. */
static __always_inline int h2_kept(const char *n, __u64 len)
{
	if (len && n[0] == ':')
		return 1;
	switch (len) {
	case 10:
		return same(n, "tracestate", 10) || same(n, "user-agent", 10);
	case 11:
		return same(n, "traceparent", 11);
	case 12:
		return same(n, "content-type", 12);
	}
	return 0;
}

/* One HTTP/2 record: the header's name and value (a close: none); with
 * `peer`, the libuv stream whose peer the record carries. */
static __always_inline void emit_h2_at(__u64 ts, __u32 what, __u64 cause, __u64 session, __u64 name, __u64 name_len,
				       __u64 value, __u64 value_len, __u64 peer, __s32 stream_id)
{
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct http_event *e = &s->http;
	__u64 id = current_ids();
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HTTP_CAPTURE + UVSPAN_H2_NAME);
	e->hdr.kind = EV_HTTP;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->ts_ns = ts;
	e->cause = cause;
	e->conn = session;
	e->what = what;
	e->stream_id = stream_id;
	e->len = value_len > 0xFFFFFFFF ? 0xFFFFFFFF : value_len;
	__u32 nl = name_len < UVSPAN_H2_NAME - 1 ? name_len : UVSPAN_H2_NAME - 1;
	if (nl && bpf_probe_read_user(e->data, nl, (void *)name))
		return;
	__u32 vl = value_len < UVSPAN_HTTP_CAPTURE - UVSPAN_H2_NAME ? value_len : UVSPAN_HTTP_CAPTURE - UVSPAN_H2_NAME;
	if (!value)
		vl = 0;
	if (vl && bpf_probe_read_user(e->data + UVSPAN_H2_NAME, vl, (void *)value))
		vl = 0;
	e->captured = what == HTTP2_CLOSE ? 0 : UVSPAN_H2_NAME + vl;
	if (peer)
		peer_of(e, peer);
	__u64 size = sizeof(*e) - UVSPAN_HTTP_CAPTURE + (((__u64)e->captured + 7) & ~7ULL);
	if (size > sizeof(*e))
		size = sizeof(*e);
	emit(e, size);
}

static __always_inline void emit_h2(__u32 what, __u64 cause, __u64 session, __u64 name, __u64 name_len, __u64 value,
				    __u64 value_len, __u64 peer, __s32 stream_id)
{
	emit_h2_at(bpf_ktime_get_ns(), what, cause, session, name, name_len, value, value_len, peer, stream_id);
}

/* The stream of a frame, and its header (0: unreadable). */
static __always_inline int h2_frame_of(__u64 frame, struct h2_frame_hd *hd)
{
	return !bpf_probe_read_user(hd, sizeof(*hd), (void *)frame);
}

#define H2_TP_READ 64

/* A stream's traceparent header (its value at `base`, `len` bytes): the
 * stream's cause decided by it (sample_incoming); a malformed one leaves
 * the root's decision. A global function: verified once. */
__attribute__((noinline)) __u64 h2_sample(__u64 cause, __u64 base, __u64 len)
{
	/* read into scratch (emit_h2 fills it afterwards) */
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		return cause;
	char *v = s->http.data;
	__u32 n = len < H2_TP_READ ? len : H2_TP_READ;
	int flag = 0;
	__u64 low56 = 0;
	if (n < TP_VALUE_LEN || bpf_probe_read_user(v, n, (void *)base) || !tp_parse(0, n, &flag, &low56))
		return cause;
	return sample_incoming(cause, flag, low56);
}

/* As `same`, a loop the verifier bounds (not unrolled: clang may merge
 * calls with different lengths). */
static __always_inline int same_n(const char *a, const char *lit, int n)
{
	for (int i = 0; i < 16; i++) {
		if (i >= n)
			break;
		if (a[i] != lit[i])
			return 0;
	}
	return 1;
}

/* Whether a client stream's records are sent: its caller (a request or a
 * task) is sampled. */
static __always_inline int h2_client_sends(__u64 cause)
{
	return cause && !dropped(cause);
}

/* A response header or trailer of a stream: a client stream's :status
 * and grpc-status are sent up with its stream id (server streams' trailers,
 * and streams not known, are not looked at). */
static __always_inline int h2_client_header(__u64 session, __s32 stream_id, __u64 name, __u64 value)
{
	struct h2_key key = { .pid = current_ids() >> 32, .stream_id = stream_id, .session = session };
	struct h2_stream *st = bpf_map_lookup_elem(&h2_stream_cause, &key);
	if (!st || !st->client)
		return 0;
	__u64 cause = fresh_cause(st->cause);
	if (!h2_client_sends(cause))
		return 0;
	__u64 nb[2] = {}, vb[2] = {};
	if (bpf_probe_read_user(nb, sizeof(nb), (void *)(name + H2_RCBUF_BASE_OFF)) || (nb[1] != 7 && nb[1] != 11) ||
	    bpf_probe_read_user(vb, sizeof(vb), (void *)(value + H2_RCBUF_BASE_OFF)))
		return 0;
	char n[16] = {};
	if (bpf_probe_read_user(n, nb[1] == 7 ? 7 : 11, (void *)nb[0]))
		return 0;
	if (nb[1] == 7 ? same_n(n, ":status", 7) : same_n(n, "grpc-status", 11))
		emit_h2(HTTP2_HEADER, cause, session, nb[0], nb[1], vb[0], vb[1], 0, stream_id);
	return 0;
}

/*
 * Server streams under the kernel's sampler (h2_defers): a stream's
 * decision can change at its traceparent, which comes after its
 * pseudo-headers. One the sampler drops as a root sends none of its
 * request headers as they come: each kept one is saved (its rcbufs, in
 * the stream's entry) and the stream decided when its HEADERS frame has
 * been read (OnFrameReceive, before node runs its handlers). Sampled after
 * all (its caller's traceparent), its saved headers are sent then, read
 * again from node's buffers; not sampled, it sends no record at all: its
 * method, scheme and status are read in passing and its duration counted
 * in op_hist at its close, as http.server.request.duration. (A stream
 * kept as a root is sent as it comes, as saving and reading again costs
 * more than sending: if its traceparent drops it, user space does.)
 */
static __always_inline int h2_defers(void)
{
	return ksample_requests && khttp && !ktail;
}

/* A short name or value (at most 8 bytes, read into a zeroed word) as a
 * number: compared in one step. */
#define WORD_GET 0x544547ULL
#define WORD_PUT 0x545550ULL
#define WORD_POST 0x54534f50ULL
#define WORD_HEAD 0x44414548ULL
#define WORD_PATCH 0x4843544150ULL
#define WORD_TRACE 0x4543415254ULL
#define WORD_DELETE 0x4554454c4544ULL
#define WORD_OPTIONS 0x534e4f4954504fULL
#define WORD_CONNECT 0x5443454e4e4f43ULL
#define WORD_HTTPS 0x7370747468ULL
#define WORD_METHOD 0x646f6874656d3aULL /* ":method" */
#define WORD_SCHEME 0x656d656863733aULL /* ":scheme" */

/* The method of a :method value (its word), enum http_method. */
static __always_inline __u8 h2_method(__u64 w)
{
	switch (w) {
	case WORD_GET: return METHOD_GET;
	case WORD_POST: return METHOD_POST;
	case WORD_PUT: return METHOD_PUT;
	case WORD_HEAD: return METHOD_HEAD;
	case WORD_DELETE: return METHOD_DELETE;
	case WORD_PATCH: return METHOD_PATCH;
	case WORD_OPTIONS: return METHOD_OPTIONS;
	case WORD_CONNECT: return METHOD_CONNECT;
	case WORD_TRACE: return METHOD_TRACE;
	}
	return METHOD_OTHER;
}

/* The word of a name or value of n bytes at p (0: longer than 8, or
 * unreadable). */
static __always_inline __u64 h2_word(__u64 p, __u64 n)
{
	__u64 w = 0;
	if (!n || n > 8 || bpf_probe_read_user(&w, n & 15, (void *)p))
		return 0;
	return w;
}

/* A pending stream's kept request header (its name's first bytes `n`,
 * rcbufs' base and length in nb, vb): saved to be sent if it is sampled
 * (the first H2_SAVED: the pseudo-headers and the four others kept fit;
 * more, repeats of those four, are counted, STAT_H2_UNSENT);
 * its method and scheme kept for the count if not. */
static __always_inline void h2_save(struct h2_stream *c, const char *n, __u64 *nb, __u64 *vb, __u64 name, __u64 value)
{
	/* the name's bytes are read already (n: zeroed past them) */
	__u64 name_w = 0;
	__builtin_memcpy(&name_w, n, 8);
	if (nb[1] == 7 && name_w == WORD_METHOD)
		c->method = h2_method(h2_word(vb[0], vb[1]));
	else if (nb[1] == 7 && name_w == WORD_SCHEME)
		c->tls = h2_word(vb[0], vb[1]) == WORD_HTTPS;
	__u32 i = c->nsaved;
	if (i < H2_SAVED) {
		c->saved[i].name = name;
		c->saved[i].value = value;
	}
	/* past H2_SAVED, counted: not sent if the stream is sampled */
	if (i < 255)
		c->nsaved = i + 1;
}

/* A pending stream's saved header i sent (the first with the stream's
 * start and its connection's peer). A global function: verified once (a
 * static one, inlined or not, is verified again at every call: once per
 * header of every path to it). */
__attribute__((noinline)) int h2_send_saved(struct h2_stream *c, __u32 i, __u64 session)
{
	if (!c || i >= H2_SAVED)
		return 0;
	__u64 nb[2] = {}, vb[2] = {};
	if (bpf_probe_read_user(nb, sizeof(nb), (void *)(c->saved[i].name + H2_RCBUF_BASE_OFF)) ||
	    bpf_probe_read_user(vb, sizeof(vb), (void *)(c->saved[i].value + H2_RCBUF_BASE_OFF)))
		return 0;
	emit_h2_at(i ? bpf_ktime_get_ns() : c->start_ns, HTTP2_HEADER, c->cause, session, nb[0], nb[1], vb[0], vb[1],
		   i ? 0 : c->peer, 0);
	return 0;
}

/* A pending stream (its entry c) is decided: sampled, its saved headers
 * go up; not, it is followed (no record). */
static __always_inline void h2_decide(struct h2_stream *c, __u64 session)
{
	if (c->state != H2_PENDING)
		return;
	if (dropped(c->cause)) {
		c->state = H2_FOLLOWED;
		return;
	}
	c->state = 0;
	__u32 n = c->nsaved;
	if (n > H2_SAVED)
		stat_add(STAT_H2_UNSENT, n - H2_SAVED);
	for (__u32 i = 0; i < H2_SAVED; i++) {
		if (i >= n)
			break;
		h2_send_saved(c, i, session);
	}
}

/* Http2Session::OnHeaderCallback(session, frame, name, value, flags,
 * user_data): one header of a HEADERS frame. A request's (category
 * NGHTTP2_HCAT_REQUEST) first header makes the stream's cause; a
 * response's or trailer's is a client stream's (h2_client_header). */
static __always_inline int h2_header(struct pt_regs *ctx)
{
	if (!requests)
		return 0;
	__u64 session = PT_REGS_PARM1(ctx), frame = PT_REGS_PARM2(ctx);
	__u64 name = PT_REGS_PARM3(ctx), value = PT_REGS_PARM4(ctx);
	struct h2_frame_hd hd = {};
	if (!h2_frame_of(frame, &hd) || hd.type != H2_TYPE_HEADERS)
		return 0;
	__s32 cat = -1;
	bpf_probe_read_user(&cat, sizeof(cat), (void *)(frame + H2_HEADERS_CAT_OFF));
	if (cat == H2_HCAT_RESPONSE || cat == H2_HCAT_HEADERS)
		return h2_client_header(session, hd.stream_id, name, value);
	if (cat != H2_HCAT_REQUEST)
		return 0;
	/* nghttp2_rcbuf: base, len */
	__u64 nb[2] = {}, vb[2] = {};
	if (bpf_probe_read_user(nb, sizeof(nb), (void *)(name + H2_RCBUF_BASE_OFF)) ||
	    bpf_probe_read_user(vb, sizeof(vb), (void *)(value + H2_RCBUF_BASE_OFF)))
		return 0;
	char n[16] = {};
	__u32 k = nb[1] < sizeof(n) ? nb[1] : sizeof(n);
	if (!k || bpf_probe_read_user(n, k, (void *)nb[0]) || !h2_kept(n, nb[1]))
		return 0;
	struct h2_key key = { .pid = current_ids() >> 32, .stream_id = hd.stream_id, .session = session };
	struct h2_stream *c = bpf_map_lookup_elem(&h2_stream_cause, &key);
	__u64 peer = 0;
	if (!c) {
		/* the new entry, made in the scratch record's data */
		struct scratch *s = get_scratch();
		if (!s)
			return 0;
		struct h2_stream *st = (struct h2_stream *)s->http.data;
		__builtin_memset(st, 0, sizeof(*st));
		st->start_ns = bpf_ktime_get_ns();
		st->cause = new_cause(CAUSE_REQUEST);
		/* the sampler, as for a root; again at its traceparent */
		if (ksample_requests)
			st->cause = sample_root(st->cause);
		/* the connection whose read this is (uv__stream_io) */
		struct thread_state *t = thread_state_of(0);
		peer = t ? t->ctx.stream : 0;
		/* dropped as a root: pending until its traceparent has had its
		 * say (one kept as a root is sent as it comes; if its
		 * traceparent drops it, user space drops it) */
		if (h2_defers() && dropped(st->cause)) {
			st->state = H2_PENDING;
			st->peer = peer;
		}
		bpf_map_update_elem(&h2_stream_cause, &key, st, BPF_ANY);
		c = bpf_map_lookup_elem(&h2_stream_cause, &key);
		if (!c)
			return 0;
	}
	if (c->client)
		return 0;
	if (ksample_requests && ksample_reads_parent() && nb[1] == 11 && same(n, "traceparent", 11))
		c->cause = h2_sample(c->cause, vb[0], vb[1]);
	if (c->state == H2_PENDING) {
		h2_save(c, n, nb, vb, name, value);
		return 0;
	}
	emit_h2(HTTP2_HEADER, c->cause, session, nb[0], nb[1], vb[0], vb[1], peer, 0);
	return 0;
}

/* A known stream's cause (NULL: a stream uvspan did not see start), with
 * its key filled in. */
static __always_inline struct h2_stream *h2_lookup(struct h2_key *key, __u64 session, __s32 stream_id)
{
	key->pid = current_ids() >> 32;
	key->stream_id = stream_id;
	key->session = session;
	return bpf_map_lookup_elem(&h2_stream_cause, key);
}

/* A known stream's handlers run: its cause becomes the thread's, the one
 * it replaced is left in `prev`. 1: a stream's cause set. With
 * `end_stream` (its peer's last frame), a client stream's response is
 * over: its end sent up. */
static __always_inline int h2_enter(__u64 session, __s32 stream_id, __u64 *prev, int end_stream)
{
	struct h2_key key = {};
	struct h2_stream *c = h2_lookup(&key, session, stream_id);
	if (!c)
		return 0;
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	*prev = thread_cause(t);
	/* --sample-time: a stream from before this window is no request */
	__u64 cause = fresh_cause(c->cause);
	cause_enter(t, cause);
	if (end_stream && c->client == H2_CLIENT_OPEN) {
		c->client = H2_CLIENT_ENDED;
		if (h2_client_sends(cause))
			emit_h2(HTTP2_CLOSE, cause, session, 0, 0, 0, 0, 0, stream_id);
	}
	return 1;
}

/* Http2Session::OnFrameReceive(session, frame, user_data): a whole frame
 * arrived; for a stream's HEADERS frame node runs its 'stream' / 'request'
 * handler inside, for the DATA frame that ends its body its 'end' handlers:
 * the stream's cause becomes the thread's. The cause it replaced is left in
 * `prev` (for the return, as a session uprobe). 1: a stream's cause set.
 * h2_frame, h2_data and h2_close are global functions: the verifier
 * checks each once (inlined in the uprobe dispatcher and the session
 * program, they took ~50,000 instructions processed in each). */
__attribute__((noinline)) int h2_frame(struct pt_regs *ctx, __u64 *prev)
{
	if (!prev)
		return 0;
	if (!requests)
		return 0;
	struct h2_frame_hd hd = {};
	if (!h2_frame_of(PT_REGS_PARM2(ctx), &hd))
		return 0;
	if (hd.type != H2_TYPE_HEADERS && !(hd.type == H2_TYPE_DATA && (hd.flags & H2_FLAG_END_STREAM)))
		return 0;
	if (hd.type == H2_TYPE_HEADERS && h2_defers()) {
		/* its request headers are all in: decided before its handlers run */
		struct h2_key key = {};
		struct h2_stream *c = h2_lookup(&key, PT_REGS_PARM1(ctx), hd.stream_id);
		if (c)
			h2_decide(c, key.session);
	}
	return h2_enter(PT_REGS_PARM1(ctx), hd.stream_id, prev, hd.flags & H2_FLAG_END_STREAM);
}

/* Http2Session::OnDataChunkReceived(session, flags, stream_id, data, len,
 * user_data): a piece of a stream's body; node runs its 'data' handlers
 * inside (a gRPC server decodes its request there). As h2_frame. */
__attribute__((noinline)) int h2_data(struct pt_regs *ctx, __u64 *prev)
{
	if (!prev)
		return 0;
	if (!requests)
		return 0;
	return h2_enter(PT_REGS_PARM1(ctx), (__s32)PT_REGS_PARM3(ctx), prev, 0);
}

/* The return of OnFrameReceive: the cause before it is the thread's again
 * (the frames after it in the same read are other streams', or none's). */
static __always_inline int h2_frame_return(__u64 prev)
{
	struct thread_state *t = thread_state_of(0);
	if (t)
		cause_leave(t, prev);
	return 0;
}

/* The stream of a call whose first two arguments are (session, stream
 * id), if uvspan saw it start: its key, and its entry (NULL: unknown). */
static __always_inline struct h2_stream *h2_known(struct pt_regs *ctx, struct h2_key *key)
{
	if (!requests)
		return 0;
	return h2_lookup(key, PT_REGS_PARM1(ctx), (__s32)PT_REGS_PARM2(ctx));
}

/* A :status value (3 bytes at v): the status, 0 if not one. */
static __always_inline __u16 h2_status(__u64 v)
{
	char d[4] = {};
	if (bpf_probe_read_user(d, 3, (void *)v))
		return 0;
	int status = status_digits(d);
	return status < 0 ? 0 : status;
}

/* nghttp2_submit_response(session, stream_id, nva, nvlen, data_prd) /
 * nghttp2_submit_trailer(session, stream_id, nva, nvlen): a stream's
 * response headers or trailers. Sent up: :status (node puts the
 * pseudo-headers first) and grpc-status (a gRPC call's outcome, in its
 * trailers, or in its headers when it has no body), among the first
 * H2_NV_SCAN headers; a followed stream (no record) keeps its :status for
 * its count instead. */
#define H2_NV_SCAN 8
#define H2_NV_STATUS 0x10000
#define H2_NV_STATUS_VALUE 0x20000

/* One response header (the nghttp2_nv at `at`) of a stream of `cause` on
 * `session`: a followed stream's :status returned (H2_NV_STATUS, with
 * H2_NV_STATUS_VALUE | its value, 0 if unreadable, when it is 3 bytes
 * long); else a :status or grpc-status header sent up, 0; -1: the list is
 * unreadable. A global function: the verifier checks its branches once,
 * not once per path through the headers before it (inlined in the scan,
 * they made ~330,000 instructions processed). */
__attribute__((noinline)) int h2_response_nv(__u64 at, int followed, __u64 cause, __u64 session)
{
	/* nghttp2_nv: name, value, namelen, valuelen */
	__u64 nv[4] = {};
	if (bpf_probe_read_user(nv, sizeof(nv), (void *)at))
		return -1;
	char n[16] = {};
	if ((nv[2] != 7 && nv[2] != 11) || bpf_probe_read_user(n, nv[2] == 7 ? 7 : 11, (void *)nv[0]))
		return 0;
	int status = nv[2] == 7 && same(n, ":status", 7);
	if (followed && status)
		return H2_NV_STATUS | (nv[3] == 3 ? H2_NV_STATUS_VALUE | h2_status(nv[1]) : 0);
	if (!followed && (status || (nv[2] == 11 && same(n, "grpc-status", 11))))
		emit_h2(HTTP2_HEADER, cause, session, nv[0], nv[2], nv[1], nv[3], 0, 0);
	return 0;
}

static __always_inline int h2_response(struct pt_regs *ctx)
{
	struct h2_key key = {};
	struct h2_stream *c = h2_known(ctx, &key);
	/* a client's trailers are no response */
	if (!c || c->client)
		return 0;
	__u64 cause = c->cause, session = key.session;
	__u64 nva = PT_REGS_PARM3(ctx), nvlen = PT_REGS_PARM4(ctx);
	int followed = c->state == H2_FOLLOWED;
	for (int i = 0; i < H2_NV_SCAN; i++) {
		if (i >= nvlen)
			break;
		int r = h2_response_nv(nva + i * H2_NV_SIZE, followed, cause, session);
		if (r < 0)
			return 0;
		if (r & H2_NV_STATUS) {
			if (r & H2_NV_STATUS_VALUE)
				c->status = r & 0xFFFF;
			return 0;
		}
	}
	return 0;
}

/* Http2Session::OnStreamClose(session, stream_id, error_code, user_data):
 * a stream's end. A client stream's 'close' handlers run inside (grpc-js
 * ends its calls there): its caller's cause becomes the thread's, the one
 * it replaced left in `prev` (for the return, as a session uprobe); one
 * whose response did not end was reset: its end is sent up here. 1: a
 * stream's cause set. */
__attribute__((noinline)) int h2_close(struct pt_regs *ctx, __u64 *prev)
{
	if (!prev)
		return 0;
	struct h2_key key = {};
	struct h2_stream *c = h2_known(ctx, &key);
	if (!c)
		return 0;
	if (!c->client) {
		/* reset before its headers were all in: decided now */
		h2_decide(c, key.session);
		__u64 cause = c->cause, start_ns = c->start_ns;
		__u32 what = http_hist_what(2, c->method, c->tls);
		int followed = c->state == H2_FOLLOWED, status = c->status;
		bpf_map_delete_elem(&h2_stream_cause, &key);
		if (followed)
			op_hist_count(key.pid, what, status, bpf_ktime_get_ns() - start_ns);
		else
			emit_h2(HTTP2_CLOSE, cause, key.session, 0, 0, 0, (__u32)PT_REGS_PARM3(ctx), 0, 0);
		return 0;
	}
	__u64 cause = fresh_cause(c->cause);
	int open = c->client == H2_CLIENT_OPEN;
	bpf_map_delete_elem(&h2_stream_cause, &key);
	if (open && h2_client_sends(cause))
		emit_h2(HTTP2_CLOSE, cause, key.session, 0, 0, 0, (__u32)PT_REGS_PARM3(ctx), 0, key.stream_id);
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	*prev = thread_cause(t);
	cause_enter(t, cause);
	return 1;
}

/* A value of `len` bytes at `v` into its slot of `e` (`size` bytes, one
 * left for the NUL). */
#define H2C_PUT(e, slot, size, v, len)                                                        \
	bpf_probe_read_user((e)->data + (slot), (len) < (size) - 1 ? (len) : (size) - 1, (void *)(v))

/* One nghttp2_nv of an outgoing stream's request (`at`) into the slot its
 * name has in `e` (enum h2_client_slot), if any. Returns the :path's
 * bytes kept for a :path (else 0); -1: unreadable. A global function:
 * verified once, not once per header (a static one is walked at every
 * call). */
__attribute__((noinline)) int h2_client_nv(__u64 at, struct http_event *e)
{
	/* nghttp2_nv: name, value, namelen, valuelen */
	__u64 nv[4] = {};
	if (!e || bpf_probe_read_user(nv, sizeof(nv), (void *)at))
		return -1;
	char n[16] = {};
	__u64 k = nv[2];
	if (k < 5 || k > 12 || bpf_probe_read_user(n, k < sizeof(n) ? k : sizeof(n), (void *)nv[0]))
		return 0;
	__u64 v = nv[1], len = nv[3];
	switch (k) {
	case 5:
		if (same_n(n, ":path", 5)) {
			__u32 kept = len < UVSPAN_HTTP_CAPTURE - H2C_PATH ? len : UVSPAN_HTTP_CAPTURE - H2C_PATH;
			if (kept && bpf_probe_read_user(e->data + H2C_PATH, kept, (void *)v))
				return 0;
			return kept;
		}
		break;
	case 7:
		if (same_n(n, ":method", 7))
			H2C_PUT(e, H2C_METHOD, 16, v, len);
		else if (same_n(n, ":scheme", 7))
			H2C_PUT(e, H2C_SCHEME, 16, v, len);
		break;
	case 10:
		if (same_n(n, ":authority", 10))
			H2C_PUT(e, H2C_AUTHORITY, 128, v, len);
		break;
	case 11:
		if (same_n(n, "traceparent", 11))
			H2C_PUT(e, H2C_TRACEPARENT, 64, v, len);
		break;
	case 12:
		if (same_n(n, "content-type", 12))
			H2C_PUT(e, H2C_CONTENT_TYPE, 64, v, len);
		break;
	}
	return 0;
}

/* nghttp2_submit_request(session, pri_spec, nva, nvlen, data_prd,
 * stream_user_data), at its entry: under a cause, its arguments kept for
 * the return. 1: the return is wanted. */
static __always_inline int h2_submit(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause)
		return 0;
	struct h2_submit s = {
		.session = PT_REGS_PARM1(ctx),
		.nva = PT_REGS_PARM3(ctx),
		.nvlen = PT_REGS_PARM4(ctx),
		.cause = cause,
	};
	__u64 id = current_ids();
	return !bpf_map_update_elem(&h2_submits, &id, &s, BPF_ANY);
}

/* Its return: the new stream's id (negative: an error, no stream). The
 * stream keeps its caller's cause; a sampled request's call sends its
 * request headers in one record (among the first H2_NV_CLIENT: node puts
 * the pseudo-headers first). */
#define H2_NV_CLIENT 16
static __always_inline int h2_submit_return(struct pt_regs *ctx)
{
	__u64 id = current_ids();
	struct h2_submit *p = bpf_map_lookup_elem(&h2_submits, &id);
	if (!p)
		return 0;
	struct h2_submit s = *p;
	bpf_map_delete_elem(&h2_submits, &id);
	__s32 stream_id = (__s32)PT_REGS_RC(ctx);
	if (stream_id <= 0)
		return 0;
	struct h2_key key = { .pid = id >> 32, .stream_id = stream_id, .session = s.session };
	struct scratch *sc = get_scratch();
	if (!sc)
		return 0;
	/* the new entry, made in the scratch record's data */
	struct h2_stream *st = (struct h2_stream *)sc->http.data;
	__builtin_memset(st, 0, sizeof(*st));
	st->cause = s.cause;
	st->client = H2_CLIENT_OPEN;
	bpf_map_update_elem(&h2_stream_cause, &key, st, BPF_ANY);
	if (!h2_client_sends(s.cause))
		return 0;
	struct http_event *e = &sc->http;
	/* the header and the fixed slots; :path's bytes are the last sent */
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HTTP_CAPTURE + H2C_PATH);
	e->hdr.kind = EV_HTTP;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->ts_ns = bpf_ktime_get_ns();
	e->cause = s.cause;
	e->conn = s.session;
	e->what = HTTP2_CLIENT;
	e->stream_id = stream_id;
	__u32 path = 0;
	for (int i = 0; i < H2_NV_CLIENT; i++) {
		if (i >= s.nvlen)
			break;
		int r = h2_client_nv(s.nva + i * H2_NV_SIZE, e);
		if (r < 0)
			break;
		if (r > 0)
			path = r;
	}
	path &= UVSPAN_HTTP_CAPTURE - 1;
	if (path > UVSPAN_HTTP_CAPTURE - H2C_PATH)
		path = UVSPAN_HTTP_CAPTURE - H2C_PATH;
	e->captured = H2C_PATH + path;
	__u64 size = sizeof(*e) - UVSPAN_HTTP_CAPTURE + ((e->captured + 7) & ~7ULL);
	if (size > sizeof(*e))
		size = sizeof(*e);
	emit(e, size);
	return 0;
}

#endif /* UVSPAN_H2_H */
