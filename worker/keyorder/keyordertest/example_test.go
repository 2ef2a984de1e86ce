package keyordertest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
)

// fences is a store that refuses a fence older than the newest it has
// seen for a key, as a store under a Runner must.
type fences map[string]int64

func (f fences) write(key string, fence int64) error {
	if fence < f[key] {
		return fmt.Errorf("write of %s with fence %d: %w", key, fence, keyorder.ErrStaleFence)
	}
	f[key] = fence
	return nil
}

// post is the handler under test: it reads its run and writes with the
// run's fence.
func post(store fences) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		run, ok := keyorder.RunFrom(ctx)
		if !ok {
			return errors.New("not run by a keyorder Runner")
		}
		return store.write(run.Key, run.Fence)
	}
}

// Run a handler with a Run of your choosing, without asynq or Redis: here,
// a stale fence is refused.
func ExampleRun() {
	ctx := context.Background()
	store := fences{}
	task := asynq.NewTask("ledger:post", []byte(`{"account":"acct-42"}`))

	run, err := keyordertest.Run(ctx, post(store), task, keyorder.Run{Key: "acct-42", Fence: 7})
	fmt.Println(run.Key, run.Pos, run.Fence, run.Mode, err)

	_, err = keyordertest.Run(ctx, post(store), task, keyorder.Run{Key: "acct-42", Fence: 6})
	fmt.Println(errors.Is(err, keyorder.ErrStaleFence))
	// Output:
	// acct-42 1 7 turn <nil>
	// true
}
