package producer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

func ExampleProducer_EnqueueModify() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()

	p, err := producer.New(rdb, producer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	changes := tasks.Changes{Address: new("1 Main St, Springfield")}
	res, err := p.EnqueueModify(ctx, "SO123", changes, producer.WithEventID("crm-7f3a9c"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Queue, res.TaskID)

	// Sending the same event again, say after a timeout, is safe: it is
	// refused as a duplicate and runs only once.
	_, err = p.EnqueueModify(ctx, "SO123", changes, producer.WithEventID("crm-7f3a9c"))
	fmt.Println(errors.Is(err, producer.ErrDuplicate), errors.Is(err, producer.ErrPayloadMismatch))

	// Reusing the event ID for a different change is a bug upstream.
	_, err = p.EnqueueModify(ctx, "SO123", tasks.Changes{Remark: new("ring twice")}, producer.WithEventID("crm-7f3a9c"))
	fmt.Println(errors.Is(err, producer.ErrDuplicate), errors.Is(err, producer.ErrPayloadMismatch))

	// A payload that breaks the contract is refused before anything is sent.
	_, err = p.EnqueueModify(ctx, "SO 123", changes)
	fmt.Println(err, errors.Is(err, tasks.ErrInvalid))
	// Output:
	// order_modify crm-7f3a9c
	// true false
	// true true
	// order_no: must contain only A-Z, a-z, 0-9, '_' and '-', got "SO 123" true
}

func ExampleProducer_EnqueueExchange() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()

	p, err := producer.New(rdb, producer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	items := []tasks.Item{{SKU: "SHIRT-M", Qty: 1}}
	res, err := p.EnqueueExchange(ctx, "SO123", items,
		producer.WithEventID("crm-7f3a9d"),
		producer.WithNewOrderNo("SO123-X1"),
		producer.WithReason("wrong size"),
	)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Queue, res.TaskID, res.EventID)
	// Output:
	// order_exchange crm-7f3a9d crm-7f3a9d
}

// exampleRedis is an in-process Redis for the examples, so they run anywhere.
var exampleRedis struct {
	mu sync.Mutex
	m  *miniredis.Miniredis
}

// redisAddr returns the address of an empty Redis for an example. A program
// would use its own, such as "localhost:6379".
func redisAddr() string {
	exampleRedis.mu.Lock()
	defer exampleRedis.mu.Unlock()
	if exampleRedis.m == nil {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			panic(err)
		}
		exampleRedis.m = m
	}
	exampleRedis.m.FlushAll()
	return exampleRedis.m.Addr()
}

func stopExampleRedis() {
	exampleRedis.mu.Lock()
	defer exampleRedis.mu.Unlock()
	if exampleRedis.m != nil {
		exampleRedis.m.Close()
		exampleRedis.m = nil
	}
}
