package asynqwire

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Finished returns how many tasks of queues are completed or archived: the
// sizes of their [CompletedKey] and [ArchivedKey] sets, with two ZCARDs per
// queue in one pipeline (on a Cluster, one per master). It is for polling
// during a measurement (tools/bench), where the Inspector's queue summary,
// which also samples memory usage, is too heavy. asynq trims the archive
// (see [ArchivedKey]) and drops a completed task at the end of its
// retention, so the counts are of what is still kept. It returns a wrapped
// Redis error. It is safe for concurrent use.
func Finished(ctx context.Context, rdb redis.UniversalClient, queues []string) (completed, archived int64, err error) {
	var cmds []*redis.IntCmd
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range queues {
			cmds = append(cmds, p.ZCard(ctx, CompletedKey(q)), p.ZCard(ctx, ArchivedKey(q)))
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("asynqwire: count finished tasks: %w", err)
	}
	for i, c := range cmds {
		if i%2 == 0 {
			completed += c.Val()
		} else {
			archived += c.Val()
		}
	}
	return completed, archived, nil
}

// QueuesListed reads asynq's set of queues ([AllQueues]): how many queues
// it lists in all, and for each of names whether it lists it, in one
// pipeline (SCARD and one SISMEMBER per name). It returns a wrapped Redis
// error. It is safe for concurrent use.
func QueuesListed(ctx context.Context, rdb redis.UniversalClient, names []string) (total int64, listed []bool, err error) {
	pipe := rdb.Pipeline()
	card := pipe.SCard(ctx, AllQueues)
	present := make([]*redis.BoolCmd, len(names))
	for i, name := range names {
		present[i] = pipe.SIsMember(ctx, AllQueues, name)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, nil, fmt.Errorf("asynqwire: count asynq's queues (%s): %w", AllQueues, err)
	}
	listed = make([]bool, len(names))
	for i, c := range present {
		listed[i] = c.Val()
	}
	return card.Val(), listed, nil
}

// ScanQueues reads one page of asynq's set of queues ([AllQueues]) with
// SSCAN from cursor (0 to start), asking for about count names; next is 0
// when the scan is complete. A name may come more than once over a scan.
// It returns a wrapped Redis error. It is safe for concurrent use.
func ScanQueues(ctx context.Context, rdb redis.Cmdable, cursor uint64, count int64) (names []string, next uint64, err error) {
	names, next, err = rdb.SScan(ctx, AllQueues, cursor, "", count).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("asynqwire: read asynq's queues (%s): %w", AllQueues, err)
	}
	return names, next, nil
}

// AnyPending reports whether a task waits in the pending list
// ([PendingKey]) of any of queues, with one LLEN per queue in one pipeline
// (on a Cluster, one per master). A drained hold reads it at the end of
// its quantum: when nothing else waits for a worker, the hold goes on. It
// returns a wrapped Redis error. It is safe for concurrent use.
func AnyPending(ctx context.Context, rdb redis.UniversalClient, queues []string) (bool, error) {
	cmds := make([]*redis.IntCmd, 0, len(queues))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range queues {
			cmds = append(cmds, p.LLen(ctx, PendingKey(q)))
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("asynqwire: read pending lists: %w", err)
	}
	for _, c := range cmds {
		if c.Val() > 0 {
			return true, nil
		}
	}
	return false, nil
}
