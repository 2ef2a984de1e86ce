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
