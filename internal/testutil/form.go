package testutil

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"slices"
	"testing"
)

// PostForm posts file to url as `curl -F` does a presigned upload: every
// field as a form field, sorted by name, then the file as field "file",
// and no Authorization header. It returns the answer's status and body.
func PostForm(t testing.TB, url string, fields map[string]string, file []byte) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := mw.WriteField(name, fields[name]); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := mw.CreateFormFile("file", "input.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Write(file); err != nil {
		t.Fatal(err)
	}
	mw.Close()
	resp, err := http.Post(url, mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}
