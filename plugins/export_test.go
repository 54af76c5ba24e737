package plugins

import (
	"errors"
	"testing"
	"time"
)

// FailEncodingWhen makes a classifier endpoint's answer fail to encode,
// as one with a NaN confidence did, when fails says so of its JSON,
// until the test ends. Call it before the gateway starts.
func FailEncodingWhen(t testing.TB, fails func(encoded []byte) bool) {
	t.Cleanup(func() { encodeAnswer = encodeJSON })
	encodeAnswer = func(v any) ([]byte, error) {
		b, err := encodeJSON(v)
		if err == nil && fails(b) {
			return nil, errors.New("json: unsupported value: NaN")
		}
		return b, err
	}
}

// LookForMissingVectorsEvery sets how often calls look again for a
// missing vectors file, until the test ends.
func LookForMissingVectorsEvery(t testing.TB, d time.Duration) {
	old := missingVectorsRetry
	t.Cleanup(func() { missingVectorsRetry = old })
	missingVectorsRetry = d
}
