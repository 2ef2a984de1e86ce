package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// MemStore is an order store in memory: a map under a mutex. It
// implements orders.Store and the writes of the two kinds it serves,
// orders.Modifier and orders.Exchanger, and keeps every rule of the
// contract (storetest.Run checks it); because every call runs under one
// mutex an exchange is never half done. A kind added to orderworker adds a
// write interface, not a method here: MemStore compiles unchanged; a
// worker given a kind whose write MemStore lacks refuses to start, so
// this example serves the kinds MemStore has writes for
// (worker.KindsFor).
//
// It is an example: it keeps every order, history entry and applied event
// for as long as the process lives, and forgets them all when it exits. A
// real store keeps its dedupe records for a retention window and its
// history to a cap. MemStore is safe for concurrent use.
type MemStore struct {
	mu     sync.Mutex
	orders map[string]*memOrder
	now    func() time.Time
}

// memOrder is one order with the facts the contract needs besides it.
type memOrder struct {
	o       orders.Order
	fence   int64             // the newest fence that wrote to it; 0 for none
	seq     int64             // the newest position applied in its turn; 0 for none
	events  map[string]record // the events applied to it, by event ID
	history []orders.Entry
}

// record is what an applied event left: enough to answer a repeat.
type record struct {
	request string // the request's type and JSON, to tell a repeat from a reuse
	newNo   string // an exchange's replacement
}

var (
	_ orders.Store     = (*MemStore)(nil)
	_ orders.Modifier  = (*MemStore)(nil)
	_ orders.Exchanger = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{orders: make(map[string]*memOrder), now: func() time.Time { return time.Now().UTC() }}
}

// Get returns the order, ErrInvalid for a malformed number and
// ErrNotFound when there is none.
func (s *MemStore) Get(_ context.Context, orderNo string) (orders.Order, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.Order{}, fmt.Errorf("get: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.orders[orderNo]
	if !ok {
		return orders.Order{}, fmt.Errorf("get %s: %w", orderNo, orders.ErrNotFound)
	}
	return clone(m.o), nil
}

// History returns the page of the order's history after q.After.
func (s *MemStore) History(_ context.Context, orderNo string, q orders.HistoryQuery) (orders.HistoryPage, error) {
	if err := orders.CheckOrderNo(orderNo); err != nil {
		return orders.HistoryPage{}, fmt.Errorf("history: %w", err)
	}
	q = q.WithDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.orders[orderNo]
	if !ok {
		return orders.HistoryPage{}, fmt.Errorf("history %s: %w", orderNo, orders.ErrNotFound)
	}
	i, _ := slices.BinarySearchFunc(m.history, q.After+1, func(e orders.Entry, v int64) int { return cmp.Compare(e.Version, v) })
	end := min(i+q.Limit, len(m.history))
	p := orders.HistoryPage{Entries: slices.Clone(m.history[i:end])}
	if end < len(m.history) {
		p.Next = m.history[end-1].Version
	}
	return p, nil
}

// Put creates or replaces an order, keeping its fence, position and
// events.
func (s *MemStore) Put(ctx context.Context, o orders.Order) error {
	o.Status = cmp.Or(o.Status, orders.StatusActive)
	if err := orders.CheckPut(o); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	w, _ := orders.WriteFrom(ctx) // who puts, if the caller says
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.orders[o.No]
	if !ok {
		m = &memOrder{events: make(map[string]record)}
		s.orders[o.No] = m
	}
	o.Version = m.o.Version + 1
	o.UpdatedAt = s.now()
	o.Items = slices.Clone(o.Items)
	m.o = o
	s.appendEntry(m, orders.Entry{Type: orders.TypePut, Worker: w.Worker, Detail: "put: " + string(o.Status)}, orders.Write{}, false)
	return nil
}

// Modify applies c to an active order once per eventID.
func (s *MemStore) Modify(ctx context.Context, eventID, orderNo string, c orders.Changes) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	if err == nil {
		err = orders.CheckModify(eventID, orderNo, c)
	}
	if err != nil {
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	}
	req := request(orders.TypeModify, c)
	s.mu.Lock()
	defer s.mu.Unlock()
	m, replay, err := s.check(w, eventID, orderNo, req)
	switch {
	case err != nil:
		return orders.Result{}, fmt.Errorf("modify %s: %w", orderNo, err)
	case replay:
		return orders.Result{Order: clone(m.o), Replayed: true}, nil
	}
	if c.Address != nil {
		m.o.Address = *c.Address
	}
	if c.Remark != nil {
		m.o.Remark = *c.Remark
	}
	if c.Items != nil {
		m.o.Items = slices.Clone(c.Items)
	}
	s.applied(m, w, eventID, orders.TypeModify, "modified", record{request: req})
	return orders.Result{Order: clone(m.o)}, nil
}

// Exchange closes an active order as exchanged and creates its
// replacement, once per eventID, in one step.
func (s *MemStore) Exchange(ctx context.Context, eventID, orderNo string, x orders.Exchange) (orders.Result, error) {
	w, err := orders.FencedWrite(ctx)
	newNo := cmp.Or(x.NewOrderNo, tasks.ReplacementOrderNo(orderNo, eventID))
	if err == nil {
		err = orders.CheckExchange(eventID, orderNo, newNo, x)
	}
	if err != nil {
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	}
	req := request(orders.TypeExchange, x)
	s.mu.Lock()
	defer s.mu.Unlock()
	a, replay, err := s.check(w, eventID, orderNo, req)
	switch {
	case err != nil:
		return orders.Result{}, fmt.Errorf("exchange %s: %w", orderNo, err)
	case replay:
		return orders.Result{Order: clone(s.orders[a.events[eventID].newNo].o), Replayed: true}, nil
	}
	if _, taken := s.orders[newNo]; taken {
		return orders.Result{}, fmt.Errorf("exchange %s: replacement order %s exists: %w", orderNo, newNo, orders.ErrConflict)
	}
	a.o.Status, a.o.ExchangedTo = orders.StatusExchanged, newNo
	s.applied(a, w, eventID, orders.TypeExchange, "exchanged to "+newNo+": "+x.Reason, record{request: req, newNo: newNo})
	b := &memOrder{events: make(map[string]record), o: orders.Order{
		No: newNo, Status: orders.StatusActive, Address: a.o.Address, Remark: a.o.Remark,
		Items: slices.Clone(x.Items), ExchangedFrom: orderNo, Version: 1, UpdatedAt: s.now(),
	}}
	s.orders[newNo] = b
	s.appendEntry(b, orders.Entry{EventID: eventID, Type: orders.TypeCreated, Detail: "created from " + orderNo}, w, false)
	return orders.Result{Order: clone(b.o)}, nil
}

// check finds the order of a write and checks the write in the contract's
// order: not found, a repeat (replay) or reuse (conflict) of the event,
// closed, passed, stale.
func (s *MemStore) check(w orders.Write, eventID, orderNo, req string) (m *memOrder, replay bool, err error) {
	m, ok := s.orders[orderNo]
	switch {
	case !ok:
		return nil, false, orders.ErrNotFound
	case m.events[eventID].request == req:
		return m, true, nil
	case m.events[eventID].request != "":
		return nil, false, fmt.Errorf("event %s was applied as another request: %w", eventID, orders.ErrConflict)
	case m.o.Status != orders.StatusActive:
		return nil, false, &orders.ClosedError{OrderNo: orderNo, Status: m.o.Status, ExchangedTo: m.o.ExchangedTo}
	case w.Seq > 0 && w.Seq <= m.seq:
		// WithNewest: the worker learns where the store stands (after a
		// failover of its Redis that lost positions, it writes again
		// above them).
		return nil, false, orders.WithNewest(fmt.Errorf("position %d is not after position %d: %w", w.Seq, m.seq, orders.ErrPassed), m.fence, m.seq)
	case w.Fence < m.fence:
		return nil, false, orders.WithNewest(fmt.Errorf("fence %d is older than %d: %w", w.Fence, m.fence, orders.ErrStaleFence), m.fence, m.seq)
	}
	return m, false, nil
}

// applied records a write that check let through and that changed m.o.
func (s *MemStore) applied(m *memOrder, w orders.Write, eventID, typ, detail string, rec record) {
	m.o.Version++
	m.o.UpdatedAt = s.now()
	m.fence = w.Fence
	inTurn := w.Seq > 0 && !w.SeqOutOfTurn
	if inTurn {
		m.seq = w.Seq
	}
	m.events[eventID] = rec
	s.appendEntry(m, orders.Entry{EventID: eventID, Type: typ, Detail: detail}, w, inTurn)
}

// appendEntry appends e to m's history at m's version, with the write's
// fence, worker and start, and its position when withSeq.
func (s *MemStore) appendEntry(m *memOrder, e orders.Entry, w orders.Write, withSeq bool) {
	e.Fence = w.Fence
	e.Worker = cmp.Or(w.Worker, e.Worker)
	e.EndedAt = m.o.UpdatedAt
	e.StartedAt = w.StartedAt.UTC()
	if w.StartedAt.IsZero() {
		e.StartedAt = e.EndedAt
	}
	e.Version = m.o.Version
	if withSeq {
		e.Seq = w.Seq
	}
	m.history = append(m.history, e)
}

// request is a request's type and JSON: the same event ID must come with
// the same one.
func request(typ string, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // Changes and Exchange always encode
	}
	return typ + " " + string(b)
}

// clone returns o with items of its own, never nil.
func clone(o orders.Order) orders.Order {
	o.Items = append([]orders.Item{}, o.Items...)
	return o
}
