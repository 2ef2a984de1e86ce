// Package notice fans the messages of one Redis pub/sub channel out to the
// local waiters of a process: the lock's release notices (worker/keyorder)
// and the token cache's refresh notices (internal/token) both go through
// it.
//
// A [Channel] keeps one subscription, started by the first waiter and
// stopped by Close. Starting it does no I/O under any lock: the SUBSCRIBE
// is sent by the Channel's own goroutine, so a Redis that stalls delays
// only the notices, never the callers that register or the other users of
// the client. go-redis reconnects and resubscribes by itself after a lost
// connection; every resubscription wakes every waiter, since a notice may
// have been lost while the connection was down.
//
// A notice only ever saves time: a waiter that misses one (Redis down, a
// Redis user without the channel in its ACL, a lost connection) must still
// find out by polling. notice is not a message queue and delivers nothing
// but wake-ups.
package notice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoPermission is matched by [Channel.Check]'s error when the Redis user
// may not publish to the channel or subscribe to it.
var ErrNoPermission = errors.New("notice: no permission for the channel")

// Config tunes a [Channel]. The zero value is ready to use.
type Config struct {
	// SubscribeTimeout bounds the first SUBSCRIBE; when it runs out,
	// go-redis retries with its next receive. Defaults to 5s.
	SubscribeTimeout time.Duration
}

// Channel fans one pub/sub channel's notices out to local waiters. A notice
// is a message whose payload is a key, optionally followed by a space and
// more ("<key>" or "<key> <rest>"); each waiter says which key it waits for.
// A Channel is safe for concurrent use. It owns one goroutine once the
// first waiter came, which Close stops; the Redis client stays the
// caller's.
type Channel struct {
	rdb     redis.UniversalClient
	channel string
	cfg     Config

	mu      sync.Mutex
	waiters map[string]map[*Waiter]struct{} // key → waiters; "" for every notice
	sub     *redis.PubSub
	ready   chan struct{} // closed once Redis confirmed the subscription
	done    chan struct{} // closed when the fan-out goroutine ends
	off     bool          // notices are off: no subscription is made
	closed  bool
}

// New returns a Channel for the pub/sub channel channel on rdb. It does no
// I/O.
func New(rdb redis.UniversalClient, channel string, cfg Config) *Channel {
	cfg.SubscribeTimeout = cmp.Or(cfg.SubscribeTimeout, 5*time.Second)
	return &Channel{rdb: rdb, channel: channel, cfg: cfg, waiters: make(map[string]map[*Waiter]struct{})}
}

// Name returns the pub/sub channel's name.
func (c *Channel) Name() string { return c.channel }

// Waiter is one local waiter. Its C receives a wake-up when a notice it
// waits for comes, and when the subscription is made or made again. C has
// room for one wake-up: a waiter that has one pending needs no second.
type Waiter struct {
	// C receives the wake-ups.
	C <-chan struct{}

	c     chan struct{}
	ch    *Channel
	key   string
	match func(rest string) bool
	ready <-chan struct{} // nil when notices are off or the Channel is closed
}

// Wait registers a waiter for the notices about key, starting the
// subscription if it is the first. A notice about key is "<key>", which
// wakes it, or "<key> <rest>", which wakes it when match is nil or
// match(rest) is true. An empty key waits for every notice, and match then
// gets the whole payload. Wait never blocks and does no I/O. After Close,
// or when notices are off, the waiter is only ever woken by nothing: the
// caller polls. Stop the waiter when done with it.
func (c *Channel) Wait(key string, match func(rest string) bool) *Waiter {
	wake := make(chan struct{}, 1)
	w := &Waiter{C: wake, c: wake, ch: c, key: key, match: match}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.off {
		return w
	}
	if c.sub == nil {
		c.start()
	}
	set := c.waiters[key]
	if set == nil {
		set = make(map[*Waiter]struct{})
		c.waiters[key] = set
	}
	set[w] = struct{}{}
	w.ready = c.ready
	return w
}

// Ready waits until the Channel's subscription is confirmed, so that a
// notice sent from now on wakes the waiter, or until limit passes (a slow
// or refused subscription then only costs the caller its polling), or ctx
// ends. It then drops a wake-up that came before: the caller is about to
// look anyway. It returns the context's cause when ctx ended first, and
// nil otherwise. It returns at once when notices are off.
func (w *Waiter) Ready(ctx context.Context, limit time.Duration) error {
	if w.ready != nil {
		select {
		case <-w.ready:
		default:
			t := time.NewTimer(limit)
			defer t.Stop()
			select {
			case <-w.ready:
			case <-t.C:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	select {
	case <-w.c:
	default:
	}
	return nil
}

// Stop unregisters the waiter. It is safe to call more than once.
func (w *Waiter) Stop() {
	c := w.ch
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.waiters[w.key]
	delete(set, w)
	if len(set) == 0 {
		delete(c.waiters, w.key)
	}
}

func (w *Waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// start creates the subscription, without I/O, and the goroutine that makes
// it and fans its notices out. c.mu must be held.
func (c *Channel) start() {
	c.sub = c.rdb.Subscribe(context.Background()) // no channel yet: no I/O here
	c.ready = make(chan struct{})
	c.done = make(chan struct{})
	go c.listen(c.sub, c.ready, c.done)
}

// listen subscribes to the channel and fans every notice out, until Close
// closes the subscription.
func (c *Channel) listen(ps *redis.PubSub, ready, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.SubscribeTimeout)
	err := ps.Subscribe(ctx, c.channel)
	cancel()
	if errors.Is(err, redis.ErrClosed) {
		return
	}
	// On any other error the channel is recorded and go-redis subscribes
	// again with its next receive.
	confirmed := false
	for msg := range ps.ChannelWithSubscriptions() {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			// Wake first: a waiter in Ready drops the wake-up of the
			// first confirmation, which it waited for anyway.
			c.wakeAll()
			if !confirmed {
				confirmed = true
				close(ready)
			}
		case *redis.Message:
			c.notify(m.Payload)
		}
	}
}

// notify wakes the waiters of a notice: those of every notice, and those of
// its key that it matches. It never blocks.
func (c *Channel) notify(payload string) {
	key, rest, hasRest := strings.Cut(payload, " ")
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.waiters[""] {
		if w.match == nil || w.match(payload) {
			w.wake()
		}
	}
	if key == "" {
		return
	}
	for w := range c.waiters[key] {
		if !hasRest || w.match == nil || w.match(rest) {
			w.wake()
		}
	}
}

// wakeAll wakes every waiter, after a (re)subscription.
func (c *Channel) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, set := range c.waiters {
		for w := range set {
			w.wake()
		}
	}
}

// Check makes sure that the Redis user may publish to the channel and
// subscribe to it, with one PUBLISH (of an empty notice, which wakes
// nobody) and one SUBSCRIBE on a connection of its own. When Redis refuses
// either for permission, Check turns notices off for this Channel, unless
// its subscription was already made (waiters then poll, which is slower but
// correct), and returns an error matching [ErrNoPermission] that names the
// ACL rule the user needs (for example `&ow:lock:released`). Other errors
// are Redis errors, wrapped.
func (c *Channel) Check(ctx context.Context) error {
	noPerm := func(err error) error {
		if redis.HasErrorPrefix(err, "NOPERM") {
			c.mu.Lock()
			if c.sub == nil {
				c.off = true
			}
			c.mu.Unlock()
			return fmt.Errorf("%w %s: grant the Redis user the channel with the ACL rule %q (%w)", ErrNoPermission, c.channel, "&"+c.channel, err)
		}
		return fmt.Errorf("notice: check channel %s: %w", c.channel, err)
	}
	if err := c.rdb.Publish(ctx, c.channel, "").Err(); err != nil {
		return noPerm(err)
	}
	ps := c.rdb.Subscribe(ctx)
	defer ps.Close()
	if err := ps.Subscribe(ctx, c.channel); err != nil {
		return noPerm(err)
	}
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		return noPerm(err)
	}
	return nil
}

// Close stops the subscription and waits for its goroutine. Waiters are
// not woken; later ones never are. Close is safe to call more than once,
// and returns the error of closing the subscription, if any.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sub, done := c.sub, c.done
	c.mu.Unlock()
	if sub == nil {
		return nil
	}
	err := sub.Close()
	<-done
	if err != nil {
		return fmt.Errorf("notice: close subscription %s: %w", c.channel, err)
	}
	return nil
}
