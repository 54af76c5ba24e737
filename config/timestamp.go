package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Timestamp is a moment written as a date, 2025-01-27 (its midnight UTC),
// or as Unix seconds, and held as Unix seconds, which is what OpenAI's
// Model.created is.
type Timestamp int64

// lastTimestamp is 9999-12-31T23:59:59Z: a value past it is most likely
// milliseconds (JavaScript's Date.now()), which would sort as the far
// future.
const lastTimestamp = 253402300799

// ParseTimestamp reads "2025-01-27" or "1737936000". An error quotes the
// value as written.
func ParseTimestamp(s string) (Timestamp, error) {
	written := s
	s = strings.TrimSpace(s)
	if day, err := time.Parse(time.DateOnly, s); err == nil {
		if day.Unix() < 0 {
			return 0, fmt.Errorf("date %q is before 1970-01-01", written)
		}
		return Timestamp(day.Unix()), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil && strings.Count(s, "-") >= 2 && strings.ContainsAny(s, "T:"):
		return 0, fmt.Errorf("date %q: write the day alone, such as 2025-01-27, or the moment in Unix seconds", written)
	case err != nil && strings.Count(s, "-") == 2:
		return 0, fmt.Errorf("date %q: want a day that exists, written YYYY-MM-DD, such as 2025-01-27", written)
	case err != nil && !isDigits(s):
		return 0, fmt.Errorf("%q: want a date such as 2025-01-27, or Unix seconds such as 1737936000", written)
	case n < 0:
		return 0, fmt.Errorf("%q is before 1970-01-01: want Unix seconds, 0 or more", written)
	case err != nil || n > lastTimestamp:
		return 0, fmt.Errorf("%q is after 9999-12-31 in Unix seconds (milliseconds? drop the last three digits), or write a date such as 2025-01-27", written)
	}
	return Timestamp(n), nil
}

func isDigits(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// String is the timestamp as a date when it is a midnight UTC, as it is
// most often written, else as Unix seconds.
func (t Timestamp) String() string {
	if t%86400 == 0 {
		return time.Unix(int64(t), 0).UTC().Format(time.DateOnly)
	}
	return strconv.FormatInt(int64(t), 10)
}

// UnmarshalYAML accepts a date or Unix seconds.
func (t *Timestamp) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseTimestamp(n.Value)
	if err != nil {
		return err
	}
	*t = v
	return nil
}
