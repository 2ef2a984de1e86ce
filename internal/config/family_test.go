package config_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/config"
)

// members declares -<name>-wait and -<name>-tries for each member, with
// the default wait of 5s but beta's 10s, after an -addr and before a
// -level.
func members(getenv func(string) string, names ...string) (*config.Set, map[string]*time.Duration) {
	s := config.NewSet("demo", getenv)
	s.SetOutput(&bytes.Buffer{})
	var addr, level string
	s.String(&addr, "addr", "DEMO_ADDR", ":8090", "listen address")
	wait := &config.Family[time.Duration]{Flag: "<member>-wait", Env: "<MEMBER>_WAIT", Usage: "how long a member waits; one per member", Default: 5 * time.Second}
	tries := &config.Family[int]{Flag: "<member>-tries", Usage: "tries of a member", Default: 3}
	waits := map[string]*time.Duration{}
	for _, name := range names {
		def := 5 * time.Second
		if name == "beta" {
			def = 10 * time.Second
		}
		waits[name] = new(time.Duration)
		s.Duration(waits[name], name+"-wait", name+"_WAIT", def, "how long "+name+" waits").Check(config.Positive).Of(wait, name)
		s.Int(new(int), name+"-tries", "", 3, "tries of "+name).Of(tries, name)
	}
	s.String(&level, "level", "", "info", "log level")
	return s, waits
}

// A family is one row, where its first member was declared, with the
// members whose default differs; a member with the family's default
// changes nothing.
func TestFamilyMarkdown(t *testing.T) {
	t.Parallel()
	s, _ := members(env(), "alpha", "beta")
	want := "| flag | env | default | meaning |\n" +
		"|---|---|---|---|\n" +
		"| `-addr` | `DEMO_ADDR` | `:8090` | listen address |\n" +
		"| `-<member>-wait` | `<MEMBER>_WAIT` | `5s` (`beta`: `10s`) | how long a member waits; one per member |\n" +
		"| `-<member>-tries` | — | `3` | tries of a member |\n" +
		"| `-level` | — | `info` | log level |\n"
	assert.Equal(t, want, s.Markdown())
	more, _ := members(env(), "alpha", "beta", "gamma")
	assert.Equal(t, want, more.Markdown(), "a member with the family's defaults changes nothing")
	one, _ := members(env(), "alpha")
	assert.Contains(t, one.Markdown(), "| `-<member>-wait` | `<MEMBER>_WAIT` | `5s` | how long a member waits; one per member |\n")
}

// The usage text, the values and the errors name each member's own
// setting.
func TestFamilyMembersAreSettings(t *testing.T) {
	t.Parallel()
	s, waits := members(env("beta_WAIT", "2s"), "alpha", "beta")
	var usage bytes.Buffer
	s.SetOutput(&usage)
	require.NoError(t, s.Parse([]string{"-alpha-wait=1s"}))
	assert.Equal(t, time.Second, *waits["alpha"])
	assert.Equal(t, 2*time.Second, *waits["beta"])

	require.ErrorIs(t, s.Parse([]string{"-h"}), config.ErrHelp)
	assert.Contains(t, usage.String(), "  -beta-wait duration\n    \thow long beta waits (env beta_WAIT, default \"10s\")\n")
	assert.NotContains(t, usage.String(), "<member>")

	bad, _ := members(env(), "alpha")
	err := bad.Parse([]string{"-alpha-wait=0s"})
	var ce *config.Error
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, "alpha-wait", ce.Flag)
}

func TestFamilySecretAndOf(t *testing.T) {
	t.Parallel()
	s := config.NewSet("demo", env())
	f := &config.Family[string]{Flag: "<member>-key", Env: "<MEMBER>_KEY", Usage: "a member's key"}
	s.String(new(string), "a-key", "A_KEY", "", "a's key").Of(f, "a")
	s.String(new(string), "b-key", "B_KEY", "key-of-b-123", "b's key").Secret().Of(f, "b")
	assert.Contains(t, s.Markdown(), "| `-<member>-key` | `<MEMBER>_KEY` | (secret) | a member's key |\n")
	assert.NotContains(t, s.Markdown(), "key-of-b-123")
	assert.Panics(t, func() { s.String(new(string), "c-key", "C_KEY", "", "c's key").Of(f, "") })
	assert.Panics(t, func() { s.String(new(string), "d-key", "D_KEY", "", "d's key").Of(nil, "d") })
}

func TestDocDefault(t *testing.T) {
	t.Parallel()
	var queues string
	s := config.NewSet("demo", env())
	var usage bytes.Buffer
	s.SetOutput(&usage)
	s.String(&queues, "queues", "DEMO_QUEUES", "a=1,b=2", "queues").DocDefault("each queue at its weight (`demo -h` | shows them)")
	assert.Contains(t, s.Markdown(), "| `-queues` | `DEMO_QUEUES` | each queue at its weight (`demo -h` \\| shows them) | queues |\n")
	require.ErrorIs(t, s.Parse([]string{"-h"}), config.ErrHelp)
	assert.Contains(t, usage.String(), `default "a=1,b=2"`)
	assert.Equal(t, "a=1,b=2", queues)
}
