package config

import (
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// Storage is the object storage of batch job files.
type Storage struct {
	// Backend is "local" (files under data_dir, served by the gateway) or
	// "s3" (any S3-compatible store). restart-only.
	Backend string `yaml:"backend"`
	// MaxUploadBytes bounds a batch input file; at most 5GiB, the spec's
	// limit and S3's for POST uploads.
	MaxUploadBytes ByteSize `yaml:"max_upload_bytes"`
	// UploadTTL and DownloadTTL are how long presigned upload and download
	// URLs stay valid (1s..168h, SigV4's limit).
	UploadTTL   time.Duration `yaml:"upload_ttl"`
	DownloadTTL time.Duration `yaml:"download_ttl"`
	Local       StorageLocal  `yaml:"local"`
	S3          StorageS3     `yaml:"s3"`
}

// StorageLocal is the embedded backend. restart-only.
type StorageLocal struct {
	// Listen is the address of the upload and download endpoint. It is not
	// the API listener: uploads of up to 5GiB stream to disk there, while
	// the API reads bodies whole and caps them at server.max_request_body.
	Listen string `yaml:"listen"`
	// PublicBaseURL is the address clients reach Listen at, written into
	// presigned URLs; default http://<listen> (with 127.0.0.1 for an
	// unspecified host such as 0.0.0.0).
	PublicBaseURL string `yaml:"public_base_url"`
}

// StorageS3 is an S3-compatible store (AWS, MinIO, R2). restart-only.
type StorageS3 struct {
	// Endpoint is host[:port] without a scheme; UseSSL selects https.
	Endpoint  string `yaml:"endpoint"`
	Region    string `yaml:"region"`
	Bucket    string `yaml:"bucket"`
	AccessKey string `yaml:"access_key"`
	SecretKey string `yaml:"secret_key"`
	UseSSL    bool   `yaml:"use_ssl"`
	// PublicEndpoint is the http(s) URL clients reach the store at, for
	// presigned URLs, when it differs from Endpoint (a store on a private
	// network behind a public ingress); empty: Endpoint.
	PublicEndpoint string `yaml:"public_endpoint"`
	// CreateBucket creates Bucket at start when it does not exist.
	CreateBucket bool `yaml:"create_bucket"`
}

// Storage defaults; gateway.yaml documents each.
const (
	DefaultStorageBackend = "local"
	DefaultMaxUploadBytes = 5 << 30 // 5GiB
	DefaultUploadTTL      = time.Hour
	DefaultDownloadTTL    = time.Hour
	DefaultStorageListen  = "127.0.0.1:8081"
	DefaultS3Region       = "us-east-1"
	DefaultS3Bucket       = "tollgate"
)

// StorageBackends are the values of storage.backend.
var StorageBackends = []string{"local", "s3"}

const maxPresignTTL = 7 * 24 * time.Hour

// bucketName is S3's rule for bucket names (3..63 characters).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

func applyStorageDefaults(s *Storage) {
	setDefault(&s.Backend, DefaultStorageBackend)
	setDefault(&s.MaxUploadBytes, DefaultMaxUploadBytes)
	setDefault(&s.UploadTTL, DefaultUploadTTL)
	setDefault(&s.DownloadTTL, DefaultDownloadTTL)
	setDefault(&s.Local.Listen, DefaultStorageListen)
	setDefault(&s.S3.Region, DefaultS3Region)
	setDefault(&s.S3.Bucket, DefaultS3Bucket)
}

func (l *loader) validateStorage(s Storage) {
	l.check(s.Backend == "local" || s.Backend == "s3", "storage.backend",
		"%q is not one of %s", s.Backend, strings.Join(StorageBackends, ", "))
	l.check(s.MaxUploadBytes >= 1 && s.MaxUploadBytes <= DefaultMaxUploadBytes, "storage.max_upload_bytes",
		"%d bytes is outside 1..5GiB", s.MaxUploadBytes)
	l.check(s.UploadTTL >= time.Second && s.UploadTTL <= maxPresignTTL, "storage.upload_ttl",
		"%s is outside 1s..168h", s.UploadTTL)
	l.check(s.DownloadTTL >= time.Second && s.DownloadTTL <= maxPresignTTL, "storage.download_ttl",
		"%s is outside 1s..168h", s.DownloadTTL)
	switch s.Backend {
	case "local":
		l.checkHostPort(s.Local.Listen, "storage.local.listen")
		if s.Local.PublicBaseURL != "" {
			l.checkBaseURL(s.Local.PublicBaseURL, "storage.local.public_base_url")
		}
	case "s3":
		e := s.S3
		switch {
		case e.Endpoint == "":
			l.check(false, "storage.s3.endpoint", "required with backend s3: host[:port] such as s3.amazonaws.com or 127.0.0.1:9000")
		case strings.Contains(e.Endpoint, "://") || strings.ContainsAny(e.Endpoint, "/?# \t"):
			l.check(false, "storage.s3.endpoint", "%q: want host[:port] without a scheme or path (use_ssl selects https)", e.Endpoint)
		}
		l.check(bucketName.MatchString(e.Bucket) && !strings.Contains(e.Bucket, ".."), "storage.s3.bucket",
			"%q is not an S3 bucket name (3 to 63 lowercase letters, digits, dots and hyphens)", e.Bucket)
		l.check(e.AccessKey != "", "storage.s3.access_key", "required with backend s3")
		l.check(e.SecretKey != "", "storage.s3.secret_key", "required with backend s3")
		l.check(!hasSpace(e.Region), "storage.s3.region", "%q contains whitespace", e.Region)
		if e.PublicEndpoint != "" {
			l.checkBaseURL(e.PublicEndpoint, "storage.s3.public_endpoint")
		}
	}
}

// checkBaseURL wants an absolute http(s) URL with no query or fragment.
func (l *loader) checkBaseURL(v, path string) {
	if !l.checkURLBlanks(v, path) {
		return
	}
	u, err := url.Parse(v)
	ok := err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.RawQuery == "" && u.Fragment == "" && u.User == nil
	l.check(ok, path, "%q: want an absolute http:// or https:// URL without query, such as https://files.example.com", v)
}

// storageRestartOnly names the storage fields a reload cannot change: the
// backend and its connection are built once at start. The size limit and
// the URL lifetimes are read per request and reload freely.
func storageRestartOnly(c, old Storage) []string {
	var changed []string
	if c.Backend != old.Backend {
		changed = append(changed, "storage.backend")
	}
	changed = append(changed, structDiff("storage.local", c.Local, old.Local)...)
	return append(changed, structDiff("storage.s3", c.S3, old.S3)...)
}

// structDiff names, as yaml paths under prefix, the fields of two values of
// one struct type that differ.
func structDiff(prefix string, a, b any) []string {
	av, bv := reflect.ValueOf(a), reflect.ValueOf(b)
	var changed []string
	for i := range av.NumField() {
		if name := yamlName(av.Type().Field(i)); name != "" &&
			!reflect.DeepEqual(av.Field(i).Interface(), bv.Field(i).Interface()) {
			changed = append(changed, fmt.Sprintf("%s.%s", prefix, name))
		}
	}
	return changed
}
