package token

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// ClientCredentialsConfig configures [ClientCredentials], the OAuth2 client
// credentials grant (RFC 6749 §4.4).
type ClientCredentialsConfig struct {
	// TokenURL is the upstream's token endpoint. Required.
	TokenURL string
	// ClientID identifies this service to the upstream. Required.
	ClientID string
	// ClientSecret authenticates this service. It is sent to TokenURL only
	// and never logged. Defaults to empty (for clients that authenticate
	// through EndpointParams).
	ClientSecret string
	// Scopes are requested with every token. Defaults to none.
	Scopes []string
	// EndpointParams are extra form parameters for the token request, e.g.
	// "audience". Defaults to none.
	EndpointParams url.Values
	// AuthStyle says how the client ID and secret are sent. Defaults to
	// auto-detection (HTTP Basic first, then form parameters, remembered).
	AuthStyle oauth2.AuthStyle
	// HTTPClient makes the token requests: a copy of it that follows no
	// redirect (a redirect would send the client secret on to where the
	// answer points). Defaults to a client with a 10s timeout over
	// http.DefaultTransport. The Cache's context still bounds each request.
	HTTPClient *http.Client
	// AllowInsecureHTTP lets TokenURL be an http:// URL of a host that is
	// not loopback, which sends the client secret and the token in clear
	// text. Defaults to false: TokenURL must be https://, or http:// to
	// localhost, 127.0.0.0/8 or ::1 (a sidecar, a test).
	AllowInsecureHTTP bool
}

// ErrInsecureURL is matched by the error of [ClientCredentials] for a
// TokenURL of http:// to a host that is not loopback, without
// ClientCredentialsConfig.AllowInsecureHTTP.
var ErrInsecureURL = errors.New("token: client credentials: TokenURL is http:// to a host that is not loopback: the client secret would cross the network in clear text")

// MaxEndpointText is the most of the token endpoint's own text (an
// error_description, or the start of a body that is not an OAuth2 error)
// that an [EndpointError] keeps, in bytes.
const MaxEndpointText = 200

// EndpointError is the error of a Fetch that the token endpoint answered
// with an error, or with a redirect, which is not followed. Its text is
// safe to log: the endpoint's own words are cut to MaxEndpointText bytes,
// their control and format characters escaped, and the client secret, if
// the endpoint echoed it, replaced by "[redacted]": the secret as it is,
// and in each encoding this client sends it in (form-encoded in the body
// and in the Basic credential, RFC 6749 §2.3.1; that credential in
// base64), each also path-escaped and form-encoded. It holds nothing of the
// request (its form carries the client secret).
type EndpointError struct {
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Code is the OAuth2 error code (RFC 6749 §5.2), such as
	// "invalid_client", sanitized; empty when the answer is not an OAuth2
	// error.
	Code string
	// Text is the error_description, or the start of the body when the
	// answer is not an OAuth2 error, sanitized.
	Text string
}

func (e *EndpointError) Error() string {
	msg := "token endpoint answered " + strconv.Itoa(e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" {
		msg += " " + t
	}
	if e.StatusCode >= 300 && e.StatusCode < 400 {
		msg += " (redirects are not followed)"
	}
	for _, part := range []string{e.Code, e.Text} {
		if part != "" {
			msg += ": " + part
		}
	}
	return msg
}

// IsLoopback reports whether host (a URL's Hostname) is localhost or a
// loopback address: where an http:// request stays on the machine. The
// token endpoint ([ClientCredentialsConfig.AllowInsecureHTTP]) and the
// order API (httpstore.Config.AllowInsecureHTTP) take http:// only to
// such a host, unless allowed.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// secretForms returns the client secret as it is and in every encoding
// the token request carries it in, longest first, so that no shorter form
// breaks a longer one before it is replaced; none for an empty secret.
// golang.org/x/oauth2 puts it in the form (url.Values.Encode: QueryEscape)
// or in the Basic credential, form-encoded with the client ID and then in
// base64. An echo may show any of them as it is, path-escaped
// (%20 for a space) or form-encoded.
func secretForms(clientID, secret string) []string {
	if secret == "" {
		return nil
	}
	basic := base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(clientID) + ":" + url.QueryEscape(secret)))
	var forms []string
	for _, f := range []string{secret, basic} {
		forms = append(forms, f, url.QueryEscape(f), url.PathEscape(f))
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(forms)
}

// sanitize returns s with its control and format characters escaped, each
// of secrets (secretForms) replaced by "[redacted]", cut to
// MaxEndpointText bytes at a UTF-8 boundary ("..." marks a cut).
func sanitize(s string, secrets []string) string {
	for _, secret := range secrets {
		s = strings.ReplaceAll(s, secret, "[redacted]")
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\ufffd") {
		piece := string(r)
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			q := strconv.QuoteRune(r)
			piece = q[1 : len(q)-1]
		}
		if b.Len()+len(piece) > MaxEndpointText-len("...") {
			return strings.TrimSpace(b.String()) + "..."
		}
		b.WriteString(piece)
	}
	return strings.TrimSpace(b.String())
}

// ClientCredentials returns a [Source] that asks cfg.TokenURL for a new token
// with the client credentials grant on every Fetch (the Cache does the
// caching). The Source is safe for concurrent use.
//
// It returns an error when TokenURL or ClientID is missing, TokenURL is not
// an absolute http or https URL, or it is http:// to a host that is not
// loopback without AllowInsecureHTTP ([ErrInsecureURL]). Fetch follows no
// redirect. It returns an [*EndpointError] when the endpoint answers with
// an error or a redirect, and golang.org/x/oauth2's other errors wrapped;
// a token without expires_in has a zero ExpiresIn, which the Cache rejects
// with ErrBadToken.
func ClientCredentials(cfg ClientCredentialsConfig) (Source, error) {
	switch u, err := url.Parse(cfg.TokenURL); {
	case cfg.TokenURL == "":
		return nil, errors.New("token: client credentials: no TokenURL")
	case err != nil || !u.IsAbs():
		return nil, errors.New("token: client credentials: TokenURL is not an absolute URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, errors.New("token: client credentials: TokenURL is not an http or https URL")
	case u.Scheme == "http" && !cfg.AllowInsecureHTTP && !IsLoopback(u.Hostname()):
		return nil, ErrInsecureURL
	case cfg.ClientID == "":
		return nil, errors.New("token: client credentials: no ClientID")
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		hc = &c
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &clientCredentials{
		conf: &clientcredentials.Config{
			ClientID:       cfg.ClientID,
			ClientSecret:   cfg.ClientSecret,
			TokenURL:       cfg.TokenURL,
			Scopes:         cfg.Scopes,
			EndpointParams: cfg.EndpointParams,
			AuthStyle:      cfg.AuthStyle,
		},
		hc:      hc,
		secrets: secretForms(cfg.ClientID, cfg.ClientSecret),
	}, nil
}

type clientCredentials struct {
	conf    *clientcredentials.Config // a pointer: it caches the detected AuthStyle
	hc      *http.Client
	secrets []string // secretForms, redacted from the endpoint's text
}

func (s *clientCredentials) Fetch(ctx context.Context) (Token, error) {
	t, err := s.conf.Token(context.WithValue(ctx, oauth2.HTTPClient, s.hc))
	if re, ok := errors.AsType[*oauth2.RetrieveError](err); ok {
		// Not wrapped: its body is the endpoint's text, whole, and its
		// response holds the request, whose form may carry the secret.
		e := &EndpointError{Code: sanitize(re.ErrorCode, s.secrets), Text: sanitize(re.ErrorDescription, s.secrets)}
		if re.Response != nil {
			e.StatusCode = re.Response.StatusCode
		}
		if e.Code == "" && e.Text == "" {
			e.Text = sanitize(string(re.Body), s.secrets)
		}
		return Token{}, fmt.Errorf("client credentials: %w", e)
	}
	if err != nil {
		return Token{}, fmt.Errorf("client credentials: %w", err)
	}
	tok := Token{Value: t.AccessToken}
	switch {
	case t.ExpiresIn > 0:
		tok.ExpiresIn = time.Duration(t.ExpiresIn) * time.Second
	case !t.Expiry.IsZero():
		tok.ExpiresIn = time.Until(t.Expiry)
	}
	return tok, nil
}
