package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
)

// queueScrapeTimeout bounds the reads behind the queue gauges at each
// scrape, all queues together.
const queueScrapeTimeout = 5 * time.Second

// queueCollector exports asynq's queue gauges, under the names and labels
// of asynq's own collector (github.com/hibiken/asynq/x/metrics), which the
// alerts, the Grafana dashboard, the autoscalers and asynqmon's charts
// read, for each of the deployment's queues:
//
//	asynq_tasks_enqueued_total{queue,state}          tasks in each state: active, pending, scheduled, retry, archived, completed
//	asynq_queue_size{queue}                          tasks in every state
//	asynq_queue_latency_seconds{queue}               how long the oldest pending task has waited; 0 when none
//	asynq_queue_memory_usage_approx_bytes{queue}     memory of the queue and its tasks, sampled
//	asynq_tasks_processed_total{queue}               runs that ended
//	asynq_tasks_failed_total{queue}                  runs that failed
//	asynq_queue_paused_total{queue}                  1 when the queue is paused, else 0
//	orderworker_queue_gauges_up{queue}               1 when this scrape read the queue, 0 when the read failed
//	orderworker_queue_ghosts_sampled{queue}          members of the queue's sampled ends that name no task
//
// Unlike asynq's collector, which reads every queue asynq lists and fails
// for all of them when one read fails (asynq v0.25.1's memory sampling
// fails on one member that names no task, which the intake's Redis user
// may LPUSH or ZADD), each queue is read on its own (asynqredis.ReadStats:
// one script of a bounded number of commands, that passes over such members).
// A queue whose read fails (Redis down, a key of the wrong type, the
// scrape's time out) costs only its own series: the scrape sends
// orderworker_queue_gauges_up 0 for it and none of its asynq gauges, rather
// than zeros that would clear an alert or scale the workers down, and logs
// the error. Only the deployment's queues are read, so a queue planted in
// asynq's set of queues adds no series and costs nothing. The alerts
// OrderworkerQueueGaugesAbsent and OrderworkerQueueGaugesUnreadable
// (deploy/prometheus/alerts.yml) watch for the gauges missing.
//
// Each scrape makes one script run per queue, bounded by queueScrapeTimeout
// in all. It is safe for concurrent use.
type queueCollector struct {
	rdb     redis.Scripter
	queues  []string
	timeout time.Duration
	now     func() time.Time
	log     *zap.Logger

	enqueued, size, latency, memory, processed, failed, paused, up, ghosts *prometheus.Desc
}

func newQueueCollector(rdb redis.Scripter, queues []string, timeout time.Duration, log *zap.Logger) *queueCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append([]string{"queue"}, labels...), nil)
	}
	return &queueCollector{
		rdb: rdb, queues: queues, timeout: timeout, now: time.Now, log: log,
		enqueued:  desc("asynq_tasks_enqueued_total", "Number of tasks enqueued; broken down by queue and state.", "state"),
		size:      desc("asynq_queue_size", "Number of tasks in a queue"),
		latency:   desc("asynq_queue_latency_seconds", "Number of seconds the oldest pending task is waiting in pending state to be processed."),
		memory:    desc("asynq_queue_memory_usage_approx_bytes", "Number of memory used by a given queue (approximated number by sampling)."),
		processed: desc("asynq_tasks_processed_total", "Number of tasks processed (both succeeded and failed); broken down by queue"),
		failed:    desc("asynq_tasks_failed_total", "Number of tasks failed; broken down by queue"),
		paused:    desc("asynq_queue_paused_total", "Number of queues paused"),
		up: desc("orderworker_queue_gauges_up",
			"1 when this scrape read the queue, 0 when the read failed (the queue's asynq_* gauges are then absent)."),
		ghosts: desc("orderworker_queue_ghosts_sampled",
			"Members of the queue's lists and sets, among those sampled for memory usage, that name no task (no task hash, or one without a message)."),
	}
}

// Describe sends the gauges' descriptions.
func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.enqueued, c.size, c.latency, c.memory, c.processed, c.failed, c.paused, c.up, c.ghosts} {
		ch <- d
	}
}

// Collect reads each queue once and sends its gauges.
func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, q := range c.queues {
		s, err := asynqredis.ReadStats(ctx, c.rdb, q)
		if err != nil {
			c.log.Warn("could not read a queue for the metrics; its gauges are left out of this scrape", zap.String("queue", q), zap.Error(err))
			gauge(c.up, 0, q)
			continue
		}
		gauge(c.up, 1, q)
		gauge(c.ghosts, float64(s.Ghosts), q)
		for _, st := range []struct {
			state string
			n     int64
		}{{"active", s.Active}, {"pending", s.Pending}, {"scheduled", s.Scheduled}, {"retry", s.Retry},
			{"archived", s.Archived}, {"completed", s.Completed}} {
			gauge(c.enqueued, float64(st.n), q, st.state)
		}
		gauge(c.size, float64(s.Size()), q)
		latency := 0.0
		if !s.OldestPendingSince.IsZero() {
			latency = max(c.now().Sub(s.OldestPendingSince).Seconds(), 0)
		}
		gauge(c.latency, latency, q)
		gauge(c.memory, float64(s.MemoryUsage), q)
		ch <- prometheus.MustNewConstMetric(c.processed, prometheus.CounterValue, float64(s.ProcessedTotal), q)
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(s.FailedTotal), q)
		paused := 0.0
		if s.Paused {
			paused = 1
		}
		gauge(c.paused, paused, q)
	}
}
