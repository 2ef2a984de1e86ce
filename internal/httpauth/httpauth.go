// Package httpauth is the authentication middleware of orderworker's HTTP
// servers: HTTP Basic for people at a browser (the dashboard) and Bearer API
// keys for programs (the dashboard's /metrics scraper, the HTTP intake), with
// several keys accepted at once so that keys can be rotated without downtime.
//
// Credentials are compared in constant time: the presented and the expected
// values are both hashed with SHA-256 and the equal-length digests compared
// with crypto/subtle, so neither the content nor the length of a secret
// leaks through timing, and every configured key is compared on every
// request. A request with more than one Authorization header is refused,
// whichever of them is valid. Only the digests are kept in memory after
// construction. The
// package logs nothing; the Authorization header is removed from the request
// before it reaches the protected handler, which learns who called from
// [Principal].
//
// It is not an authorization layer (every authenticated caller may do
// everything the handler allows), and it does not rate-limit failed
// attempts.
package httpauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// MinKeyLength is the shortest Bearer key [Bearer] accepts, in bytes. Keys
// are meant to be generated, for example with `openssl rand -hex 32`.
const MinKeyLength = 16

// ErrConfig is returned (wrapped, with the reason) by [Basic] and [Bearer]
// for unusable credentials or realm. The message never contains a secret.
var ErrConfig = errors.New("httpauth: bad configuration")

// Scheme checks one kind of credential. Implementations must be safe for
// concurrent use and must not log or keep the presented credential.
type Scheme interface {
	// Authenticate reports whether r carries a valid credential and, if so,
	// a name for the caller that is safe to log. The schemes of this package
	// refuse a request with more than one Authorization header.
	Authenticate(r *http.Request) (principal string, ok bool)
	// Challenges returns the WWW-Authenticate values sent with a 401.
	Challenges() []string
}

type digest = [sha256.Size]byte

func sum(s string) digest { return sha256.Sum256([]byte(s)) }

// equal compares two digests in constant time.
func equal(a, b digest) int { return subtle.ConstantTimeCompare(a[:], b[:]) }

type basic struct {
	user, pass digest
	name       string
	challenge  string
}

// Basic returns a Scheme that accepts HTTP Basic credentials (RFC 7617)
// equal to user and password. user must be non-empty without a colon and
// password non-empty; realm names the protection space in the browser's
// login prompt and must be printable ASCII other than `"` and `\`. The
// principal is the user name. It returns an error wrapping [ErrConfig]
// otherwise. The Scheme is safe for concurrent use.
func Basic(realm, user, password string) (Scheme, error) {
	if err := checkRealm(realm); err != nil {
		return nil, err
	}
	switch {
	case user == "":
		return nil, fmt.Errorf("%w: empty basic-auth user", ErrConfig)
	case strings.Contains(user, ":"):
		return nil, fmt.Errorf("%w: basic-auth user may not contain a colon", ErrConfig)
	case password == "":
		return nil, fmt.Errorf("%w: empty basic-auth password", ErrConfig)
	}
	return &basic{
		user: sum(user), pass: sum(password), name: user,
		challenge: `Basic realm="` + realm + `", charset="UTF-8"`,
	}, nil
}

func (b *basic) Authenticate(r *http.Request) (string, bool) {
	if _, ok := authorization(r); !ok {
		return "", false
	}
	user, pass, ok := r.BasicAuth() // reads that one header
	if !ok {
		return "", false
	}
	// Both comparisons always run, so timing does not tell which failed.
	if equal(sum(user), b.user)&equal(sum(pass), b.pass) != 1 {
		return "", false
	}
	return b.name, true
}

func (b *basic) Challenges() []string { return []string{b.challenge} }

type bearer struct {
	keys      []digest
	name      string
	challenge string
}

// Bearer returns a Scheme that accepts an `Authorization: Bearer <key>`
// header (RFC 6750; the scheme name in any case) whose key is one of keys.
// Listing several keys lets clients move from an old key to a new one
// without downtime. Each key must be at least [MinKeyLength] bytes of
// visible ASCII without spaces; keys in query strings or cookies are never
// accepted, since those end up in logs. The principal is "key#N", N being the
// 1-based position of the matching key in keys, so logs tell keys apart
// without showing them. It returns an error wrapping [ErrConfig] for an empty
// list or a bad key (the error gives the key's position, never its value).
// The Scheme is safe for concurrent use.
func Bearer(realm string, keys []string) (Scheme, error) { return NamedBearer(realm, "key", keys) }

// NamedBearer returns a Scheme like [Bearer]'s whose principal is
// "<name>#N" rather than "key#N", so that logs and audit notes say which
// kind of key acted (the dashboard's login tokens, its metrics tokens, the
// intake's enqueue keys). name must be 1–32 lowercase ASCII letters,
// digits or '-'. It returns an error wrapping [ErrConfig] as [Bearer] does,
// or for a bad name. The Scheme is safe for concurrent use.
func NamedBearer(realm, name string, keys []string) (Scheme, error) {
	if err := checkRealm(realm); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no bearer keys", ErrConfig)
	}
	b := &bearer{name: name, challenge: `Bearer realm="` + realm + `"`}
	for i, k := range keys {
		if len(k) < MinKeyLength {
			return nil, fmt.Errorf("%w: bearer key #%d is shorter than %d bytes", ErrConfig, i+1, MinKeyLength)
		}
		for _, c := range []byte(k) {
			if c <= ' ' || c >= 0x7f {
				return nil, fmt.Errorf("%w: bearer key #%d has a space, control or non-ASCII byte", ErrConfig, i+1)
			}
		}
		b.keys = append(b.keys, sum(k))
	}
	return b, nil
}

func (b *bearer) Authenticate(r *http.Request) (string, bool) {
	h, ok := authorization(r)
	if !ok {
		return "", false
	}
	token, ok := bearerToken(h)
	if !ok {
		return "", false
	}
	got := sum(token)
	match := -1
	// Compare with every key, without stopping at a match.
	for i, k := range b.keys {
		if equal(got, k) == 1 {
			match = i
		}
	}
	if match < 0 {
		return "", false
	}
	return b.name + "#" + strconv.Itoa(match+1), true
}

// KeyPrincipal returns the principal [Bearer] gives the key at the 1-based
// position n of its keys: "key#N".
func KeyPrincipal(n int) string { return "key#" + strconv.Itoa(n) }

func (b *bearer) Challenges() []string { return []string{b.challenge} }

// authorization returns the request's Authorization header when it has
// exactly one. A request with several is refused by every scheme, whichever
// of them is valid: servers, proxies and logs disagree on which one counts
// (Go's Header.Get takes the first), so accepting one would let a request
// be judged on a credential that something in front of this server did not
// see, or did not log.
func authorization(r *http.Request) (string, bool) {
	v := r.Header.Values("Authorization")
	if len(v) != 1 {
		return "", false
	}
	return v[0], true
}

// bearerToken extracts the token of an "Authorization: Bearer <token>" value.
func bearerToken(h string) (string, bool) {
	const prefix = "bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	token := strings.TrimSpace(h[len(prefix):])
	return token, token != ""
}

func checkName(name string) error {
	if name == "" || len(name) > 32 {
		return fmt.Errorf("%w: bearer principal name must be 1 to 32 characters", ErrConfig)
	}
	for _, c := range []byte(name) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("%w: bearer principal name %q must be lowercase letters, digits or '-'", ErrConfig, name)
		}
	}
	return nil
}

func checkRealm(realm string) error {
	if realm == "" {
		return fmt.Errorf("%w: empty realm", ErrConfig)
	}
	for _, c := range []byte(realm) {
		if c < ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return fmt.Errorf("%w: realm %q must be printable ASCII without quotes or backslashes", ErrConfig, realm)
		}
	}
	return nil
}

type anyOf []Scheme

// Any returns a Scheme that accepts a request any of schemes accepts, tried
// in order, and challenges with all of them (each distinct challenge once).
// Put [Basic] first where a
// browser is expected, so that it shows its login prompt. Any of no schemes
// accepts nothing.
func Any(schemes ...Scheme) Scheme { return anyOf(schemes) }

func (a anyOf) Authenticate(r *http.Request) (string, bool) {
	for _, s := range a {
		if p, ok := s.Authenticate(r); ok {
			return p, true
		}
	}
	return "", false
}

// Challenges returns the challenges of every scheme, in order, each once.
func (a anyOf) Challenges() []string {
	var out []string
	for _, s := range a {
		for _, c := range s.Challenges() {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// Option changes how [Require] answers a request it refuses.
type Option func(*options)

type options struct {
	json bool
}

// JSONErrors makes [Require] answer a refused request with the body
// {"error":"unauthorized"} as application/json, for APIs. The default is the
// text "unauthorized".
func JSONErrors() Option { return func(o *options) { o.json = true } }

type principalKey struct{}

// Principal returns the name under which [Require] let the request in (see
// [Basic] and [Bearer]), and false when no Require middleware has run.
func Principal(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok
}

// Require returns middleware that passes a request on only if s accepts it.
// The handler then sees the request without its Authorization header and
// finds the caller's name with [Principal]. A refused request gets 401
// Unauthorized with one WWW-Authenticate header per challenge of s and
// Cache-Control: no-store. s must not be nil. The middleware is safe for
// concurrent use.
func Require(s Scheme, opts ...Option) func(http.Handler) http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	challenges := s.Challenges()
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, ok := s.Authenticate(r)
			if !ok {
				deny(w, challenges, o)
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
			r.Header = r.Header.Clone()
			r.Header.Del("Authorization")
			next.ServeHTTP(w, r)
		})
	}
}

func deny(w http.ResponseWriter, challenges []string, o options) {
	h := w.Header()
	for _, c := range challenges {
		h.Add("WWW-Authenticate", c)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if o.json {
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"unauthorized"}` + "\n"))
		return
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte("unauthorized\n"))
}
