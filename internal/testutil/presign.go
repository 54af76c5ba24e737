package testutil

import (
	"net/url"
	"strconv"
	"testing"
	"time"
)

// PresignedExpiry is when a presigned URL (SigV4, as storage signs them)
// expires by its signature: X-Amz-Date plus X-Amz-Expires seconds.
func PresignedExpiry(t testing.TB, link string) time.Time {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	signedAt, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		t.Fatalf("X-Amz-Date of %s: %v", link, err)
	}
	seconds, err := strconv.Atoi(q.Get("X-Amz-Expires"))
	if err != nil {
		t.Fatalf("X-Amz-Expires of %s: %v", link, err)
	}
	return signedAt.Add(time.Duration(seconds) * time.Second)
}
