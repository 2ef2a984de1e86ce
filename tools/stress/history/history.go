// Package history checks what an order store accepted, write by write,
// rather than counting outcomes: per order, that positions went up in the
// order of acceptance, that fences never went down, that an equal fence
// came only from the same hold of the order's lock, that each event was
// applied once, and that the order ends as the replay of the writes it
// accepted.
//
// Its input is a [History]: every write an order store accepted, per
// order, in the order it accepted them. [FromLog] builds one from the log
// of the reference upstream order API (orderapitest.Handler.Log), and
// [FromEntry] turns an entry of the Redis store's history into a [Write]
// whose body the caller fills in (the Redis store's history has no
// bodies: tools/stress knows them from what it enqueued).
//
// It is part of the lab (tools/stress and its tests); nothing of the
// product imports it.
package history

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/worker/orders"
)

// The kinds of write the checker knows how to replay.
const (
	// KindPut writes a whole order (its seed).
	KindPut = "put"
	// KindModify changes an order's fields.
	KindModify = "modify"
	// KindExchange closes an order; its replacement gets a KindCreated
	// write at the same point.
	KindExchange = "exchange"
	// KindCreated creates the replacement of an exchanged order.
	KindCreated = "created"
)

// Write is one write an order store accepted.
type Write struct {
	// OrderNo is the order written.
	OrderNo string
	// Kind is one of the Kind constants, or another kind's name (which
	// the replay cannot model: a finding of RuleReplay).
	Kind string
	// EventID is the event that made the write; empty for a put.
	EventID string
	// Fence is the fence the write was made under; 0 for a put.
	Fence int64
	// Worker names the writer: with Fence, the hold of the lock.
	Worker string
	// Seq is the position the store recorded; 0 for none (a put, a
	// creation, a write checked out of turn).
	Seq int64
	// Replayed says the store answered the write as a repeat of its
	// event: nothing was applied.
	Replayed bool
	// At is when the write arrived or was applied, for the report.
	At time.Time

	// Put is the order a put wrote (KindPut).
	Put orders.Order
	// Changes are what a modify changed (KindModify).
	Changes orders.Changes
	// Exchange is what an exchange did (KindExchange), with NewOrderNo
	// the replacement's number; its Items are also the created
	// replacement's (KindCreated).
	Exchange orders.Exchange
	// From is the exchanged order a replacement was created from
	// (KindCreated).
	From string
}

func (w Write) String() string {
	s := fmt.Sprintf("%s %s", w.Kind, cmp.Or(w.EventID, "-"))
	if w.Fence != 0 {
		s += fmt.Sprintf(" fence %d by %q", w.Fence, w.Worker)
	}
	if w.Seq != 0 {
		s += fmt.Sprintf(" at position %d", w.Seq)
	}
	return s
}

// History is every write accepted, per order number, each order's in the
// order the store accepted them.
type History map[string][]Write

// The rules of [Check], each a [Finding]'s Rule.
const (
	// RulePosition: an order's recorded positions go up strictly in the
	// order of acceptance.
	RulePosition = "position"
	// RuleFence: an order's fences never go down, from its first write
	// under its own lock (a replacement's creation carries its exchange's
	// fence, and is not compared).
	RuleFence = "fence"
	// RuleHold: an order's write with the same fence as the one before
	// comes from the same hold: the same worker.
	RuleHold = "hold"
	// RuleOnce: each event is applied once (once created, for a
	// replacement), and a repeat answered as a replay was applied
	// before.
	RuleOnce = "once"
	// RuleReplay: the order's final state is the replay of its accepted
	// writes: it starts with a put or a creation, modifies set their
	// fields, an exchange closes it (nothing is applied after), and the
	// replacement starts with the exchanged order's address and remark and
	// the exchange's items.
	RuleReplay = "replay"
)

// Finding is one broken rule.
type Finding struct {
	Rule    string
	OrderNo string
	Detail  string
}

func (f Finding) String() string { return fmt.Sprintf("%s: %s: %s", f.Rule, f.OrderNo, f.Detail) }

// Check checks h against its rules (the Rule constants) and the final
// state of every order it names, final (as the store answers a read now),
// and returns what it found, by order number and then by rule. An order
// in final that h does not name is a finding (RuleReplay) too.
func Check(h History, final map[string]orders.Order) []Finding {
	c := &checker{h: h}
	applied := map[string]map[string][]string{} // event → kind → orders
	for _, no := range slices.Sorted(maps.Keys(h)) {
		var last *Write // the last applied fenced write
		var lastSeq *Write
		for i := range h[no] {
			w := &h[no][i]
			if w.Replayed {
				continue
			}
			if w.EventID != "" {
				m := applied[w.EventID]
				if m == nil {
					m = map[string][]string{}
					applied[w.EventID] = m
				}
				m[w.Kind] = append(m[w.Kind], no)
			}
			if w.Seq > 0 {
				if lastSeq != nil && w.Seq <= lastSeq.Seq {
					c.add(RulePosition, no, "%s accepted after %s", w, lastSeq)
				}
				lastSeq = w
			}
			if w.Fence == 0 || w.Kind == KindCreated {
				// A creation carries its exchange's fence, from the
				// exchanged order's lock; the replacement starts without
				// one (docs/upstream-order-api.md), and its own lock's
				// fences may be lower (another key's counter, or a
				// promoted master whose clock is behind).
				continue
			}
			if last != nil {
				switch {
				case w.Fence < last.Fence:
					c.add(RuleFence, no, "%s accepted after %s", w, last)
				case w.Fence == last.Fence && w.Worker != last.Worker:
					c.add(RuleHold, no, "%s accepted after %s: one fence, two writers", w, last)
				}
			}
			if last == nil || w.Fence >= last.Fence {
				last = w
			}
		}
	}
	for _, ev := range slices.Sorted(maps.Keys(applied)) {
		for _, kind := range slices.Sorted(maps.Keys(applied[ev])) {
			if nos := applied[ev][kind]; len(nos) > 1 {
				c.add(RuleOnce, nos[0], "event %s applied %d times as %s, to %v", ev, len(nos), kind, nos)
			}
		}
	}
	for _, no := range slices.Sorted(maps.Keys(h)) {
		for _, w := range h[no] {
			if w.Replayed && len(applied[w.EventID][w.Kind]) == 0 {
				c.add(RuleOnce, no, "%s answered as a replay of an event never applied", w)
			}
		}
	}
	for _, no := range slices.Sorted(maps.Keys(h)) {
		want, err := c.replay(no, "", 0)
		if err != nil {
			c.add(RuleReplay, no, "%v", err)
			continue
		}
		got, ok := final[no]
		switch {
		case !ok:
			c.add(RuleReplay, no, "the store has no such order; the replay gives %s", describe(want))
		case !same(got, want):
			c.add(RuleReplay, no, "the store has %s, the replay gives %s", describe(got), describe(want))
		}
	}
	for _, no := range slices.Sorted(maps.Keys(final)) {
		if _, ok := h[no]; !ok {
			c.add(RuleReplay, no, "the store has %s, with no write accepted", describe(final[no]))
		}
	}
	slices.SortStableFunc(c.found, func(a, b Finding) int { return cmp.Compare(a.OrderNo, b.OrderNo) })
	return c.found
}

type checker struct {
	h     History
	found []Finding
}

func (c *checker) add(rule, no, format string, args ...any) {
	c.found = append(c.found, Finding{Rule: rule, OrderNo: no, Detail: fmt.Sprintf(format, args...)})
}

// replay returns order no as its accepted writes leave it, up to and
// without the exchange of event until when until is not empty. depth
// bounds the chain of replacements.
func (c *checker) replay(no, until string, depth int) (orders.Order, error) {
	ws := c.h[no]
	if depth > 100 {
		return orders.Order{}, fmt.Errorf("a chain of more than 100 replacements")
	}
	var o orders.Order
	started := false
	for _, w := range ws {
		if w.Replayed {
			continue
		}
		if w.Kind == KindExchange && until != "" && w.EventID == until {
			return o, nil
		}
		if started && o.Status != orders.StatusActive {
			return orders.Order{}, fmt.Errorf("%s applied to the order %s", w, o.Status)
		}
		switch w.Kind {
		case KindPut:
			if started {
				return orders.Order{}, fmt.Errorf("%s after the order's first write", w)
			}
			o = orders.Order{No: no, Status: cmp.Or(w.Put.Status, orders.StatusActive), Address: w.Put.Address, Remark: w.Put.Remark, Items: w.Put.Items}
		case KindCreated:
			if started {
				return orders.Order{}, fmt.Errorf("%s after the order's first write", w)
			}
			from, err := c.replay(w.From, w.EventID, depth+1)
			if err != nil {
				return orders.Order{}, fmt.Errorf("its exchanged order %s: %w", w.From, err)
			}
			o = orders.Order{No: no, Status: orders.StatusActive, Address: from.Address, Remark: from.Remark,
				Items: w.Exchange.Items, ExchangedFrom: w.From}
		case KindModify:
			if !started {
				return orders.Order{}, fmt.Errorf("%s before the order was put or created", w)
			}
			if w.Changes.Address != nil {
				o.Address = *w.Changes.Address
			}
			if w.Changes.Remark != nil {
				o.Remark = *w.Changes.Remark
			}
			if w.Changes.Items != nil {
				o.Items = w.Changes.Items
			}
		case KindExchange:
			if !started {
				return orders.Order{}, fmt.Errorf("%s before the order was put or created", w)
			}
			o.Status, o.ExchangedTo = orders.StatusExchanged, w.Exchange.NewOrderNo
		default:
			return orders.Order{}, fmt.Errorf("%s: a kind the replay does not know", w)
		}
		started = true
	}
	if until != "" {
		return orders.Order{}, fmt.Errorf("no exchange by event %s", until)
	}
	if !started {
		return orders.Order{}, fmt.Errorf("no write accepted")
	}
	return o, nil
}

// same compares the fields that writes set.
func same(a, b orders.Order) bool {
	return a.Status == b.Status && a.Address == b.Address && a.Remark == b.Remark &&
		slices.Equal(a.Items, b.Items) && a.ExchangedTo == b.ExchangedTo && a.ExchangedFrom == b.ExchangedFrom
}

func describe(o orders.Order) string {
	s := fmt.Sprintf("%s, address %q, remark %q, items %v", o.Status, o.Address, o.Remark, o.Items)
	if o.ExchangedTo != "" {
		s += ", exchanged to " + o.ExchangedTo
	}
	if o.ExchangedFrom != "" {
		s += ", exchanged from " + o.ExchangedFrom
	}
	return s
}

// FromEntry is the write of one entry of an order's history in the
// store (orders.Store.History), without its body (Put, Changes,
// Exchange: the caller knows them); ok is false for an entry that is no
// write (a note). A creation's From is left to the caller too.
func FromEntry(no string, e orders.Entry) (w Write, ok bool) {
	w = Write{OrderNo: no, EventID: e.EventID, Fence: e.Fence, Worker: e.Worker, Seq: e.Seq, At: e.EndedAt}
	switch e.Type {
	case orders.TypePut:
		w.Kind = KindPut
	case orders.TypeModify:
		w.Kind = KindModify
	case orders.TypeExchange:
		w.Kind = KindExchange
	case orders.TypeCreated:
		w.Kind = KindCreated
	case orders.TypeNote:
		return Write{}, false
	default:
		w.Kind = e.Type
	}
	return w, true
}

// The bodies of the API's writes (docs/upstream-order-api.md).
type (
	modifyBody struct {
		Address *string       `json:"address"`
		Remark  *string       `json:"remark"`
		Items   []orders.Item `json:"items"`
	}
	exchangeBody struct {
		Items      []orders.Item `json:"items"`
		NewOrderNo string        `json:"new_order_no"`
		Reason     string        `json:"reason"`
	}
)

// FromLog builds the history of what the reference order API accepted
// from its log: its accepted writes, each order's in the log's order
// (which is the store's order of acceptance), an exchange's replacement
// given its creation at the exchange's place. It returns an error for a
// log that dropped records (past orderapitest.MaxLog) or whose accepted
// write's body does not decode.
func FromLog(log orderapitest.Log) (History, error) {
	if log.Dropped > 0 {
		return nil, fmt.Errorf("the log dropped %d writes", log.Dropped)
	}
	h := History{}
	for i, r := range log.Records {
		if !r.Accepted() {
			continue
		}
		w := Write{OrderNo: r.OrderNo, Kind: r.Kind, EventID: r.EventID, Fence: r.Fence, Worker: r.Worker,
			Replayed: r.Replayed, At: r.At}
		if !r.SeqCheck {
			w.Seq = r.Seq
		}
		var err error
		switch r.Kind {
		case orderapitest.KindPut:
			w.Kind = KindPut
			err = json.Unmarshal(r.Body, &w.Put)
		case orderapitest.KindModify:
			w.Kind = KindModify
			var b modifyBody
			err = json.Unmarshal(r.Body, &b)
			w.Changes = orders.Changes(b)
		case orderapitest.KindExchange:
			w.Kind = KindExchange
			var b exchangeBody
			err = json.Unmarshal(r.Body, &b)
			w.Exchange = orders.Exchange(b)
			// The replacement's number as the store chose it.
			w.Exchange.NewOrderNo = r.Order.No
		}
		if err != nil {
			return nil, fmt.Errorf("record %d (%s %s on %s): body: %w", i, r.Kind, r.EventID, r.OrderNo, err)
		}
		h[w.OrderNo] = append(h[w.OrderNo], w)
		if w.Kind == KindExchange {
			c := w
			c.OrderNo, c.Kind, c.Seq, c.From = w.Exchange.NewOrderNo, KindCreated, 0, w.OrderNo
			h[c.OrderNo] = append(h[c.OrderNo], c)
		}
	}
	return h, nil
}
