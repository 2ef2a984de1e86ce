package intake

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
)

// The intake places a change by its producer's shard setting, answers the
// shard queue, and finds tasks in every queue of the setting, the draining
// count's included.
func TestShardedQueues(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	shards := tasks.Shards{Count: 3, Draining: []int{1}}
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, Shards: shards})
	require.NoError(t, err)
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	s, err := New(db.Client, p, store, Config{APIKeys: []string{key1}})
	require.NoError(t, err)
	srv := httptest.NewServer(record(t, s))
	t.Cleanup(srv.Close)
	e := &env{srv: srv, db: db, rdb: db.Client, store: store, insp: asynq.NewInspectorFromRedisClient(db.Client)}

	r := e.post(t, "/v1/orders/SO1001/modify", "ev-1", modifyBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var res producer.Result
	r.decode(t, &res)
	assert.Equal(t, "order_modify:2", res.Queue, "SO1001 is in shard 2 of 3")

	// A change accepted before the count changed, in the old queue.
	old, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix})
	require.NoError(t, err)
	_, err = old.EnqueueModify(t.Context(), "SO123", tasks.Changes{Remark: new("old")}, producer.WithEventID("ev-old"))
	require.NoError(t, err)

	for id, queue := range map[string]string{"ev-1": "order_modify:2", "ev-old": "order_modify"} {
		r = e.do(t, http.MethodGet, "/v1/tasks/"+id, "", nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var got taskView
		r.decode(t, &got)
		assert.Equal(t, queue, got.Queue, id)
	}
	r = e.do(t, http.MethodGet, "/v1/tasks/ev-1?queue=order_modify:2", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.do(t, http.MethodGet, "/v1/tasks/ev-1?queue=order_modify:0", "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	r = e.do(t, http.MethodGet, "/v1/tasks/ev-1?queue=order_modify:3", "", nil)
	require.Equal(t, http.StatusBadRequest, r.status, "a queue the setting has not")
	assert.Contains(t, r.errorBody(t).Error.Message, "order_modify:2")
}
