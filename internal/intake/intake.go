// Package intake is orderworker's HTTP API for upstream systems that cannot
// import package producer, most of them Java services. Through it they
// enqueue order modifies and exchanges with the producer's policy, and read
// orders, order histories, what is happening to an order (its status:
// internal/orderview) and the state of tasks. "producer serve" (the
// intake process of the Procfile) serves it; api/openapi.yaml describes it
// exactly, and a test holds the two together.
//
// A [Server] is an http.Handler. It owns no listener, no http.Server and no
// Redis client: cmd/producer sets the server's timeouts, shuts it down and
// closes the client. It is not an authorization layer: every caller with a
// valid key may do everything.
//
// # Routes
//
//	POST /v1/orders/{order_no}/{kind}     enqueue a task of the kind   202
//
// (one POST route per task kind the producer enqueues, named by the kind's
// Name, such as /v1/orders/{order_no}/modify for order:modify:
// producer.Config.Kinds, the contract's tasks.Kinds by default, so a kind
// of a program's own gets its route as the contract's do)
//
//	GET  /v1/orders/{order_no}            the order                    200
//	GET  /v1/orders/{order_no}/history    the order's history          200
//	GET  /v1/orders/{order_no}/status     what is happening to it      200
//	GET  /v1/blocked-orders               the orders that are stuck    200
//	GET  /v1/tasks/{task_id}              a task's state and retries   200
//	POST /v1/orders/{order_no}/actions/{retry|skip|hold|resume}
//	                                      an operator action (admin)   200
//	GET  /healthz                         the process serves           200
//	GET  /readyz                          Redis answers                200 or 503
//
// Every /v1 route needs an `Authorization: Bearer <key>` header with one of
// [Config.APIKeys], and only one Authorization header: a request with several
// is refused, whichever is valid. /healthz and /readyz need none. The
// actions (package orderops: retry the head now, skip it, hold the order,
// resume it) need a key of [Config.AdminKeys] instead, the admin scope: an
// enqueue key is answered 403 (forbidden) there. Their body is
// {"reason": "..."} (required for skip and hold); the principal recorded
// with the action is the admin key's name, "admin#N". A state that does
// not allow the action (nothing waits, the head runs right now, the order
// is already held) is answered 409 (action_refused). [Routes] lists them.
//
// # Enqueueing and idempotency
//
// The body of a POST is the task's JSON payload as package tasks defines it,
// without order_no, which the path gives (a body may repeat it, equal to the
// path's). The event ID, the idempotency key, comes in the Idempotency-Key
// header or in the body's event_id; given both, they must be equal. One of
// them is required: the intake does not make one up, because a client that
// retries a request whose answer it lost must send the same key, or the
// change would be applied twice. The header may be a bare key (as Stripe
// takes it) or a structured-field string in double quotes (as the IETF
// Idempotency-Key draft writes it): `abc` and `"abc"` are the same key.
//
// The task ID is the event ID, and an event ID names one change. A request
// whose key asynq still holds (see package producer for how long) with the
// same payload is refused with 409 Conflict and the existing task's ID and
// state, so that a retry can count as success; a key used for a different
// change (another payload, another order or another task type: a modify and
// an exchange with one key collide) is refused with 422 Unprocessable
// Content for the producer's dedupe window (7 days). Nothing is enqueued for
// any 4xx answer.
//
// Each accepted change takes the next position in its order's sequence (see
// package producer), returned as seq; the workers apply an order's changes
// in that order.
//
// # Rate limit
//
// Each API key has a token bucket ([Config.Rate], [Config.Burst], and
// [Config.KeyLimits] per key): by default 2000 enqueues a second sustained
// and 10000 at once. Every request to an enqueue route (the POST routes,
// [Route.Limited]) takes a token once authenticated, whatever its answer; a
// request that finds its key's bucket empty is answered 429 (rate_limited)
// with Retry-After, the whole seconds (at least 1) until a token is back,
// and nothing is read or enqueued. A retry must send the same
// Idempotency-Key. Reads are not limited: they write nothing that outlives
// the request, are bounded by RequestTimeout, and a client held back on
// enqueues must still be able to follow its tasks. Without keys
// (InsecureNoAuth) every caller shares one bucket. The buckets live in the
// process: each replica of the intake limits on its own, so a key's
// allowance across N replicas behind a balancer is up to N times Rate.
//
// Requests refused without a valid key (401, 403, and the 404 or 405 of a
// route that does not exist) are limited too: 20 at once and 1 a second
// per client (its IP address, for IPv6 its /64), 200 at once and 20 a
// second for all clients together. Past either, a request without a valid
// key is answered 429 (too_many_refusals) with Retry-After and logged at
// debug only; a request with a valid key is never held back. So a flood of
// unauthenticated requests costs neither memory nor log space beyond a
// bound. The probes are not limited.
//
// # Errors
//
// Every answer other than 2xx has a JSON body of one shape:
//
//	{"error": {"code": "invalid_field",
//	           "message": "changes.items[0].qty: must be between 1 and 10000, got 0",
//	           "field": "changes.items[0].qty",
//	           "request_id": "5f0c..."}}
//
// code is one of the codes below; field, when present, names what is at
// fault: a body field's path, a path or query parameter, or a header.
// request_id echoes the X-Request-Id of the response. A 409 or 422 adds the
// existing task's task_id, queue and event_id beside "error", a 409 also its
// state.
//
//	400 malformed_body            the body is not one JSON object in UTF-8, or could not be read
//	408 request_timeout           the body did not arrive within the server's read timeout
//	400 invalid_field             a body field is unknown, of the wrong type or breaks a rule
//	400 invalid_parameter         a path or query parameter or the Idempotency-Key header is malformed
//	400 idempotency_key_required  neither the Idempotency-Key header nor the body's event_id is given
//	400 idempotency_key_mismatch  the header and the body's event_id differ
//	401 unauthorized              no valid API key, or several Authorization headers; WWW-Authenticate says how to give one
//	403 forbidden                 an enqueue key on an admin route (the actions)
//	404 not_found                 no such order, task or route
//	405 method_not_allowed        the path exists with other methods (listed in Allow)
//	409 duplicate                 the key was already enqueued with this payload
//	409 action_refused            the order's state does not allow the action now; the message says why
//	413 body_too_large            the body is over [Config.MaxBody]
//	415 unsupported_media_type    the Content-Type is not JSON
//	422 idempotency_key_reused    the key was already used for a different change
//	429 rate_limited              the API key's enqueue rate limit is reached; Retry-After says when a token is back
//	429 backlog_full              too many changes of the order wait to be applied (the producer's MaxWaiting); nothing was enqueued; Retry-After says when to retry
//	429 too_many_refusals         too many requests without a valid key were refused, from the client or from all; Retry-After says when to retry (with a valid key)
//	503 unavailable               Redis is unreachable or failed; Retry-After says when to retry
//
// # Logs
//
// Each request is logged once, on the logger's "http" child, with its
// request ID (the caller's X-Request-Id when it is 1 to 128 visible ASCII
// characters, otherwise a new UUID, echoed either way), method, path, route,
// status, size, duration, remote address, the key's position ("key#2", never
// the key) and, where known, the event ID and error code. No header and no
// body is logged.
package intake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/orderworker/orderworker/internal/httpauth"
	"github.com/orderworker/orderworker/internal/httpserve"
	"github.com/orderworker/orderworker/internal/orderops"
	"github.com/orderworker/orderworker/internal/orderview"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/orders"
)

// The defaults of [Config].
const (
	// DefaultMaxBody is the default of [Config.MaxBody]: 64 KiB.
	DefaultMaxBody = 64 << 10
	// DefaultRequestTimeout is the default of [Config.RequestTimeout].
	DefaultRequestTimeout = 10 * time.Second
	// DefaultRetryAfter is the default of [Config.RetryAfter].
	DefaultRetryAfter = 5 * time.Second
	// DefaultProbeTimeout is the default of [Config.ProbeTimeout].
	DefaultProbeTimeout = time.Second
)

// Realm is the protection space named in the WWW-Authenticate challenge of a
// 401 answer.
const Realm = "orderworker intake"

// The headers the intake reads or writes besides the standard ones.
const (
	// HeaderIdempotencyKey carries the event ID of an enqueue.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderRequestID carries the request ID, taken from the request when
	// usable and always set on the response.
	HeaderRequestID = httpserve.HeaderRequestID
)

// Config tunes a [Server]. A zero field means its default; APIKeys has none
// and must be set unless InsecureNoAuth is.
type Config struct {
	// APIKeys are the bearer keys the /v1 routes accept, each at least
	// httpauth.MinKeyLength bytes of visible ASCII. List several to rotate
	// keys without downtime: add the new key, move the clients over, then
	// drop the old one. Keys are compared in constant time and never
	// logged. Required unless InsecureNoAuth is set; there is no default.
	APIKeys []string

	// AdminKeys are the bearer keys of the admin scope: the only keys the
	// operator actions (POST /v1/orders/{order_no}/actions/{action}) accept,
	// as principal "admin#N" (N its position here). An enqueue key gets 403
	// there, and an admin key is not an enqueue key (list it in both to
	// make it both). Same rules as APIKeys. Defaults to none: every action
	// is refused (403) to every key.
	AdminKeys []string

	// InsecureNoAuth serves the /v1 routes without authentication, for
	// local development, the actions included (as "anonymous"). It may not
	// be combined with APIKeys or AdminKeys. Defaults to false.
	InsecureNoAuth bool

	// MaxBody is the largest request body accepted, in bytes; a larger one
	// is answered 413. It must not exceed tasks.MaxPayloadBytes. Defaults to
	// 64 KiB, far above any valid payload.
	MaxBody int64

	// RequestTimeout bounds the Redis work of one request (an enqueue, an
	// order or task read); past it the request is answered 503. asynq's
	// Inspector, which reads tasks, takes no context: a task read past it
	// is answered 503 all the same, and the Inspector's read left to end
	// with the Redis client's own timeouts. Defaults to 10 seconds.
	RequestTimeout time.Duration

	// RetryAfter is the Retry-After of a 503 answer, rounded up to whole
	// seconds. Defaults to 5 seconds.
	RetryAfter time.Duration

	// ProbeTimeout bounds the Redis PING behind /readyz. Defaults to 1
	// second, the default timeout of a Kubernetes probe. The PING's result
	// is kept for a second (httpserve.Ready), so that a flood of /readyz
	// makes about one PING a second.
	ProbeTimeout time.Duration

	// GapWait is the workers' gap wait (GAP_WAIT), whose time left the
	// order status reports for a position that waits for a task that will
	// not come. Set it to the workers' value. Defaults to 30 seconds, the
	// workers' default.
	GapWait time.Duration

	// BlockedAfter is how long the change at the head of an order's
	// sequence may wait before GET /v1/blocked-orders lists the order
	// (BLOCKED_AFTER). Defaults to 1 minute (orderview.DefaultBlockedAfter).
	BlockedAfter time.Duration

	// Rate is how many enqueues a second each API key may make, sustained:
	// every key has a token bucket of its own that refills at Rate and
	// holds Burst, each enqueue request takes a token whatever its answer,
	// and one that finds the bucket empty is answered 429 (rate_limited)
	// with a Retry-After of the seconds until a token is back, having read
	// no body and enqueued nothing. Only the enqueue routes take tokens
	// (see [Route.Limited]); reads are not limited. Without keys
	// (InsecureNoAuth) every caller shares one bucket. [Unlimited] turns
	// the limit off; it may not be negative, and no rate refuses
	// everything. Defaults to 2000 a second ([DefaultRate]).
	Rate rate.Limit

	// Burst is the size of each key's bucket: how many enqueues a key may
	// make at once after a quiet spell, above Rate. It may not be negative.
	// Defaults to 10000 ([DefaultBurst]).
	Burst int

	// KeyLimits overrides Rate and Burst for some keys, by the key's
	// 1-based position in APIKeys: the N of "key#N" in the access log, so
	// that the setting names no key. A zero field of a [Limit] takes the
	// Config's. A position outside APIKeys is an error, and so is any
	// entry with InsecureNoAuth. Defaults to none.
	KeyLimits map[int]Limit

	// ActionRate is how many operator actions a second each admin key
	// (each principal, admin#N) may take, sustained, past a burst of
	// ActionBurst: past it an action is answered 429 (rate_limited) with
	// Retry-After, and nothing is done (see orderops.Config.Rate).
	// orderops.Unlimited turns the limit off. Defaults to 1 a second
	// (orderops.DefaultRate).
	ActionRate rate.Limit

	// ActionBurst is how many operator actions an admin key may take at
	// once. Defaults to 20 (orderops.DefaultBurst).
	ActionBurst int

	// Logger receives the access log, on its "http" child. Defaults to a
	// logger that discards everything.
	Logger *zap.Logger

	// TracerProvider, when set, makes each request to the /v1 routes a
	// server span ("<METHOD> <route>", otelhttp) that continues the trace
	// of the request's W3C traceparent and tracestate headers; the access
	// log line carries its trace_id and span_id. Only a request the intake
	// admits gets a span: one refused before its handler (401, 403, 429
	// rate_limited) or for a route that does not exist (404, 405) gets
	// none, so that an outsider can neither fill the exporter's queue nor
	// join a trace of his own. The span's string attributes taken from the
	// request (url.path, user_agent.original, ...) are cut to
	// tracing.MaxStartAttributeLen bytes. Give the Producer the same
	// provider, so that the enqueue is a child span and the task carries
	// the trace to the workers. Defaults to nil: no spans.
	TracerProvider trace.TracerProvider

	// now is the rate limits' clock, for tests. Defaults to time.Now.
	now func() time.Time
	// refusal and refusalGlobal are the limits of refused requests, of
	// each client and of all, for tests (see refusalRate). Default to
	// the package's constants.
	refusal, refusalGlobal Limit
}

func (c Config) withDefaults() Config {
	c.MaxBody = cmp.Or(c.MaxBody, DefaultMaxBody)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.RetryAfter = cmp.Or(c.RetryAfter, DefaultRetryAfter)
	c.ProbeTimeout = cmp.Or(c.ProbeTimeout, DefaultProbeTimeout)
	c.Rate = cmp.Or(c.Rate, DefaultRate)
	c.Burst = cmp.Or(c.Burst, DefaultBurst)
	if c.now == nil {
		c.now = time.Now
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.InsecureNoAuth && len(c.AdminKeys) > 0:
		return errors.New("intake: InsecureNoAuth given together with AdminKeys: drop one or the other")
	case c.InsecureNoAuth && len(c.APIKeys) > 0:
		return errors.New("intake: InsecureNoAuth given together with APIKeys: drop one or the other")
	case !c.InsecureNoAuth && len(c.APIKeys) == 0:
		return errors.New("intake: no APIKeys (set InsecureNoAuth to serve without authentication)")
	case c.MaxBody < 0 || c.MaxBody > tasks.MaxPayloadBytes:
		return fmt.Errorf("intake: MaxBody %d is not between 1 and %d bytes", c.MaxBody, tasks.MaxPayloadBytes)
	case c.RequestTimeout < 0:
		return fmt.Errorf("intake: negative RequestTimeout %v", c.RequestTimeout)
	case c.RetryAfter < 0:
		return fmt.Errorf("intake: negative RetryAfter %v", c.RetryAfter)
	case c.ProbeTimeout < 0:
		return fmt.Errorf("intake: negative ProbeTimeout %v", c.ProbeTimeout)
	case c.GapWait < 0:
		return fmt.Errorf("intake: negative GapWait %v", c.GapWait)
	case c.BlockedAfter < 0:
		return fmt.Errorf("intake: negative BlockedAfter %v", c.BlockedAfter)
	case c.InsecureNoAuth && len(c.KeyLimits) > 0:
		return errors.New("intake: KeyLimits given with InsecureNoAuth: without keys every caller shares the one bucket of Rate and Burst")
	}
	if err := checkLimit(Limit{Rate: c.Rate, Burst: c.Burst}); err != nil {
		return fmt.Errorf("intake: Rate and Burst: %w", err)
	}
	for _, n := range slices.Sorted(maps.Keys(c.KeyLimits)) {
		if n < 1 || n > len(c.APIKeys) {
			return fmt.Errorf("intake: KeyLimits: no key #%d (APIKeys has %d)", n, len(c.APIKeys))
		}
		if err := checkLimit(c.KeyLimits[n]); err != nil {
			return fmt.Errorf("intake: KeyLimits: key #%d: %w", n, err)
		}
	}
	return nil
}

// Route is one operation of the API.
type Route struct {
	// Method is the HTTP method. A GET route answers HEAD as well.
	Method string
	// Path is the path pattern, in the syntax of both net/http.ServeMux and
	// OpenAPI: "/v1/orders/{order_no}".
	Path string
	// Public reports whether the route is served without credentials.
	Public bool
	// Limited reports whether the route takes a token of the caller's rate
	// limit ([Config.Rate]): the enqueue routes do. Reads are not limited:
	// they write nothing that outlives the request, and a client held
	// back on enqueues must still be able to follow its tasks.
	Limited bool
	// Admin reports whether the route needs a key of [Config.AdminKeys]
	// (the operator actions); an enqueue key gets 403 there.
	Admin bool
}

// route is a route and the method that serves it.
type route struct {
	Route
	serve func(*Server, http.ResponseWriter, *http.Request)
}

// routeTable is the API's one route table for the task kinds kinds: what
// [Routes] returns and what [New] registers. Every kind has its POST
// route, /v1/orders/{order_no}/<kind name>, first, in the table's order.
func routeTable(kinds tasks.Table) []route {
	out := make([]route, 0, len(kinds)+8)
	for _, k := range kinds {
		out = append(out, route{Route{http.MethodPost, "/v1/orders/{order_no}/" + k.Name, false, true, false},
			func(s *Server, w http.ResponseWriter, r *http.Request) { s.post(k, w, r) }})
	}
	return append(out,
		route{Route{http.MethodGet, "/v1/orders/{order_no}", false, false, false}, (*Server).getOrder},
		route{Route{http.MethodGet, "/v1/orders/{order_no}/history", false, false, false}, (*Server).getHistory},
		route{Route{http.MethodGet, "/v1/orders/{order_no}/status", false, false, false}, (*Server).getStatus},
		route{Route{http.MethodGet, "/v1/blocked-orders", false, false, false}, (*Server).getBlocked},
		route{Route{http.MethodGet, "/v1/tasks/{task_id}", false, false, false}, (*Server).getTask},
		route{Route{http.MethodPost, "/v1/orders/{order_no}/actions/{action}", false, false, true}, (*Server).postAction},
		route{Route{http.MethodGet, "/healthz", true, false, false}, (*Server).healthz},
		route{Route{http.MethodGet, "/readyz", true, false, false}, (*Server).readyz},
	)
}

// Routes returns, in a new slice, the routes of a Server whose producer
// enqueues the task kinds kinds (producer.Config.Kinds; tasks.Kinds() for
// the contract's): the POST route of each kind in kinds' order, then the
// others in the order of the package documentation.
func Routes(kinds tasks.Table) []Route {
	table := routeTable(kinds)
	out := make([]Route, len(table))
	for i, rt := range table {
		out[i] = rt.Route
	}
	return out
}

// Server is the intake's http.Handler. Make one with [New]. It is safe for
// concurrent use.
type Server struct {
	cfg        Config
	rdb        redis.UniversalClient
	producer   *producer.Producer
	store      orders.Store
	views      *orderview.Reader
	inspector  *asynq.Inspector
	queues     []string // where tasks are looked for: p's kinds in their order (exchanges first)
	auth       httpauth.Scheme
	admin      httpauth.Scheme // nil without AdminKeys
	ops        *orderops.Ops
	challenges []string
	limits     limiters
	refusals   *refusals
	log        *zap.Logger
	handler    http.Handler
	ready      *httpserve.Ready // the PING behind /readyz, kept for a second
}

var _ http.Handler = (*Server)(nil)

// New returns a Server that enqueues with p, reads orders from store, and
// reads tasks and answers /readyz through rdb, which should be the Redis
// that p enqueues to. Its routes, views and actions read task kinds
// against p's (producer.Config.Kinds): each has its POST route, and
// tasks are looked for in p's queues, every shard queue of each kind under
// p's shard setting (producer.Config.Shards), draining counts included.
// It fills the zero fields of cfg with their defaults.
//
// It returns an error for a nil dependency, a field of cfg that breaks its
// documented rules, or an unusable API key (the error gives the key's
// position, never its value).
func New(rdb redis.UniversalClient, p *producer.Producer, store orders.Store, cfg Config) (*Server, error) {
	switch {
	case rdb == nil:
		return nil, errors.New("intake: nil Redis client")
	case p == nil:
		return nil, errors.New("intake: nil producer")
	case store == nil:
		return nil, errors.New("intake: nil order store")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	shards, kinds := p.Config().Shards, p.Config().Kinds
	views, err := orderview.New(rdb, store, orderview.Config{KeyPrefix: p.Config().KeyPrefix, GapWait: cfg.GapWait, Shards: shards,
		Kinds: kinds, BlockedAfter: cfg.BlockedAfter})
	if err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	s := &Server{
		cfg:       cfg,
		rdb:       rdb,
		producer:  p,
		store:     store,
		views:     views,
		inspector: asynq.NewInspectorFromRedisClient(rdb),
		queues:    shards.AllQueues(kinds),
		ready:     httpserve.NewReady(func(ctx context.Context) error { return rdb.Ping(ctx).Err() }, cfg.ProbeTimeout, 0, nil),
		log:       cfg.Logger.Named("http"),
		limits:    newLimiters(cfg),
		refusals:  newRefusals(cfg),
	}
	if err := s.setAuth(); err != nil {
		return nil, err
	}
	// Ops never takes a lock, so it holds nothing to close. With the Redis
	// store it notes each action in the order's history.
	s.ops, err = orderops.New(rdb, orderops.Config{KeyPrefix: p.Config().KeyPrefix, Shards: shards, Kinds: kinds, Logger: cfg.Logger, Store: store,
		Rate: cfg.ActionRate, Burst: cfg.ActionBurst, Now: cfg.now})
	if err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}

	s.handler = httpserve.AccessLog(s.log, s.limitRefusals(s.routes(kinds)))
	return s, nil
}

// setAuth sets the schemes of the API keys and the admin keys, unless
// InsecureNoAuth. It returns an error naming the setting of an unusable
// key.
func (s *Server) setAuth() error {
	if s.cfg.InsecureNoAuth {
		return nil
	}
	auth, err := httpauth.Bearer(Realm, s.cfg.APIKeys)
	if err != nil {
		return fmt.Errorf("intake: APIKeys: %w", err)
	}
	s.auth, s.challenges = auth, auth.Challenges()
	if len(s.cfg.AdminKeys) > 0 {
		if s.admin, err = httpauth.Bearer(Realm, s.cfg.AdminKeys); err != nil {
			return fmt.Errorf("intake: AdminKeys: %w", err)
		}
	}
	return nil
}

// routes returns the mux of the route table of kinds, each route wrapped
// as it says (routeHandler). The same paths with any other method, and
// every other path, get the API's JSON errors rather than ServeMux's plain
// text.
func (s *Server) routes(kinds tasks.Table) *http.ServeMux {
	mux := http.NewServeMux()
	methods := make(map[string][]string)
	var paths []string
	for _, rt := range routeTable(kinds) {
		mux.Handle(rt.Method+" "+rt.Path, s.routeHandler(rt))
		if _, ok := methods[rt.Path]; !ok {
			paths = append(paths, rt.Path)
		}
		methods[rt.Path] = append(methods[rt.Path], rt.Method)
		if rt.Method == http.MethodGet {
			methods[rt.Path] = append(methods[rt.Path], http.MethodHead)
		}
	}
	for _, path := range paths {
		allow := strings.Join(slices.Sorted(slices.Values(methods[path])), ", ")
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.writeError(w, r, &apiError{status: http.StatusMethodNotAllowed, code: codeMethodNotAllowed,
				message: fmt.Sprintf("%s is not allowed here; allowed: %s", r.Method, allow)})
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &apiError{status: http.StatusNotFound, code: codeNotFound, message: "no such route"})
	})
	return mux
}

// routeHandler is route rt's handler: traced unless public, rate limited
// when limited, and behind the admin keys or the API keys unless public.
func (s *Server) routeHandler(rt route) http.Handler {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rt.serve(s, w, r) })
	if !rt.Public {
		h = s.trace(h)
	}
	if rt.Limited {
		h = s.rateLimit(h)
	}
	switch {
	case rt.Admin:
		h = s.authorizeAdmin(h)
	case !rt.Public:
		h = s.authenticate(h)
	}
	return h
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }
