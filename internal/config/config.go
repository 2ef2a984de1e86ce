// Package config is the configuration convention every orderworker binary
// uses: each setting is both a command-line flag and an environment variable,
// a flag wins over the variable and the variable over the default, and every
// value is parsed and validated before the binary starts, with an error that
// names the flag, the variable and the offending value.
//
// A binary declares its settings on a [Set], then calls [Set.Parse] once:
//
//	var cfg struct {
//		Addr    string
//		Timeout time.Duration
//		Keys    []string
//		Redis   *redisconn.Options
//	}
//	s := config.NewSet("dashboard", os.Getenv)
//	s.String(&cfg.Addr, "addr", "DASHBOARD_ADDR", ":8090", "listen address")
//	s.Duration(&cfg.Timeout, "timeout", "DASHBOARD_TIMEOUT", 30*time.Second, "request timeout").
//		Check(config.Positive)
//	s.StringList(&cfg.Keys, "api-keys", "API_KEYS", nil, "accepted API keys").Secret()
//	s.Redis(&cfg.Redis, "redis-url", "REDIS_URL", config.DefaultRedisURL, "Redis to use")
//	if err := s.Parse(os.Args[1:]); err != nil { ... }
//
// Secrets (see [Var.Secret]) never appear in the usage text, in [Set.Markdown],
// in [Set.Entries] or in error messages; the password of a Redis URL is
// redacted wherever the URL is shown.
//
// Only cmd/* packages use config: library packages take their settings as
// Go values and know no environment variable names. config reads no
// environment itself; the caller injects the lookup function, so tests pass a
// map lookup.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/orderworker/orderworker/internal/redisconn"
	"github.com/orderworker/orderworker/tasks"
)

// DefaultRedisURL is the conventional default of REDIS_URL: database 0 of a
// Redis on the local host.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// ErrHelp is returned by [Set.Parse] when the arguments ask for help (-h,
// -help or --help). The usage text has then been written to the Set's output;
// a binary should exit with status 0.
var ErrHelp = flag.ErrHelp

// RedisURLForms describes the forms of a Redis URL setting, for its usage
// text: one node, a Sentinel group or a Cluster (see [Set.Redis]).
const RedisURLForms = redisconn.Forms

// redacted stands in for a secret value wherever one would be shown.
const redacted = "<redacted>"

// Source says where a setting's value came from.
type Source string

// The sources of a value, in increasing precedence.
const (
	FromDefault Source = "default"
	FromEnv     Source = "env"
	FromFlag    Source = "flag"
)

// Error describes a setting whose value could not be parsed or failed a
// check. [Set.Parse] returns one *Error per bad setting, joined with
// errors.Join; match them with errors.As.
type Error struct {
	// Flag is the flag name without the dash.
	Flag string
	// Env is the environment variable, or "" for a flag-only setting.
	Env string
	// Source is where the bad value came from.
	Source Source
	// Value is the bad value as given, quoted; "<redacted>" for a secret; a
	// Redis URL with its password redacted, or "<unparseable URL>" for one
	// that does not parse (which may be a misplaced password).
	Value string
	// Err says what is wrong with it.
	Err error
}

// Error names the setting's flag and variable, where the value came from,
// the value (redacted as described on Value) and what is wrong with it.
func (e *Error) Error() string {
	var where string
	switch e.Source {
	case FromEnv:
		where = fmt.Sprintf("%s=%s (env", e.Env, e.Value)
		if e.Flag != "" {
			where += "; flag -" + e.Flag
		}
		where += ")"
	case FromFlag:
		where = fmt.Sprintf("-%s=%s (flag", e.Flag, e.Value)
		if e.Env != "" {
			where += "; env " + e.Env
		}
		where += ")"
	default:
		where = fmt.Sprintf("-%s default %s (", e.Flag, e.Value)
		if e.Env != "" {
			where += "env " + e.Env + " and "
		}
		where += "flag unset)"
	}
	return fmt.Sprintf("config: %s: %v", where, e.Err)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Set is the declared settings of one binary. Declare every setting, then
// call [Set.Parse] once. The declaring methods (String, Int, Bool, Duration,
// StringList, Redis, Shards) panic on a setting without a flag name or declared
// twice (the same flag or variable), which is a programming error. A Set is
// not safe for concurrent use; it is meant to be used from run before
// anything starts.
type Set struct {
	name     string
	getenv   func(string) string
	out      io.Writer
	settings []*setting
	args     []string
}

// setting is the type-erased part of a [Var].
type setting struct {
	flag, env, usage, kind string
	def                    string // the default as shown in usage and Markdown
	secret                 bool
	isBool                 bool
	source                 Source
	raw                    string                  // the value as given, for errors
	parse                  func(raw string) error  // sets the target from text
	show                   func(raw string) string // how a given value may be shown
	current                func() string           // the current value as shown
	validate               func() error            // the Var's checks
	err                    *Error                  // the first parse error
	fam                    *family                 // the family it is a member of (Var.Of), or nil
	docDef                 string                  // the default Markdown shows instead of def (Var.DocDefault)
}

// Var is one declared setting whose value has type T. Its methods configure
// the setting and return it for chaining; call them before [Set.Parse].
type Var[T any] struct {
	s      *setting
	p      *T
	checks []func(T) error
	format func(T) string // a value as the usage text shows it
}

// NewSet returns an empty Set for the binary name (used in the usage text).
// getenv looks up an environment variable, returning "" when it is unset;
// pass os.Getenv in main and a map lookup in tests. An environment variable
// set to the empty string counts as unset. The usage text goes to os.Stderr
// unless [Set.SetOutput] says otherwise.
func NewSet(name string, getenv func(string) string) *Set {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &Set{name: name, getenv: getenv, out: os.Stderr}
}

// SetOutput sets where [Set.Parse] writes the usage text when asked for help.
func (s *Set) SetOutput(w io.Writer) { s.out = w }

// Args returns the arguments left after the flags, once [Set.Parse] has run.
func (s *Set) Args() []string { return s.args }

func register[T any](s *Set, p *T, flagName, env, kind, usage string, def T, format func(T) string, parse func(string) (T, error)) *Var[T] {
	if flagName == "" {
		panic("config: every setting needs a flag name")
	}
	for _, o := range s.settings {
		if o.flag == flagName || (env != "" && o.env == env) {
			panic(fmt.Sprintf("config: setting -%s / %s declared twice", flagName, env))
		}
	}
	*p = def
	v := &Var[T]{p: p, format: format}
	st := &setting{
		flag: flagName, env: env, usage: usage, kind: kind,
		def:    format(def),
		source: FromDefault,
		raw:    format(def),
		show:   strconv.Quote,
	}
	st.parse = func(raw string) error {
		x, err := parse(raw)
		if err != nil {
			return err
		}
		*p = x
		return nil
	}
	st.current = func() string { return format(*p) }
	st.validate = func() error {
		for _, c := range v.checks {
			if err := c(*p); err != nil {
				return err
			}
		}
		return nil
	}
	v.s = st
	s.settings = append(s.settings, st)
	return v
}

// String declares a string setting, sets *p to def, and returns the
// setting for [Var.Secret] and [Var.Check]. A flag name (without the dash)
// is required; env may be "" for a flag-only setting, which reads no
// variable. usage is the one-line meaning shown by -h and [Set.Markdown].
// The other declaring methods take the same arguments.
func (s *Set) String(p *string, flagName, env, def, usage string) *Var[string] {
	return register(s, p, flagName, env, "string", usage, def,
		func(v string) string { return v },
		func(raw string) (string, error) { return raw, nil })
}

// Int declares an integer setting (decimal, or 0x-prefixed hexadecimal).
func (s *Set) Int(p *int, flagName, env string, def int, usage string) *Var[int] {
	return register(s, p, flagName, env, "int", usage, def, strconv.Itoa,
		func(raw string) (int, error) {
			n, err := strconv.ParseInt(strings.TrimSpace(raw), 0, strconv.IntSize)
			if err != nil {
				return 0, errors.New("not an integer")
			}
			return int(n), nil
		})
}

// Bool declares a boolean setting. The variable and flag accept what
// strconv.ParseBool does (1, t, T, true, TRUE, True, and 0, f, F, false,
// FALSE, False); on the command line "-name" alone means true, and false
// must be written "-name=false".
func (s *Set) Bool(p *bool, flagName, env string, def bool, usage string) *Var[bool] {
	v := register(s, p, flagName, env, "bool", usage, def, strconv.FormatBool,
		func(raw string) (bool, error) {
			b, err := strconv.ParseBool(strings.TrimSpace(raw))
			if err != nil {
				return false, errors.New("not a boolean (want true or false)")
			}
			return b, nil
		})
	v.s.isBool = true
	return v
}

// Duration declares a duration setting written as Go durations are, such as
// 500ms, 30s or 1m30s. A bare 0 means zero.
func (s *Set) Duration(p *time.Duration, flagName, env string, def time.Duration, usage string) *Var[time.Duration] {
	return register(s, p, flagName, env, "duration", usage, def, time.Duration.String,
		func(raw string) (time.Duration, error) {
			d, err := time.ParseDuration(strings.TrimSpace(raw))
			if err != nil {
				return 0, errors.New("not a duration (write it like 500ms, 30s or 1m30s)")
			}
			return d, nil
		})
}

// StringList declares a comma-separated list. Items are trimmed of spaces and
// empty items are dropped, so "a, b,," is [a b] and "" is an empty list.
func (s *Set) StringList(p *[]string, flagName, env string, def []string, usage string) *Var[[]string] {
	return register(s, p, flagName, env, "list", usage, slices.Clone(def),
		func(v []string) string { return strings.Join(v, ",") },
		func(raw string) ([]string, error) { return splitList(raw), nil })
}

func splitList(raw string) []string {
	var out []string
	for item := range strings.SplitSeq(raw, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Redis declares a Redis URL setting, parsed with [redisconn.Parse] into
// *p: one node (redis://[user:password@]host[:port][/db], rediss:// for TLS
// with the server name checked against the host, unix:///path for a
// socket), a Sentinel group (?master_name=NAME&addr=…) or a Cluster
// (several addr), each with go-redis's query options such as
// ?dial_timeout=3s, and ContextTimeoutEnabled set so that context deadlines
// bound commands. def must be a valid URL; [DefaultRedisURL] is the
// convention. Passwords (of the user info and of the password query
// parameter) are redacted wherever the URL is shown, errors included.
func (s *Set) Redis(p **redisconn.Options, flagName, env, def, usage string) *Var[*redisconn.Options] {
	opts, err := parseRedisURL(def)
	if err != nil {
		panic(fmt.Sprintf("config: default of -%s: %v", flagName, err))
	}
	v := register(s, p, flagName, env, "url", usage, opts,
		func(o *redisconn.Options) string { return o.String() },
		parseRedisURL)
	v.s.show = func(raw string) string { return strconv.Quote(redisconn.Redact(raw)) }
	return v
}

// ShardsForms describes the values of a queue shard setting, for its usage
// text (see [Set.Shards]).
const ShardsForms = "N, or N,OLD while the tasks placed under OLD drain (see docs/scaling.md, Queue shards)"

// Shards declares a queue shard setting, parsed with tasks.ParseShards into
// *p: a count N from 1 to tasks.MaxShards, then the counts that drain
// ("3", "3,1"). It defaults to 1, one queue per task type.
func (s *Set) Shards(p *tasks.Shards, flagName, env, usage string) *Var[tasks.Shards] {
	return register(s, p, flagName, env, "shards", usage, tasks.Shards{Count: 1}, tasks.Shards.String,
		func(raw string) (tasks.Shards, error) {
			sh, err := tasks.ParseShards(raw)
			if err != nil {
				// The *Error around this one names the setting and the
				// value.
				return tasks.Shards{}, trimmed{fmt.Sprintf("want a count from 1 to %d, then the counts that drain, e.g. 3 or 3,1", tasks.MaxShards), err}
			}
			return sh, nil
		})
}

func parseRedisURL(raw string) (*redisconn.Options, error) {
	o, err := redisconn.Parse(raw)
	if err != nil {
		// The *Error around this one names the setting: drop the
		// package's prefix, keep matching redisconn.ErrURL.
		return nil, trimmed{strings.TrimPrefix(err.Error(), redisconn.ErrURL.Error()+": "), err}
	}
	return o, nil
}

// trimmed is an error shown with a shorter message than the one it wraps.
type trimmed struct {
	msg string
	err error
}

func (e trimmed) Error() string { return e.msg }
func (e trimmed) Unwrap() error { return e.err }

// Secret marks the setting as a secret: its default and value never appear
// in the usage text, [Set.Markdown], [Set.Entries] or error messages.
func (v *Var[T]) Secret() *Var[T] {
	v.s.secret = true
	return v
}

// Check adds validators that [Set.Parse] runs on the final value, whatever
// its source (the default included), in order, stopping at the first error.
// A validator's error should say what is wanted ("must be positive"); Parse
// adds the flag, the variable and the value.
func (v *Var[T]) Check(fns ...func(T) error) *Var[T] {
	v.checks = append(v.checks, fns...)
	return v
}

// Source reports where the value came from, once [Set.Parse] has run.
func (v *Var[T]) Source() Source { return v.s.source }

// Parse reads the settings: first the defaults, then the environment
// variables, then args (the command line without the program name), then
// runs every setting's checks. It returns [ErrHelp] after writing the usage
// text when args ask for help, and otherwise every bad setting as an *[Error]
// (joined with errors.Join) or an error about an unknown flag. Call it once.
func (s *Set) Parse(args []string) error {
	var errs []error
	for _, st := range s.settings {
		if st.env == "" {
			continue
		}
		raw := s.getenv(st.env)
		if raw == "" {
			continue
		}
		st.source, st.raw = FromEnv, raw
		if err := st.parse(raw); err != nil {
			st.err = errorFor(st, err)
		}
	}

	fs := flag.NewFlagSet(s.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	for _, st := range s.settings {
		fs.Var(flagValue{st}, st.flag, st.usage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.WriteUsage(s.out)
			return ErrHelp
		}
		// The flag package's own errors are about unknown flags and missing
		// arguments; bad values are caught by flagValue below.
		return fmt.Errorf("config: %w (run with -h for the list of flags)", err)
	}
	s.args = fs.Args()
	// A bad variable that a flag overrides is no error: the flag wins.
	for _, st := range s.settings {
		if st.err != nil {
			errs = append(errs, st.err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, st := range s.settings {
		if err := st.validate(); err != nil {
			errs = append(errs, errorFor(st, err))
		}
	}
	return errors.Join(errs...)
}

// errorFor describes err about the setting's current raw value.
func errorFor(st *setting, err error) *Error {
	value := st.show(st.raw)
	if st.secret {
		value = redacted
	}
	return &Error{Flag: st.flag, Env: st.env, Source: st.source, Value: value, Err: err}
}

// flagValue adapts a setting to flag.Value. Set never fails, so that the flag
// package, which quotes the raw value in its errors, never sees a secret; the
// error is kept on the setting and reported by Parse.
type flagValue struct{ st *setting }

func (f flagValue) String() string {
	if f.st == nil || f.st.secret {
		return ""
	}
	return f.st.def
}

func (f flagValue) Set(raw string) error {
	st := f.st
	st.source, st.raw, st.err = FromFlag, raw, nil
	if err := st.parse(raw); err != nil {
		st.err = errorFor(st, err)
	}
	return nil
}

func (f flagValue) IsBoolFlag() bool { return f.st != nil && f.st.isBool }

// WriteUsage writes the usage text: every flag with its type, variable,
// default (not for secrets) and meaning, in declaration order.
func (s *Set) WriteUsage(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s [flags]\n\n", s.name)
	b.WriteString("Each flag can also be set by the environment variable shown; a flag wins\n")
	b.WriteString("over the variable, and the variable over the default.\n\n")
	for _, st := range s.settings {
		fmt.Fprintf(&b, "  -%s", st.flag)
		if !st.isBool {
			fmt.Fprintf(&b, " %s", st.kind)
		}
		fmt.Fprintf(&b, "\n    \t%s (", st.usage)
		if st.env != "" {
			fmt.Fprintf(&b, "env %s, ", st.env)
		} else {
			b.WriteString("no env, ")
		}
		switch {
		case st.secret:
			b.WriteString("secret")
		case st.def == "":
			b.WriteString("no default")
		default:
			fmt.Fprintf(&b, "default %q", st.def)
		}
		b.WriteString(")\n")
	}
	_, _ = io.WriteString(w, b.String())
}

// Markdown returns the settings as a Markdown table for a doc:
// | flag | env | default | meaning |, one row per setting in declaration
// order, but one row per family (see [Var.Of]). A secret's default shows
// as "(secret)", an empty one as "(none)", and one set by [Var.DocDefault]
// as that text.
func (s *Set) Markdown() string {
	var b strings.Builder
	b.WriteString("| flag | env | default | meaning |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, r := range s.markdownRows() {
		b.WriteString(r)
	}
	return b.String()
}

func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "`", "'").Replace(s)
}

// Entry is one setting's effective value, for a startup log line.
type Entry struct {
	// Flag is the flag name without the dash.
	Flag string
	// Env is the environment variable, or "" for a flag-only setting.
	Env string
	// Value is the value as text: "<redacted>" for a secret that is set
	// and "" for one that is not, and a Redis URL with its password redacted.
	Value string
	// Source is where the value came from.
	Source Source
}

// Entries returns every setting's effective value, in declaration order,
// with secrets redacted. Call it after [Set.Parse].
func (s *Set) Entries() []Entry {
	out := make([]Entry, 0, len(s.settings))
	for _, st := range s.settings {
		v := st.current()
		if st.secret && v != "" {
			v = redacted
		}
		out = append(out, Entry{Flag: st.flag, Env: st.env, Value: v, Source: st.source})
	}
	return out
}

// CheckDoc reports whether doc (a Markdown file) holds the Set's [Set.Markdown]
// table between the lines "<!-- section:begin -->" and
// "<!-- section:end -->". Binaries call it from a test so that the
// documented settings never drift from the code; the error says what to
// paste, or to run the test with UPDATE_DOCS=1 (see [Set.UpdateDoc]).
func (s *Set) CheckDoc(doc []byte, section string) error {
	_, table, _, err := cutDoc(doc, section)
	if err != nil {
		return err
	}
	if want := s.Markdown(); table != want {
		return fmt.Errorf("config: the %s table is stale; run the test with UPDATE_DOCS=1, or replace it with:\n%s", section, want)
	}
	return nil
}

// UpdateDoc returns doc with the table between the section's markers
// replaced by the Set's [Set.Markdown], for a test that rewrites the doc
// when asked to (UPDATE_DOCS=1).
func (s *Set) UpdateDoc(doc []byte, section string) ([]byte, error) {
	before, _, after, err := cutDoc(doc, section)
	if err != nil {
		return nil, err
	}
	return []byte(before + s.Markdown() + after), nil
}

// cutDoc splits doc around the table of section: what precedes it (the
// begin marker included), the table, and what follows (from the end marker).
func cutDoc(doc []byte, section string) (before, table, after string, err error) {
	begin, end := "<!-- "+section+":begin -->\n", "<!-- "+section+":end -->"
	head, rest, ok := strings.Cut(string(doc), begin)
	if !ok {
		return "", "", "", fmt.Errorf("config: no %q marker", strings.TrimSpace(begin))
	}
	table, tail, ok := strings.Cut(rest, end)
	if !ok {
		return "", "", "", fmt.Errorf("config: no %q marker", end)
	}
	return head + begin, table, end + tail, nil
}

// CheckOrUpdateDoc is CheckDoc, or, when the environment variable
// UPDATE_DOCS is "1", UpdateDoc written back to the file at path. Binaries'
// tests call it with the doc that holds their table.
func (s *Set) CheckOrUpdateDoc(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if os.Getenv("UPDATE_DOCS") != "1" {
		return s.CheckDoc(doc, section)
	}
	updated, err := s.UpdateDoc(doc, section)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, updated, 0o644); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// LogField returns the settings as one zap field, "settings", with secrets
// redacted as in [Set.Entries], for a binary's start-up log line.
func (s *Set) LogField() zap.Field {
	var fields []zap.Field
	for _, e := range s.Entries() {
		fields = append(fields, zap.String(e.Flag, e.Value))
	}
	return zap.Dict("settings", fields...)
}
