package main

import (
	"context"
	"errors"
	"io"
)

// serve runs the HTTP intake. Placeholder until the intake lands.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return errors.New("serve: not implemented yet")
}
