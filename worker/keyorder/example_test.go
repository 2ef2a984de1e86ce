package keyorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

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

// accountOf is the key of a posting's task: its account.
func accountOf(t *asynq.Task) (string, error) {
	var p posting
	err := json.Unmarshal(t.Payload(), &p)
	return p.Account, err
}

// Enqueue the postings of an account with a Client, run them with a
// Runner's handler: each account's postings run one at a time, in order,
// each with a fence its store checks. The Client and the Runner are built
// on one Sequencer, the key space, so that they cannot disagree on it.
// (Compiled, not run: it needs a Redis.)
func ExampleRunner() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	seq, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: "ledger:"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := keyorder.NewClient(seq, keyorder.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	for _, amount := range []int64{100, -30, -50} {
		payload, _ := json.Marshal(posting{Account: "acct-42", Amount: amount})
		if _, err := c.Enqueue(ctx, "acct-42", asynq.NewTask("ledger:post", payload), asynq.Queue("ledger")); err != nil {
			log.Fatal(err)
		}
	}

	r, err := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: accountOf})
	if err != nil {
		log.Fatal(err)
	}
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
		_ = r.Close()
		log.Fatal(err)
	}
	// The whole stop: the holds, then the server, then the Runner.
	defer func() {
		if err := r.Shutdown(srv); err != nil {
			log.Print(err)
		}
	}()
}

// List the accounts whose postings do not move, and why, for an operator:
// the read never scans the keyspace, and a read-only Redis user may run
// it. (Compiled, not run: it needs a Redis.)
func ExampleRunner_Blocked() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	seq, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: "ledger:"})
	if err != nil {
		log.Fatal(err)
	}
	r, err := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: accountOf})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	found, err := r.Blocked(ctx, keyorder.BlockedQuery{Queues: []string{"ledger"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range found.Keys {
		switch b.Reason {
		case keyorder.BlockedFailing:
			fmt.Printf("%s: posting %d failed %d times: %s\n", b.Head.Key, b.Head.Pos, b.Head.Retried, b.Head.LastErr)
		case keyorder.BlockedGap:
			fmt.Printf("%s: posting %d will not come (%s); skipped after the gap wait\n", b.Head.Key, b.Head.Pos, b.Fate)
		default:
			fmt.Printf("%s: %s since %s\n", b.Head.Key, b.Reason, b.Since.Format(time.RFC3339))
		}
	}
	if found.Truncated {
		fmt.Println("more tasks wait than were read: the list may miss some")
	}
}
