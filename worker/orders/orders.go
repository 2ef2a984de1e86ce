// Package orders is the order model of orderworker and the public contract
// of an order store: the [Order] and its history [Entry], the [Store]
// interface that order changes are written to, the package's errors, and
// the [Write] that carries a write's fence to the store. A store
// implements [Store] (reads and puts) and one small interface per write:
// [Modifier], [Exchanger], and the optional [Annotator]; or, for a store
// that passes changes on to the system that owns the orders, one
// [Forwarder] for every kind. The module's
// own backends (the Redis store, the embedded default and the
// verification oracle for the others; the HTTP store of the company's
// order API, docs/upstream-order-api.md) are not importable; a program of
// another module implements Store and the writes it serves itself, checks
// them with the conformance suite of package worker/orders/storetest, and
// hands the store to worker.New (see examples/ownstore).
//
// Every write made on behalf of a task carries the event ID (the upstream's
// idempotency key) and a [Write] in the context with the fencing token of the
// per-order lock. A store applies each event at most once per order, and
// refuses a write whose fence is older than the newest it has seen for that
// order, so a lock holder that has lost its lock can never write. The checks
// every store makes before writing ([CheckEventID], [CheckModify],
// [CheckExchange], [CheckPut], [FencedWrite]) are here, so that the
// backends refuse the same requests with the same errors.
//
// orders is not the wire contract (that is package tasks), does not take
// locks (the worker does, and hands the fence in through [WithWrite]),
// and does not retry: [Permanent] tells the caller whether a retry can
// help.
package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// Status is the state of an order.
type Status string

// The states of an order. Only an active order may be changed; the others are
// closed for good (except by [Store.Put]).
const (
	// StatusActive is an order that may be modified or exchanged.
	StatusActive Status = "active"
	// StatusExchanged is an order that was replaced by another; its
	// ExchangedTo names the replacement.
	StatusExchanged Status = "exchanged"
	// StatusCancelled is an order that was cancelled without a replacement.
	StatusCancelled Status = "cancelled"
)

func (s Status) valid() bool {
	switch s {
	case StatusActive, StatusExchanged, StatusCancelled:
		return true
	}
	return false
}

// Item is one line of an order: a stock-keeping unit and a quantity. It is
// the wire contract's item, so tasks and orders need no conversion.
type Item = tasks.Item

// Order is an order as the store holds it.
type Order struct {
	// No is the order number: 1 to 64 characters of [A-Za-z0-9_-].
	No string `json:"order_no"`
	// Status is active, exchanged or cancelled.
	Status Status `json:"status"`
	// Address is the delivery address.
	Address string `json:"address"`
	// Remark is free text from the customer or the shop.
	Remark string `json:"remark"`
	// Items are the order's lines; never nil when read from the store.
	Items []Item `json:"items"`
	// Version starts at 1 and goes up by one with every write to the
	// order (not with a note of an [Annotator], which changes nothing of
	// the order). A version is thus the position of its write in the
	// history (the history's cursor).
	Version int64 `json:"version"`
	// ExchangedTo is the replacement order, set when Status is exchanged.
	ExchangedTo string `json:"exchanged_to,omitempty"`
	// ExchangedFrom is the order this one replaced, if any.
	ExchangedFrom string `json:"exchanged_from,omitempty"`
	// UpdatedAt is the store's clock (Redis TIME for the Redis store) at the
	// last write (when Version last went up), in UTC with microsecond
	// precision.
	UpdatedAt time.Time `json:"updated_at"`
}

// Changes is what a modify changes. A nil field is left as it is.
type Changes struct {
	Address *string
	Remark  *string
	// Items, when not nil, replaces the order's items. It must then be
	// non-empty: an order without items is not a valid order, and an empty
	// list is too easily told apart from "unchanged" only by accident
	// (JSON null versus []).
	Items []Item
}

// Exchange is what an exchange does: it closes the order and creates its
// replacement with new items.
type Exchange struct {
	// Items are the replacement's items; required and non-empty.
	Items []Item
	// NewOrderNo is the replacement's number. When empty it is derived from
	// the order and the event ID by [tasks.ReplacementOrderNo], so that a retry
	// creates the same replacement.
	NewOrderNo string
	// Reason is recorded in the history of the exchanged order.
	Reason string
}

// The history entry types. Task-driven writes use the task type names.
const (
	// TypeModify is the entry of an applied [Modifier.Modify].
	TypeModify = "order:modify"
	// TypeExchange is the entry, on the exchanged order, of an applied
	// [Exchanger.Exchange].
	TypeExchange = "order:exchange"
	// TypeCreated is the first entry of an order created by an exchange.
	TypeCreated = "order:created"
	// TypePut is the entry of a [Store.Put].
	TypePut = "order:put"
	// TypeNote is the entry of an [Annotator.Annotate]: a note, such as an
	// operator's action on the order, that changes none of its fields.
	TypeNote = "order:note"
)

// Entry is one entry of an order's history: one applied write, or a note
// ([Annotator]).
type Entry struct {
	// EventID is the event that made the write; empty for a put and a
	// note.
	EventID string `json:"event_id"`
	// Type is the type of the write: a task-driven write's task type (such
	// as TypeModify), or TypeCreated, TypePut or TypeNote.
	Type string `json:"type"`
	// Fence is the fencing token the write was made under; 0 for a put
	// and a note, which are not fenced. The entry that creates a
	// replacement order carries the fence of the exchanged order's lock.
	Fence int64 `json:"fence"`
	// Worker is who wrote, from [Write.Worker]; for a note, the principal
	// ([Note.By]).
	Worker string `json:"worker"`
	// StartedAt is when the writer started its work, from [Write.StartedAt]
	// (the store's clock when not given).
	StartedAt time.Time `json:"started_at"`
	// EndedAt is the store's clock when the write was applied.
	EndedAt time.Time `json:"ended_at"`
	// Version is the order's version after the write; for a note, the
	// order's version when the note was written (the note follows the
	// write of that version).
	Version int64 `json:"version"`
	// Detail says what changed, for people: "changed address, items",
	// "exchanged to SO2", "created from SO1 by event E"; for a note,
	// [Note.Detail]: "hold by alice: customer called".
	Detail string `json:"detail"`
	// Seq is the change's position in the order's sequence (the order of
	// acceptance), from [Write.Seq]; 0 for none (a put, a creation, a task
	// enqueued without a position, or a store that does not keep it).
	Seq int64 `json:"seq,omitempty"`
}

// Result is the outcome of a write.
type Result struct {
	// Order is the order as the write left it. For an exchange it is the
	// replacement order; read the exchanged one with [Store.Get].
	Order Order
	// Replayed says the event had already been applied; nothing was
	// written this time, and Order is the order as it is now (the Redis
	// store), or as the first application left it (a store that records
	// outcomes, such as the HTTP store's upstream).
	Replayed bool
}

// Store is what every order store implements, whatever kinds of change it
// applies: reading an order and its history, and putting an order for
// seeding and administration. The writes that tasks make are each their
// own small interface (such as [Modifier] and [Exchanger], and
// [Annotator] for the notes of operator actions), so that adding a kind
// of change adds an interface rather than a method every store must
// write: a store implements the writes of the kinds it serves, and a
// Worker refuses at start a kind whose write its store lacks (see
// worker.New), unless the store is a [Forwarder], which passes any
// kind's change on to the system that owns the orders. The module's
// Redis store implements every write; its HTTP store implements Modifier
// and Exchanger and forwards the other kinds. A store of your own
// implements the writes it serves: storetest.Run checks the rules below,
// each write's only when the store implements it or forwards it.
//
// Implementations are safe for concurrent use. The errors are those of
// this package, wrapped with context; match them with errors.Is and
// classify them with [Permanent].
//
// # The rules of every fenced write
//
// A write made on behalf of a task ([Modifier.Modify], [Exchanger.Exchange]
// and every write interface to come) needs a [Write] in the context (see
// [WithWrite]) and returns [ErrNoFence] without one. It is checked, in
// this order, and refused without writing anything:
//  1. [ErrNoFence] without a fenced Write, [ErrInvalid] for a request that
//     the write's check ([CheckModify], [CheckExchange]) refuses,
//     [ErrNotFound] for an unknown order;
//  2. dedupe: an event ID already applied to the order is answered with
//     Result.Replayed and writes nothing, whatever its fence and position
//     and even if the order has closed since; the same event ID with a
//     different type or request is [ErrConflict];
//  3. [ErrClosed] (a [*ClosedError] naming the replacement) for an
//     exchanged or cancelled order;
//  4. [ErrPassed] when Write.Seq is positive and not after the newest
//     position applied to the order (see Write.Seq and Write.SeqOutOfTurn);
//  5. the fence: [ErrStaleFence] when Write.Fence is older than the newest
//     fence that has written to the order (an equal one is allowed).
//
// An applied write stores the fence (and, in turn, the position) as the
// order's newest, bumps the version, appends a history entry and records
// the event ID with its outcome, all at once: a write refused as stale
// records nothing, so that it applies under a fresh fence.
//
// The versions number the history's writes, one each, with no gap: the
// history's cursor (HistoryQuery.After) is a version. A store that also
// records notes ([Annotator]) shows each note after the write of its
// version, on that write's page.
//
// A store that wraps another (to add a hook, a cache, metrics) and embeds
// Store keeps only Store's methods: it implements the writes it wants to
// pass on itself.
type Store interface {
	// Get returns the order. It returns ErrNotFound when there is none.
	Get(ctx context.Context, orderNo string) (Order, error)
	// History returns a page of the order's history, oldest first: the
	// entries after version q.After (see [HistoryQuery]). It returns
	// ErrNotFound when there is no such order. [AllHistory] follows the
	// pages.
	History(ctx context.Context, orderNo string, q HistoryQuery) (HistoryPage, error)
	// Put creates or replaces an order, for seeding and administration. It
	// is not fenced and not idempotent: each call bumps the version (1 for
	// a new order) and appends a history entry of type TypePut with fence
	// 0. It keeps the order's newest fence, position and applied events.
	// An empty Status means active; Version and UpdatedAt are set by the
	// store. It returns ErrInvalid for an order that [CheckPut] refuses.
	Put(ctx context.Context, o Order) error
}

// Modifier is implemented by a [Store] that applies modifies: the write of
// the order:modify kind. It keeps the rules of every fenced write (see
// [Store]).
type Modifier interface {
	// Modify applies c to an active order once per eventID: it sets the
	// fields c names and keeps the others, and the history entry is of
	// type TypeModify with the event ID, the fence, Write.Worker and the
	// new version. Result.Order is the order as the write left it (zero
	// when Write.NoResult allows). It returns ErrNotFound, ErrClosed (a
	// *ClosedError naming the replacement), ErrPassed, ErrStaleFence,
	// ErrNoFence, ErrInvalid, or ErrConflict when eventID was already used
	// for a different change.
	Modify(ctx context.Context, eventID, orderNo string, c Changes) (Result, error)
}

// Exchanger is implemented by a [Store] that applies exchanges: the write
// of the order:exchange kind. It keeps the rules of every fenced write
// (see [Store]).
type Exchanger interface {
	// Exchange closes an active order A as exchanged and creates its
	// replacement B, once per eventID. B is numbered x.NewOrderNo, or
	// tasks.ReplacementOrderNo(A, eventID) when that is empty, so that a
	// retry creates the same B. A gets status exchanged, ExchangedTo B, a
	// bumped version and an entry of type TypeExchange; it keeps its
	// items. B is active at version 1, with x.Items, A's address and remark
	// and ExchangedFrom A, and its history starts with an entry of type
	// TypeCreated carrying the event ID and the fence A was closed under.
	// Result.Order is B. No half-done exchange survives: a retry of the
	// event completes it (and answers Replayed once both halves are done).
	// It returns the errors of Modify, and ErrConflict, changing nothing,
	// when B's number is taken by an unrelated order.
	Exchange(ctx context.Context, eventID, orderNo string, x Exchange) (Result, error)
}

// Forwarder is implemented by a [Store] that passes a change on to the
// system that owns the orders, which applies it: the HTTP store, whose
// upstream API applies every kind's change itself. A Worker applies a
// task of a kind whose write the store lacks (a kind added to the
// contract, or a program's own) by forwarding it, so such a store serves
// every kind with no method per write. A store that has the kind's write
// (as the HTTP store has [Modifier] and [Exchanger]) is given the write
// instead. It keeps the rules of every fenced write (see [Store]).
type Forwarder interface {
	// Forward applies c to order c.OrderNo once per c.EventID, under the
	// fence of the Write in ctx. Result.Order is the order as the change
	// left it (zero when Write.NoResult allows). It returns the errors of
	// [Modifier.Modify], and ErrInvalid for a change the owner refuses.
	Forward(ctx context.Context, c Change) (Result, error)
}

// Change is one task's change as a [Forwarder] passes it on.
type Change struct {
	// Type is the task type, as "order:cancel": the type of the history
	// entry the change writes.
	Type string
	// Name is the kind's name, as "cancel": the intake's path segment and
	// the upstream's.
	Name string
	// EventID is the event's ID (the idempotency key) and OrderNo the
	// order it changes.
	EventID, OrderNo string
	// Body is the task's payload without its header (tasks.Body): the
	// kind's own members, a JSON object, as the intake's route takes them.
	Body json.RawMessage
}

// Annotator is implemented by a [Store] that can record a note in an
// order's history: who did what to the order outside its writes, and why
// (the operator actions: retry now, skip, hold, resume). It is optional:
// a store without it (the HTTP store, whose upstream API has no place for
// a note) simply keeps no notes, and callers check for it with a type
// assertion. The module's Redis store implements it; storetest.Run checks
// it when a store does.
type Annotator interface {
	// Annotate appends an entry of type TypeNote to order orderNo's
	// history: Worker is n.By, Detail is n.Detail(), EventID is empty and
	// Fence and Seq are 0; StartedAt and EndedAt are the store's clock;
	// Version is the order's version (the note shows after the write of
	// that version). It changes nothing of the order: not its data,
	// version or UpdatedAt, nor its newest fence or position, nor its
	// applied events, so that the refusals of Modify and Exchange
	// (dedupe, ErrPassed, ErrStaleFence) are as they were. Notes are kept
	// apart from the writes: however many notes come, none pushes a write
	// out of the history (a store bounds its notes on their own). It is
	// neither fenced nor idempotent: each call appends an entry. It
	// returns ErrNotFound when there is no such order (a note never
	// creates one), and ErrInvalid for a note that [CheckNote] refuses.
	Annotate(ctx context.Context, orderNo string, n Note) error
}

// Note is what an [Annotator] records.
type Note struct {
	// By is the principal: the OS user, the API key's name, the dashboard
	// user. Required; at most MaxNoteBy bytes.
	By string
	// Action is what was done, as a verb phrase: "hold", "skipped
	// position 3". Required; at most MaxNoteAction bytes.
	Action string
	// Reason is why; optional, at most MaxNoteReason bytes.
	Reason string
}

// The limits of a [Note]'s fields, in bytes.
const (
	MaxNoteBy     = 64
	MaxNoteAction = 64
	MaxNoteReason = 200
)

// Detail is the note's text in the history (Entry.Detail): "<action> by
// <by>", followed by ": <reason>" when there is a reason.
func (n Note) Detail() string {
	s := n.Action + " by " + n.By
	if n.Reason != "" {
		s += ": " + n.Reason
	}
	return s
}

// CheckNote returns an error matching [ErrInvalid] for a note that
// [Annotator.Annotate] refuses: a malformed order number, an empty By or
// Action, a field longer than its limit (MaxNoteBy, MaxNoteAction,
// MaxNoteReason), or one that is not UTF-8 or holds a control character or
// a format character (unicode.Cf: U+202E and the other bidirectional
// controls, which reorder what a reader sees).
func CheckNote(orderNo string, n Note) error {
	if err := CheckOrderNo(orderNo); err != nil {
		return err
	}
	for _, f := range []struct {
		name, v  string
		max      int
		required bool
	}{{"by", n.By, MaxNoteBy, true}, {"action", n.Action, MaxNoteAction, true}, {"reason", n.Reason, MaxNoteReason, false}} {
		switch {
		case f.required && strings.TrimSpace(f.v) == "":
			return fmt.Errorf("note: empty %s: %w", f.name, ErrInvalid)
		case len(f.v) > f.max:
			return fmt.Errorf("note: %s longer than %d bytes: %w", f.name, f.max, ErrInvalid)
		case !utf8.ValidString(f.v) || strings.ContainsFunc(f.v, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }):
			return fmt.Errorf("note: %s is not UTF-8 text without control or format characters: %w", f.name, ErrInvalid)
		}
	}
	return nil
}

// The limits of a history page.
const (
	// DefaultHistoryPage is the page size of a HistoryQuery without Limit.
	DefaultHistoryPage = 100
	// MaxHistoryPage is the largest page a HistoryQuery may ask for.
	MaxHistoryPage = 1000
)

// HistoryQuery selects a page of an order's history.
type HistoryQuery struct {
	// After is the cursor: the Version of the last entry of the previous
	// page (HistoryPage.Next). 0 starts at the oldest entry kept.
	After int64
	// Limit is the most writes the page holds: 1 to MaxHistoryPage; the
	// notes of an [Annotator] come with the write they follow, on top.
	// Defaults to DefaultHistoryPage; a larger value is cut to
	// MaxHistoryPage.
	Limit int
}

// WithDefaults returns q with its defaults filled in and its Limit cut to
// MaxHistoryPage, as stores read it.
func (q HistoryQuery) WithDefaults() HistoryQuery {
	if q.Limit <= 0 {
		q.Limit = DefaultHistoryPage
	}
	q.Limit = min(q.Limit, MaxHistoryPage)
	q.After = max(q.After, 0)
	return q
}

// HistoryPage is a page of an order's history.
type HistoryPage struct {
	// Entries are the page's entries, oldest first.
	Entries []Entry
	// Next is the cursor of the next page (HistoryQuery.After), or 0 when
	// this page is the last.
	Next int64
}

// AllHistory reads an order's whole history, page after page, oldest first.
// It returns the errors of [Store.History]. The history may change between
// two pages; each entry is still read at most once.
func AllHistory(ctx context.Context, s Store, orderNo string) ([]Entry, error) {
	var all []Entry
	q := HistoryQuery{Limit: MaxHistoryPage}
	for {
		p, err := s.History(ctx, orderNo, q)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Entries...)
		if p.Next == 0 {
			return all, nil
		}
		q.After = p.Next
	}
}

// Write says who writes and under which fence. It travels to the store in
// the context; see [WithWrite]. (The module's Redis store, on the lock's
// own Redis, also commits the lock's hand-off with its write, through a
// hook the worker offers it separately; other stores need only the
// Write.)
type Write struct {
	// Fence is the fencing token of the per-order lock the writer holds. It
	// must be positive. The store refuses it when it is older than the
	// newest fence it has seen for the order; an equal fence is allowed, so
	// one lock hold may write more than once.
	Fence int64
	// Worker identifies the writer in the history (for example host, process
	// and task ID). Optional.
	Worker string
	// StartedAt is when the writer started the work, for the history.
	// Optional: the store's clock is used when it is zero.
	StartedAt time.Time
	// Seq is the change's position in its order's sequence, recorded in
	// the history entry (Entry.Seq). 0 means none: the write is not
	// ordered. A store keeps the newest position applied to each order and
	// refuses a write whose position is not after it with ErrPassed (the
	// HTTP store sends it for the upstream to do the same), so that an
	// order never moves back in its sequence, even for a change whose
	// dedupe record has expired or whose position was skipped.
	Seq int64
	// SeqOutOfTurn says the change did not run in Seq's turn: its
	// position had already been passed, or its order's sequence was gone
	// (worker.ModePassed), so Seq may be one that the order's sequence never
	// handed out (a task enqueued by hand with any seq). The store still
	// refuses such a write with ErrPassed when Seq is not after the newest
	// position applied, but it must not record Seq as the newest, nor in
	// the history: only a position applied in its turn moves the order on,
	// so that no task can hold back the order's later changes. Defaults to
	// false: Seq is recorded.
	SeqOutOfTurn bool
	// NoResult says the caller does not read Result.Order: a store may
	// leave it zero and save reading the order back (the Redis store does).
	// Defaults to false.
	NoResult bool
	// Commit is the engine's hook for a store on the lock's own Redis
	// (keyorder.Commit): with it, the store also checks the lock's newest
	// fence and commits the hand-off of the order's turn in its write's
	// last script. nil means none; stores that cannot use it ignore it.
	Commit keyorder.Commit
}

type writeKey struct{}

// WithWrite returns a copy of ctx that carries w to the store.
func WithWrite(ctx context.Context, w Write) context.Context {
	return context.WithValue(ctx, writeKey{}, w)
}

// WriteFrom returns the [Write] that ctx carries, if any.
func WriteFrom(ctx context.Context) (Write, bool) {
	w, ok := ctx.Value(writeKey{}).(Write)
	return w, ok
}

func validItems(items []Item) error {
	for i, it := range items {
		if it.SKU == "" {
			return fmt.Errorf("item %d: empty sku: %w", i, ErrInvalid)
		}
		if it.Qty <= 0 {
			return fmt.Errorf("item %d (%s): qty %d is not positive: %w", i, it.SKU, it.Qty, ErrInvalid)
		}
	}
	return nil
}

// CheckOrderNo returns an error matching [ErrInvalid] unless no is a valid
// order number by [tasks.ValidOrderNo]: 1 to 64 characters of
// [A-Za-z0-9_-].
func CheckOrderNo(no string) error {
	if !tasks.ValidOrderNo(no) {
		return fmt.Errorf("order number %q is not 1-64 characters of [A-Za-z0-9_-]: %w", no, ErrInvalid)
	}
	return nil
}

// FencedWrite returns the [Write] that ctx carries. It returns ErrNoFence
// when there is none or its Fence is not positive: a store never writes
// unfenced.
func FencedWrite(ctx context.Context) (Write, error) {
	w, ok := WriteFrom(ctx)
	if !ok {
		return Write{}, ErrNoFence
	}
	if w.Fence <= 0 {
		return Write{}, fmt.Errorf("fence %d: %w", w.Fence, ErrNoFence)
	}
	return w, nil
}

// CheckPut returns an error matching [ErrInvalid] for an order that
// [Store.Put] refuses: a malformed order number (its own, ExchangedTo's or
// ExchangedFrom's), an unknown status (fill in an empty one first), or an
// item without SKU or with a quantity below 1.
func CheckPut(o Order) error {
	if err := CheckOrderNo(o.No); err != nil {
		return err
	}
	if !o.Status.valid() {
		return fmt.Errorf("status %q: %w", o.Status, ErrInvalid)
	}
	for _, no := range []string{o.ExchangedTo, o.ExchangedFrom} {
		if no != "" {
			if err := CheckOrderNo(no); err != nil {
				return err
			}
		}
	}
	return validItems(o.Items)
}

// CheckEventID returns an error matching [ErrInvalid] unless id is a
// well-formed event ID by [tasks.ValidEventID] (tasks.EventIDRule): what
// every payload's Validate requires, so that a store records nothing that
// a task could not carry (a control character would break the Redis
// store's history entries).
func CheckEventID(id string) error {
	if !tasks.ValidEventID(id) {
		return fmt.Errorf("event ID %q is not %s: %w", clipID(id), tasks.EventIDRule, ErrInvalid)
	}
	return nil
}

// clipID cuts an event ID short for an error message.
func clipID(id string) string {
	if len(id) > 64 {
		return id[:64] + "..."
	}
	return id
}

// CheckModify returns an error matching [ErrInvalid] for a modify that
// [Modifier.Modify] refuses before writing: a malformed event ID
// ([CheckEventID]), a malformed order number, items given but empty, or a
// bad item.
func CheckModify(eventID, orderNo string, c Changes) error {
	if err := CheckEventID(eventID); err != nil {
		return err
	}
	if err := CheckOrderNo(orderNo); err != nil {
		return err
	}
	if c.Items != nil && len(c.Items) == 0 {
		return fmt.Errorf("items given but empty: %w", ErrInvalid)
	}
	return validItems(c.Items)
}

// CheckExchange returns an error matching [ErrInvalid] for an exchange that
// [Exchanger.Exchange] refuses before writing: a malformed event ID
// ([CheckEventID]), a malformed order number or replacement number newNo
// (which the caller has filled in with [tasks.ReplacementOrderNo] when
// x.NewOrderNo is empty), a replacement numbered as the order itself, no
// items, a bad item, or a reason that the payload's Validate refuses
// ([tasks.CheckReason]).
func CheckExchange(eventID, orderNo, newNo string, x Exchange) error {
	if err := CheckEventID(eventID); err != nil {
		return err
	}
	if err := tasks.CheckReason(x.Reason); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if err := CheckOrderNo(orderNo); err != nil {
		return err
	}
	if err := CheckOrderNo(newNo); err != nil {
		return fmt.Errorf("new order: %w", err)
	}
	if newNo == orderNo {
		return fmt.Errorf("new order number is the order's own: %w", ErrInvalid)
	}
	if len(x.Items) == 0 {
		return fmt.Errorf("no items: %w", ErrInvalid)
	}
	return validItems(x.Items)
}
