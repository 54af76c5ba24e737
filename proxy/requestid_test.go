package proxy

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// Request ids are UUIDv7 (they are the usage events' ids in ClickHouse):
// version 7, RFC 4122 variant, the current millisecond in front, and
// never repeated.
func TestNewRequestIDIsAUUIDv7OfNow(t *testing.T) {
	before := time.Now().UnixMilli()
	seen := make(map[string]bool)
	for range 10000 {
		s := newRequestID()
		id, err := uuid.Parse(s)
		if err != nil || id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			t.Fatalf("%q: version %d, variant %v, err %v", s, id.Version(), id.Variant(), err)
		}
		sec, nsec := id.Time().UnixTime()
		if ms := sec*1000 + nsec/1e6; ms < before || ms > time.Now().UnixMilli() {
			t.Fatalf("%q carries %d ms, not the current millisecond (%d..)", s, ms, before)
		}
		if seen[s] {
			t.Fatalf("%q repeated", s)
		}
		seen[s] = true
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = newRequestID()
		}
	})
}
