package asynqwire

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// This module requires the asynq release asynqwire spells (a test binary
// carries no module list to check, so ask the go command).
func TestGoModPinsTheSpelledRelease(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", asynqModule).Output()
	require.NoError(t, err)
	require.Equal(t, Version, strings.TrimSpace(string(out)))
	require.NoError(t, CheckVersion())
}

// Another release, required by an importing module, is refused with what to
// do; a replacement is read for its version; a local replacement passes.
func TestAnotherAsynqReleaseIsRefused(t *testing.T) {
	t.Parallel()
	build := func(v string, replace *debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Deps: []*debug.Module{{Path: "github.com/redis/go-redis/v9", Version: "v9.23.0"},
			{Path: asynqModule, Version: v, Replace: replace}}}
	}
	require.NoError(t, checkVersion(build(Version, nil)))
	err := checkVersion(build("v0.26.0", nil))
	require.ErrorContains(t, err, "v0.26.0")
	require.ErrorContains(t, err, "require github.com/hibiken/asynq v0.25.1")
	require.Error(t, checkVersion(build(Version, &debug.Module{Path: asynqModule, Version: "v0.24.1"})))
	require.NoError(t, checkVersion(build("v0.26.0", &debug.Module{Path: "../asynq"})), "a local replacement has no version to check")
	require.NoError(t, checkVersion(&debug.BuildInfo{}), "a build without asynq")
}
