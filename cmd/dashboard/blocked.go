package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/orderview"
)

// blockedScrapeTimeout bounds the read behind the blocked-order gauges at
// each scrape.
const blockedScrapeTimeout = 5 * time.Second

// blockedCollector exports the blocked-orders list (orderview.Reader.Blocked)
// as two gauges, read at scrape time, as asynq's queue gauges are:
//
//	orderworker_orders_blocked{reason}              blocked orders, by reason (every reason, 0 included)
//	orderworker_oldest_blocked_order_age_seconds    the oldest one's age; 0 when none
//
// No label names an order or an event. Each scrape makes one read of the
// list, bounded by blockedScrapeTimeout and by the reader's BlockedScan (at
// most that many tasks of each queue's retry and scheduled sets and
// expired leases, and as many held orders): its cost does not grow with
// the orders. When the read fails, the scrape reports the error for those
// gauges and nothing for them, rather than zeros that would clear an
// alert.
type blockedCollector struct {
	views   *orderview.Reader
	timeout time.Duration
	log     *zap.Logger
	blocked *prometheus.Desc
	oldest  *prometheus.Desc
}

func newBlockedCollector(views *orderview.Reader, timeout time.Duration, log *zap.Logger) *blockedCollector {
	return &blockedCollector{
		views: views, timeout: timeout, log: log,
		blocked: prometheus.NewDesc("orderworker_orders_blocked",
			"Orders whose next change has waited longer than BLOCKED_AFTER, or that an operator holds, by reason.",
			[]string{"reason"}, nil),
		oldest: prometheus.NewDesc("orderworker_oldest_blocked_order_age_seconds",
			"How long the oldest blocked order's next change has waited (or it has been held); 0 when none is blocked.",
			nil, nil),
	}
}

// Describe sends the two gauges' descriptions.
func (c *blockedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocked
	ch <- c.oldest
}

// Collect reads the list once and sends the gauges.
func (c *blockedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	page, err := c.views.Blocked(ctx, orderview.BlockedQuery{Limit: 1})
	if err != nil {
		c.log.Warn("could not read the blocked orders for the metrics", zap.Error(err))
		ch <- prometheus.NewInvalidMetric(c.blocked, err)
		return
	}
	if page.Truncated {
		c.log.Warn("the blocked-order gauges count only the tasks one read takes; there may be more blocked orders")
	}
	for _, reason := range orderview.Reasons() {
		ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, float64(page.Counts[reason]), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(page.OldestAgeMS)/1000)
}
