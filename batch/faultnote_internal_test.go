package batch

import "testing"

func TestWithoutAddresses(t *testing.T) {
	for in, want := range map[string]string{
		`reading the input size: storage: batch/demo/x/input.ndjson: Head "http://127.0.0.1:11106/tollgate/batch/demo/x/input.ndjson": dial tcp 127.0.0.1:11106: connect: connection refused`: `reading the input size: storage: batch/demo/x/input.ndjson: Head <address>: dial tcp <address>: connect: connection refused`,
		`dial tcp [::1]:4222: i/o timeout`:         `dial tcp <address>: i/o timeout`,
		`lookup minio.internal:9000: no such host`: `lookup <address>: no such host`,
		`nats: timeout`: `nats: timeout`,
		`stopped at line 12: classification engine unavailable`: `stopped at line 12: classification engine unavailable`,
	} {
		if got := withoutAddresses(in); got != want {
			t.Errorf("withoutAddresses(%q)\n = %q\nwant %q", in, got, want)
		}
	}
}
