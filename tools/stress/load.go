package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The task kinds of the mix.
const (
	taskModify   = tasks.TypeModify
	taskExchange = tasks.TypeExchange
)

// enqueued is one task the producer accepted.
type enqueued struct {
	EventID string
	Type    string
	Queue   string
	OrderNo string
	NewNo   string // exchanges: the replacement's number
	Client  int    // the upstream client that sent it
	Seq     int64  // its position in its order's sequence
	// At is how long into the chaos phase the producer accepted it.
	At time.Duration
	// Changes is a modify's change, for the replay check.
	Changes tasks.Changes
	// Items is an exchange's items.
	Items []tasks.Item
}

// chain is one seeded order and the replacements exchanges made of it. Its
// modifies go to the newest number an exchange was accepted for: they wait
// for the replacement's creation. Now and then one more modify goes to the
// number just exchanged, which the worker rejects (archived, "is
// exchanged"), naming the replacement. The clients take turns on a chain:
// its mutex keeps one client's send, and its choice of number, together.
type chain struct {
	mu  sync.Mutex
	cur string // the number modifies go to
	old string // the number exchanged last, for the late modify
	n   int    // exchanges enqueued so far
}

// load seeds the orders and enqueues the task mix from several clients.
type load struct {
	p      *producer.Producer
	c      settings
	chains []*chain
	hot    []string  // the hot orders (hot.go), seeded with the others
	start  time.Time // of the chaos phase: run sets it, unless set before

	mu    sync.Mutex
	tasks []enqueued

	// resent counts the changes sent again after a failed acceptance, and
	// resentDup those of them answered as a duplicate.
	resent, resentDup atomic.Int64
}

func newLoad(p *producer.Producer, c settings) *load {
	l := &load{p: p, c: c}
	for i := range c.Orders {
		l.chains = append(l.chains, &chain{cur: fmt.Sprintf("S%02d", i)})
	}
	return l
}

// seeded returns the numbers of the orders seed puts; call it before run.
func (l *load) seeded() []string {
	nos := make([]string, len(l.chains))
	for i, ch := range l.chains {
		nos[i] = ch.cur
	}
	return nos
}

func (l *load) seed(ctx context.Context, store orders.Store) error {
	for _, ch := range l.chains {
		err := store.Put(ctx, orders.Order{No: ch.cur, Address: seedAddress, Remark: "", Items: seedItems})
		if err != nil {
			return fmt.Errorf("seed %s: %w", ch.cur, err)
		}
	}
	for _, no := range l.hot {
		if err := store.Put(ctx, orders.Order{No: no, Address: seedAddress, Remark: "", Items: seedItems}); err != nil {
			return fmt.Errorf("seed %s: %w", no, err)
		}
	}
	return nil
}

// The seeded orders' fields, for the replay check.
var (
	seedAddress = "seeded"
	seedItems   = []orders.Item{{SKU: "A", Qty: 1}}
)

func (l *load) count(typ string) int {
	n := 0
	for _, t := range l.tasks {
		if t.Type == typ {
			n++
		}
	}
	return n
}

// run enqueues c.Tasks tasks evenly over d, from c.Clients clients that
// each send one change after another.
func (l *load) run(ctx context.Context, d time.Duration) error {
	if l.start.IsZero() {
		l.start = time.Now()
	}
	start := l.start
	errs := make(chan error, l.c.Clients)
	var wg sync.WaitGroup
	for client := range l.c.Clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(l.c.Seed), uint64(100+client)))
			for i := client; i < l.c.Tasks; i += l.c.Clients {
				at := start.Add(time.Duration(int64(d) * int64(i) / int64(l.c.Tasks)))
				if wait := time.Until(at); wait > 0 {
					select {
					case <-ctx.Done():
						errs <- context.Cause(ctx)
						return
					case <-time.After(wait):
					}
				}
				if err := l.next(ctx, rng, client, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// next enqueues task i of the mix, from client.
func (l *load) next(ctx context.Context, rng *rand.Rand, client, i int) error {
	ch := l.chains[rng.IntN(len(l.chains))]
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ev := "ev-" + strconv.Itoa(i)
	t := enqueued{EventID: ev, Client: client}
	var payload tasks.Payload
	switch r := rng.IntN(1000); {
	case r < l.c.ExchangesPerK:
		ch.n++
		base := ch.cur
		if j := strings.Index(base, "-X"); j >= 0 {
			base = base[:j]
		}
		t.NewNo = base + "-X" + strconv.Itoa(ch.n)
		t.Items = []tasks.Item{{SKU: "B" + strconv.Itoa(i), Qty: 1 + i%5}}
		payload = tasks.ExchangePayload{EventID: ev, OrderNo: ch.cur, Items: t.Items, NewOrderNo: t.NewNo, Reason: "stress"}
	default:
		switch i % 3 {
		case 0:
			t.Changes.Address = new("address " + strconv.Itoa(i))
		case 1:
			t.Changes.Remark = new("remark " + strconv.Itoa(i))
		default:
			t.Changes.Items = []tasks.Item{{SKU: "A", Qty: 1 + i%7}, {SKU: "C" + strconv.Itoa(i%11), Qty: 1}}
		}
		no := ch.cur
		if ch.old != "" && r < l.c.ExchangesPerK+l.c.LatePerK {
			no = ch.old // a late modify of the order just exchanged: rejected
		}
		payload = tasks.ModifyPayload{EventID: ev, OrderNo: no, Changes: t.Changes}
	}
	k, h := payload.Kind(), payload.Header()
	t.Type, t.OrderNo = k.Type, h.OrderNo
	res, err := l.retryEnqueue(ctx, func(ctx context.Context) (producer.Result, error) {
		return l.p.Enqueue(ctx, payload)
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", k.Name, ev, err)
	}
	t.Seq, t.Queue = res.Seq, res.Queue
	t.At = time.Since(l.start)
	if t.NewNo != "" {
		ch.old, ch.cur = ch.cur, t.NewNo
	}
	l.mu.Lock()
	l.tasks = append(l.tasks, t)
	l.mu.Unlock()
	return nil
}

// retryEnqueue enqueues until the producer accepts the task or reports it
// already holds it (an earlier attempt got through but its reply was lost,
// e.g. in the Redis restart or a cut of the acceptance's link), for up to
// a minute. It returns the accepted task's result: the existing task's,
// for a duplicate. It counts in l the changes sent again, and those of
// them answered as a duplicate.
func (l *load) retryEnqueue(ctx context.Context, enqueue func(context.Context) (producer.Result, error)) (producer.Result, error) {
	deadline := time.Now().Add(time.Minute)
	backoff := 50 * time.Millisecond
	for try := 0; ; try++ {
		if try == 1 {
			l.resent.Add(1)
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := enqueue(actx)
		cancel()
		var dup *producer.DuplicateError
		switch {
		case err == nil:
			return res, nil
		case errors.As(err, &dup):
			if errors.Is(err, producer.ErrPayloadMismatch) {
				return res, err
			}
			if try > 0 {
				l.resentDup.Add(1)
			}
			return res, nil
		case ctx.Err() != nil:
			return res, context.Cause(ctx)
		case time.Now().After(deadline):
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, context.Cause(ctx)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
