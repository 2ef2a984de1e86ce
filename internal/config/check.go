package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// The validators below are for [Var.Check]. Their errors say what is wanted;
// [Set.Parse] adds the flag, the variable and the value.

// Number is the set of types [Positive] and [NonNegative] accept;
// time.Duration is one of them.
type Number interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64
}

// Positive fails for a value that is zero or negative.
func Positive[T Number](v T) error {
	if v <= 0 {
		return errors.New("must be positive")
	}
	return nil
}

// NonNegative fails for a negative value.
func NonNegative[T Number](v T) error {
	if v < 0 {
		return errors.New("must not be negative")
	}
	return nil
}

// OneOf returns a validator that fails for a string other than one of
// allowed (compared exactly).
func OneOf(allowed ...string) func(string) error {
	return func(v string) error {
		if !slices.Contains(allowed, v) {
			return fmt.Errorf("must be one of %s", strings.Join(allowed, ", "))
		}
		return nil
	}
}

// NotEmpty fails for an empty or all-space string.
func NotEmpty(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("must not be empty")
	}
	return nil
}

// URL returns a validator that fails unless the string is an absolute URL
// with a host and, when schemes are given, one of those schemes. An empty
// string passes, so that an optional URL may be left unset; add [NotEmpty]
// to require one.
func URL(schemes ...string) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		u, err := url.Parse(v)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // url.Error repeats the whole URL
			}
			return fmt.Errorf("not a valid URL: %w", err)
		}
		if !u.IsAbs() || u.Host == "" {
			return errors.New("must be an absolute URL such as http://host:port")
		}
		if len(schemes) > 0 && !slices.Contains(schemes, u.Scheme) {
			return fmt.Errorf("URL scheme must be one of %s", strings.Join(schemes, ", "))
		}
		return nil
	}
}

// AtLeastOne fails for a list with no items.
func AtLeastOne(v []string) error {
	if len(v) == 0 {
		return errors.New("must list at least one item")
	}
	return nil
}
