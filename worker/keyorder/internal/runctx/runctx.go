// Package runctx is the context key under which a keyorder Runner hands a
// handler its run (keyorder.Run, read with keyorder.RunFrom). It is shared
// by package keyorder and its test helpers (package keyordertest), so that
// a unit test can give a handler a run without a Runner; nothing else may
// use it.
package runctx

// Key is the context key of a handler's keyorder.Run.
type Key struct{}
