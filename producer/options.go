package producer

import "time"

// Option adjusts one enqueue. Options are applied in order, so a later one
// overrides an earlier one of the same kind; a nil Option is ignored.
type Option func(*options)

type options struct {
	eventID    *string
	newOrderNo *string
	reason     *string
	maxRetry   *int
	processIn  time.Duration
}

// WithEventID sets the event ID, the upstream's idempotency key, which also
// becomes the task ID. It must be a valid event ID (see tasks.ValidEventID);
// an empty one fails with [ErrInvalidOption] rather than being replaced by a
// generated one. Without it the payload's event ID is used, or else a UUIDv7 is
// generated.
func WithEventID(id string) Option {
	return func(o *options) { o.eventID = &id }
}

// WithNewOrderNo sets the exchange's new_order_no, the replacement order's
// number. It applies to exchanges only: a modify given it fails with
// [ErrInvalidOption]. Without it the worker derives the new order number from
// the event ID.
func WithNewOrderNo(orderNo string) Option {
	return func(o *options) { o.newOrderNo = &orderNo }
}

// WithReason sets the exchange's reason, for people. It applies to exchanges
// only: a modify given it fails with [ErrInvalidOption].
func WithReason(reason string) Option {
	return func(o *options) { o.reason = &reason }
}

// WithProcessIn delays the task by d: it is scheduled rather than pending,
// and a worker takes it no sooner than d from now. A d of zero or less means
// now. The event ID is held from the moment of the enqueue, not of the run.
func WithProcessIn(d time.Duration) Option {
	return func(o *options) { o.processIn = d }
}

// WithMaxRetry overrides [Config.MaxRetry] for this task: n is how many times
// it is retried after failing, 0 for never. A negative n fails with
// [ErrInvalidOption].
func WithMaxRetry(n int) Option {
	return func(o *options) { o.maxRetry = &n }
}
