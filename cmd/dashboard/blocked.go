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
// as gauges, read at scrape time, as asynq's queue gauges are:
//
//	orderworker_orders_blocked{reason}              blocked orders, by reason (every reason, 0 included)
//	orderworker_oldest_blocked_order_age_seconds    the oldest one's age; 0 when none
//	orderworker_orders_blocked_up                   1 when this scrape read the list, 0 when the read failed
//	orderworker_orders_blocked_truncated            1 when a set held more tasks than the read takes (there may be blocked orders the gauges miss), else 0
//	orderworker_blocked_read_ghosts                 members of the retry and scheduled sets this read passed over because they name no task
//
// No label names an order or an event. Each scrape makes one read of the
// list, bounded by blockedScrapeTimeout and by the reader's BlockedScan (at
// most that many tasks of each queue's retry and scheduled sets and
// expired leases, and as many held orders): its cost does not grow with
// the orders. An order that cannot be read (a key of the wrong type, say)
// is counted as unreadable and fails nothing. When the read of the list
// itself fails (Redis down, the scrape's time out), the scrape still
// serves everything else (asynq's queue gauges above all): it sends
// orderworker_orders_blocked_up 0 and neither blocked gauge, rather than
// zeros that would clear an alert, and logs the error. The alert
// OrderworkerBlockedListUnreadable (deploy/prometheus/alerts.yml) watches
// the up gauge, and OrderworkerBlockedListTruncated the truncated one.
// Members that name no task (ghosts, which the intake's Redis user may
// ZADD) are passed over and do not count towards BlockedScan, so they
// cannot push a stuck order out of the read; only past ten times
// BlockedScan members of one set do they make it truncated.
type blockedCollector struct {
	views     *orderview.Reader
	timeout   time.Duration
	log       *zap.Logger
	blocked   *prometheus.Desc
	oldest    *prometheus.Desc
	up        *prometheus.Desc
	truncated *prometheus.Desc
	ghosts    *prometheus.Desc
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
		up: prometheus.NewDesc("orderworker_orders_blocked_up",
			"1 when this scrape read the blocked-orders list, 0 when the read failed (the blocked-order gauges are then absent).",
			nil, nil),
		truncated: prometheus.NewDesc("orderworker_orders_blocked_truncated",
			"1 when a retry or scheduled set (or the held orders' index) held more than one read takes: there may be blocked orders the gauges miss; else 0.",
			nil, nil),
		ghosts: prometheus.NewDesc("orderworker_blocked_read_ghosts",
			"Members of the retry and scheduled sets this read passed over because they name no task (no task hash, or one without a message).",
			nil, nil),
	}
}

// Describe sends the gauges' descriptions.
func (c *blockedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocked
	ch <- c.oldest
	ch <- c.up
	ch <- c.truncated
	ch <- c.ghosts
}

// Collect reads the list once and sends the gauges.
func (c *blockedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	page, err := c.views.Blocked(ctx, orderview.BlockedQuery{Limit: 1})
	if err != nil {
		c.log.Warn("could not read the blocked orders for the metrics", zap.Error(err))
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	truncated := 0.0
	if page.Truncated {
		truncated = 1
		c.log.Warn("the blocked-order gauges count only the tasks one read takes; there may be more blocked orders", zap.Int("ghosts", page.Ghosts))
	}
	ch <- prometheus.MustNewConstMetric(c.truncated, prometheus.GaugeValue, truncated)
	ch <- prometheus.MustNewConstMetric(c.ghosts, prometheus.GaugeValue, float64(page.Ghosts))
	for _, reason := range orderview.Reasons() {
		ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, float64(page.Counts[reason]), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(page.OldestAgeMS)/1000)
}
