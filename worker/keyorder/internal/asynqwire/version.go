package asynqwire

import (
	"fmt"
	"runtime/debug"
)

// Version is the asynq release whose private Redis layout this package
// spells. Another release may lay its data out otherwise.
const Version = "v0.25.1"

// asynqModule is asynq's module path.
const asynqModule = "github.com/hibiken/asynq"

// CheckVersion returns an error when the running program was built with
// another asynq release than [Version] (an importing module that requires
// a newer asynq gets it, whatever this module's go.mod pins). It returns
// nil when the build carries no module information (go run of a file, a
// build without modules), or does not link asynq.
func CheckVersion() error {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return checkVersion(info)
}

func checkVersion(info *debug.BuildInfo) error {
	for _, m := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if m == nil || m.Path != asynqModule {
			continue
		}
		v := m.Version
		if m.Replace != nil {
			v = m.Replace.Version
		}
		if v != Version && v != "(devel)" && v != "" {
			return fmt.Errorf("asynqwire: built with %s %s, but orderworker relies on the Redis layout of %s: require %s %s in your go.mod",
				asynqModule, v, Version, asynqModule, Version)
		}
	}
	return nil
}
