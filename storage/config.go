package storage

import (
	"context"
	"fmt"
	"net"

	"github.com/tollgate/tollgate/config"
)

// FromConfig builds the store cfg.Storage selects. For the local backend
// the caller must also serve it: (*Local).Serve on a listener bound to
// cfg.Storage.Local.Listen, and (*Local).Shutdown when stopping.
// An s3 store that does not answer is checked again in the background
// until ctx ends (see NewS3).
func FromConfig(ctx context.Context, cfg *config.Config, logf func(string, ...any)) (Store, error) {
	s := cfg.Storage
	switch s.Backend {
	case "local":
		base := s.Local.PublicBaseURL
		if base == "" {
			base = DefaultPublicBaseURL(s.Local.Listen)
		}
		return NewLocal(LocalOptions{DataDir: cfg.Server.DataDir, PublicBaseURL: base, Logf: logf})
	case "s3":
		e := s.S3
		return NewS3(ctx, S3Options{
			Endpoint: e.Endpoint, UseSSL: e.UseSSL, Region: e.Region, Bucket: e.Bucket,
			AccessKey: e.AccessKey, SecretKey: e.SecretKey,
			PublicEndpoint: e.PublicEndpoint, CreateBucket: e.CreateBucket, Logf: logf,
		})
	}
	return nil, fmt.Errorf("storage: unknown backend %q (want local or s3)", s.Backend)
}

// DefaultPublicBaseURL is http://<listen>, with 127.0.0.1 for a host that
// listens everywhere (0.0.0.0, ::, empty): clients on other machines need
// storage.local.public_base_url.
func DefaultPublicBaseURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
