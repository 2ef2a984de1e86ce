package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/worker/keyorder"
)

// backlogScrapeTimeout bounds the read behind the backlog gauges at each
// scrape.
const backlogScrapeTimeout = 2 * time.Second

// backlogCollector exports what waits behind the orders' heads, from the
// engine's index of backlogs (keyorder.Sequencer.Backlog), which the
// acceptance and the pass-on scripts keep in the step that changes it:
//
//	orderworker_orders_backlogged    orders with changes waiting behind their head
//	orderworker_changes_parked       changes waiting behind their order's head, all orders together
//	orderworker_backlog_deepest      the most changes waiting behind one order's head
//	orderworker_backlog_up           1 when this scrape read the index, 0 when the read failed
//
// The autoscalers read the pending gauge (the orders that can run); these
// say what waits behind them, which more workers do not run sooner. Each
// scrape costs one read-only script of three commands, whatever the number
// of orders. On a Cluster the index is not kept (its keys would be in
// another slot than the orders'): the collector sends no series. A failed
// read sends orderworker_backlog_up 0 and no other gauge, and logs the
// error. It is safe for concurrent use.
type backlogCollector struct {
	seq     *keyorder.Sequencer
	timeout time.Duration
	log     *zap.Logger

	backlogged, parked, deepest, up *prometheus.Desc
}

func newBacklogCollector(seq *keyorder.Sequencer, timeout time.Duration, log *zap.Logger) *backlogCollector {
	return &backlogCollector{
		seq: seq, timeout: timeout, log: log,
		backlogged: prometheus.NewDesc("orderworker_orders_backlogged",
			"Orders with changes waiting behind their head (parked until the head passes its turn on).", nil, nil),
		parked: prometheus.NewDesc("orderworker_changes_parked",
			"Changes waiting behind their order's head, all orders together: positions handed out and not yet reached, the head excluded.", nil, nil),
		deepest: prometheus.NewDesc("orderworker_backlog_deepest",
			"The most changes waiting behind one order's head; 0 when none.", nil, nil),
		up: prometheus.NewDesc("orderworker_backlog_up",
			"1 when this scrape read the index of backlogs, 0 when the read failed (the backlog gauges are then absent).", nil, nil),
	}
}

// Describe sends the gauges' descriptions.
func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.backlogged, c.parked, c.deepest, c.up} {
		ch <- d
	}
}

// Collect reads the index once and sends the gauges.
func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	b, err := c.seq.Backlog(ctx)
	switch {
	case errors.Is(err, keyorder.ErrNoBacklog):
		return
	case err != nil:
		c.log.Warn("could not read the backlogs for the metrics; their gauges are left out of this scrape", zap.Error(err))
		gauge(c.up, 0)
		return
	}
	gauge(c.up, 1)
	gauge(c.backlogged, b.Keys)
	gauge(c.parked, b.Positions)
	gauge(c.deepest, b.Deepest)
}
