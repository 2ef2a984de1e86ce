package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// asynqmon v0.7.2's UI pastes queue and group names into the URLs of its
// API calls as they are ("/queues/" + qname + ":pause", "/queues/" + qname),
// as it does task IDs (see taskids.go). asynq lists every queue named in its
// set asynq:queues, and anything that can write asynq:* can add one: the
// intake's Redis user, or a raw asynq client with
// asynq.Queue("order_modify/pending_tasks:archive_all#"). The row of that
// queue on asynqmon's home page then turns a click on Pause into
// POST /api/queues/order_modify/pending_tasks:archive_all (the '#' drops
// ":pause"), and a queue "order_modify/pending_tasks:delete_all" turns Delete
// into DELETE /api/queues/order_modify/pending_tasks:delete_all: the very
// requests of "Archive all" and "Delete all" on order_modify, which no server
// can tell from them. A group name (".../groups/" + gname + "/...") has the
// same shape.
//
// So the dashboard knows the queues this deployment defines, the contract's
// queues and their shards under QUEUE_SHARDS (tasks.Shards.AllQueues), and
// around asynqmon's API:
//
//   - it hides every other queue from the API's answers: the elements of a
//     list whose "queue" is not one of them (the home page's queues, a
//     server's active workers, the cluster's queue locations), the keys of
//     the queue_stats answer and of a server's queue_priorities; and answers
//     404 to a GET of such a queue's pages. The UI never sees the name, so it
//     builds no URL from it;
//   - it hides, the same way, every group whose name is not made of
//     groupChars (asynq groups are not part of the contract);
//   - it refuses, with 400 and a JSON error, every write whose queue segment
//     is not one of the deployment's queues or whose group segment is not
//     made of groupChars, and every write outside .../queues/{qname}/...
//     (asynqmon v0.7.2 has none).
//
// The order page's search view lists the hidden queues as suspicious, with
// no action (see unknownQueues), and the first time the guard hides a name it
// logs a warning. The workers serve only the deployment's queues, so a task
// on such a queue is never run; remove the queue with asynq's Inspector or
// CLI ("asynq queue rm").

// Error codes of the writes (and GETs) refused for their queue or group.
const (
	errorCodeUnknownQueue = "unknown_queue"
	errorCodeInvalidGroup = "invalid_group"
)

// groupChars are the characters of a group name the dashboard shows and
// acts on: those of an event ID, none of which a URL reads as structure.
// "." and ".." are refused too, being path segments.
var groupName = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// safeGroup reports whether g is a group name the dashboard shows and acts
// on.
func safeGroup(g string) bool { return groupName.MatchString(g) && g != "." && g != ".." }

// maxNotedNames bounds the hidden names the dashboard remembers having
// logged, so that a flood of planted queues cannot grow its memory.
const maxNotedNames = 256

// queueSet is the queues this deployment defines. It is safe for concurrent
// use.
type queueSet struct {
	known  map[string]bool
	names  string // for messages: "order_modify, order_exchange"
	shards string // QUEUE_SHARDS as read: "1", "3,1"
	log    *zap.Logger

	mu    sync.Mutex
	noted map[string]bool // hidden names already logged
}

// newQueueSet returns the queues of kinds under s; log gets a warning the
// first time a name is hidden.
func newQueueSet(s tasks.Shards, kinds tasks.Table, log *zap.Logger) *queueSet {
	all := s.AllQueues(kinds)
	q := &queueSet{known: make(map[string]bool, len(all)), names: strings.Join(all, ", "), shards: s.String(),
		log: log, noted: map[string]bool{}}
	for _, name := range all {
		q.known[name] = true
	}
	return q
}

// defines reports whether name is one of the deployment's queues.
func (q *queueSet) defines(name string) bool { return q.known[name] }

// note logs, once per name, that the guard hid a queue (what is "queue")
// or a group from asynqmon.
func (q *queueSet) note(what, name string) {
	q.mu.Lock()
	if q.noted[what+"\x00"+name] || len(q.noted) >= maxNotedNames {
		q.mu.Unlock()
		return
	}
	q.noted[what+"\x00"+name] = true
	q.mu.Unlock()
	if what == "queue" {
		q.log.Warn("a queue outside this deployment is hidden from asynqmon and refused in writes; remove it with asynq's CLI if nothing of yours uses it",
			zap.String("queue", quoteName(name)), zap.String("queues", q.names), zap.String("queue_shards", q.shards))
		return
	}
	q.log.Warn("an asynq group with a name outside "+groupName.String()+" is hidden from asynqmon and refused in writes",
		zap.String("group", quoteName(name)))
}

// unknownQueue is the message of a request refused for its queue.
func (q *queueSet) unknownQueue(name string) string {
	return fmt.Sprintf("queue %s is not one this deployment defines (%s, with QUEUE_SHARDS=%s); the dashboard hides it and does nothing to it",
		quoteName(name), q.names, q.shards)
}

func invalidGroup(name string) string {
	return fmt.Sprintf("group %s is not made of A-Z, a-z, 0-9, '_', '.', ':' and '-' (1 to 128 of them); the dashboard hides it and does nothing to it",
		quoteName(name))
}

// quoteName quotes a name in ASCII, cut to 60 bytes, for messages and logs.
func quoteName(name string) string {
	const limit = 60
	if len(name) > limit {
		return strconv.QuoteToASCII(name[:limit]) + "..."
	}
	return strconv.QuoteToASCII(name)
}

// checkNames checks the queue and group segments of a request to asynqmon's
// API: api is the decoded path after the API's prefix ("queues", qname,
// ...). A write must name one of the deployment's queues and, if any, a
// safe group; a GET of a queue's or a group's pages must too. It returns
// nil when the request may go on.
func (q *queueSet) checkNames(method string, api []string) *refusal {
	write := method != "GET" && method != "HEAD"
	if len(api) < 2 || api[0] != "queues" {
		if write {
			return &refusal{400, errorCodeUnknownQueue, "every write of asynqmon's API names a queue: .../api/queues/{queue}..."}
		}
		return nil // the lists (queues, queue_stats, servers, ...) are rewritten instead
	}
	status := 404 // a GET of a hidden queue's page: there is no such queue to see
	if write {
		status = 400
	}
	qname := api[1]
	if write && len(api) == 2 && method == "POST" {
		// POST .../queues/{qname}:pause and :resume
		for _, a := range []string{":pause", ":resume"} {
			if s, ok := strings.CutSuffix(qname, a); ok {
				qname = s
				break
			}
		}
	}
	if !q.defines(qname) {
		return &refusal{status, errorCodeUnknownQueue, q.unknownQueue(qname)}
	}
	if len(api) >= 4 && api[2] == "groups" && !safeGroup(api[3]) {
		return &refusal{status, errorCodeInvalidGroup, invalidGroup(api[3])}
	}
	return nil
}

// hideNames removes, from the JSON value v of a GET answer, what names a
// queue outside the deployment or an unsafe group (see the comment at the
// top), and reports whether it removed anything. stats says v is the answer
// of .../queue_stats, whose "stats" member is keyed by queue name.
func (q *queueSet) hideNames(v any, stats bool) bool {
	changed := false
	if doc, ok := v.(map[string]any); ok && stats {
		if m, ok := doc["stats"].(map[string]any); ok {
			changed = q.dropKeys(m) || changed
		}
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, m := range v {
				if pm, ok := m.(map[string]any); ok && k == "queue_priorities" {
					changed = q.dropKeys(pm) || changed
					continue
				}
				v[k] = walk(m)
			}
			return v
		case []any:
			kept := v[:0]
			for _, m := range v {
				if q.hides(m) {
					changed = true
					continue
				}
				kept = append(kept, walk(m))
			}
			// Zero the tail so the dropped elements are not kept alive.
			clear(v[len(kept):])
			return kept
		}
		return v
	}
	walk(v)
	return changed
}

// hides reports whether the list element v is an object about a queue
// outside the deployment or an unsafe group, and notes the name.
func (q *queueSet) hides(v any) bool {
	obj, ok := v.(map[string]any)
	if !ok {
		return false
	}
	if name, ok := obj["queue"].(string); ok && !q.defines(name) {
		q.note("queue", name)
		return true
	}
	if name, ok := obj["group"].(string); ok && !safeGroup(name) {
		q.note("group", name)
		return true
	}
	return false
}

// dropKeys deletes the members of m not named after one of the
// deployment's queues.
func (q *queueSet) dropKeys(m map[string]any) bool {
	changed := false
	for k := range m {
		if !q.defines(k) {
			q.note("queue", k)
			delete(m, k)
			changed = true
		}
	}
	return changed
}

// maxListedQueues bounds the suspicious queues the order page lists, and
// maxScans the SSCAN calls (of scanCount members each) it makes to find
// them, so that one view costs the same however many queues were planted.
const (
	maxListedQueues = 50
	maxScans        = 10
	scanCount       = 100
)

// unknownQueues returns, sorted, up to maxListedQueues of the queues asynq
// knows (its set of queues, which its Inspector and asynqmon list, read
// with asynqredis) that the deployment does not define, and how many there are in all:
// what the order page lists as suspicious. It costs one pipeline (SCARD and
// a SISMEMBER per queue of the deployment) and, when there are any, at most
// maxScans SSCAN calls; past those it returns the names found so far.
func (q *queueSet) unknownQueues(ctx context.Context, rdb redis.UniversalClient) ([]string, int, error) {
	card, listed, err := asynqredis.Listed(ctx, rdb, slices.Collect(maps.Keys(q.known)))
	if err != nil {
		return nil, 0, err
	}
	total := int(card)
	for _, l := range listed {
		if l {
			total--
		}
	}
	if total <= 0 {
		return nil, 0, nil
	}
	var out []string
	var cursor uint64
	for range maxScans {
		names, next, err := asynqredis.Scan(ctx, rdb, cursor, scanCount)
		if err != nil {
			return nil, 0, err
		}
		for _, name := range names {
			if !q.defines(name) && !slices.Contains(out, name) && len(out) < maxListedQueues {
				out = append(out, name)
			}
		}
		cursor = next
		if cursor == 0 || len(out) == maxListedQueues {
			break
		}
	}
	slices.Sort(out)
	return out, max(total, len(out)), nil
}
