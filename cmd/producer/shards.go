package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/hibiken/asynq"

	"github.com/orderworker/orderworker/tasks"
)

// shardsReport is the answer of "producer shards": where the tasks of the
// queues of a shard setting are placed, for the last step of a change of
// the count (see docs/scaling.md, "Changing the shard count").
type shardsReport struct {
	// Shards is the setting read (QUEUE_SHARDS).
	Shards string `json:"shards"`
	// Queues are the queues of the setting that asynq has.
	Queues []queuePlacement `json:"queues"`
	// Old counts the tasks waiting (pending, active, scheduled or retry)
	// in a placement of a draining count only, not in their order's queue
	// under the count; ArchivedOld the archived ones.
	Old         int `json:"old"`
	ArchivedOld int `json:"archived_old"`
}

// queuePlacement is one queue of a shardsReport.
type queuePlacement struct {
	Queue string `json:"queue"`
	// Waiting counts its tasks pending, active, scheduled or retry; Old
	// those of them placed under a draining count only; ArchivedOld its
	// archived tasks placed so.
	Waiting     int `json:"waiting"`
	Old         int `json:"old"`
	ArchivedOld int `json:"archived_old"`
}

// errNotDrained is returned by checkShards when tasks placed under a
// draining count wait still.
var errNotDrained = errors.New("tasks placed under a draining count wait still")

// checkShards reads every task of every queue of s and kinds (asynq's lists, page by
// page) and counts those that are placed under a draining count of s and
// not under its count: while any waits, the draining counts must stay in
// every worker's setting. It returns the report, and errNotDrained (wrapped)
// when any waits. It reads whole queues, so on a long backlog it is slow;
// and since the workers move tasks while it reads, a task may be missed:
// trust two clean reports in a row.
func checkShards(insp *asynq.Inspector, s tasks.Shards, kinds tasks.Table) (shardsReport, error) {
	rep := shardsReport{Shards: s.String(), Queues: []queuePlacement{}}
	now := tasks.Shards{Count: s.Count}
	known, err := insp.Queues()
	if err != nil {
		return rep, fmt.Errorf("shards: list queues: %w", err)
	}
	lists := []struct {
		list     func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
		archived bool
	}{
		{insp.ListPendingTasks, false}, {insp.ListActiveTasks, false}, {insp.ListScheduledTasks, false},
		{insp.ListRetryTasks, false}, {insp.ListArchivedTasks, true},
	}
	for _, q := range s.AllQueues(kinds) {
		if !slices.Contains(known, q) {
			continue
		}
		qp := queuePlacement{Queue: q}
		for _, l := range lists {
			archived := l.archived
			const size = 1000
			for page := 1; ; page++ {
				infos, err := l.list(q, asynq.PageSize(size), asynq.Page(page))
				if err != nil {
					return rep, fmt.Errorf("shards: list %s: %w", q, err)
				}
				for _, info := range infos {
					old := placedOld(now, kinds, info)
					switch {
					case archived && old:
						qp.ArchivedOld++
					case archived:
					case old:
						qp.Waiting++
						qp.Old++
					default:
						qp.Waiting++
					}
				}
				if len(infos) < size {
					break
				}
			}
		}
		rep.Old += qp.Old
		rep.ArchivedOld += qp.ArchivedOld
		rep.Queues = append(rep.Queues, qp)
	}
	if rep.Old > 0 {
		return rep, fmt.Errorf("shards: %d %w (keep %s in the workers' QUEUE_SHARDS)", rep.Old, errNotDrained, s)
	}
	return rep, nil
}

// placedOld reports whether a task is on a queue that is not its order's
// queue under now: placed there under a draining count. A task whose
// payload does not read as a kind of kinds counts as not old: the workers
// archive it wherever it is.
func placedOld(now tasks.Shards, kinds tasks.Table, info *asynq.TaskInfo) bool {
	k := kinds.Of(info.Type)
	if k == nil {
		return false
	}
	p, err := k.Decode(info.Payload)
	if err != nil {
		return false
	}
	return !now.Accepts(k, p.Header().OrderNo, info.Queue)
}
