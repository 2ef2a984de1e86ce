package tasks

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
)

// MaxShards is the largest shard count: far above any sensible one (a few
// per Redis Cluster master), and a bound on the queues a worker serves and
// on the values of its metrics' queue label.
const MaxShards = 64

// ShardSep separates a kind's queue from the shard number in a shard
// queue's name: "order_modify:2". See [Kind.ShardQueue] for why a colon.
const ShardSep = ":"

// ShardOf returns the shard of order orderNo among count shards: the
// CRC-32 of the order number modulo count, 0 when count is 1 or less.
//
// The CRC-32 is the common one (IEEE 802.3, polynomial 0x04C11DB7,
// reflected, initial value and final XOR 0xFFFFFFFF), computed over the
// order number's bytes (an order number is ASCII) and read as an unsigned
// 32-bit number: Go's hash/crc32.ChecksumIEEE, Java's java.util.zip.CRC32,
// Python's zlib.crc32, PHP's crc32, MySQL's CRC32(). For example
// CRC-32("SO1001") is 52386047, so with 3 shards SO1001 is in shard
// 52386047 mod 3 = 2.
func ShardOf(orderNo string, count int) int {
	if count <= 1 {
		return 0
	}
	return int(crc32String(orderNo) % uint32(count))
}

// ieee is the table of the IEEE CRC-32.
var ieee = crc32.MakeTable(crc32.IEEE)

// crc32String is crc32.ChecksumIEEE([]byte(s)) without the copy to the
// heap that the conversion costs (order numbers are at most 64 bytes).
func crc32String(s string) uint32 {
	crc := ^uint32(0)
	for i := 0; i < len(s); i++ {
		crc = ieee[byte(crc)^s[i]] ^ crc>>8
	}
	return ^crc
}

// ShardQueue returns the name of shard i of the kind's queue among count
// shards: the kind's own queue when count is 1 or less (so a deployment
// without sharding keeps its queue names), else the queue, a colon and the
// shard number: "order_modify:0", "order_modify:1", "order_modify:2".
//
// asynq keeps a queue's keys in one Redis Cluster hash slot, the slot of
// the queue's name (every key of a queue carries the name as its hash tag,
// "{<queue>}"; package tasks spells no key of asynq's). The colon form
// puts the three shards of each kind into the three thirds of the slot
// range (order_modify:0, :1, :2 in slots 9427, 13554, 1169;
// order_exchange:0, :1, :2 in 9686, 13815, 1428), so on a cluster whose
// slots are split evenly over 3 masters each master gets one shard of
// each kind. The form with a dot, "order_modify.0", would put shards 0 and
// 1 on one master (slots 11108 and 15173).
func (k *Kind) ShardQueue(i, count int) string {
	if count <= 1 {
		return k.Queue
	}
	return k.Queue + ShardSep + strconv.Itoa(i)
}

// QueueFor returns the queue a task of the kind for order orderNo goes to
// when the kind is spread over count queues: shard [ShardOf] of
// [Kind.ShardQueue]. With count 1 or less it is the kind's queue.
func (k *Kind) QueueFor(orderNo string, count int) string {
	return k.ShardQueue(ShardOf(orderNo, count), count)
}

// ShardQueues returns the kind's count queues, shard 0 first: the kind's
// queue alone when count is 1 or less.
func (k *Kind) ShardQueues(count int) []string {
	count = max(count, 1)
	out := make([]string, count)
	for i := range count {
		out[i] = k.ShardQueue(i, count)
	}
	return out
}

// Shards says over how many queues each kind's tasks are spread (the same
// count for every kind), by a stable hash of the order number (see
// [ShardOf]), so that all the tasks of one order are in one queue.
//
// Count is the shard count tasks are placed by. Draining lists earlier
// counts during a change of the count: tasks placed under them may still
// wait in their queues, so workers serve those queues too and accept the
// tasks there, and lookups of a task (the workers' gap check, the order
// status, the producer's duplicate check) look there too. Drop them once
// those tasks are gone (see docs/scaling.md, "Changing the shard count").
//
// The zero value, like Count 1, is one queue per kind, the kinds' own
// queues. Every process (producers, the intake, the CLI, workers and the
// dashboard) must be given the same Shards. A Shards is a value; its
// methods are safe for concurrent use.
type Shards struct {
	// Count is the shard count tasks are placed by, 1 to MaxShards; 0
	// means 1.
	Count int
	// Draining are earlier shard counts whose tasks may still be queued,
	// each 1 to MaxShards. Defaults to none.
	Draining []int
}

// ErrShards is matched by the errors of [ParseShards] and
// [Shards.Validate].
var ErrShards = errors.New("tasks: bad shard count")

// ParseShards reads a shard setting: the count ("3"), then, comma
// separated, the counts that drain ("3,1" while tasks placed with one
// queue per kind drain). Spaces around the numbers are ignored. It returns
// an error matching [ErrShards] for anything else, or for a count outside
// 1..MaxShards.
func ParseShards(s string) (Shards, error) {
	var out Shards
	for i, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil {
			return Shards{}, fmt.Errorf("%w: %q: want a count, then the counts that drain, e.g. 3 or 3,1", ErrShards, s)
		}
		if i == 0 {
			out.Count = n
		} else {
			out.Draining = append(out.Draining, n)
		}
	}
	if out.Count == 0 {
		return Shards{}, fmt.Errorf("%w: 0 is not between 1 and %d", ErrShards, MaxShards)
	}
	if err := out.Validate(); err != nil {
		return Shards{}, err
	}
	return out, nil
}

// Validate reports a count outside 1..MaxShards (a zero Count means 1),
// with an error matching [ErrShards].
func (s Shards) Validate() error {
	for i, n := range append([]int{s.Count}, s.Draining...) {
		if n < 1 && !(i == 0 && n == 0) || n > MaxShards {
			return fmt.Errorf("%w: %d is not between 1 and %d", ErrShards, n, MaxShards)
		}
	}
	return nil
}

// String writes s as [ParseShards] reads it: "3", "3,1".
func (s Shards) String() string {
	parts := make([]string, 0, 1+len(s.Draining))
	for _, n := range s.Counts() {
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, ",")
}

// Counts returns Count (1 for 0), then the Draining counts other than it,
// each once, in their order.
func (s Shards) Counts() []int {
	out := []int{max(s.Count, 1)}
	for _, n := range s.Draining {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Placements returns the queues where a task of kind k for order orderNo
// may be: its queue under Count first (where a task goes now), then its
// queue under each draining count, each queue once.
func (s Shards) Placements(k *Kind, orderNo string) []string {
	var out []string
	for _, n := range s.Counts() {
		if q := k.QueueFor(orderNo, n); !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	return out
}

// Accepts reports whether queue is one of [Shards.Placements] of a task of
// kind k for order orderNo, without allocating: the check a worker makes
// on every task.
func (s Shards) Accepts(k *Kind, orderNo, queue string) bool {
	shard, ok := k.shardOf(queue)
	if !ok {
		return false
	}
	placed := func(n int) bool {
		if n <= 1 {
			return shard == -1
		}
		return shard >= 0 && shard == ShardOf(orderNo, n)
	}
	if placed(s.Count) {
		return true
	}
	for _, n := range s.Draining {
		if placed(n) {
			return true
		}
	}
	return false
}

// Queues returns every queue of kind k under Count and the draining
// counts, each once: the queues a worker serves for the kind.
func (s Shards) Queues(k *Kind) []string {
	var out []string
	for _, n := range s.Counts() {
		for _, q := range k.ShardQueues(n) {
			if !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
	}
	return out
}

// AllQueues returns [Shards.Queues] of every kind of t (the configured
// kinds, usually [Kinds] or a producer's or worker's Config.Kinds), in
// t's order.
func (s Shards) AllQueues(t Table) []string {
	var out []string
	for _, k := range t {
		out = append(out, s.Queues(k)...)
	}
	return out
}

// shardOf reads queue as the kind's own queue (shard -1) or one of its
// shard queues (shard numbers below MaxShards); ok is false for any other
// queue.
func (k *Kind) shardOf(queue string) (shard int, ok bool) {
	base, num, sharded := strings.Cut(queue, ShardSep)
	switch {
	case base != k.Queue:
		return 0, false
	case !sharded:
		return -1, true
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n >= MaxShards || strconv.Itoa(n) != num {
		return 0, false
	}
	return n, true
}
