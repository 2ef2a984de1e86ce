package main

import (
	"bufio"
	"strconv"
	"strings"

	"github.com/orderworker/orderworker/tasks"
	"github.com/prometheus/client_golang/prometheus"
)

// holdStats are a worker's hold metrics: the holds that drained
// (orderworker_hold_changes' count), the changes run in them (its sum, the
// first of each included), the holds that yielded
// (orderworker_holds_yielded_total), and the modify runs
// (orderworker_task_duration_seconds' count for the modify type, every
// outcome).
type holdStats struct {
	Holds   int64
	Changes float64
	Yielded int64
	Runs    int64
}

// perHold is the mean changes per hold that drained, 0 for none.
func (h holdStats) perHold() float64 {
	if h.Holds == 0 {
		return 0
	}
	return h.Changes / float64(h.Holds)
}

func (h holdStats) add(o holdStats) holdStats {
	return holdStats{Holds: h.Holds + o.Holds, Changes: h.Changes + o.Changes, Yielded: h.Yielded + o.Yielded, Runs: h.Runs + o.Runs}
}

// gatherHolds reads the hold metrics of a worker.NewMetrics registry.
func gatherHolds(g prometheus.Gatherer) (holdStats, error) {
	var h holdStats
	mfs, err := g.Gather()
	if err != nil {
		return h, err
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "orderworker_hold_changes":
				h.Holds += int64(m.GetHistogram().GetSampleCount())
				h.Changes += m.GetHistogram().GetSampleSum()
			case "orderworker_holds_yielded_total":
				h.Yielded += int64(m.GetCounter().GetValue())
			case "orderworker_task_duration_seconds":
				for _, l := range m.GetLabel() {
					if l.GetName() == "task_type" && l.GetValue() == tasks.TypeModify {
						h.Runs += int64(m.GetHistogram().GetSampleCount())
					}
				}
			}
		}
	}
	return h, nil
}

// parseHolds reads the hold metrics from a worker process's /metrics, in
// Prometheus' text format.
func parseHolds(text string) holdStats {
	var h holdStats
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name, v := line[:i], line[i+1:]
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		series, labels, _ := strings.Cut(name, "{")
		switch series {
		case "orderworker_hold_changes_count":
			h.Holds += int64(x)
		case "orderworker_hold_changes_sum":
			h.Changes += x
		case "orderworker_holds_yielded_total":
			h.Yielded += int64(x)
		case "orderworker_task_duration_seconds_count":
			if strings.Contains(labels, `task_type="`+tasks.TypeModify+`"`) {
				h.Runs += int64(x)
			}
		}
	}
	return h
}
