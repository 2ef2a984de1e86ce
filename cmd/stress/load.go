package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/orderworker/orderworker/internal/orders"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/redis/go-redis/v9"
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
}

// chain is one seeded order and the replacements exchanges made of it. Its
// modifies go to the newest number the load has seen created: a modify
// enqueued before an exchange of its order and run after it is rejected
// (archived, "is exchanged"), which the checks accept. Until an exchange
// has been seen applied, the chain gets no further tasks (unless ten picks
// in a row found only such chains).
type chain struct {
	cur     string // the number modifies go to
	pending string // the replacement an enqueued exchange will create
	n       int    // exchanges enqueued so far
	checked time.Time
}

// load seeds the orders and enqueues the task mix.
type load struct {
	p      *producer.Producer
	rdb    redis.UniversalClient
	c      settings
	rng    *rand.Rand
	chains []*chain
	tasks  []enqueued
}

func newLoad(p *producer.Producer, rdb redis.UniversalClient, c settings) *load {
	l := &load{p: p, rdb: rdb, c: c, rng: rand.New(rand.NewPCG(uint64(c.Seed), 1))}
	for i := range c.Orders {
		l.chains = append(l.chains, &chain{cur: fmt.Sprintf("S%02d", i)})
	}
	return l
}

func (l *load) seed(ctx context.Context, store orders.Store) error {
	for _, ch := range l.chains {
		err := store.Put(ctx, orders.Order{No: ch.cur, Address: "seeded", Remark: "", Items: []orders.Item{{SKU: "A", Qty: 1}}})
		if err != nil {
			return fmt.Errorf("seed %s: %w", ch.cur, err)
		}
	}
	return nil
}

func (l *load) count(typ string) int {
	n := 0
	for _, t := range l.tasks {
		if t.Type == typ {
			n++
		}
	}
	return n
}

// run enqueues c.Tasks tasks evenly over d.
func (l *load) run(ctx context.Context, d time.Duration) error {
	start := time.Now()
	for i := range l.c.Tasks {
		at := start.Add(time.Duration(int64(d) * int64(i) / int64(l.c.Tasks)))
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(wait):
			}
		}
		if err := l.next(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// next enqueues task i of the mix.
func (l *load) next(ctx context.Context, i int) error {
	// A chain whose exchange has not been seen applied yet gets no
	// modifies: they would most likely find its order closed.
	ch := l.chains[l.rng.IntN(len(l.chains))]
	for range 10 {
		if l.advance(ctx, ch); ch.pending == "" {
			break
		}
		ch = l.chains[l.rng.IntN(len(l.chains))]
	}
	ev := "ev-" + strconv.Itoa(i)
	if ch.pending == "" && l.rng.IntN(1000) < l.c.ExchangesPerK {
		ch.n++
		base := ch.cur
		if j := strings.Index(base, "-X"); j >= 0 {
			base = base[:j]
		}
		newNo := base + "-X" + strconv.Itoa(ch.n)
		payload := tasks.ExchangePayload{EventID: ev, OrderNo: ch.cur, Items: []tasks.Item{{SKU: "B" + strconv.Itoa(i), Qty: 1 + i%5}},
			NewOrderNo: newNo, Reason: "stress"}
		err := retryEnqueue(ctx, func(ctx context.Context) (producer.Result, error) {
			return l.p.Enqueue(ctx, payload)
		})
		if err != nil {
			return fmt.Errorf("exchange %s: %w", ev, err)
		}
		l.tasks = append(l.tasks, enqueued{EventID: ev, Type: taskExchange, Queue: tasks.QueueExchange, OrderNo: ch.cur, NewNo: newNo})
		ch.pending = newNo
		return nil
	}
	var changes tasks.Changes
	switch i % 3 {
	case 0:
		a := "address " + strconv.Itoa(i)
		changes.Address = &a
	case 1:
		r := "remark " + strconv.Itoa(i)
		changes.Remark = &r
	default:
		changes.Items = []tasks.Item{{SKU: "A", Qty: 1 + i%7}, {SKU: "C" + strconv.Itoa(i%11), Qty: 1}}
	}
	payload := tasks.ModifyPayload{EventID: ev, OrderNo: ch.cur, Changes: changes}
	err := retryEnqueue(ctx, func(ctx context.Context) (producer.Result, error) {
		return l.p.Enqueue(ctx, payload)
	})
	if err != nil {
		return fmt.Errorf("modify %s: %w", ev, err)
	}
	l.tasks = append(l.tasks, enqueued{EventID: ev, Type: taskModify, Queue: tasks.QueueModify, OrderNo: ch.cur})
	return nil
}

// advance moves a chain to its replacement once that exists (checked at
// most every 200 ms per chain).
func (l *load) advance(ctx context.Context, ch *chain) {
	if ch.pending == "" || time.Since(ch.checked) < 200*time.Millisecond {
		return
	}
	ch.checked = time.Now()
	n, err := l.rdb.Exists(ctx, prefix+"order:{"+ch.pending+"}").Result()
	if err == nil && n == 1 {
		ch.cur, ch.pending = ch.pending, ""
	}
}

// retryEnqueue enqueues until the producer accepts the task or reports it
// already holds it (an earlier attempt got through but its reply was lost,
// e.g. in the Redis restart), for up to a minute.
func retryEnqueue(ctx context.Context, enqueue func(context.Context) (producer.Result, error)) error {
	deadline := time.Now().Add(time.Minute)
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := enqueue(actx)
		cancel()
		var dup *producer.DuplicateError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &dup):
			if errors.Is(err, producer.ErrPayloadMismatch) {
				return err
			}
			return nil
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case time.Now().After(deadline):
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
