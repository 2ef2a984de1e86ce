package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a worker process's own Prometheus series (asynq's queue gauges
// are exported once, by the dashboard). Create them once per process with
// NewMetrics and pass them in Config.Metrics. All methods are safe for
// concurrent use; a nil *Metrics records nothing.
//
// The series:
//
//	orderworker_task_duration_seconds{task_type,queue,outcome}  histogram: one task run, lock wait included
//	orderworker_lock_wait_seconds{task_type}              histogram: time to get the order's lock
//	orderworker_lock_wakeups_total{task_type,by}          waits ended by a release notice (by="notice") or the random delay (by="delay")
//	orderworker_lock_busy_total{task_type}                tasks that met their wait deadline and went back to the queue
//	orderworker_lock_lost_total{task_type}                task runs cancelled because their lease was lost
//	orderworker_stale_fence_total{task_type}              writes the store refused for a stale fence
//	orderworker_changes_archived_total{task_type,reason}  changes asynq archived: not applied, and never will be by themselves
//	orderworker_hold_changes                              histogram: changes run in one hold that drained (see Config.DrainMax)
//	orderworker_holds_yielded_total                       holds that released the order with changes still waiting (a quantum spent while other tasks waited or the worker was more than half busy, or half the first task's time)
//	orderworker_ghost_tasks_removed_total{queue}          task IDs that name no task (no task hash, or one without a message), removed from a queue by the recoverer, never run
//	orderworker_token_refreshes_total{result}             upstream token refreshes by this process (result="ok"|"error")
//	orderworker_token_refresh_seconds                     histogram: one upstream token refresh
//	orderworker_token_wait_seconds                        histogram: callers' wait for a token when none was cached
//
// outcome is one of the Outcome* constants. task_type is a type of the
// Worker's kinds (Config.Kinds: the contract's, tasks.Kinds, by default),
// or "unknown" for any other type found in an order queue
// (such a task is archived): the type string comes from whoever wrote to
// Redis, and as a label each new one would add series that never go away.
// queue is the queue the task was taken from (or the ghosts removed from): one of the queues the Worker
// serves (Worker.Queues, shard queues included), a set fixed by its Config,
// so that a shard that is not served, or one whose tasks run slow or fail,
// shows. reason is one of a fixed set, by the error the change was
// archived with (matched with errors.Is, never by its text):
// invalid_payload, unknown_type, misplaced, task_id_mismatch, bad_position,
// out_of_budget, retries_exhausted, not_found, closed, passed, conflict,
// store_refused, other (see docs/operations.md, "Alerts"). A Worker sets
// every pair of its task types and reasons, and the ghosts of each queue
// it serves, to 0 when it is created, so that increase() sees the first
// archive or ghost. No label takes an order number
// or an event ID.
type Metrics struct {
	taskDuration *prometheus.HistogramVec
	lockWait     *prometheus.HistogramVec
	wakeups      *prometheus.CounterVec
	busy         *prometheus.CounterVec
	lost         *prometheus.CounterVec
	staleFence   *prometheus.CounterVec
	archived     *prometheus.CounterVec
	refreshes    *prometheus.CounterVec
	refreshTime  prometheus.Histogram
	tokenWait    prometheus.Histogram
	holdChanges  prometheus.Histogram
	holdsYielded prometheus.Counter
	ghosts       *prometheus.CounterVec
}

// NewMetrics creates the worker's series and registers them on reg. It
// returns an error when they are already registered there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		taskDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "orderworker_task_duration_seconds", Help: "Duration of one task run, lock wait included, by task type, queue (shard) and outcome.", Buckets: buckets,
		}, []string{"task_type", "queue", "outcome"}),
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "orderworker_lock_wait_seconds", Help: "Time a task waited for its order's lock.", Buckets: buckets,
		}, []string{"task_type"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_lock_wakeups_total", Help: "Lock waits ended by a release notice (by=notice) or by the random delay (by=delay).",
		}, []string{"task_type", "by"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_lock_busy_total", Help: "Tasks that met their lock wait deadline and went back to the queue.",
		}, []string{"task_type"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_lock_lost_total", Help: "Task runs cancelled because their order lock's lease was lost.",
		}, []string{"task_type"}),
		staleFence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_stale_fence_total", Help: "Writes the order store refused because their fencing token was stale.",
		}, []string{"task_type"}),
		archived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_changes_archived_total", Help: "Changes archived by asynq (not applied), by task type and reason.",
		}, []string{"task_type", "reason"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_token_refreshes_total", Help: "Upstream access token refreshes made by this process, by result.",
		}, []string{"result"}),
		refreshTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderworker_token_refresh_seconds", Help: "Duration of one upstream access token refresh.", Buckets: buckets,
		}),
		tokenWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderworker_token_wait_seconds", Help: "Time callers waited for an access token when none was cached.", Buckets: buckets,
		}),
		holdChanges: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderworker_hold_changes", Help: "Changes of one order run in one hold of its lock that drained (the first included).",
			Buckets: []float64{2, 3, 5, 10, 20, 50, 100, 200, 500},
		}),
		holdsYielded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderworker_holds_yielded_total", Help: "Holds that yielded: released the order with changes of it still waiting (see WORKER_DRAIN_MAX in docs/operations.md).",
		}),
		ghosts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderworker_ghost_tasks_removed_total", Help: "Task IDs that name no task (no task hash, or one without a message), removed from a queue's lease set, active or pending list by the recoverer, by queue.",
		}, []string{"queue"}),
	}
	for _, c := range []prometheus.Collector{m.taskDuration, m.lockWait, m.wakeups, m.busy, m.lost, m.staleFence, m.archived, m.refreshes, m.refreshTime, m.tokenWait, m.holdChanges, m.holdsYielded, m.ghosts} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("worker: register metrics: %w", err)
		}
	}
	return m, nil
}

// taskTypeUnknown is the task_type label of every type outside the
// contract.
const taskTypeUnknown = "unknown"

// taskTypeLabel returns the task_type label of the series of a task of
// type taskType: the type itself for a kind of Config.Kinds, "unknown" for
// anything else, so that the label has a bounded set of values.
func (w *Worker) taskTypeLabel(taskType string) string {
	if w.kinds.Of(taskType) == nil {
		return taskTypeUnknown
	}
	return taskType
}

// observeTask records one task run, of a task taken from queue; taskType
// is its task_type label (Worker.taskTypeLabel).
func (m *Metrics) observeTask(taskType, queue string, err error, took time.Duration, ti *Done) {
	if m == nil {
		return
	}
	m.taskDuration.WithLabelValues(taskType, queue, Outcome(err)).Observe(took.Seconds())
	if ti.Lock.Attempts > 0 {
		m.lockWait.WithLabelValues(taskType).Observe(ti.Lock.Waited.Seconds())
	}
	if n := ti.Lock.WokenByNotice; n > 0 {
		m.wakeups.WithLabelValues(taskType, "notice").Add(float64(n))
	}
	if n := ti.Lock.WokenByDelay; n > 0 {
		m.wakeups.WithLabelValues(taskType, "delay").Add(float64(n))
	}
	var busy *keyorder.BusyError
	switch {
	case errors.As(err, &busy):
		m.busy.WithLabelValues(taskType).Inc()
		m.lockWait.WithLabelValues(taskType).Observe(busy.Waited.Seconds())
	case errors.Is(err, keyorder.ErrLost):
		m.lost.WithLabelValues(taskType).Inc()
	}
	if errors.Is(err, orders.ErrStaleFence) {
		m.staleFence.WithLabelValues(taskType).Inc()
	}
}

// initArchived sets the archived count of every reason of each task type
// (labels, as taskTypeLabel gives them) to 0.
func (m *Metrics) initArchived(taskTypes []string) {
	if m == nil {
		return
	}
	for _, typ := range taskTypes {
		for _, reason := range archiveReasons {
			m.archived.WithLabelValues(typ, reason)
		}
	}
}

// observeArchived records one change archived; taskType is its task_type
// label (Worker.taskTypeLabel) and reason one of archiveReasons.
func (m *Metrics) observeArchived(taskType, reason string) {
	if m == nil {
		return
	}
	m.archived.WithLabelValues(taskType, reason).Inc()
}

// TokenRefreshed records one upstream token refresh; it has the shape of the
// token cache's refresh hook.
func (m *Metrics) TokenRefreshed(took time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.refreshes.WithLabelValues(result).Inc()
	m.refreshTime.Observe(took.Seconds())
}

// TokenWaited records how long a caller waited for a token; it has the shape
// of the token cache's wait hook.
func (m *Metrics) TokenWaited(took time.Duration) {
	if m == nil {
		return
	}
	m.tokenWait.Observe(took.Seconds())
}

// observeHold records a hold that drained: how many changes it ran, and
// whether it used its quantum with changes still waiting.
func (m *Metrics) observeHold(changes int, yielded bool) {
	if m == nil {
		return
	}
	m.holdChanges.Observe(float64(changes))
	if yielded {
		m.holdsYielded.Inc()
	}
}

// initGhosts sets the ghosts removed from each of queues to 0.
func (m *Metrics) initGhosts(queues []string) {
	if m == nil {
		return
	}
	for _, q := range queues {
		m.ghosts.WithLabelValues(q)
	}
}

// observeGhosts records n task IDs that named no task, removed from queue
// (one the Worker serves).
func (m *Metrics) observeGhosts(queue string, n int) {
	if m == nil {
		return
	}
	m.ghosts.WithLabelValues(queue).Add(float64(n))
}
