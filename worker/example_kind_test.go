package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/orderworker/orderworker/worker/workertest"
)

// giftWrapKind is a kind of the program's own, order:gift-wrap: wrap an
// order as a gift, with a note. It is made as the contract's kinds are,
// and handed to the producer in producer.Config.Kinds.
var giftWrapKind = tasks.NewKind[giftWrapPayload]("order:gift-wrap", "gift-wrap", "order_gift_wraps", 1)

// giftWrapPayload is the payload of giftWrapKind. Seq is its last field,
// as in the contract's payloads (the producer appends the position to the
// JSON).
type giftWrapPayload struct {
	EventID string              `json:"event_id"`
	OrderNo string              `json:"order_no"`
	Note    string              `json:"note"`
	Trace   *tasks.TraceContext `json:"trace,omitempty"`
	Seq     int64               `json:"seq,omitempty"`
}

func (p giftWrapPayload) Kind() *tasks.Kind { return giftWrapKind }

func (p giftWrapPayload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}

func (p giftWrapPayload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}

func (p giftWrapPayload) Validate() error {
	if !tasks.ValidEventID(p.EventID) || !tasks.ValidOrderNo(p.OrderNo) || p.Note == "" {
		return fmt.Errorf("%w: a gift wrap needs an event ID, an order number and a note: %w", tasks.ErrInvalid, asynq.SkipRetry)
	}
	return nil
}

// giftWrapper is the store write of giftWrapKind, an interface of the
// program's own: the worker's entry asks its store for it.
type giftWrapper interface {
	WrapGift(ctx context.Context, eventID, orderNo, note string) error
}

// giftStore is the program's order store, in memory: it keeps the gift
// note of each order, written under the fence of the order's lock. (The
// example's store has no orders to Get; a real one keeps the rules of
// orders.Store.)
type giftStore struct {
	mu     sync.Mutex
	notes  map[string]string
	fences map[string]int64 // the newest fence of each order
}

func (s *giftStore) WrapGift(ctx context.Context, eventID, orderNo, note string) error {
	w, err := orders.FencedWrite(ctx) // the fence of the order's lock
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Fence < s.fences[orderNo] {
		return orders.ErrStaleFence // a newer holder of the lock wrote since
	}
	s.fences[orderNo], s.notes[orderNo] = w.Fence, note
	return nil
}

func (s *giftStore) Get(context.Context, string) (orders.Order, error) {
	return orders.Order{}, orders.ErrNotFound
}

func (s *giftStore) History(context.Context, string, orders.HistoryQuery) (orders.HistoryPage, error) {
	return orders.HistoryPage{}, orders.ErrNotFound
}

func (s *giftStore) Put(context.Context, orders.Order) error {
	return errors.New("giftStore: keeps gift notes only")
}

// The worker's entry of a kind of the program's own, with a store write of
// its own: NewKind joins the payload type and the write, and the compiler
// checks the handler's types. The handler runs inside the order's lock, in
// its turn, with the fence in ctx. Here workertest runs one task through
// the entry with the Worker's rules, without Redis; a Worker takes the
// same entry in worker.Config.Kinds, with the producer given giftWrapKind
// in producer.Config.Kinds.
func ExampleNewKind() {
	giftWrap := worker.NewKind(worker.Wait{}, func(ctx context.Context, store giftWrapper, p giftWrapPayload) error {
		return store.WrapGift(ctx, p.EventID, p.OrderNo, p.Note)
	})

	store := &giftStore{notes: map[string]string{}, fences: map[string]int64{}}
	w, err := workertest.New(store, workertest.Config{Kinds: []worker.Kind{giftWrap}})
	if err != nil {
		log.Fatal(err)
	}
	res := w.Work(context.Background(), giftWrapPayload{EventID: "crm-41", OrderNo: "SO1", Note: "Happy birthday!", Seq: 1})
	fmt.Println(res.Outcome, res.Mode, store.notes["SO1"])

	// A payload its Validate refuses is rejected before the store.
	res = w.Work(context.Background(), giftWrapPayload{EventID: "crm-42", OrderNo: "SO1", Seq: 2})
	fmt.Println(res.Outcome, errors.Is(res.Err, tasks.ErrInvalid))

	// A store without the write is refused at start, naming the kind and
	// the interface, as worker.New refuses it.
	_, err = workertest.New(noGiftStore{store}, workertest.Config{Kinds: []worker.Kind{giftWrap}})
	fmt.Println(errors.Is(err, worker.ErrNoWrite))
	// Output:
	// ok turn Happy birthday!
	// rejected true
	// true
}

// noGiftStore is an order store without the gift wrap's write.
type noGiftStore struct{ orders.Store }
