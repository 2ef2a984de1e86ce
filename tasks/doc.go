// Package tasks is orderworker's wire contract: the asynq task types, the
// queues they go to, their JSON payloads and the rules a payload must follow.
// Producers build tasks with it and workers parse them with it, so both sides
// agree byte for byte.
//
// It is a leaf package: it imports no other orderworker package, does no I/O
// and holds no state. It is not the enqueueing policy (task IDs, retries,
// retention, timeouts); that belongs to package producer.
//
// # Task types and queues
//
// Each task type is a [Kind] of the table [Kinds]: its type name (such as
// "order:modify"), its queue (such as "order_modify"), its default priority
// weight and its payload struct (such as [ModifyPayload]). Every kind has
// its own queue, and every queue name begins with "order_". The queue names
// are part of the contract: a system that enqueues by hand must use them,
// because the worker serves each queue with its kind's weight ([Kind.Weight]).
// The README's task contract lists the kinds with their payloads.
//
// # Queue shards
//
// On a Redis Cluster each asynq queue lives in one hash slot, so one queue
// per type puts all of a type's queue traffic on one master. An optional
// shard count N ([Shards]) spreads each type over N queues, the same N for
// every type: an order's tasks go to shard CRC-32(order_no) mod N of their
// type's queue ([ShardOf], [Kind.QueueFor]), named "<queue>:<shard>":
//
//	queue of a task = order_modify                               with N = 1 (the default)
//	                  order_modify:<CRC-32(order_no) mod N>      with N > 1
//
// so all the tasks of one order are in one queue. With N = 1 the queues are
// the ones above. Every process must use the same N. A task found on a
// queue that is not its type's shard for its order (under N, or under a
// count that drains, see [Shards]) is archived with the reason: the
// workers look a position's task up only where this rule puts it.
//
// The producer uses the payload's event_id, unchanged, as the asynq task ID, so
// the same event is refused while asynq still holds a task with that ID. A
// system that enqueues by hand must do the same: the workers archive a task
// whose ID is not its event_id, with that reason.
//
// An event_id is 1 to 128 characters of A-Z, a-z, 0-9, '_', '-', '.' and ':',
// the first a letter or digit ([ValidEventID]): a UUID, a ULID and
// "crm:order-7:v3" qualify. Since it is the task ID, and tools such as
// asynqmon paste task IDs into URLs unescaped, it may hold nothing a URL reads
// as structure ('/', '?', '#', '%') and cannot start with a dot.
//
// # Payloads
//
// A payload is one JSON object in UTF-8. Field names are matched exactly
// (case-sensitively); unknown fields, duplicate fields and anything after the
// object are errors. A JSON null counts as an absent field. The limits are the
// constants of this package.
//
// Text is taken as sent, never repaired. A string that escapes half of a
// UTF-16 surrogate pair ("\ud800" alone) is an error naming the field, where
// encoding/json would put U+FFFD in its place. Free text may hold line breaks
// ("\n" or "\r\n"): an address has lines, and a browser's text box sends
// "\r\n". A remark and a reason may hold tabs too; an address may not, since
// it is printed on labels and exported to columns. No other control character
// is accepted anywhere (NUL, escape sequences, a carriage return on its own,
// DEL, the C1 controls): none is meant by the people who write these fields,
// and downstream they truncate strings, rewrite terminals or break layouts. A
// sku has no control character at all.
//
// A modify changes an existing order. changes holds at least one of address,
// remark and items; a field left out is left unchanged, and items, when
// given, replaces the order's whole item list:
//
//	{
//	  "event_id": "crm-7f3a9c",
//	  "order_no": "SO123",
//	  "changes": {
//	    "address": "1 Main St, Springfield",
//	    "remark": "leave at the door",
//	    "items": [{"sku": "SKU-1", "qty": 2}, {"sku": "SKU-9", "qty": 1}]
//	  }
//	}
//
// An exchange cancels order_no and creates a replacement order holding items.
// new_order_no names the replacement; when it is left out the worker derives
// one from event_id, so a retry creates the same order:
//
//	{
//	  "event_id": "crm-7f3a9d",
//	  "order_no": "SO123",
//	  "items": [{"sku": "SKU-2", "qty": 1}],
//	  "new_order_no": "SO123-X1",
//	  "reason": "wrong size"
//	}
//
// # Trace context
//
// Every payload may carry an optional "trace" field, the W3C Trace Context
// (https://www.w3.org/TR/trace-context/) of the change's acceptance, since
// asynq tasks have no headers ([TraceContext]):
//
//	"trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=x"}
//
// traceparent is required in it, tracestate optional; both are printable
// ASCII, at most [MaxTraceparentLen] and [MaxTracestateLen] bytes. Their
// syntax is not checked: a worker that traces starts a new trace for a
// value it cannot read, and a worker that does not trace ignores the field.
// The field is not part of the change: the same change sent again under
// another trace is the same change. A worker older than this field
// refuses a payload that has it, so workers are upgraded first.
//
// # Errors
//
// Every error this package returns for a bad payload matches [ErrInvalid] and
// asynq.SkipRetry with errors.Is, so a worker that returns it has asynq archive
// the task with the message instead of retrying it. Where one field is at
// fault the error is a [*FieldError] naming the field's path, for example
//
//	changes.items[2].qty: must be between 1 and 10000, got 0
package tasks
