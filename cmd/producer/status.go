package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orderworker/orderworker/cmd/internal/safetext"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/worker/orders"
)

// printStatus writes an order's status for a terminal: the order, what is
// happening to it, its lock, its sequence, its tasks and its latest history.
// Every string from Redis or asynq is shown with its control characters
// escaped, so that none can rewrite the terminal.
func printStatus(w io.Writer, st orderview.Status) error {
	p := &printer{w: w}
	p.order(st)
	p.line("")
	p.line("What is happening (at %s):", st.At.Format(time.RFC3339))
	for _, s := range st.Summary {
		p.line("  - %s", clean(s))
	}
	p.line("")
	if l := st.Lock; l.Held {
		p.line("Lock: held by %s, fence %d, lease %v left", clean(l.Holder), l.Fence, ms(l.LeaseMS).Round(time.Second))
	} else {
		p.line("Lock: free")
	}
	p.line("")
	p.sequence(st)
	p.line("")
	p.tasks(st)
	p.line("")
	p.history(st)
	return p.err
}

// printer writes lines and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) line(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
	}
}

// table writes rows (cells joined by tabs) aligned, indented by two spaces.
func (p *printer) table(rows [][]string) {
	if p.err != nil {
		return
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		if _, err := fmt.Fprintln(tw, "  "+strings.Join(r, "\t")); err != nil {
			p.err = err
			return
		}
	}
	p.err = tw.Flush()
}

func (p *printer) order(st orderview.Status) {
	o := st.Order
	if o == nil {
		p.line("%s: not in the order store", st.OrderNo)
		return
	}
	p.line("%s  %s  version %d  written %s", o.No, o.Status, o.Version, o.UpdatedAt.Format(time.RFC3339))
	rows := [][]string{{"address", clean(o.Address)}, {"remark", clean(o.Remark)}, {"items", itemList(o.Items)}}
	if o.ExchangedTo != "" {
		rows = append(rows, []string{"exchanged to", o.ExchangedTo})
	}
	if o.ExchangedFrom != "" {
		rows = append(rows, []string{"exchanged from", o.ExchangedFrom})
	}
	p.table(rows)
}

func (p *printer) sequence(st orderview.Status) {
	sq := st.Sequence
	if !sq.Exists {
		p.line("Sequence: none (no change accepted in the last 7 days)")
		return
	}
	p.line("Sequence: last finished position (cursor) %d, last handed out %d; %s waiting", sq.Done, sq.Last, orderview.Count(sq.Last-sq.Done))
	switch {
	case len(sq.Waiting) == 0 && sq.More == 0:
		p.line("  nothing waits")
	case len(sq.Waiting) > 0:
		rows := [][]string{{"SEQ", "", "STATE", "LABEL", "TASK STATE", "RESERVED"}}
		for _, w := range sq.Waiting {
			next, reserved := "", ""
			if w.Next {
				next = "next"
			}
			if !w.ReservedAt.IsZero() {
				reserved = ago(st.At, w.ReservedAt)
			}
			label := clean(w.Label)
			if w.Reason != "" {
				label = clean(w.Reason)
			}
			rows = append(rows, []string{strconv.FormatInt(w.Seq, 10), next, w.State, label, w.TaskState, reserved})
		}
		p.table(rows)
	}
	if sq.More > 0 {
		p.line("  (the first %d listed, and %s more)", len(sq.Waiting), orderview.Count(sq.More))
	}
	if g := sq.Gap; g != nil {
		p.line("Gap: position %d (%s) waits for a task that will not come: %s", g.Seq, clean(g.Label), clean(g.Reason))
		p.line("  reserved %s; gap wait %v, %v left", ago(st.At, g.ReservedAt), ms(g.GapWaitMS), ms(g.LeftMS).Round(time.Second))
	}
	if len(sq.Log) > 0 {
		p.line("Log (latest settlements, oldest first):")
		rows := [][]string{{"SEQ", "AT", "KIND", "LABEL", "REASON"}}
		for _, e := range sq.Log {
			seq := "-" // a task without a position, archived
			if e.Seq > 0 {
				seq = strconv.FormatInt(e.Seq, 10)
			}
			rows = append(rows, []string{seq, e.At.Format(time.RFC3339), e.Kind, clean(e.Label), clean(e.Reason)})
		}
		p.table(rows)
	}
}

func (p *printer) tasks(st orderview.Status) {
	if len(st.Tasks) == 0 {
		p.line("Tasks: none found through the order's records (a task enqueued by hand without a position is not among them)")
		return
	}
	p.line("Tasks (found through the order's records):")
	rows := [][]string{{"TASK ID", "QUEUE", "STATE", "SEQ", "FAILED", "FOUND IN"}}
	for _, t := range st.Tasks {
		seq := ""
		if t.Seq > 0 {
			seq = strconv.FormatInt(t.Seq, 10)
		}
		rows = append(rows, []string{clean(t.TaskID), t.Queue, t.State, seq, fmt.Sprintf("%d/%d", t.Retried, t.MaxRetry), t.Source})
	}
	p.table(rows)
	for _, t := range st.Tasks {
		p.line("  %s: %s", clean(t.TaskID), clean(t.Note))
		if t.LastError != "" && !strings.Contains(t.Note, t.LastError) {
			p.line("    last error: %s", clean(t.LastError))
		}
	}
}

func (p *printer) history(st orderview.Status) {
	if len(st.History) == 0 {
		p.line("History: none")
		return
	}
	p.line("History (latest %d of %d):", len(st.History), st.HistoryTotal)
	rows := [][]string{{"VERSION", "EVENT", "TYPE", "SEQ", "ENDED", "DETAIL"}}
	for _, e := range st.History {
		seq := ""
		if e.Seq > 0 {
			seq = strconv.FormatInt(e.Seq, 10)
		}
		rows = append(rows, []string{strconv.FormatInt(e.Version, 10), clean(e.EventID), e.Type, seq, e.EndedAt.Format(time.RFC3339), clean(e.Detail)})
	}
	p.table(rows)
}

// itemList shows an order's items as "SKU×QTY, …".
func itemList(its []orders.Item) string {
	parts := make([]string, len(its))
	for i, it := range its {
		parts[i] = fmt.Sprintf("%s×%d", clean(it.SKU), it.Qty)
	}
	return strings.Join(parts, ", ")
}

// ms turns milliseconds into a duration.
func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// ago says how long before now t was, to the second.
func ago(now, t time.Time) string {
	return max(now.Sub(t), 0).Round(time.Second).String() + " ago"
}

// clean escapes the control and format characters (bidirectional
// overrides among them) and the invalid UTF-8 of s: see [safetext.Escape],
// which the dashboard's order page uses too.
func clean(s string) string { return safetext.Escape(s) }

// printBlocked writes a page of the blocked-orders list for a terminal:
// one row per order, oldest first, then each order's explanation. Every
// string from Redis or asynq is shown escaped, as in printStatus.
func printBlocked(w io.Writer, page orderview.BlockedPage) error {
	p := &printer{w: w}
	p.line("Blocked orders at %s (next change waiting longer than %v, or held): %d", page.At.Format(time.RFC3339),
		ms(page.BlockedAfterMS), page.Total)
	if page.Truncated {
		p.line("  (asynq's sets held more tasks than one read takes: there may be more)")
	}
	if len(page.Orders) == 0 {
		p.line("  none")
		return p.err
	}
	rows := [][]string{{"ORDER", "REASON", "SINCE", "AGE", "WAITING", "HEAD"}}
	for _, b := range page.Orders {
		head := ""
		if b.Head != nil {
			head = clean(b.Head.Label)
			if b.Head.TaskState != "" {
				head += " (" + b.Head.TaskState + ")"
			}
		}
		rows = append(rows, []string{b.OrderNo, b.Reason, b.Since.Format(time.RFC3339), ms(b.AgeMS).Round(time.Second).String(),
			strconv.FormatInt(b.Waiting, 10), head})
	}
	p.table(rows)
	for _, b := range page.Orders {
		p.line("  %s: %s", b.OrderNo, clean(b.Explanation))
	}
	if page.NextCursor != "" {
		p.line("  (more: raise -limit, or page with GET /v1/blocked-orders?cursor=%s)", page.NextCursor)
	}
	return p.err
}
