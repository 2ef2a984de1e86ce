package keyorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// A posting to an account: the accounts' postings must apply one at a
// time, in the order they were accepted.
type posting struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Enqueue the postings of an account with a Client, run them with a
// Runner's handler: each account's postings run one at a time, in order,
// each with a fence its store checks. (Compiled, not run: it needs a
// Redis.)
func ExampleRunner() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	c, err := keyorder.NewClient(rdb, keyorder.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	for _, amount := range []int64{100, -30, -50} {
		payload, _ := json.Marshal(posting{Account: "acct-42", Amount: amount})
		if _, err := c.Enqueue(ctx, "acct-42", asynq.NewTask("ledger:post", payload), asynq.Queue("ledger")); err != nil {
			log.Fatal(err)
		}
	}

	r, err := keyorder.NewRunner(rdb, keyorder.RunnerConfig{
		Key: func(t *asynq.Task) (string, error) {
			var p posting
			err := json.Unmarshal(t.Payload(), &p)
			return p.Account, err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	mux := asynq.NewServeMux()
	mux.Handle("ledger:post", r.Handler(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		run, _ := keyorder.RunFrom(ctx)
		// Write with run.Fence: the store refuses a fence older than the
		// newest it has seen for run.Key, wrapping keyorder.ErrStaleFence.
		fmt.Println("posting", run.Pos, "of", run.Key, "under fence", run.Fence)
		return nil
	})))
	srv := asynq.NewServerFromRedisClient(rdb, r.ServerConfig(asynq.Config{Queues: map[string]int{"ledger": 1}}))
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	defer func() {
		r.Stop() // the holds end before their next task
		srv.Shutdown()
	}()
}
