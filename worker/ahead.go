package worker

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/logging"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// aheadBound is, for a Worker with cfg, how far ahead the task of an order's next change (info, in
// asynq's scheduled or retry set) may be due before the gap check brings
// it forward: Config.MaxScheduleAhead, which no producer with the same
// bound schedules past, or, in the retry set, the longest backoff its
// failures so far can have earned, when that is longer (asynq's
// DefaultRetryDelayFunc, which the worker's failures use, grows as n⁴
// seconds: past 24 h from the 20th failure).
func aheadBound(cfg Config, info *asynq.TaskInfo) time.Duration {
	bound := cfg.MaxScheduleAhead
	if info.State == asynq.TaskStateRetry {
		// Retried is the task message's, which the intake's Redis user
		// may write: no more failures than asynq's default budget count.
		bound = max(bound, backoffCeiling(min(info.Retried, maxTrustedRetried)))
	}
	return bound
}

// maxTrustedRetried bounds the failures aheadBound takes from a task's
// message: asynq's default MaxRetry, above any budget the producer gives
// (keyorder.DefaultMaxRetryWait is its backoff ceiling).
const maxTrustedRetried = 25

// backoffCeiling bounds the delay asynq.DefaultRetryDelayFunc gives for
// n failures or fewer (at most n⁴ + 15 + 29·(n+1) seconds): n⁴ + 15 +
// 30·(n+1) seconds.
func backoffCeiling(n int) time.Duration {
	s := math.Pow(float64(max(n, 0)), 4) + 15 + 30*float64(n+1)
	if s >= float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s) * time.Second
}

// bringForward moves info, the task of the head of te in order orderNo's
// sequence, due later than its bound allows, to the front of its queue,
// and warns: it cannot have come from a producer, and would hold its order
// until then. It returns a wrapped Redis error. A task that moved on
// meanwhile (it ran, or someone moved it) is left alone: it comes, or the
// next gap check sees it again.
func (w *Worker) bringForward(ctx context.Context, orderNo string, te *keyorder.TurnError, info *asynq.TaskInfo, bound time.Duration) error {
	moved, state, err := asynqredis.Forward(ctx, w.rdb, info.Queue, info.ID)
	if err != nil {
		return fmt.Errorf("bring task %s of position %d forward: %w", info.ID, te.Head, err)
	}
	logging.WithTrace(ctx, w.log).Warn("head scheduled further ahead than any producer schedules; brought forward",
		zap.String("order_no", orderNo), zap.Int64("seq", te.Head), zap.String("task_id", info.ID),
		zap.String("queue", info.Queue), zap.String("state", info.State.String()), zap.Time("due", info.NextProcessAt),
		zap.Duration("max_schedule_ahead", bound), zap.Bool("moved", moved), zap.String("found", state))
	return nil
}
