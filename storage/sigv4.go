package storage

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// AWS Signature Version 4, the parts the local backend signs and verifies
// with: POST policies (browser uploads) and query-string presigned URLs.
// https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html
// https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html

const (
	sigAlgorithm    = "AWS4-HMAC-SHA256"
	amzDateFormat   = "20060102T150405Z"
	scopeDateFormat = "20060102"
	sigService      = "s3"
	sigTerminator   = "aws4_request"
	unsignedPayload = "UNSIGNED-PAYLOAD"
)

// credential is the X-Amz-Credential value:
// <access key>/<yyyymmdd>/<region>/s3/aws4_request.
type credential struct {
	accessKey, date, region string
}

func (c credential) String() string {
	return c.accessKey + "/" + c.scope()
}

func (c credential) scope() string {
	return c.date + "/" + c.region + "/" + sigService + "/" + sigTerminator
}

var errMalformedCredential = errors.New("want <access key>/<yyyymmdd>/<region>/s3/aws4_request")

func parseCredential(s string) (credential, error) {
	// The access key may itself hold "/", so the scope is cut from the end.
	parts := strings.Split(s, "/")
	if len(parts) < 5 {
		return credential{}, errMalformedCredential
	}
	n := len(parts)
	c := credential{accessKey: strings.Join(parts[:n-4], "/"), date: parts[n-4], region: parts[n-3]}
	if parts[n-2] != sigService || parts[n-1] != sigTerminator || c.accessKey == "" || c.region == "" {
		return credential{}, errMalformedCredential
	}
	if _, err := time.Parse(scopeDateFormat, c.date); err != nil {
		return credential{}, errMalformedCredential
	}
	return c, nil
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// signingKey derives the key that signs requests of one day, region and
// service from the secret key.
func signingKey(secret string, c credential) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), c.date)
	k = hmacSHA256(k, c.region)
	k = hmacSHA256(k, sigService)
	return hmacSHA256(k, sigTerminator)
}

// policySignature signs a base64 POST policy.
func policySignature(secret string, c credential, policyB64 string) string {
	return hex.EncodeToString(hmacSHA256(signingKey(secret, c), policyB64))
}

// signaturesEqual compares hex signatures in constant time.
func signaturesEqual(want, got string) bool {
	return hmac.Equal([]byte(want), []byte(strings.ToLower(got)))
}

// uriEncode is SigV4's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ is
// percent-encoded (upper-case hex); "/" too unless keepSlash.
func uriEncode(s string, keepSlash bool) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == '~', c == '/' && keepSlash:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// canonicalQuery encodes q sorted by name, then value, leaving out
// X-Amz-Signature.
func canonicalQuery(q url.Values) string {
	type pair struct{ k, v string }
	var pairs []pair
	for k, vs := range q {
		if k == "X-Amz-Signature" {
			continue
		}
		for _, v := range vs {
			pairs = append(pairs, pair{uriEncode(k, false), uriEncode(v, false)})
		}
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].k != pairs[j].k {
			return pairs[i].k < pairs[j].k
		}
		return pairs[i].v < pairs[j].v
	})
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.k)
		b.WriteByte('=')
		b.WriteString(p.v)
	}
	return b.String()
}

// presignedRequest is what a query-string signature covers. Headers holds
// the lower-case names and values of the signed headers, host included.
type presignedRequest struct {
	method  string
	path    string // decoded; encoded with uriEncode for signing
	query   url.Values
	headers map[string]string
}

// signature of r with the credential and date already in r.query.
func (r presignedRequest) signature(secret string, c credential, amzDate string) string {
	names := make([]string, 0, len(r.headers))
	for name := range r.headers {
		names = append(names, name)
	}
	sort.Strings(names)
	var canonicalHeaders strings.Builder
	for _, name := range names {
		canonicalHeaders.WriteString(name + ":" + strings.Join(strings.Fields(r.headers[name]), " ") + "\n")
	}
	canonicalRequest := strings.Join([]string{
		r.method,
		uriEncode(r.path, true),
		canonicalQuery(r.query),
		canonicalHeaders.String(),
		strings.Join(names, ";"),
		unsignedPayload,
	}, "\n")
	sum := sha256.Sum256([]byte(canonicalRequest))
	stringToSign := sigAlgorithm + "\n" + amzDate + "\n" + c.scope() + "\n" + hex.EncodeToString(sum[:])
	return hex.EncodeToString(hmacSHA256(signingKey(secret, c), stringToSign))
}

// presignQuery returns the query of a GET of path on host signed at now for
// ttl, X-Amz-Signature last as AWS writes it.
func presignQuery(secret string, c credential, host, path string, now time.Time, ttl time.Duration) string {
	amzDate := now.UTC().Format(amzDateFormat)
	q := url.Values{
		"X-Amz-Algorithm":     {sigAlgorithm},
		"X-Amz-Credential":    {c.String()},
		"X-Amz-Date":          {amzDate},
		"X-Amz-Expires":       {strconv.FormatInt(int64(ttl/time.Second), 10)},
		"X-Amz-SignedHeaders": {"host"},
	}
	r := presignedRequest{method: "GET", path: path, query: q, headers: map[string]string{"host": host}}
	return canonicalQuery(q) + "&X-Amz-Signature=" + r.signature(secret, c, amzDate)
}
