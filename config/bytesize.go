package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ByteSize is a size written as a plain byte count or with a unit:
// 512KiB, 8MiB, 5GB (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// byteUnitNames lists the accepted units, for error messages.
const byteUnitNames = "KiB, MiB, GiB (powers of 1024), KB, MB, GB (of 1000) or B"

// ParseByteSize parses "8MiB", "1000000" or "5GB". An error quotes the
// value as written.
func ParseByteSize(s string) (ByteSize, error) {
	written := s
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err == nil && n < 0:
		return 0, fmt.Errorf("size %q is negative", written)
	case err != nil && errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("size %q is too large", written)
	case err != nil && isWhole(s):
		// 1.0MiB or 1e3KiB: a whole number, written as a float.
		return 0, fmt.Errorf("size %q: write the number without a point or exponent, such as %s", written, wholeNumber(s, written))
	case err != nil && isFraction(s):
		return 0, fmt.Errorf("size %q is not a whole number: write it in a smaller unit%s", written, wholeHint(s, mult))
	case err != nil:
		return 0, fmt.Errorf("size %q: want a byte count such as 1048576, or a whole number with a unit: %s", written, byteUnitNames)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", written)
	}
	return ByteSize(n * mult), nil
}

// isWhole reports whether s is a whole number written as a float.
func isWhole(s string) bool {
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && isFraction(s) && f == math.Trunc(f) && f < 1<<62
}

// wholeNumber is written with the float s replaced by its whole number.
func wholeNumber(s, written string) string {
	f, _ := strconv.ParseFloat(s, 64)
	return strings.Replace(strings.TrimSpace(written), s, strconv.FormatInt(int64(f), 10), 1)
}

func isFraction(s string) bool {
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && f >= 0 && !strings.ContainsAny(s, "xXpP_") // not hex, Inf or NaN
}

// wholeHint suggests the size s (a fraction of mult) as whole KiB or
// bytes, when it is one.
func wholeHint(s string, mult int64) string {
	f, _ := strconv.ParseFloat(s, 64)
	b := f * float64(mult)
	if b != float64(int64(b)) || b > 1<<53 {
		return ""
	}
	if n := int64(b); n%1024 == 0 {
		return fmt.Sprintf(", such as %dKiB", n/1024)
	}
	return fmt.Sprintf(", such as %d", int64(b))
}

// UnmarshalYAML accepts an integer or a string with a unit.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return err
	}
	*b = v
	return nil
}
