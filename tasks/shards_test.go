package tasks_test

import (
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redisproc"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// TestShardOfGolden pins the shard hash: systems that enqueue by hand
// compute it themselves (docs/scaling.md's placement rule gives these
// values), so it must never
// change. The CRC-32 values are what Python's zlib.crc32 and Java's
// java.util.zip.CRC32 give for the same bytes.
func TestShardOfGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		orderNo  string
		crc      uint32
		of2, of3 int
		of4, of8 int
		queue3   string
	}{
		{"SO1001", 52386047, 1, 2, 3, 7, "order_modify:2"},
		{"SO1002", 2585135429, 1, 2, 1, 5, "order_modify:2"},
		{"SO1003", 3977329107, 1, 0, 3, 3, "order_modify:0"},
		{"SO123", 233812141, 1, 1, 1, 5, "order_modify:1"},
		{"SO2001", 296417041, 1, 1, 1, 1, "order_modify:1"},
		{"order-7", 164682458, 0, 2, 2, 2, "order_modify:2"},
		{"SO123-X1", 3921167528, 0, 2, 0, 0, "order_modify:2"},
	}
	for _, tt := range tests {
		t.Run(tt.orderNo, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.crc, crc32.ChecksumIEEE([]byte(tt.orderNo)), "the table itself")
			assert.Equal(t, int(tt.crc%3), tt.of3, "the table itself")
			assert.Equal(t, 0, tasks.ShardOf(tt.orderNo, 1))
			assert.Equal(t, 0, tasks.ShardOf(tt.orderNo, 0))
			assert.Equal(t, tt.of2, tasks.ShardOf(tt.orderNo, 2))
			assert.Equal(t, tt.of3, tasks.ShardOf(tt.orderNo, 3))
			assert.Equal(t, tt.of4, tasks.ShardOf(tt.orderNo, 4))
			assert.Equal(t, tt.of8, tasks.ShardOf(tt.orderNo, 8))
			assert.Equal(t, tt.queue3, tasks.Modify.QueueFor(tt.orderNo, 3), "as docs/scaling.md spells it")
			// Every kind's: its queue, a colon and the shard.
			for _, k := range tasks.Kinds() {
				assert.Equal(t, k.Queue+":"+strconv.Itoa(tt.of3), k.QueueFor(tt.orderNo, 3), k.Type)
			}
		})
	}
}

func TestOneShardKeepsTheQueueNames(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "order_modify", tasks.Modify.QueueFor("SO1001", 1))
	var zero tasks.Shards
	var own []string // every kind's own queue, in the table's order
	for _, k := range tasks.Kinds() {
		for _, count := range []int{0, 1} {
			assert.Equal(t, k.Queue, k.QueueFor("SO1001", count), k.Type)
			assert.Equal(t, []string{k.Queue}, k.ShardQueues(count), k.Type)
		}
		assert.Equal(t, []string{k.Queue}, zero.Placements(k, "SO1"), k.Type)
		own = append(own, k.Queue)
	}
	assert.Equal(t, own, zero.AllQueues(tasks.Kinds()))
	assert.Equal(t, "1", zero.String())
}

func TestShardQueues(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []string{"order_modify:0", "order_modify:1", "order_modify:2"}, tasks.Modify.ShardQueues(3))
	s := tasks.Shards{Count: 3, Draining: []int{1}}
	assert.Equal(t, []string{"order_modify:0", "order_modify:1", "order_modify:2", "order_modify"}, s.Queues(tasks.Modify))
	assert.Equal(t, []string{"order_modify:2", "order_modify"}, s.Placements(tasks.Modify, "SO1001"))
	// Shrinking: 2 shards while 3 drain; the shard of an order may stay.
	s = tasks.Shards{Count: 2, Draining: []int{3, 2}}
	assert.Equal(t, []int{2, 3}, s.Counts())
	assert.Equal(t, []string{"order_modify:0", "order_modify:1", "order_modify:2"}, s.Queues(tasks.Modify))
	assert.Equal(t, []string{"order_modify:1", "order_modify:2"}, s.Placements(tasks.Modify, "SO1001"))
	assert.Equal(t, []string{"order_modify:1"}, s.Placements(tasks.Modify, "SO123"))
	assert.Equal(t, "2,3", s.String())
}

func TestShardsAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		shards tasks.Shards
		kind   *tasks.Kind
		queue  string
		want   bool
	}{
		{"one queue", tasks.Shards{}, tasks.Modify, "order_modify", true},
		{"one queue, a shard", tasks.Shards{}, tasks.Modify, "order_modify:0", false},
		{"one queue, another kind", tasks.Shards{}, tasks.Modify, "order_exchange", false},
		{"its shard", tasks.Shards{Count: 3}, tasks.Modify, "order_modify:2", true},
		{"another shard", tasks.Shards{Count: 3}, tasks.Modify, "order_modify:1", false},
		{"the unsharded queue", tasks.Shards{Count: 3}, tasks.Modify, "order_modify", false},
		{"its shard of another kind", tasks.Shards{Count: 3}, tasks.Modify, "order_exchange:2", false},
		{"the unsharded queue, draining", tasks.Shards{Count: 3, Draining: []int{1}}, tasks.Modify, "order_modify", true},
		{"its shard of a draining count", tasks.Shards{Count: 2, Draining: []int{3}}, tasks.Modify, "order_modify:2", true},
		{"its shard now", tasks.Shards{Count: 2, Draining: []int{3}}, tasks.Modify, "order_modify:1", true},
		{"no shard of either", tasks.Shards{Count: 2, Draining: []int{3}}, tasks.Modify, "order_modify:0", false},
		{"not a queue of the contract", tasks.Shards{Count: 3}, tasks.Modify, "order_modify:x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// SO1001: CRC-32 52386047, shard 1 of 2, 2 of 3.
			assert.Equal(t, tt.want, tt.shards.Accepts(tt.kind, "SO1001", tt.queue))
			assert.Equal(t, tt.want, slices.Contains(tt.shards.Placements(tt.kind, "SO1001"), tt.queue), "agrees with Placements")
		})
	}
}

// The worker checks every task's queue: the check allocates nothing. (Not
// parallel: AllocsPerRun refuses to run beside other tests.)
func TestShardsAcceptsAllocatesNothing(t *testing.T) {
	s := tasks.Shards{Count: 3, Draining: []int{1}}
	allocs := testing.AllocsPerRun(100, func() { s.Accepts(tasks.Modify, "SO1001", "order_modify:1") })
	assert.Zero(t, allocs)
}

// FuzzShardOf checks the allocation-free CRC-32 against the standard
// library's for any order number.
func FuzzShardOf(f *testing.F) {
	f.Add("SO1001")
	f.Add("")
	f.Fuzz(func(t *testing.T, no string) {
		want := int(crc32.ChecksumIEEE([]byte(no)) % 7)
		if got := tasks.ShardOf(no, 7); got != want {
			t.Fatalf("ShardOf(%q, 7) = %d, want %d", no, got, want)
		}
	})
}

func TestTableOfQueue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		queue string
		want  *tasks.Kind
	}{
		{"order_modify", tasks.Modify},
		{"order_modify:0", tasks.Modify},
		{"order_exchange:63", tasks.Exchange},
		{"order_exchange:64", nil},
		{"order_modify:01", nil},
		{"order_modify:-1", nil},
		{"order_modify:", nil},
		{"order_modify.1", nil},
		{"default", nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tasks.Kinds().OfQueue(tt.queue), tt.queue)
	}
}

func TestParseShards(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want tasks.Shards
	}{
		{"1", tasks.Shards{Count: 1}},
		{"3", tasks.Shards{Count: 3}},
		{" 3 , 1 ", tasks.Shards{Count: 3, Draining: []int{1}}},
		{"2,3,1", tasks.Shards{Count: 2, Draining: []int{3, 1}}},
		{"64", tasks.Shards{Count: 64}},
	}
	for _, tt := range good {
		got, err := tasks.ParseShards(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
	for _, in := range []string{"", "0", "65", "-1", "3,", "3,0", "x", "3;1"} {
		_, err := tasks.ParseShards(in)
		assert.ErrorIs(t, err, tasks.ErrShards, in)
	}
	assert.NoError(t, tasks.Shards{}.Validate())
	assert.ErrorIs(t, tasks.Shards{Count: 2, Draining: []int{0}}.Validate(), tasks.ErrShards)
}

// TestShardsSpreadOverThreeMasters checks the claim of Kind.ShardQueue:
// on a cluster whose 16384 slots are split evenly over 3 masters (as
// redis-cli --cluster create and redisproc split them), the 3 shard
// queues of each kind, whose asynq keys are all tagged with the queue
// name, land on 3 different masters. The worker's cluster test checks it
// on a real cluster with CLUSTER KEYSLOT. Whether they do depends on the
// queue's name (about one name in five spreads), so a new kind's queue is
// named to pass it: docs/adding-a-task-type.md.
func TestShardsSpreadOverThreeMasters(t *testing.T) {
	t.Parallel()
	for _, k := range tasks.Kinds() {
		assert.True(t, spreads(k.Queue), "the 3 shard queues of %s (queue %s) do not land on 3 different masters of 3: name its queue otherwise (docs/adding-a-task-type.md)", k.Type, k.Queue)
	}
	// The queue names the docs give as examples.
	assert.True(t, spreads("order_cancels"), "docs/adding-a-task-type.md's example")
	assert.False(t, spreads("order_cancel"), "a name that does not spread: order_cancel:0 and :1 share a master")
	assert.True(t, spreads("test_custom_kind"), "the test-only kind of internal/testkit/testkind (TestACustomKindEndToEnd)")
	assert.True(t, spreads("test_note_kind"), "worker's test-only kind (TestATestKindGoesThroughProducerAndWorker)")
	// And the dot form the colon replaced does not.
	third := func(slot int) int { return slot * 3 / 16384 }
	assert.Equal(t, third(redisproc.Slot("order_modify.0")), third(redisproc.Slot("order_modify.1")),
		fmt.Sprint("order_modify.0 and .1 share a master: ", redisproc.Slot("order_modify.0"), redisproc.Slot("order_modify.1")))
}

// spreads reports whether the 3 shard queues of a kind queued to queue
// land on 3 different masters of a cluster whose slots are split evenly
// over 3.
func spreads(queue string) bool {
	k := tasks.NewKind[tasks.ModifyPayload]("order:probe", "probe", queue, 1)
	seen := map[int]bool{}
	for _, q := range k.ShardQueues(3) {
		seen[redisproc.Slot(asynqredis.PendingKey(q))*3/16384] = true
	}
	return len(seen) == 3
}
