/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Causes across threads: a worker_threads MessagePort message is handled
 * under the cause that posted it. node queues each message on the
 * receiving port (MessagePortData::AddToIncomingQueue, on the sender's
 * thread) and deserializes it right before its 'message' handlers run
 * (Message::Deserialize, on the receiver's loop thread, once per message
 * whatever the batch its callback drains), so the message (its address)
 * carries the cause from one thread to the other: a request's work sent to
 * a worker, the worker's work for it, and the reply's handler on the main
 * loop stay the request's.
 */
#ifndef UVSPAN_PORTS_H
#define UVSPAN_PORTS_H

#include "ops.h"

/* MessagePortData::AddToIncomingQueue(this, std::shared_ptr<Message>):
 * the shared_ptr passed by reference (its first word: the Message). A
 * message posted under no cause is kept too (as 0): its handler is then a
 * task of its own, not whatever ran before it. */
static __always_inline int port_post(struct pt_regs *ctx)
{
	__u64 msg = 0;
	if (bpf_probe_read_user(&msg, sizeof(msg), (void *)PT_REGS_PARM2(ctx)) || !msg)
		return 0;
	__u64 cause = current_cause();
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = msg };
	bpf_map_update_elem(&port_msgs, &k, &cause, BPF_ANY);
	return 0;
}

/* Message::Deserialize(this, env, context, port_list): a queued message
 * is about to reach its handlers. One never queued (structuredClone's, on
 * the calling thread) leaves the cause as it is. */
static __always_inline int port_receive(struct pt_regs *ctx)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM1(ctx) };
	__u64 *c = bpf_map_lookup_elem(&port_msgs, &k);
	if (!c)
		return 0;
	__u64 cause = *c;
	bpf_map_delete_elem(&port_msgs, &k);
	set_cause(cause ? cause : new_task_cause(CAUSE_IO));
	return 0;
}

#endif /* UVSPAN_PORTS_H */
