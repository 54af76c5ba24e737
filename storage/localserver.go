package storage

import (
	"bytes"
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The local backend's HTTP side speaks S3's dialect for the two requests a
// client of the batch API makes: POST /<bucket> (a browser-style upload
// with a signed policy) and GET /<bucket>/<key> (a presigned download).
// Refusals are S3's XML errors with S3's codes, so S3 client libraries and
// tools report them as they would from AWS.

const (
	// maxFormFields bounds the bytes of the form fields before the file
	// (names and values) and their count, as S3 does.
	maxFormFieldBytes = 64 << 10
	maxFormFields     = 100
	// defaultIdleTimeout cuts a transfer that stalls; a slow one that
	// keeps moving is never cut.
	defaultIdleTimeout = time.Minute
	// clockSkew is how far in the future a signature's date may be.
	clockSkew = 15 * time.Minute
)

// s3Error is a refusal in S3's XML shape:
// <Error><Code>…</Code><Message>…</Message>…</Error>.
type s3Error struct {
	XMLName        xml.Name `xml:"Error"`
	Status         int      `xml:"-"`
	Code           string   `xml:"Code"`
	Message        string   `xml:"Message"`
	Key            string   `xml:"Key,omitempty"`
	BucketName     string   `xml:"BucketName,omitempty"`
	MaxSizeAllowed int64    `xml:"MaxSizeAllowed,omitempty"`
	MinSizeAllowed int64    `xml:"MinSizeAllowed,omitempty"`
	RequestID      string   `xml:"RequestId"`
}

func (e *s3Error) Error() string { return e.Code + ": " + e.Message }

func errAccessDenied(msg string) *s3Error {
	return &s3Error{Status: http.StatusForbidden, Code: "AccessDenied", Message: msg}
}

func errPolicy(msg string) *s3Error {
	return errAccessDenied("Invalid according to Policy: " + msg)
}

func errInvalidArgument(msg string) *s3Error {
	return &s3Error{Status: http.StatusBadRequest, Code: "InvalidArgument", Message: msg}
}

func errQueryAuth(msg string) *s3Error {
	return &s3Error{Status: http.StatusBadRequest, Code: "AuthorizationQueryParametersError", Message: msg}
}

var (
	errSignatureMismatch = &s3Error{Status: http.StatusForbidden, Code: "SignatureDoesNotMatch",
		Message: "The request signature we calculated does not match the signature you provided. Check your key and signing method."}
	errUnknownAccessKey = &s3Error{Status: http.StatusForbidden, Code: "InvalidAccessKeyId",
		Message: "The AWS Access Key Id you provided does not exist in our records."}
	errInternal = &s3Error{Status: http.StatusInternalServerError, Code: "InternalError",
		Message: "We encountered an internal error. Please try again."}
)

// errWriting is the refusal of an upload the disk did not take: 507 in
// MinIO's words when the disk is full (or the quota spent), which no
// retry mends until space is freed; else S3's 500, which a retry may.
// A full disk was a 500 "Please try again", and the clients retried in
// vain; MinIO answers 507 XMinioStorageFull, as the SDKs expect of it.
func errWriting(err error) *s3Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return &s3Error{Status: http.StatusInsufficientStorage, Code: "XMinioStorageFull",
			Message: "The storage is full: its disk has no space left for this file, which was not stored. Upload it again once space has been freed."}
	}
	return errInternal
}

// Handler serves uploads and downloads. It must be mounted at the root of
// a listener whose address PublicBaseURL names (a path in PublicBaseURL may
// be stripped by a reverse proxy or not).
func (l *Local) Handler() http.Handler { return http.HandlerFunc(l.serveHTTP) }

func (l *Local) serveHTTP(w http.ResponseWriter, r *http.Request) {
	requestID := newRequestID()
	w.Header().Set("x-amz-request-id", requestID)
	var err *s3Error
	bucket, key := l.splitPath(r.URL.Path)
	switch {
	case bucket != LocalBucket:
		err = &s3Error{Status: http.StatusNotFound, Code: "NoSuchBucket", Message: "The specified bucket does not exist", BucketName: bucket}
	case r.Method == http.MethodPost && key == "":
		err = l.serveUpload(w, r)
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && key != "":
		err = l.serveDownload(w, r, key)
	default:
		err = &s3Error{Status: http.StatusMethodNotAllowed, Code: "MethodNotAllowed", Message: "The specified method is not allowed against this resource."}
	}
	if err != nil {
		// The shared refusals (errSignatureMismatch, errInternal…) are
		// read by concurrent requests: stamp a copy.
		stamped := *err
		stamped.RequestID = requestID
		err = &stamped
		if r.Method == http.MethodPost {
			// The rest of a refused upload may be gigabytes, or never
			// come: hang up instead of reading it.
			w.Header().Set("Connection", "close")
		}
		l.logf("storage: refused %q %q from %s: %q", r.Method, r.URL.Path, r.RemoteAddr, err.Error())
		writeS3Error(w, r, err)
	}
}

// splitPath returns the bucket and key of a request path, with or without
// the public base URL's path in front.
func (l *Local) splitPath(p string) (bucket, key string) {
	if prefix := strings.TrimRight(l.base.Path, "/"); prefix != "" && strings.HasPrefix(p, prefix+"/") {
		p = p[len(prefix):]
	}
	bucket, key, _ = strings.Cut(strings.TrimPrefix(p, "/"), "/")
	return bucket, key
}

func writeS3Error(w http.ResponseWriter, r *http.Request, e *s3Error) {
	body, _ := xml.Marshal(e)
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Content-Length", strconv.Itoa(len(xml.Header)+len(body)))
	w.WriteHeader(e.Status)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, xml.Header)
		_, _ = w.Write(body)
	}
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))
}

// serveUpload handles a POST policy upload: the form fields come first,
// then the file; fields after the file are ignored, as S3 does.
func (l *Local) serveUpload(w http.ResponseWriter, r *http.Request) *s3Error {
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "multipart/form-data" || params["boundary"] == "" {
		return &s3Error{Status: http.StatusPreconditionFailed, Code: "PreconditionFailed",
			Message: "Bucket POST must be of the enclosure-type multipart/form-data"}
	}
	body := &idleReader{r: r.Body, rc: http.NewResponseController(w), idle: l.idleTimeout}
	fields, file, e := readFormFields(multipart.NewReader(body, params["boundary"]))
	if e != nil {
		return e
	}

	pol, e := l.verifyPost(fields, time.Now())
	if e != nil {
		return e
	}
	key := fields["key"]
	final, err := l.objectPath(key)
	if err != nil {
		e := errInvalidArgument(err.Error())
		e.Key = key
		return e
	}
	etag, e := l.receiveFile(file, key, final, pol)
	// Commit's fsync may have outlasted the deadline; the end of the form
	// after the file is still to be read.
	_ = body.rc.SetReadDeadline(time.Now().Add(l.idleTimeout))
	if e != nil {
		e.Key = key
		return e
	}
	l.answerUpload(w, fields["success_action_status"], key, etag)
	return nil
}

// readFormFields reads the fields of an upload form up to its file part,
// which it returns unread: the file is streamed to disk only once the
// fields have been verified. The fields' names are lowercased; their
// count and bytes are bounded as S3 bounds them.
func readFormFields(form *multipart.Reader) (map[string]string, *multipart.Part, *s3Error) {
	fields := map[string]string{}
	budget := maxFormFieldBytes
	var file *multipart.Part
	for file == nil {
		part, err := form.NextRawPart()
		if errors.Is(err, io.EOF) {
			return nil, nil, errInvalidArgument("POST requires exactly one file upload per request.")
		}
		if err != nil {
			return nil, nil, errInvalidArgument("malformed multipart body: " + err.Error())
		}
		name := strings.ToLower(part.FormName())
		switch {
		case name == "file":
			file = part
			continue
		case name == "":
			return nil, nil, errInvalidArgument("a part of the form has no field name")
		case len(fields) == maxFormFields:
			return nil, nil, errInvalidArgument(fmt.Sprintf("the form has more than %d fields", maxFormFields))
		}
		value, err := io.ReadAll(io.LimitReader(part, int64(budget)+1))
		if err != nil {
			return nil, nil, errInvalidArgument("reading form field " + name + ": " + err.Error())
		}
		budget -= len(name) + len(value)
		if budget < 0 {
			return nil, nil, &s3Error{Status: http.StatusBadRequest, Code: "MaxPostPreDataLengthExceeded",
				Message: "Your POST request fields preceding the upload file were too large."}
		}
		if _, dup := fields[name]; dup {
			return nil, nil, errInvalidArgument("the form field " + name + " is sent twice")
		}
		fields[name] = string(value)
	}
	return fields, file, nil
}

// answerUpload answers a stored upload as its success_action_status field
// asks, as S3 does: 200 or 204 (the default) without a body, 201 with a
// PostResponse document.
func (l *Local) answerUpload(w http.ResponseWriter, successActionStatus, key, etag string) {
	location := l.base.Scheme + "://" + l.base.Host + uriEncode(l.objectURLPath(key), true)
	w.Header().Set("ETag", etag)
	w.Header().Set("Location", location)
	switch successActionStatus {
	case "200":
		w.WriteHeader(http.StatusOK)
	case "201":
		body, _ := xml.Marshal(struct {
			XMLName  xml.Name `xml:"PostResponse"`
			Location string   `xml:"Location"`
			Bucket   string   `xml:"Bucket"`
			Key      string   `xml:"Key"`
			ETag     string   `xml:"ETag"`
		}{Location: location, Bucket: LocalBucket, Key: key, ETag: etag})
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, xml.Header)
		_, _ = w.Write(body)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// receiveFile streams the file part into a partial file, enforcing the
// policy's size range as the bytes arrive, and commits it under key. It
// returns the ETag (the MD5 of the content, as S3's for a single part).
func (l *Local) receiveFile(file io.Reader, key, final string, pol *postPolicy) (string, *s3Error) {
	u, err := l.newPartial(key, final)
	if err != nil {
		l.logf("storage: %v", err)
		return "", errWriting(err)
	}
	defer u.Abort() // after Commit it does nothing
	sum := md5.New()
	dst := &recordingWriter{w: u, h: sum}
	n, err := io.Copy(dst, io.LimitReader(file, pol.maxSize+1))
	switch {
	case dst.err != nil:
		l.logf("storage: writing %s: %v", key, dst.err)
		return "", errWriting(dst.err)
	case err != nil:
		return "", &s3Error{Status: http.StatusBadRequest, Code: "IncompleteBody",
			Message: "The upload ended before the file did: " + err.Error()}
	case n > pol.maxSize:
		return "", &s3Error{Status: http.StatusBadRequest, Code: "EntityTooLarge",
			Message: "Your proposed upload exceeds the maximum allowed size", MaxSizeAllowed: pol.maxSize}
	case n < pol.minSize:
		return "", &s3Error{Status: http.StatusBadRequest, Code: "EntityTooSmall",
			Message: "Your proposed upload is smaller than the minimum allowed size", MinSizeAllowed: pol.minSize}
	}
	if err := u.Commit(); err != nil {
		l.logf("storage: %v", err)
		return "", errWriting(err)
	}
	return `"` + hex.EncodeToString(sum.Sum(nil)) + `"`, nil
}

// recordingWriter tells write errors (the disk) from read errors (the
// client) after io.Copy, and hashes what it writes.
type recordingWriter struct {
	w   io.Writer
	h   hash.Hash
	err error
}

func (rw *recordingWriter) Write(p []byte) (int, error) {
	n, err := rw.w.Write(p)
	rw.h.Write(p[:n])
	if err != nil {
		rw.err = err
	}
	return n, err
}

// postPolicy is a decoded, verified POST policy.
type postPolicy struct {
	minSize, maxSize int64
}

// requiredPostFields are the form fields of a SigV4 POST upload, in the
// order they are reported missing.
var requiredPostFields = []string{"key", "policy", "x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-signature"}

// verifyPost checks the fields of an upload form the way S3 does: the
// signature of the policy, then its expiration, then every condition, then
// that no field escaped the policy.
func (l *Local) verifyPost(fields map[string]string, now time.Time) (*postPolicy, *s3Error) {
	for _, name := range requiredPostFields {
		if _, ok := fields[name]; !ok {
			return nil, errInvalidArgument(fmt.Sprintf("Bucket POST must contain a field named '%s'. If it is specified, please check the order of the fields.", name))
		}
	}
	if fields["x-amz-algorithm"] != sigAlgorithm {
		return nil, errInvalidArgument("X-Amz-Algorithm only supports \"" + sigAlgorithm + "\"")
	}
	cred, e := l.checkCredential(fields["x-amz-credential"], fields["x-amz-date"], errInvalidArgument)
	if e != nil {
		return nil, e
	}
	if !signaturesEqual(policySignature(l.secret, cred, fields["policy"]), fields["x-amz-signature"]) {
		return nil, errSignatureMismatch
	}

	raw, err := base64.StdEncoding.DecodeString(fields["policy"])
	if err != nil {
		return nil, errInvalidPolicy("the policy is not base64")
	}
	var doc struct {
		Expiration string            `json:"expiration"`
		Conditions []json.RawMessage `json:"conditions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, errInvalidPolicy("the policy is not a JSON object with expiration and conditions: " + err.Error())
	}
	if doc.Expiration == "" {
		return nil, errInvalidPolicy("Policy missing expiration.")
	}
	expiration, err := time.Parse(time.RFC3339Nano, doc.Expiration)
	if err != nil {
		return nil, errInvalidPolicy("Invalid 'expiration' value: '" + doc.Expiration + "'")
	}
	if !now.Before(expiration) {
		return nil, errPolicy("Policy expired.")
	}

	pol := &postPolicy{minSize: 0, maxSize: MaxUploadBytes}
	covered := map[string]bool{}
	for _, rawCond := range doc.Conditions {
		cond, e := parseCondition(rawCond)
		if e != nil {
			return nil, e
		}
		if cond.op == "content-length-range" {
			pol.minSize, pol.maxSize = max(pol.minSize, cond.min), min(pol.maxSize, cond.max)
			continue
		}
		covered[cond.field] = true
		value := fields[cond.field]
		if cond.field == "bucket" {
			value = LocalBucket
		}
		if cond.op == "eq" && value != cond.value || cond.op == "starts-with" && !strings.HasPrefix(value, cond.value) {
			return nil, errPolicy(fmt.Sprintf("Policy Condition failed: [%q, \"$%s\", %q]", cond.op, cond.field, cond.value))
		}
	}
	var extra []string
	for name := range fields {
		if !covered[name] && name != "policy" && name != "x-amz-signature" && !strings.HasPrefix(name, "x-ignore-") {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		return nil, errPolicy("Extra input fields: " + strings.Join(extra, ", "))
	}
	return pol, nil
}

func errInvalidPolicy(msg string) *s3Error {
	return &s3Error{Status: http.StatusBadRequest, Code: "InvalidPolicyDocument", Message: "Invalid Policy: " + msg}
}

// checkCredential parses an X-Amz-Credential and X-Amz-Date pair and checks
// they name this store's key and region on the same day. fail builds the
// error for a malformed value.
func (l *Local) checkCredential(credValue, amzDate string, fail func(string) *s3Error) (credential, *s3Error) {
	cred, err := parseCredential(credValue)
	if err != nil {
		return credential{}, fail("Error parsing the X-Amz-Credential parameter: " + err.Error())
	}
	if cred.accessKey != l.cred.accessKey {
		return credential{}, errUnknownAccessKey
	}
	if cred.region != l.cred.region {
		return credential{}, fail(fmt.Sprintf("Error parsing the X-Amz-Credential parameter; the region '%s' is wrong; expecting '%s'", cred.region, l.cred.region))
	}
	if _, err := time.Parse(amzDateFormat, amzDate); err != nil {
		return credential{}, fail("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
	}
	if !strings.HasPrefix(amzDate, cred.date) {
		return credential{}, fail("Error parsing the X-Amz-Credential parameter; the date does not match X-Amz-Date")
	}
	return cred, nil
}

// condition is one entry of a policy's conditions: {"field": "value"},
// ["eq"|"starts-with", "$field", "value"] or
// ["content-length-range", min, max]. Field names compare lower-case.
type condition struct {
	op, field, value string
	min, max         int64
}

func parseCondition(raw json.RawMessage) (condition, *s3Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '{' {
		var m map[string]string
		if err := json.Unmarshal(raw, &m); err != nil || len(m) != 1 {
			return condition{}, errInvalidPolicy("a condition object must hold one field and its string value: " + string(raw))
		}
		for field, value := range m {
			return condition{op: "eq", field: strings.ToLower(strings.TrimPrefix(field, "$")), value: value}, nil
		}
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil || len(list) != 3 {
		return condition{}, errInvalidPolicy("a condition must be an object or a list of three: " + string(raw))
	}
	var op string
	if json.Unmarshal(list[0], &op) != nil {
		return condition{}, errInvalidPolicy("unknown condition operator: " + string(list[0]))
	}
	switch op = strings.ToLower(op); op {
	case "eq", "starts-with":
		var field, value string
		if json.Unmarshal(list[1], &field) != nil || json.Unmarshal(list[2], &value) != nil || !strings.HasPrefix(field, "$") {
			return condition{}, errInvalidPolicy("want [\"" + op + "\", \"$field\", \"value\"], got " + string(raw))
		}
		return condition{op: op, field: strings.ToLower(field[1:]), value: value}, nil
	case "content-length-range":
		lo, errLo := policyInt(list[1])
		hi, errHi := policyInt(list[2])
		if errLo != nil || errHi != nil || lo < 0 || hi < lo {
			return condition{}, errInvalidPolicy("want [\"content-length-range\", min, max] with 0 <= min <= max, got " + string(raw))
		}
		return condition{op: op, min: lo, max: hi}, nil
	}
	return condition{}, errInvalidPolicy("unknown condition operator: " + op)
}

// policyInt reads a number written as a JSON number or a string of digits.
func policyInt(raw json.RawMessage) (int64, error) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw)
	}
	return strconv.ParseInt(s, 10, 64)
}

// serveDownload answers a presigned GET (or HEAD) of key; Range requests
// work, so an interrupted download can resume.
func (l *Local) serveDownload(w http.ResponseWriter, r *http.Request, key string) *s3Error {
	if e := l.verifyPresigned(r, key, time.Now()); e != nil {
		return e
	}
	f, _, err := l.openFile(key)
	if errors.Is(err, ErrNotExist) || errors.Is(err, ErrInvalidKey) {
		return &s3Error{Status: http.StatusNotFound, Code: "NoSuchKey", Message: "The specified key does not exist.", Key: key}
	}
	if err != nil {
		l.logf("storage: %v", err)
		return errInternal
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		l.logf("storage: %s: %v", key, err)
		return errInternal
	}
	contentType := "application/octet-stream"
	if path.Ext(key) == ".ndjson" {
		contentType = "application/x-ndjson"
	}
	w.Header().Set("Content-Type", contentType)
	http.ServeContent(&idleWriter{ResponseWriter: w, rc: http.NewResponseController(w), idle: l.idleTimeout}, r, "", fi.ModTime(), f)
	return nil
}

// verifyPresigned checks a query-string signature: well-formed, this
// store's credential, the signature itself, then the validity window.
func (l *Local) verifyPresigned(r *http.Request, key string, now time.Time) *s3Error {
	q := r.URL.Query()
	if q.Get("X-Amz-Signature") == "" && q.Get("X-Amz-Credential") == "" {
		return errAccessDenied("Access Denied")
	}
	for _, name := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature"} {
		if len(q[name]) != 1 {
			return errQueryAuth("Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters.")
		}
	}
	if q.Get("X-Amz-Algorithm") != sigAlgorithm {
		return errQueryAuth("X-Amz-Algorithm only supports \"" + sigAlgorithm + "\"")
	}
	amzDate := q.Get("X-Amz-Date")
	cred, e := l.checkCredential(q.Get("X-Amz-Credential"), amzDate, errQueryAuth)
	if e != nil {
		return e
	}
	expires, err := strconv.ParseInt(q.Get("X-Amz-Expires"), 10, 64)
	if err != nil || expires < 1 || expires > int64(maxPresignTTL/time.Second) {
		return errQueryAuth("X-Amz-Expires must be a number of seconds from 1 to 604800")
	}
	signed := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	if !slices.Contains(signed, "host") {
		return errQueryAuth("X-Amz-SignedHeaders must include host")
	}
	headers := make(map[string]string, len(signed))
	for _, name := range signed {
		headers[name] = r.Header.Get(name)
	}
	// The host signed is the public one: a reverse proxy in front may
	// rewrite the Host header.
	headers["host"] = l.base.Host
	req := presignedRequest{method: r.Method, path: l.objectURLPath(key), query: q, headers: headers}
	if !signaturesEqual(req.signature(l.secret, cred, amzDate), q.Get("X-Amz-Signature")) {
		return errSignatureMismatch
	}
	signedAt, _ := time.Parse(amzDateFormat, amzDate)
	if now.After(signedAt.Add(time.Duration(expires) * time.Second)) {
		return errAccessDenied("Request has expired")
	}
	if signedAt.After(now.Add(clockSkew)) {
		return errAccessDenied("Request is not valid yet")
	}
	return nil
}

// idleReader moves the connection's read deadline forward as the body
// arrives, a few times per idle period at most.
type idleReader struct {
	r    io.Reader
	rc   *http.ResponseController
	idle time.Duration
	next time.Time
}

func (ir *idleReader) Read(p []byte) (int, error) {
	if now := time.Now(); now.After(ir.next) {
		_ = ir.rc.SetReadDeadline(now.Add(ir.idle))
		ir.next = now.Add(min(time.Second, ir.idle/4))
	}
	return ir.r.Read(p)
}

// idleWriter is idleReader for a response body.
type idleWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
	next time.Time
}

func (iw *idleWriter) Write(p []byte) (int, error) {
	if now := time.Now(); now.After(iw.next) {
		_ = iw.rc.SetWriteDeadline(now.Add(iw.idle))
		iw.next = now.Add(min(time.Second, iw.idle/4))
	}
	return iw.ResponseWriter.Write(p)
}

func (iw *idleWriter) Unwrap() http.ResponseWriter { return iw.ResponseWriter }
