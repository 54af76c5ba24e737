package proxytest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// call sends method to url with an empty body and returns status and body.
func call(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, decode(t, string(body))
}

func createResponse(t *testing.T, s *Server, body string) string {
	t.Helper()
	resp := post(t, context.Background(), s.URL+"/responses", body)
	if strings.Contains(body, `"stream":true`) {
		events, err := readSSE(resp.Body)
		if err != nil || len(events) == 0 {
			t.Fatalf("stream: %v %+v", err, events)
		}
		return field(t, decode(t, events[0].data), "response", "id").(string)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return field(t, decode(t, string(b)), "id").(string)
}

func TestResponsesAreKeptRetrievedAndDeleted(t *testing.T) {
	s := newServer(t, Options{Chunks: 2})
	for _, body := range []string{responsesReq, `{"model":"r1","input":"hello","stream":true}`} {
		id := createResponse(t, s, body)
		status, m := call(t, "GET", s.URL+"/responses/"+id)
		if status != 200 || field(t, m, "id") != id || field(t, m, "status") != "completed" ||
			field(t, m, "output", 0, "content", 0, "text") != "tok0 tok1" {
			t.Fatalf("GET %s: %d %v", id, status, m)
		}
		status, m = call(t, "GET", s.URL+"/responses/"+id+"/input_items")
		if status != 200 || field(t, m, "object") != "list" || field(t, m, "data", 0, "content", 0, "text") != "hello" ||
			field(t, m, "has_more") != false {
			t.Fatalf("input_items: %d %v", status, m)
		}
		status, m = call(t, "POST", s.URL+"/responses/"+id+"/cancel")
		if status != 400 || field(t, m, "error", "message") != "Cannot cancel a synchronous response." {
			t.Fatalf("cancel of a completed response: %d %v", status, m)
		}
		status, m = call(t, "DELETE", s.URL+"/responses/"+id)
		if status != 200 || field(t, m, "id") != id || field(t, m, "deleted") != true {
			t.Fatalf("DELETE: %d %v", status, m)
		}
		status, m = call(t, "GET", s.URL+"/responses/"+id)
		if status != 404 || field(t, m, "error", "message") != "Response with id '"+id+"' not found." ||
			field(t, m, "error", "code") != nil {
			t.Fatalf("GET after DELETE: %d %v", status, m)
		}
	}
}

func TestResponsesStateEdges(t *testing.T) {
	s := newServer(t, Options{})
	// store:false is not kept; a previous_response_id it lacks is vLLM's 404.
	id := createResponse(t, s, `{"model":"r","input":"x","store":false}`)
	if s.Stored(id) {
		t.Fatal("store:false was kept")
	}
	resp := post(t, context.Background(), s.URL+"/responses", `{"model":"r","input":"x","previous_response_id":"resp_nope"}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || field(t, decode(t, string(b)), "error", "message") != "Response with id 'resp_nope' not found." {
		t.Fatalf("unknown previous_response_id: %d %s", resp.StatusCode, b)
	}
	prev := createResponse(t, s, `{"model":"r","input":[{"role":"user","content":"a"},{"id":"own","type":"message","role":"user","content":"b"}]}`)
	createResponse(t, s, `{"model":"r","input":"y","previous_response_id":"`+prev+`"}`)

	// input_items: newest first by default; limit and order from the query.
	status, m := call(t, "GET", s.URL+"/responses/"+prev+"/input_items?limit=1&order=asc")
	if status != 200 || field(t, m, "data", 0, "content") != "a" || field(t, m, "has_more") != true ||
		!strings.HasPrefix(field(t, m, "first_id").(string), "in_") {
		t.Fatalf("input_items asc: %d %v", status, m)
	}
	// The next page starts after the last id of the one before.
	firstPage := field(t, m, "last_id").(string)
	status, next := call(t, "GET", s.URL+"/responses/"+prev+"/input_items?limit=1&order=asc&after="+firstPage)
	if status != 200 || field(t, next, "data", 0, "content") != "b" || field(t, next, "has_more") != false {
		t.Fatalf("input_items after %s: %d %v", firstPage, status, next)
	}
	status, m = call(t, "GET", s.URL+"/responses/"+prev+"/input_items")
	if status != 200 || field(t, m, "data", 0, "id") != "own" || field(t, m, "last_id") == "own" {
		t.Fatalf("input_items desc: %d %v", status, m)
	}
	if got := s.Requests(); got[len(got)-1].RawQuery != "" || got[len(got)-3].RawQuery != "limit=1&order=asc" {
		t.Fatalf("recorded queries %q, %q", got[len(got)-3].RawQuery, got[len(got)-1].RawQuery)
	}

	// A background response can be cancelled, once.
	bg := createResponse(t, s, `{"model":"r","input":"x","background":true}`)
	if status, m := call(t, "GET", s.URL+"/responses/"+bg); status != 200 || field(t, m, "status") != "queued" {
		t.Fatalf("background: %d %v", status, m)
	}
	if status, m := call(t, "POST", s.URL+"/responses/"+bg+"/cancel"); status != 200 || field(t, m, "status") != "cancelled" {
		t.Fatalf("cancel: %d %v", status, m)
	}
	if status, _ := call(t, "POST", s.URL+"/responses/"+bg+"/cancel"); status != 400 {
		t.Fatalf("second cancel: %d", status)
	}

	// Wrong methods and paths.
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/responses/" + prev, 405},
		{"GET", "/responses/" + prev + "/cancel", 405},
		{"GET", "/responses/" + prev + "/other", 404},
		{"GET", "/responses/resp_unknown/input_items", 404},
	} {
		if status, _ := call(t, c.method, s.URL+c.path); status != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, status, c.status)
		}
	}

	// GET ?stream=true replays it as one response.completed event.
	req, _ := http.NewRequest("GET", s.URL+"/responses/"+prev+"?stream=true", nil)
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	events, err := readSSE(r2.Body)
	if err != nil || len(events) != 1 || events[0].name != "response.completed" ||
		field(t, decode(t, events[0].data), "response", "id") != prev {
		t.Fatalf("stream replay: %v %+v", err, events)
	}

	// Nothing is kept under NoRecord.
	s.SetOptions(Options{NoRecord: true})
	if id := createResponse(t, s, responsesReq); s.Stored(id) {
		t.Fatal("NoRecord kept a response")
	}
}
